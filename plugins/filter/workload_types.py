# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: workload_types
short_description: The workload types of GPU nodes, or those of one kind
version_added: 1.0.0
description:
  - The one list of workload types the roles and playbooks test against, so that a type is added or regrouped in
    one place.
  - V(all) gives every type (C(container), C(vm-passthrough), C(vm-vgpu), C(dra)). V(iommu) gives the types whose
    hosts need the IOMMU (its firmware table, viable groups, C(intel_iommu=on) on Intel and C(iommu=pt)) and
    GPUs to give away; the VM types and C(dra), whose driver binds a GPU to vfio-pci when a VM's claim is prepared.
    V(host_devices) gives the types whose GPUs reach VMs through the sandbox device plugin and KubeVirt's
    C(permittedHostDevices).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: Which types.
    type: str
    required: true
    choices: [all, iommu, host_devices]
"""

EXAMPLES = r"""
- name: Only on hosts that need the IOMMU
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }} needs the IOMMU"
  when: gpuops_workload_type in ('iommu' | gpuops.sandbox.workload_types)
"""

RETURN = r"""
_value:
  description: The workload types of that kind.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import WORKLOAD_TYPE_KINDS


def workload_types(kind):
    if kind not in WORKLOAD_TYPE_KINDS:
        raise AnsibleFilterError("workload type kind %r is not one of %s" % (kind, ", ".join(sorted(WORKLOAD_TYPE_KINDS))))
    return list(WORKLOAD_TYPE_KINDS[kind])


class FilterModule:
    """The workload types, in one place."""

    def filters(self):
        return {"workload_types": workload_types}
