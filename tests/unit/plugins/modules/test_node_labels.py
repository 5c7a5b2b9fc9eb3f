# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import json

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import OWNED_LABELS_ANNOTATION as OWNED
from ansible_collections.gpuops.sandbox.plugins.modules import node_labels
from ansible_collections.gpuops.sandbox.tests.unit.plugins.fake_kube import FakeKube
from ansible_collections.gpuops.sandbox.tests.unit.plugins.modules.module_harness import call

WL = "nvidia.com/gpu.workload.config"
VG = "nvidia.com/vgpu.config"


def node(name, labels=None, taints=None, owned=None):
    meta = {"name": name, "labels": dict(labels or {})}
    if owned is not None:
        meta["annotations"] = {OWNED: json.dumps(owned, sort_keys=True, separators=(",", ":"))}
    return {"metadata": meta, "spec": {"taints": list(taints or [])}}


def invoke(monkeypatch, fake, nodes, **extra):
    args = dict(nodes=nodes, **extra)
    return call(monkeypatch, lambda: node_labels.run_module(node_labels.build_module(), api_factory=lambda p: fake), args)


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
