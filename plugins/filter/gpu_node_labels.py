# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: gpu_node_labels
short_description: The GPU Operator labels of a node for its workload type
version_added: 1.0.0
description:
  - Returns the labels the collection manages on a GPU node, for M(gpuops.sandbox.node_labels).
    Labels that must not be there have a null value, so a node that changes workload type loses the
    labels of its old type.
  - C(nvidia.com/gpu.workload.config) is the workload type (C(container) for C(dra) nodes, where the
    GPU Operator still installs the driver and toolkit).
  - C(nvidia.com/vgpu.config) is the vGPU config name on C(vm-vgpu) nodes, absent elsewhere.
  - On C(dra) nodes the deploy labels of the operands a DRA node must not run (C(device-plugin),
    C(operator-validator), C(gpu-feature-discovery), C(dcgm), C(dcgm-exporter), as
    C(nvidia.com/gpu.deploy.<operand>)) are C(false), so the GPU Operator keeps those operands off the node.
    On other nodes deploy labels are not named. The GPU Operator's own C(true) values are never asked for or
    removed, and M(gpuops.sandbox.node_labels) releases the collection's earlier C(false) ones.
  - Fails naming the value for an unknown workload type, and for a vGPU config name that is not among
    O(vgpu_configs) when that is given.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: Workload type of the node.
    type: str
    required: true
    choices: [container, vm-passthrough, vm-vgpu, dra]
  vgpu_config_name:
    description: vGPU config name of a C(vm-vgpu) node; empty leaves the choice to the vGPU Device Manager's default.
    type: str
  vgpu_configs:
    description: Config names the vGPU Device Manager knows; null skips the check.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Labels of a vGPU node
  ansible.builtin.debug:
    msg: "{{ 'vm-vgpu' | gpuops.sandbox.gpu_node_labels('A10-4Q', ['A10-4Q', 'A10-8Q']) }}"
  # => {"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": "A10-4Q"}
"""

RETURN = r"""
_value:
  description: Label keys and values; null means the label must be removed.
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import PlanError, workload_labels


def gpu_node_labels(workload_type, vgpu_config_name=None, vgpu_configs=None):
    try:
        return workload_labels(workload_type, vgpu_config_name or None,
                               None if vgpu_configs is None else list(vgpu_configs))
    except PlanError as exc:
        raise AnsibleFilterError(exc.msg)


class FilterModule:
    """Filters for the cluster side."""

    def filters(self):
        return {"gpu_node_labels": gpu_node_labels}
