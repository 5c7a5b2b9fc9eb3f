# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: device_owner
short_description: Who binds a node's GPUs to vfio-pci, or creates its vGPU devices, the host or the GPU Operator
version_added: 1.0.0
description:
  - The one rule for C(gpuops_vfio_binding) and C(gpuops_vgpu_devices), read by the preflight, host_prepare and
    host_verify roles, so that the preparation and the readiness checks never disagree on who owns the devices.
  - The owner given wins when it is not empty. Otherwise it is C(operator) when the play deploys the cluster (a
    kubeconfig is given), since the GPU Operator's sandbox components then bind the GPUs and create the vGPU
    devices. Without a kubeconfig nobody else would, so the host does (C(host)).
  - The owner given is returned as it is, valid or not; checking it is the preflight role's job.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The owner set in the inventory (C(gpuops_vfio_binding) or C(gpuops_vgpu_devices)), or empty.
    type: str
    required: true
  kubeconfig:
    description: The play's kubeconfig (C(gpuops_kubeconfig)); empty when the play does not deploy the cluster.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Who binds this node's GPUs
  ansible.builtin.debug:
    msg: "{{ gpuops_vfio_binding | default('') | gpuops.sandbox.device_owner(gpuops_kubeconfig | default('')) }}"
"""

RETURN = r"""
_value:
  description: C(host), C(operator), or the owner given.
  type: str
"""

from ansible.errors import AnsibleFilterError


def device_owner(given, kubeconfig=""):
    for name, value in (("the device owner given", given), ("kubeconfig", kubeconfig)):
        if value is not None and not isinstance(value, str):
            raise AnsibleFilterError("device_owner: %s must be a string (host or operator for the owner, a path "
                                     "for the kubeconfig), got %r" % (name, value))
    if given:
        return given
    return "operator" if kubeconfig else "host"


class FilterModule:
    """Who owns a node's passthrough bindings and vGPU devices, by one rule."""

    def filters(self):
        return {"device_owner": device_owner}
