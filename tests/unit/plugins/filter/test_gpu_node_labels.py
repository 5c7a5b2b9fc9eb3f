# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.gpu_node_labels import FilterModule

f = FilterModule().filters()["gpu_node_labels"]


def test_vgpu_then_passthrough_drops_the_vgpu_label():
    assert f("vm-vgpu", "A10-4Q", ["A10-4Q"])["nvidia.com/vgpu.config"] == "A10-4Q"
    labels = f("vm-passthrough", "A10-4Q")
    assert labels["nvidia.com/gpu.workload.config"] == "vm-passthrough"
    assert labels["nvidia.com/vgpu.config"] is None


def test_errors_name_the_value():
    with pytest.raises(AnsibleFilterError, match="'vm-gpu' is not one of"):
        f("vm-gpu")
    with pytest.raises(AnsibleFilterError, match=r"'A10-9Q' is not in the vGPU Device Manager's configuration \(it has: A10-4Q\)"):
        f("vm-vgpu", "A10-9Q", ["A10-4Q"])


def test_gpu_hosts():
    from ansible_collections.gpuops.sandbox.plugins.filter.gpu_hosts import gpu_hosts
    config = {"version": "v1", "vgpu-configs": {"A10-4Q": [{"devices": "all", "vgpu-devices": {"A10-4Q": 6}}]}}
    hosts = gpu_hosts([
        {"inventory_hostname": "h1", "gpuops_workload_type": "vm-vgpu", "gpuops_vgpu_config_name": "A10-4Q"},
        {"inventory_hostname": "h2", "gpuops_node_name": "node-2", "gpuops_workload_type": "vm-passthrough",
         "gpuops_vgpu_config_name": "A10-4Q", "gpuops_node_taints": []},
        {"inventory_hostname": "h3", "group_names": ["gpu_nodes", "container"]},  # typed by its group only
    ], config)
    assert [h["name"] for h in hosts] == ["h1", "node-2", "h3"]
    assert hosts[0]["vgpu_type_names"] == ["A10-4Q"] and hosts[0]["labels"]["nvidia.com/vgpu.config"] == "A10-4Q"
    assert hosts[1]["vgpu_config_name"] is None and hosts[1]["taints"] == [] and hosts[2]["taints"] is None
    assert hosts[2]["labels"]["nvidia.com/gpu.workload.config"] == "container"
    # Only a container node hands the collection's earlier deploy labels over (as the operator's true).
    assert hosts[0]["release_to"] == {} and hosts[1]["release_to"] == {}
    assert hosts[2]["release_to"]["nvidia.com/gpu.deploy.device-plugin"] == "true"
    with pytest.raises(AnsibleFilterError, match="host h1: vGPU config 'A10-8Q' is not in"):
        gpu_hosts([{"inventory_hostname": "h1", "gpuops_workload_type": "vm-vgpu", "gpuops_vgpu_config_name": "A10-8Q"}], config)
    with pytest.raises(AnsibleFilterError, match="same node name n"):
        gpu_hosts([{"inventory_hostname": "a", "gpuops_node_name": "n", "gpuops_workload_type": "container"},
                   {"inventory_hostname": "b", "gpuops_node_name": "n", "gpuops_workload_type": "container"}])


@pytest.mark.parametrize("groups, why", [
    (["gpu_nodes"], "gpuops_workload_type is not set and none of its groups stands for a type"),
    (["gpu_nodes", "container", "vm_vgpu"], "it is in the groups container, vm_vgpu, which stand for different types"),
])
def test_gpu_hosts_refuses_a_host_without_a_type(groups, why):
    """The cluster half takes a host's type by the rule preflight uses: no default of its own."""
    from ansible_collections.gpuops.sandbox.plugins.filter.gpu_hosts import gpu_hosts
    with pytest.raises(AnsibleFilterError) as caught:
        gpu_hosts([{"inventory_hostname": "h9", "group_names": groups}])
    assert str(caught.value).startswith("host h9 has no workload type: %s; set gpuops_workload_type (one of container, "
                                        "vm-passthrough, vm-vgpu, dra)" % why)


@pytest.mark.parametrize("groups, given, expected", [
    (["gpu_nodes", "vm_passthrough"], None, "vm-passthrough"),
    (["gpu_nodes", "vm_vgpu"], "vm-passthrough", "vm-passthrough"),  # the type set for the host wins
])
def test_gpu_hosts_types_a_host_by_the_one_rule(groups, given, expected):
    from ansible_collections.gpuops.sandbox.plugins.filter.gpu_hosts import gpu_hosts
    host = {"inventory_hostname": "h1", "group_names": groups, "gpu_facts_gpus": [], "gpu_facts_mdev_parents": []}
    if given:
        host["gpuops_workload_type"] = given
    [entry] = gpu_hosts([host])
    assert entry["workload_type"] == expected
    assert entry["labels"]["nvidia.com/gpu.workload.config"] == expected


def test_gpu_hosts_names_a_pci_ids_path_it_cannot_read(tmp_path):
    from ansible_collections.gpuops.sandbox.plugins.filter.gpu_hosts import gpu_hosts
    host = {"inventory_hostname": "h1", "gpuops_workload_type": "vm-passthrough"}
    for path, why in ((str(tmp_path / "pci.ids") + "\x00", "a file name cannot hold a NUL byte"),
                      (str(tmp_path / "missing"), "No such file or directory")):
        with pytest.raises(AnsibleFilterError, match="cannot read plugin_pci_ids .*" + why):
            gpu_hosts([host], plugin_pci_ids=path)
