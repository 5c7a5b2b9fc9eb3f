# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: chart_values_as_given
short_description: Chart values written so that the chart's templates keep them
version_added: 1.1.0
description:
  - Some templates of a chart pass a value through Helm's C(default), which takes 0, false and the empty string for
    not set and renders its own default instead. Where the chart keeps another spelling of the same value, the value
    is rewritten to it; other values are returned as they are.
  - For the GPU Operator chart (C(gpu-operator)) C(driver.upgradePolicy.maxUnavailable) 0 (the chart would render
    C(25%)) becomes C(0%).
  - Values such a template replaces and that have no other spelling are named by
    P(gpuops.sandbox.chart_values_problems#filter).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The chart values.
    type: dict
    required: true
  chart:
    description: The chart's name (C(name) of its C(Chart.yaml)).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: The release's values, maxUnavailable 0 kept as 0%
  ansible.builtin.set_fact:
    release_values: "{{ values | gpuops.sandbox.chart_values_as_given('gpu-operator') }}"
"""

RETURN = r"""
_value:
  description: The values, a new mapping.
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._chart_values import as_given


def chart_values_as_given(values, chart):
    if not isinstance(values, dict):
        raise AnsibleFilterError("chart_values_as_given takes chart values as a mapping, not %s" % type(values).__name__)
    return as_given(values, str(chart))


class FilterModule:
    """Chart values the chart's templates keep."""

    def filters(self):
        return {"chart_values_as_given": chart_values_as_given}
