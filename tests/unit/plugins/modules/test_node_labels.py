# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import OWNED_LABELS_ANNOTATION as OWNED
from ansible_collections.gpuops.sandbox.plugins.modules import node_labels
from ansible_collections.gpuops.sandbox.tests.unit.fakes.fake_kube import (
    SECRET_SCENARIOS, FakeKube, check_clean_end, check_no_credential_shown, fuzz_args, fuzz_values)
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call

WL = "nvidia.com/gpu.workload.config"
VG = "nvidia.com/vgpu.config"


def node(name, labels=None, taints=None, owned=None):
    meta = {"name": name, "labels": dict(labels or {})}
    if owned is not None:
        meta["annotations"] = {OWNED: json.dumps(owned, sort_keys=True, separators=(",", ":"))}
    return {"metadata": meta, "spec": {"taints": list(taints or [])}}


def invoke(monkeypatch, fake, nodes, **extra):
    args = dict(nodes=nodes, **extra)
    return call(monkeypatch, lambda: node_labels.main(api_factory=lambda p: fake), args)


def test_labels_set_and_stale_label_removed(monkeypatch):
    fake = FakeKube([node("a", {WL: "vm-vgpu", VG: "A10-4Q", "keep": "x"}), node("b")])
    want = [{"name": "a", "labels": {WL: "vm-passthrough", VG: None}}, {"name": "b", "labels": {WL: "container"}}]
    kind, result = invoke(monkeypatch, fake, want)
    assert kind == "exit" and result["changed"] and result["changed_nodes"] == ["a", "b"]
    assert fake.nodes["a"]["metadata"]["labels"] == {WL: "vm-passthrough", "keep": "x"}
    assert fake.nodes["b"]["metadata"]["labels"] == {WL: "container"}
    # Second run: nothing to do, only the list request.
    fake.requests = 0
    kind, result = invoke(monkeypatch, fake, want)
    assert kind == "exit" and not result["changed"] and result["api_requests"] == 1


def test_check_mode_and_diff_change_nothing(monkeypatch):
    fake = FakeKube([node("a", {WL: "vm-vgpu", VG: "A10-4Q"})])
    want = [{"name": "a", "labels": {WL: "vm-passthrough", VG: None}}]
    kind, result = invoke(monkeypatch, fake, want, _ansible_check_mode=True, _ansible_diff=True)
    assert kind == "exit" and result["changed"]
    assert result["diff"]["before"]["a"]["labels"] == {WL: "vm-vgpu", VG: "A10-4Q"}
    assert result["diff"]["after"]["a"]["labels"] == {WL: "vm-passthrough", VG: None}
    assert fake.patches == [] and fake.nodes["a"]["metadata"]["labels"][VG] == "A10-4Q"


def test_bool_and_int_values_become_strings(monkeypatch):
    fake = FakeKube([node("a")])
    kind = invoke(monkeypatch, fake, [{"name": "a", "labels": {"nvidia.com/gpu.deploy.device-plugin": False, "n": 3}}])[0]
    assert kind == "exit"
    assert fake.nodes["a"]["metadata"]["labels"] == {"nvidia.com/gpu.deploy.device-plugin": "false", "n": "3"}


@pytest.mark.parametrize("labels, needle", [
    ({"bad key!": "x"}, "'bad key!'"),
    ({"nvidia.com/ok": "bad value!"}, "'bad value!'"),
    ({"UPPER.Example/ok": "x"}, "'UPPER.Example'"),
    ({"ok": "x" * 64}, "is not valid"),
])
def test_bad_label_fails_before_anything(monkeypatch, labels, needle):
    fake = FakeKube([node("a"), node("b")])
    kind, result = invoke(monkeypatch, fake, [{"name": "b", "labels": {WL: "container"}}, {"name": "a", "labels": labels}])
    assert kind == "fail" and needle in result["msg"] and "nothing was changed" in result["msg"]
    assert fake.patches == [] and fake.requests == 0


def test_missing_node_fails_before_any_patch(monkeypatch):
    fake = FakeKube([node("a")])
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "labels": {WL: "container"}}, {"name": "ghost", "labels": {}}])
    assert kind == "fail" and "no node named ghost" in result["msg"]
    assert fake.patches == []


def test_missing_node_ignored_when_asked(monkeypatch):
    fake = FakeKube([node("a")])
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "labels": {WL: "container"}}, {"name": "ghost"}],
                          missing_nodes="ignore")
    assert kind == "exit" and result["missing_nodes"] == ["ghost"] and result["changed_nodes"] == ["a"]


def test_forbidden_fails_before_any_patch(monkeypatch):
    fake = FakeKube([node("a")], denied=[("patch", "nodes")])
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "labels": {WL: "container"}}])
    assert kind == "fail" and "may not patch nodes" in result["msg"]
    assert fake.patches == []


