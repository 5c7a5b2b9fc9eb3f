# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ansible_collections.gpuops.sandbox.plugins.module_utils._kube import KubeApi, KubeError
from ansible_collections.gpuops.sandbox.plugins.modules import kube_access
from ansible_collections.gpuops.sandbox.tests.unit.fakes.fake_kube import (
    SECRET_SCENARIOS, FakeKube, check_clean_end, check_no_credential_shown, fuzz_args, fuzz_values)
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call


def invoke(monkeypatch, fake, **args):
    return call(monkeypatch, lambda: kube_access.main(api_factory=lambda p: fake), args)


def test_allowed(monkeypatch):
    kind, result = invoke(monkeypatch, FakeKube(), permissions=[{"verb": "patch", "resource": "nodes"}])
    assert kind == "exit" and result["server_version"] == "v1.35.4" and not result["changed"]


def test_denied_names_the_permission(monkeypatch):
    kind, result = invoke(monkeypatch, FakeKube(denied=[("patch", "nodes")]), permissions=[{"verb": "patch", "resource": "nodes"}])
    assert kind == "fail" and "may not patch nodes" in result["msg"]


def test_bad_kubeconfig_message_has_no_contents(tmp_path):
    path = tmp_path / "kubeconfig"
    secret = "s3cr3t-token-value"
    path.write_text("apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: %s\n" % secret)
    try:
        KubeApi(kubeconfig=str(path))
    except KubeError as exc:
        assert str(path) in exc.msg and secret not in exc.msg
    else:
        raise AssertionError("a kubeconfig without a context must fail")


def test_unreachable_server_is_named(tmp_path):
    path = tmp_path / "kubeconfig"
    secret = "s3cr3t-token-value"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n"
        "clusters:\n- name: k\n  cluster: {server: 'https://127.0.0.1:9', insecure-skip-tls-verify: true}\n"
        "users:\n- name: u\n  user: {token: %s}\n" % secret)
    api = KubeApi(kubeconfig=str(path), request_timeout=5)
    try:
        api.version()
    except KubeError as exc:
        assert "cannot reach the API server at https://127.0.0.1:9" in exc.msg and secret not in exc.msg
    else:
        raise AssertionError("port 9 must not answer")
    assert os.path.exists(path)


NOT_FINITE = ["inf", "-inf", "Infinity", "-Infinity", " +inf ", float("inf"), float("-inf"), "9" * 5000]


@pytest.mark.parametrize("value", NOT_FINITE, ids=lambda value: repr(value)[:12])
def test_request_timeout_not_finite_fails_naming_it(monkeypatch, value):
    """These used to end in a traceback (OverflowError, ValueError) inside ansible-core's integer check."""
    fake = FakeKube()
    kind, result = invoke(monkeypatch, fake, request_timeout=value)
    assert kind == "fail" and result["msg"].startswith("request_timeout=") and "nothing was changed" in result["msg"]
    assert "Traceback" not in result["msg"] and fake.requests == 0


@pytest.mark.parametrize("value, needle", [
    (-1, "request_timeout must be 1 to 3600 seconds, got -1; nothing was changed"),
    (0, "request_timeout must be 1 to 3600 seconds, got 0; nothing was changed"),
    (3601, "request_timeout must be 1 to 3600 seconds, got 3601; nothing was changed"),
    ("1e400", "request_timeout must be 1 to 3600 seconds, got a number of 401 digits; nothing was changed"),
    ("nan", "request_timeout"),
])
def test_request_timeout_out_of_range_fails_before_any_request(monkeypatch, value, needle):
    fake = FakeKube()
    kind, result = invoke(monkeypatch, fake, request_timeout=value)
    assert kind == "fail" and needle in result["msg"] and fake.requests == 0


@pytest.mark.parametrize("scenario", sorted(SECRET_SCENARIOS))
def test_no_failure_shows_a_credential(monkeypatch, tmp_path, scenario):
    """Through the real client, every way a kubeconfig's credential can meet a failure: the secret is nowhere."""
    check_no_credential_shown(tmp_path, scenario, lambda path: call(monkeypatch, kube_access.main, dict(
        kubeconfig=path, request_timeout=5, permissions=[{"verb": "patch", "resource": "nodes"}])))


_PERMISSION = hs.fixed_dictionaries({"verb": hs.sampled_from(["patch", "get"]), "resource": hs.sampled_from(["nodes", "pods"])},
                                    optional={"group": hs.sampled_from(["", "kubevirt.io"]), "namespace": hs.sampled_from(["kubevirt", None])})
_PERMISSION_FUZZ = fuzz_args(_PERMISSION, dict((key, fuzz_values()) for key in ("verb", "resource", "group", "namespace", "bogus")), 2)
_ARGS = fuzz_args(hs.fixed_dictionaries({"permissions": hs.lists(_PERMISSION, max_size=3)}), {
    "permissions": hs.one_of(hs.lists(_PERMISSION_FUZZ, max_size=3), fuzz_values(["verb", "resource", "group", "namespace"])),
    "request_timeout": hs.one_of(hs.integers(1, 3600), fuzz_values()), "context": fuzz_values(), "kubeconfig": fuzz_values(),
    "bogus": fuzz_values()})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=_ARGS, denied=hs.booleans())
def test_fuzz_arguments_end_cleanly(monkeypatch, args, denied):
    fake = FakeKube(denied=[("patch", "nodes")] if denied else ())
    kind, result = call(monkeypatch, lambda: kube_access.main(api_factory=lambda p: fake), args)
    check_clean_end(kind, result)
