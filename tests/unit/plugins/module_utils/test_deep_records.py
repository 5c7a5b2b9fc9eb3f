# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A record nested deeper than Python's JSON parser recurses raises RecursionError, not ValueError: every reader of
a record the collection left (on the host or on a cluster object) reads it as damaged, like any other bad JSON."""

from __future__ import annotations

import json

from ansible_collections.gpuops.sandbox.plugins.module_utils import _cluster, _host, _persist
from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call_main

DEEP = "[" * 100000 + "]" * 100000
DEEP_OBJECT = '{"a": ' * 100000 + "1" + "}" * 100000


def test_the_deep_texts_are_recursion_errors_not_value_errors():
    for text in (DEEP, DEEP_OBJECT):
        try:
            json.loads(text)
        except RecursionError:
            continue
        raise AssertionError("json.loads no longer recurses that deep; these tests test nothing")


def test_gpu_facts_reads_a_deep_prepared_record_as_no_record(monkeypatch, tmp_path):
    host = st.build_gpu_host(tmp_path)
    host.write(_host.PREPARED_RECORD, DEEP)
    kind, result = call_main(monkeypatch, gpu_facts, host.root, {})
    assert kind == "exit", result
    assert result["ansible_facts"]["gpu_facts_host"]["prepared"] is None
    host.write(_host.PREPARED_RECORD, DEEP_OBJECT)
    assert _host.read_prepared(host.root) is None


def test_a_deep_pending_record_still_means_pending(tmp_path):
    tree = st.SysfsTree(tmp_path)
    tree.write(_persist.pending_path(_persist.PENDING_INITRAMFS), DEEP)
    assert _persist.read_pending(tree.root, _persist.PENDING_INITRAMFS) == {}


def test_a_deep_annotation_on_a_node_counts_as_no_labels():
    node = {"metadata": {"name": "n1", "annotations": {_cluster.OWNED_LABELS_ANNOTATION: DEEP}}}
    assert _cluster.owned_labels(node) == {}


def test_a_deep_annotation_on_the_kubevirt_cr_counts_as_nothing_owned():
    cr = {"metadata": {"name": "kubevirt", "annotations": {_cluster.OWNED_ANNOTATION: DEEP}},
          "spec": {"configuration": {}}, "status": {"observedKubeVirtVersion": "v1.6.0"}}
    plan = _cluster.plan_kubevirt(cr, [])
    assert plan["removed"] == [] and plan["added"] == []


def test_a_deep_qmp_line_is_an_error_of_its_own_not_a_traceback():
    import pytest
    from ansible_collections.gpuops.sandbox.plugins.module_utils import _guest_probe
    with pytest.raises(_guest_probe.GuestError) as info:
        _guest_probe.qmp_replies(DEEP + "\n{\"return\": {}}\n")
    assert "not JSON" in info.value.args[0] or "not JSON" in str(info.value)