def test_failed_patch_rolls_back_the_others(monkeypatch):
    fake = FakeKube([node("a", {WL: "vm-vgpu"}), node("b", {WL: "vm-vgpu"}), node("c", {WL: "vm-vgpu"})], fail_patch=["b"])
    want = [{"name": n, "labels": {WL: "container"}} for n in "abc"]
    kind, result = invoke(monkeypatch, fake, want)
    assert kind == "fail" and "1 of 3 node patches failed" in result["msg"] and "rolled back the 2 nodes" in result["msg"]
    assert [fake.nodes[n]["metadata"]["labels"][WL] for n in "abc"] == ["vm-vgpu"] * 3


def test_taints_managed_by_prefix_only(monkeypatch):
    taints = [{"key": "nvidia.com/old", "effect": "NoSchedule"},
              {"key": "dedicated", "value": "ml", "effect": "NoSchedule", "timeAdded": "x"}]
    fake = FakeKube([node("a", taints=taints)])
    want = [{"name": "a", "taints": [{"key": "nvidia.com/gpu.workload", "value": "vm", "effect": "NoSchedule"}]}]
    kind, result = invoke(monkeypatch, fake, want)
    assert kind == "exit" and result["changed"]
    assert fake.nodes["a"]["spec"]["taints"] == [taints[1], {"key": "nvidia.com/gpu.workload", "value": "vm", "effect": "NoSchedule"}]
    kind, result = invoke(monkeypatch, fake, want)
    assert kind == "exit" and not result["changed"]
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "taints": []}])
    assert fake.nodes["a"]["spec"]["taints"] == [taints[1]]


def test_taint_patch_retries_on_conflict(monkeypatch):
    fake = FakeKube([node("a")], conflict_once=["a"])
    want = [{"name": "a", "taints": [{"key": "nvidia.com/x", "effect": "NoExecute"}]}]
    kind, result = invoke(monkeypatch, fake, want)
    assert kind == "exit" and result["changed"]
    assert fake.nodes["a"]["spec"]["taints"] == [{"key": "nvidia.com/x", "effect": "NoExecute"}]


def test_node_given_twice(monkeypatch):
    fake = FakeKube([node("a")])
    kind, result = invoke(monkeypatch, fake, [{"name": "a"}, {"name": "a"}])
    assert kind == "fail" and "node a is given twice" in result["msg"]


def test_many_nodes_one_list_request_and_patches_only_for_differences(monkeypatch):
    nodes = [node("n%04d" % i, {WL: "container"}, owned={WL: "container"}) if i % 2 else node("n%04d" % i)
             for i in range(1000)]
    fake = FakeKube(nodes)
    kind, result = invoke(monkeypatch, fake, [{"name": "n%04d" % i, "labels": {WL: "container"}} for i in range(1000)])
    assert kind == "exit" and len(result["changed_nodes"]) == 500
    # one list, one access review, 500 patches
    assert result["api_requests"] == 502


def test_only_labels_this_module_set_are_released(monkeypatch):
    """A label set in an earlier run and no longer wanted goes, but only while it has the value set then."""
    deploy, validator = "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.operator-validator"
    fake = FakeKube([node("a", {WL: "vm-passthrough", "nvidia.com/gpu.deploy.vfio-manager": "true"})])
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "labels": {WL: "container", deploy: "false", validator: "false"}}])
    assert kind == "exit" and result["changed"]
    assert json.loads(fake.nodes["a"]["metadata"]["annotations"][OWNED]) == {WL: "container", deploy: "false", validator: "false"}
    # Somebody (the operator, a user) changes one of them; the node then leaves DRA: only the label still
    # carrying the value this module set is removed, the operator's own vfio-manager=true was never touched.
    fake.nodes["a"]["metadata"]["labels"][validator] = "true"
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "labels": {WL: "vm-passthrough"}}], _ansible_diff=True)
    assert kind == "exit" and result["changed"]
    assert fake.nodes["a"]["metadata"]["labels"] == {WL: "vm-passthrough", validator: "true",
                                                     "nvidia.com/gpu.deploy.vfio-manager": "true"}
    assert result["diff"]["after"]["a"]["labels"] == {WL: "vm-passthrough", deploy: None}
    assert json.loads(fake.nodes["a"]["metadata"]["annotations"][OWNED]) == {WL: "vm-passthrough"}
    fake.patches = []
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "labels": {WL: "vm-passthrough"}}])
    assert kind == "exit" and not result["changed"] and fake.patches == []


def test_a_broken_record_releases_nothing(monkeypatch):
    broken = node("a", {WL: "container", "x.example/y": "1"})
    broken["metadata"]["annotations"] = {OWNED: "not json"}
    fake = FakeKube([broken])
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "labels": {WL: "container"}}])
    assert kind == "exit" and fake.nodes["a"]["metadata"]["labels"] == {WL: "container", "x.example/y": "1"}
    assert json.loads(fake.nodes["a"]["metadata"]["annotations"][OWNED]) == {WL: "container"}


