# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: gpu_selectors
short_description: The vendors argument of gpu_facts and vfio_bind from the GPU vendor and device IDs
version_added: 1.1.0
description:
  - Returns the vendor IDs as they are when no device ID is given, and otherwise each vendor with each device ID,
    C(vendor:device), as M(gpuops.sandbox.gpu_facts) and M(gpuops.sandbox.vfio_bind) take them in O(_input)'s place.
  - One rule for every role and playbook (C(gpuops_gpu_vendor_ids) with C(gpuops_gpu_device_ids)).
  - A value that is not a list of strings raises an error naming it.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The vendor IDs (C(gpuops_gpu_vendor_ids)).
    type: list
    elements: str
    required: true
  device_ids:
    description: The device IDs (C(gpuops_gpu_device_ids)); empty selects every device of the vendors.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Gather the GPUs the inventory selects
  gpuops.sandbox.gpu_facts:
    vendors: "{{ gpuops_gpu_vendor_ids | gpuops.sandbox.gpu_selectors(gpuops_gpu_device_ids | default([])) }}"
"""

RETURN = r"""
_value:
  description: The selectors, for example C(["10de"]) or C(["10de:2236", "10de:2331"]).
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import PlanError
from ansible_collections.gpuops.sandbox.plugins.module_utils._host_plan import gpu_selectors as _gpu_selectors


def gpu_selectors(vendor_ids, device_ids=None):
    try:
        return _gpu_selectors(vendor_ids, device_ids)
    except PlanError as exc:
        raise AnsibleFilterError("gpu_selectors: %s" % exc.msg)


class FilterModule:
    """The GPU selectors, by one rule."""

    def filters(self):
        return {"gpu_selectors": gpu_selectors}
