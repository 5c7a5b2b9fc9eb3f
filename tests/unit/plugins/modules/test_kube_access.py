# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os

from ansible_collections.gpuops.sandbox.plugins.module_utils._kube import KubeApi, KubeError
from ansible_collections.gpuops.sandbox.plugins.modules import kube_access
from ansible_collections.gpuops.sandbox.tests.unit.plugins.fake_kube import FakeKube
from ansible_collections.gpuops.sandbox.tests.unit.plugins.modules.module_harness import call


def invoke(monkeypatch, fake, **args):
    return call(monkeypatch, lambda: kube_access.run_module(kube_access.build_module(), api_factory=lambda p: fake), args)


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