def test_released_labels_named_in_release_to_are_handed_over(monkeypatch):
    """A DRA node turned container: the collection's `false` deploy labels become the operator's `true`."""
    deploy, dcgm = "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.dcgm"
    fake = FakeKube([node("a", {WL: "container", deploy: "false", dcgm: "true", "nvidia.com/gpu.deploy.driver": "true"},
                          owned={WL: "container", deploy: "false", dcgm: "false"})])
    handover = {deploy: "true", dcgm: "true", "nvidia.com/gpu.deploy.gpu-feature-discovery": True}
    want = [{"name": "a", "labels": {WL: "container"}, "release_to": handover}]
    # Check mode shows the handover and changes nothing.
    kind, result = invoke(monkeypatch, fake, want, _ansible_check_mode=True, _ansible_diff=True)
    assert kind == "exit" and result["changed"] and fake.patches == []
    # dcgm was changed by somebody else since (it is theirs, not the collection's to hand over).
    assert result["diff"]["before"]["a"]["labels"] == {WL: "container", deploy: "false"}
    assert result["diff"]["after"]["a"]["labels"] == {WL: "container", deploy: "true"}
    kind, result = invoke(monkeypatch, fake, want)
    assert kind == "exit" and result["changed"]
    assert fake.nodes["a"]["metadata"]["labels"] == {WL: "container", deploy: "true", dcgm: "true",
                                                     "nvidia.com/gpu.deploy.driver": "true"}
    assert json.loads(fake.nodes["a"]["metadata"]["annotations"][OWNED]) == {WL: "container"}
    # Handed over: the next run leaves the label alone, even when its new owner changes it.
    fake.nodes["a"]["metadata"]["labels"][deploy] = "paused-for-driver-upgrade"
    fake.patches = []
    kind, result = invoke(monkeypatch, fake, want)
    assert kind == "exit" and not result["changed"] and fake.patches == []


def test_a_bad_release_to_key_fails_before_anything(monkeypatch):
    fake = FakeKube([node("a", {WL: "dra"}, owned={WL: "dra"})])
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "labels": {WL: "container"}, "release_to": {"bad key!": "true"}}])
    assert kind == "fail" and "bad key!" in result["msg"] and fake.patches == []


@pytest.mark.parametrize("option, value", [
    ("request_timeout", "inf"), ("request_timeout", "-inf"), ("request_timeout", "Infinity"),
    ("request_timeout", float("inf")), ("request_timeout", "9" * 5000),
    ("parallel", "inf"), ("parallel", "-Infinity"), ("parallel", float("-inf")), ("parallel", "9" * 5000),
], ids=lambda value: repr(value)[:12])
def test_not_finite_integers_fail_naming_the_option(monkeypatch, option, value):
    """These used to end in a traceback inside ansible-core's integer check."""
    fake = FakeKube([node("a")])
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "labels": {WL: "container"}}], **{option: value})
    assert kind == "fail" and result["msg"].startswith(option + "=") and "nothing was changed" in result["msg"]
    assert fake.requests == 0 and fake.patches == []


@pytest.mark.parametrize("option, value, needle", [
    ("request_timeout", -1, "request_timeout must be 1 to 3600 seconds, got -1; nothing was changed"),
    ("request_timeout", 0, "request_timeout must be 1 to 3600 seconds, got 0; nothing was changed"),
    ("request_timeout", 3601, "request_timeout must be 1 to 3600 seconds, got 3601; nothing was changed"),
    ("parallel", 0, "parallel must be 1 to 32 patches in flight, got 0; nothing was changed"),
    ("parallel", -3, "parallel must be 1 to 32 patches in flight, got -3; nothing was changed"),
    ("parallel", 33, "parallel must be 1 to 32 patches in flight, got 33; nothing was changed"),
    ("parallel", "1e400", "parallel must be 1 to 32 patches in flight, got a number of 401 digits; nothing was changed"),
    ("parallel", True, "parallel must be a whole number of patches in flight, got True"),
])
def test_out_of_range_integers_fail_before_any_request(monkeypatch, option, value, needle):
    """request_timeout 0 used to become 30 and parallel 0 to become 1, silently; -1 got a client library's dump."""
    fake = FakeKube([node("a")])
    kind, result = invoke(monkeypatch, fake, [{"name": "a", "labels": {WL: "container"}}], **{option: value})
    assert kind == "fail" and needle in result["msg"]
    assert fake.requests == 0 and fake.patches == []


