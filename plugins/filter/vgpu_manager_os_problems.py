# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: vgpu_manager_os_problems
short_description: What keeps the vGPU Manager image from fitting the OS of the vm-vgpu nodes
version_added: 1.0.0
description:
  - The GPU Operator runs one vgpu-manager DaemonSet whose image tag is the driver version plus C(-<ID><VERSION_ID>)
    of one GPU node it lists (the major version only for C(rhel), C(rocky) and C(ol)). Takes the entries of
    P(gpuops.sandbox.gpu_hosts#filter) and the OS tags the vGPU Manager image was built for, and returns one message
    per problem. A vm-vgpu host whose OS has no image, and GPU hosts of several OSes (the tag then depends on which
    node the operator reads), are problems. Hosts whose facts were not gathered are not judged.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: Entries of P(gpuops.sandbox.gpu_hosts#filter).
    type: list
    elements: dict
    required: true
  built_os_tags:
    description: OS tags the vGPU Manager image was built for (C(vgpu_manager_image_os_tag)); empty judges nothing.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Fail when the vGPU Manager image does not fit the vm-vgpu nodes
  ansible.builtin.assert:
    that: __problems | length == 0
    fail_msg: "{{ __problems | join('; ') }}"
  vars:
    __problems: >-
      {{ groups['gpu_nodes'] | map('extract', hostvars) | gpuops.sandbox.gpu_hosts
         | gpuops.sandbox.vgpu_manager_os_problems(['ubuntu22.04']) }}
"""

RETURN = r"""
_value:
  description: One message per problem; empty when the image fits.
  type: list
  elements: str
"""

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import vgpu_manager_os_problems


class FilterModule:
    """The vGPU Manager image against the nodes' OS."""

    def filters(self):
        return {"vgpu_manager_os_problems": vgpu_manager_os_problems}
