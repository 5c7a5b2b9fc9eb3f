# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: inventory_gpu_facts
short_description: The GPU facts an inventory gives for a host, checked against the shape gpu_facts returns
version_added: 1.1.0
description:
  - For a node whose host another tool prepares (C(gpuops_host_managed=false)), the inventory gives the facts
    M(gpuops.sandbox.gpu_facts) would have gathered - C(gpu_facts_gpus), and C(gpu_facts_host) and
    C(gpu_facts_mdev_parents) when the cluster side needs them. This filter checks them where they enter the play,
    before anything reads them.
  - Each value must have the type gpu_facts gives it. Every GPU needs C(address) (C(0000:65:00.0)), C(vendor) and
    C(device) (4 hex digits); a vendor or device ID written as a number of four digits (a C(device) of C(2236)
    unquoted, which YAML reads as a number) is taken as the ID those digits spell, and a driver or OS version
    written as a whole number (C(12)) as that text. Any other number where gpu_facts gives text is refused, since
    what was written is lost (YAML reads C(0233) as octal, C(0x2335) as hexadecimal, C(535.10) as 535.1); quote it.
  - Keys gpu_facts does not return are kept as they are.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The host's variables (C(hostvars[inventory_hostname])).
    type: dict
    required: true
  host:
    description: The host's inventory name, for the messages.
    type: str
    required: true
  require_gpus:
    description: Whether a missing C(gpu_facts_gpus) is a problem.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Check the GPU facts the inventory gives
  ansible.builtin.assert:
    that: __facts.problems | length == 0
    fail_msg: "{{ __facts.problems | join('; ') }}"
  vars:
    __facts: "{{ hostvars[inventory_hostname] | gpuops.sandbox.inventory_gpu_facts(inventory_hostname) }}"
"""

RETURN = r"""
_value:
  description: What the check found.
  type: dict
  contains:
    problems:
      description: One sentence per bad value, naming the host, the key, the value and what is accepted; empty
        when the facts have gpu_facts' shape.
      type: list
      elements: str
    facts:
      description: The facts the host variables have (of C(gpu_facts_gpus), C(gpu_facts_host),
        C(gpu_facts_mdev_parents)) in gpu_facts' shape (IDs given as numbers made text).
      type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpuops.sandbox.plugins.module_utils._inventory_facts import check_facts


def inventory_gpu_facts(hostvars, host, require_gpus=True):
    try:
        require = boolean(require_gpus, strict=True)
    except TypeError:
        raise AnsibleFilterError("inventory_gpu_facts: require_gpus must be a boolean, got %r" % (require_gpus,))
    facts, problems = check_facts(host, hostvars, require_gpus=require)
    return {"facts": facts, "problems": problems}


class FilterModule:
    """gpuops.sandbox.inventory_gpu_facts"""

    def filters(self):
        return {"inventory_gpu_facts": inventory_gpu_facts}
