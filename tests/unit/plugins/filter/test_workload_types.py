# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The workload types in one place: the kinds, and that no role or playbook keeps a list of its own."""

from __future__ import annotations

import os
import re

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.workload_type_of import FilterModule as WorkloadTypeOf
from ansible_collections.gpuops.sandbox.plugins.filter.workload_types import FilterModule
from ansible_collections.gpuops.sandbox.tests.unit.fakes.host_vars import HostVars

workload_types = FilterModule().filters()["workload_types"]
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))))


def test_kinds():
    assert workload_types("all") == ["container", "vm-passthrough", "vm-vgpu", "dra"]
    assert workload_types("iommu") == ["vm-passthrough", "vm-vgpu", "dra"]
    assert workload_types("host_devices") == ["vm-passthrough", "vm-vgpu"]
    assert set(workload_types("iommu")) <= set(workload_types("all"))


def test_an_unknown_kind_names_the_kinds():
    with pytest.raises(AnsibleFilterError, match="workload type kind 'vm' is not one of all, host_devices, iommu"):
        workload_types("vm")


def test_no_role_or_playbook_keeps_a_copy_of_a_kind():
    """A literal list in a role, template or playbook holding exactly the types of a kind is a second copy of it."""
    kinds = [set(workload_types(k)) for k in ("all", "iommu", "host_devices")]
    literal = re.compile(r"[\[(]((?:\s*'[a-z-]+'\s*,)+\s*'[a-z-]+'\s*)[\])]")
    found = []
    for folder in ("roles", "playbooks"):
        for root, _dirs, files in os.walk(os.path.join(TOP, folder)):
            for name in files:
                if not name.endswith((".yml", ".yaml", ".j2")) or name == "argument_specs.yml":
                    continue
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as handle:
                    for number, line in enumerate(handle, 1):
                        for match in literal.finditer(line):
                            if set(re.findall(r"'([a-z-]+)'", match.group(1))) in kinds:
                                found.append("%s:%d" % (os.path.relpath(path, TOP), number))
    assert found == []


def test_the_checker_sees_a_copy(tmp_path):
    line = "  when: host_type in ['vm-passthrough', 'vm-vgpu', 'dra']"
    literal = re.compile(r"[\[(]((?:\s*'[a-z-]+'\s*,)+\s*'[a-z-]+'\s*)[\])]")
    groups = [set(re.findall(r"'([a-z-]+)'", m.group(1))) for m in literal.finditer(line)]
    assert groups == [set(workload_types("iommu"))]


# --- workload_type_of: the one rule for a host's type ---------------------------------------------------------

workload_type_of = WorkloadTypeOf().filters()["workload_type_of"]


@pytest.mark.parametrize("groups, given, expected", [
    (["gpu_nodes", "vm_vgpu"], "", "vm-vgpu"),
    (["all_gpu", "vm_passthrough", "gpu_nodes"], "", "vm-passthrough"),
    (["gpu_nodes", "dra"], "container", "container"),      # the type set for the host wins
    (["gpu_nodes", "container", "dra"], "", ""),           # two types from groups: none, preflight names the host
    (["gpu_nodes", "container", "container"], "", "container"),
    (["gpu_nodes"], "", ""),
    ([], None, ""),
    (["vm_vgpu"], "vm-typo", "vm-typo"),                   # returned as given; preflight refuses it
])
def test_the_type_of_a_host(groups, given, expected):
    assert workload_type_of(groups, given) == expected


@pytest.mark.parametrize("groups, given, message", [
    ("vm_vgpu", "", "takes the host's group names \\(a list\\), got 'vm_vgpu'"),
    (["vm_vgpu"], ["dra"], "the workload type given must be a string, got \\['dra'\\]"),
])
def test_bad_input_is_named(groups, given, message):
    with pytest.raises(AnsibleFilterError, match=message):
        workload_type_of(groups, given)


def test_no_role_or_playbook_keeps_its_own_group_map():
    """The group -> type map lives in _cluster.WORKLOAD_TYPE_GROUPS; a YAML mapping of it is a second copy."""
    copy = re.compile(r"vm_passthrough:\s*['\"]?vm-passthrough")
    found = []
    for folder in ("roles", "playbooks"):
        for root, _dirs, files in os.walk(os.path.join(TOP, folder)):
            for name in files:
                if name.endswith((".yml", ".yaml", ".j2")):
                    path = os.path.join(root, name)
                    with open(path, encoding="utf-8") as handle:
                        if copy.search(handle.read()):
                            found.append(os.path.relpath(path, TOP))
    assert found == []


@pytest.mark.parametrize("host_vars, given, expected", [
    (dict(group_names=["gpu_nodes", "vm_passthrough"]), "", "vm-passthrough"),       # typed by its group only
    (dict(group_names=["gpu_nodes", "vm_passthrough"], gpuops_workload_type="dra"), "", "dra"),
    (dict(group_names=["gpu_nodes", "vm_passthrough"], gpuops_workload_type="dra"), "vm-vgpu", "vm-vgpu"),
    (dict(group_names=["gpu_nodes"]), "", ""),
    (dict(), "", ""),
])
def test_the_type_from_a_hosts_variables(host_vars, given, expected):
    """The cluster half hands hostvars[host] (map('extract', hostvars) | map('gpuops.sandbox.workload_type_of'))."""
    assert workload_type_of(HostVars(host_vars), given) == expected


OWN_DEFAULT = re.compile(r"gpuops_workload_type'?\s*(\|\s*default\(\s*'[a-z-]+'|,\s*default='[a-z-]+')"
                         r"|get\(\"gpuops_workload_type\"\)\s*or\s*\"[a-z]")


def test_no_play_keeps_a_default_type_of_its_own():
    """Every play types a host by workload_type_of; reading gpuops_workload_type with a default of its own (the cluster
    half's `container` once) types a node by its group differently from preflight."""
    found = []
    for folder in ("roles", "playbooks", "plugins"):
        for root, _dirs, files in os.walk(os.path.join(TOP, folder)):
            for name in files:
                if name.endswith((".yml", ".yaml", ".j2", ".py")):
                    path = os.path.join(root, name)
                    with open(path, encoding="utf-8") as handle:
                        for number, line in enumerate(handle, 1):
                            if OWN_DEFAULT.search(line):
                                found.append("%s:%d" % (os.path.relpath(path, TOP), number))
    assert found == []


def test_the_checker_sees_an_own_default():
    own = OWN_DEFAULT.search
    assert own("map(attribute='gpuops_workload_type', default='container')")
    assert own("{{ gpuops_workload_type | default('container') }}")
    assert own('wtype = hv.get("gpuops_workload_type") or "container"')
    assert not own("gpuops_workload_type | default('')")
    assert not own('host_vars.get("gpuops_workload_type") or ""')