def test_the_largest_parallel_works(monkeypatch):
    fake = FakeKube([node("n%d" % i) for i in range(40)])
    kind, result = invoke(monkeypatch, fake, [{"name": "n%d" % i, "labels": {WL: "container"}} for i in range(40)],
                          parallel=32, request_timeout=3600)
    assert kind == "exit" and len(result["changed_nodes"]) == 40


def test_an_unexpected_error_in_one_patch_rolls_back_the_others(monkeypatch):
    class Broken(FakeKube):
        def patch_node(self, name, patch):
            if name == "b" and "labels" in (patch.get("metadata") or {}) and patch["metadata"]["labels"].get(WL):
                raise TypeError("something odd")
            return FakeKube.patch_node(self, name, patch)

    fake = Broken([node(n, {WL: "vm-vgpu"}) for n in "abc"])
    kind, result = invoke(monkeypatch, fake, [{"name": n, "labels": {WL: "container"}} for n in "abc"])
    assert kind == "fail" and "node b: TypeError: something odd" in result["msg"]
    assert "rolled back the 2 nodes" in result["msg"]
    assert [fake.nodes[n]["metadata"]["labels"][WL] for n in "abc"] == ["vm-vgpu"] * 3


@pytest.mark.parametrize("scenario", sorted(SECRET_SCENARIOS))
def test_no_failure_shows_a_credential(monkeypatch, tmp_path, scenario):
    """Through the real client, every way a kubeconfig's credential can meet a failure: the secret is nowhere."""
    check_no_credential_shown(tmp_path, scenario, lambda path: call(monkeypatch, node_labels.main, dict(
        kubeconfig=path, request_timeout=5, nodes=[{"name": "a", "labels": {WL: "container"}}])))


_KEYS = ["name", "labels", "release_to", "taints", "key", "value", "effect", WL, "nvidia.com/x"]
_LABELS = hs.dictionaries(hs.sampled_from([WL, VG, "nvidia.com/gpu.deploy.dcgm", "x.example/y"]),
                          hs.sampled_from(["container", "vm-passthrough", "A10-4Q", True, False, 3, None]), max_size=3)
_TAINT = hs.fixed_dictionaries({"key": hs.sampled_from(["nvidia.com/x", "nvidia.com/gpu.workload", "dedicated"]),
                                "effect": hs.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])},
                               optional={"value": hs.sampled_from(["vm", "ml", None])})
_NODE = hs.fixed_dictionaries({"name": hs.sampled_from(["a", "b", "ghost"])},
                              optional={"labels": _LABELS, "release_to": _LABELS, "taints": hs.lists(_TAINT, max_size=2)})
_NODE_FUZZ = fuzz_args(_NODE, {
    "name": fuzz_values(), "labels": hs.one_of(hs.dictionaries(hs.sampled_from([WL, "bad key!", "Bad/x"]), fuzz_values(), max_size=2),
                                               fuzz_values(_KEYS)),
    "release_to": fuzz_values(_KEYS), "taints": hs.one_of(hs.lists(fuzz_args(_TAINT, dict((k, fuzz_values()) for k in ("key", "value", "effect")), 1),
                                                                   max_size=2), fuzz_values(_KEYS)),
    "bogus": fuzz_values()}, 2)
_ARGS = fuzz_args(hs.fixed_dictionaries({"nodes": hs.lists(_NODE, max_size=3)}), {
    "nodes": hs.one_of(hs.lists(_NODE_FUZZ, max_size=3), fuzz_values(_KEYS)),
    "taint_key_prefixes": fuzz_values(), "missing_nodes": hs.one_of(hs.sampled_from(["fail", "ignore"]), fuzz_values()),
    "parallel": hs.one_of(hs.integers(1, 32), fuzz_values()), "request_timeout": fuzz_values(), "context": fuzz_values(),
    "bogus": fuzz_values()})


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=_ARGS, check=hs.booleans(), fail_patch=hs.booleans())
def test_fuzz_arguments_end_cleanly(monkeypatch, args, check, fail_patch):
    fake = FakeKube([node("a", {WL: "vm-vgpu"}), node("b", taints=[{"key": "nvidia.com/x", "effect": "NoSchedule"}])],
                    fail_patch=["b"] if fail_patch else ())
    before = _state(fake)
    kind, result = call(monkeypatch, lambda: node_labels.main(api_factory=lambda p: fake), dict(args, _ansible_check_mode=check))
    check_clean_end(kind, result)
    if kind == "fail" or check:
        # A failure changes nothing (or rolls back what it patched); check mode patches nothing.
        assert _state(fake) == before


def _state(fake):
    """Labels, annotations and taints of every node (an empty map is the same as none, as on an API server)."""
    return dict((name, (n["metadata"].get("labels") or {}, n["metadata"].get("annotations") or {}, n["spec"].get("taints") or []))
                for name, n in fake.nodes.items())
