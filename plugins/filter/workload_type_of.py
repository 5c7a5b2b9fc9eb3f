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
  - The one rule that works out a GPU node's workload type, for every role and playbook that needs it, the cluster
    half included.
  - The type given (the host's C(gpuops_workload_type)) wins when it is not empty. Otherwise the host's groups
    decide; C(container), C(vm_passthrough), C(vm_vgpu) and C(dra) stand for the types C(container),
    C(vm-passthrough), C(vm-vgpu) and C(dra). A host in no such group, or in groups of two different types, gets
    the empty string, which the preflight role and the cluster half refuse with a message naming the host.
  - The type given is returned as it is, valid or not; checking it is the preflight role's job.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description:
      - The host's group names (C(group_names)), or all of a host's variables (C(hostvars[host])), whose
        C(group_names) and C(gpuops_workload_type) are read.
    type: raw
    required: true
  given:
    description: The workload type set for the host, if any; it wins over the one in the host's variables.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: The workload type of each GPU node
  ansible.builtin.debug:
    msg: "{{ group_names | gpuops.sandbox.workload_type_of(gpuops_workload_type | default('')) }}"

- name: The workload type of every GPU node, from the controller
  ansible.builtin.debug:
    msg: "{{ groups['gpu_nodes'] | map('extract', hostvars) | map('gpuops.sandbox.workload_type_of') | list }}"
"""

RETURN = r"""
_value:
  description: The workload type, or the empty string when neither the type given nor the groups name one.
  type: str
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import PlanError, host_workload_type
from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import workload_type_of as _workload_type_of


def workload_type_of(value, given=""):
    try:
        if isinstance(value, Mapping):
            # A play hands a host's variables as a Mapping (ansible-core 2.19: HostVarsVars), which is not a dict.
            return host_workload_type(value, given)
        return _workload_type_of(value, given)
    except PlanError as exc:
        raise AnsibleFilterError(exc.msg)


class FilterModule:
    """A host's workload type, by one rule."""

    def filters(self):
        return {"workload_type_of": workload_type_of}
