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
        {"inventory_hostname": "h3"},
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
        gpu_hosts([{"inventory_hostname": "a", "gpuops_node_name": "n"}, {"inventory_hostname": "b", "gpuops_node_name": "n"}])


def test_gpu_hosts_names_a_pci_ids_path_it_cannot_read(tmp_path):
    from ansible_collections.gpuops.sandbox.plugins.filter.gpu_hosts import gpu_hosts
    host = {"inventory_hostname": "h1", "gpuops_workload_type": "vm-passthrough"}
    for path, why in ((str(tmp_path / "pci.ids") + "\x00", "a file name cannot hold a NUL byte"),
                      (str(tmp_path / "missing"), "No such file or directory")):
        with pytest.raises(AnsibleFilterError, match="cannot read plugin_pci_ids .*" + why):
            gpu_hosts([host], plugin_pci_ids=path)
