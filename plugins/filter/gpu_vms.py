# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: the KubeVirt VMs on a node that hold GPUs, which a drain cannot move."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
---
name: gpu_vms
short_description: The running KubeVirt VMs on a node that hold GPUs (they cannot live-migrate)
version_added: 1.0.0
description:
  - Takes VirtualMachineInstance objects (from M(kubernetes.core.k8s_info)) and a node name, and returns one entry
    per VMI that runs on that node (C(status.nodeName)), is not finished (phase not C(Succeeded) or C(Failed)),
    and holds a GPU, a host device or a DRA resource claim (C(spec.domain.devices.gpus),
    C(spec.domain.devices.hostDevices), C(spec.resourceClaims)). Such a VM cannot live-migrate, and a drain waits for
    it until it times out.
  - Each entry has C(namespace), C(name), C(devices) (the device names, or the claim names) and C(owner) (the
    VirtualMachine that would start it again, when there is one).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: VirtualMachineInstance objects.
    type: list
    elements: dict
    required: true
  node:
    description: The node's name.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Refuse to drain a node whose VMs hold GPUs
  ansible.builtin.assert:
    that: vmis.resources | gpuops.sandbox.gpu_vms(node) | length == 0
"""

RETURN = r"""
_value:
  description: The VMs, sorted by namespace and name.
  type: list
  elements: dict
"""


def _devices(spec):
    devices = ((spec.get("domain") or {}).get("devices") or {})
    found = []
    for key in ("gpus", "hostDevices"):
        for device in devices.get(key) or []:
            if isinstance(device, dict):
                found.append(str(device.get("deviceName") or device.get("name") or key))
    for claim in spec.get("resourceClaims") or []:
        if isinstance(claim, dict):
            name = claim.get("resourceClaimTemplateName") or claim.get("resourceClaimName") or claim.get("name")
            found.append("claim %s" % (name or "?"))
    return found


def gpu_vms(vmis, node):
    if not isinstance(vmis, list):
        raise AnsibleFilterError("gpu_vms expects a list of VirtualMachineInstance objects, got %s" % type(vmis).__name__)
    found = []
    for vmi in vmis:
        if not isinstance(vmi, dict):
            raise AnsibleFilterError("gpu_vms: not a VirtualMachineInstance: %r" % (vmi,))
        status = vmi.get("status") or {}
        if status.get("nodeName") != node or status.get("phase") in ("Succeeded", "Failed"):
            continue
        devices = _devices(vmi.get("spec") or {})
        if not devices:
            continue
        meta = vmi.get("metadata") or {}
        owners = [o.get("name") for o in meta.get("ownerReferences") or [] if o.get("kind") == "VirtualMachine"]
        found.append({"namespace": meta.get("namespace", ""), "name": meta.get("name", ""), "devices": devices,
                      "owner": owners[0] if owners else None})
    return sorted(found, key=lambda v: (v["namespace"], v["name"]))


class FilterModule:
    """gpuops.sandbox.gpu_vms"""

    def filters(self):
        return {"gpu_vms": gpu_vms}
