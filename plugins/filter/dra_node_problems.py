# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: dra_node_problems
short_description: What each DRA node still lacks from the DRA driver
version_added: 1.0.0
description:
  - Takes the entries of P(gpuops.sandbox.gpu_hosts#filter) and returns, for every C(dra) host's node, the list
    of what it lacks; an empty list means the node is ready.
  - A DRA node is ready when the wanted DeviceClasses exist and the DRA driver has published a ResourceSlice for
    the node (C(spec.nodeName)) holding a device whose C(type) attribute is one of O(device_types).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: Entries of P(gpuops.sandbox.gpu_hosts#filter).
    type: list
    elements: dict
    required: true
  slices:
    description: The cluster's ResourceSlices (C(resource.k8s.io/v1)).
    type: list
    elements: dict
    required: true
  device_classes:
    description: The cluster's DeviceClasses.
    type: list
    elements: dict
    required: true
  driver:
    description: The DRA driver's name (C(spec.driver) of its slices).
    type: str
    default: gpu.nvidia.com
  device_types:
    description: Device types of which one must be offered (C(vfio) for passthrough to VMs, C(gpu) for containers).
    type: list
    elements: str
    default: [vfio, gpu]
  wanted_classes:
    description: DeviceClasses that must exist.
    type: list
    elements: str
    default: [vfio.gpu.nvidia.com]
"""

EXAMPLES = r"""
- name: Fail when a DRA node has no GPU published yet
  ansible.builtin.assert:
    that: __problems.values() | flatten | length == 0
  vars:
    __problems: >-
      {{ groups['gpu_nodes'] | map('extract', hostvars) | gpuops.sandbox.gpu_hosts
         | gpuops.sandbox.dra_node_problems(slices.resources, classes.resources) }}
"""

RETURN = r"""
_value:
  description: Node name to the list of what it lacks (empty when ready); only DRA nodes are listed.
  type: dict
"""

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import DRA_DRIVER, dra_node_problems


def dra_node_problems_filter(entries, slices, device_classes, driver=DRA_DRIVER, device_types=("vfio", "gpu"),
                             wanted_classes=("vfio.gpu.nvidia.com",)):
    return dra_node_problems(entries, slices, device_classes, driver, tuple(device_types), tuple(wanted_classes))


class FilterModule:
    """DRA nodes against what the DRA driver published."""

    def filters(self):
        return {"dra_node_problems": dra_node_problems_filter}
