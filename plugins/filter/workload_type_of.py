# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: workload_type_of
short_description: The workload type of a host, given or from its inventory groups
version_added: 1.0.0
description:
  - The one rule that works out a GPU node's workload type, for the roles and playbooks that need it.
  - The type given (the host's C(gpuops_workload_type)) wins when it is not empty. Otherwise the host's groups
    decide; C(container), C(vm_passthrough), C(vm_vgpu) and C(dra) stand for the types C(container),
    C(vm-passthrough), C(vm-vgpu) and C(dra). A host in no such group, or in groups of two different types, gets
    the empty string, which the preflight role refuses with a message naming the host.
  - The type given is returned as it is, valid or not; checking it is the preflight role's job.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The host's group names (C(group_names)).
    type: list
    elements: str
    required: true
  given:
    description: The workload type set for the host, if any.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: The workload type of each GPU node
  ansible.builtin.debug:
    msg: "{{ group_names | gpuops.sandbox.workload_type_of(gpuops_workload_type | default('')) }}"
"""

RETURN = r"""
_value:
  description: The workload type, or the empty string when neither the type given nor the groups name one.
  type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import WORKLOAD_TYPE_GROUPS


def workload_type_of(group_names, given=""):
    if given is not None and not isinstance(given, str):
        raise AnsibleFilterError("the workload type given must be a string, got %r" % (given,))
    if given:
        return given
    if isinstance(group_names, str) or not isinstance(group_names, (list, tuple)):
        raise AnsibleFilterError("workload_type_of takes the host's group names (a list), got %r" % (group_names,))
    found = []
    for name in group_names:
        kind = WORKLOAD_TYPE_GROUPS.get(name)
        if kind and kind not in found:
            found.append(kind)
    return found[0] if len(found) == 1 else ""


class FilterModule:
    """A host's workload type, by one rule."""

    def filters(self):
        return {"workload_type_of": workload_type_of}
