# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: chart_values_problems
short_description: Keys of the user's chart values that the chart does not have, and values it would replace
version_added: 1.1.0
description:
  - Checks the user's own values for a Helm chart against the chart's C(values.yaml) (the text
    C(helm show values) prints, or that text already loaded). A key the chart does not have at its place is named by
    its full path, with the nearest key the chart has there (a typo such as C(sandboxWorkloads.enable) for
    C(enabled) is otherwise stored in the release and read by no template).
  - Nothing is checked below a map that takes keys of the user's choosing - one whose default in C(values.yaml) is
    empty or null, one named C(nodeSelector), C(tolerations), C(labels), C(annotations), C(env), C(resources),
    C(args), C(affinity) and the like, one whose dotted path is in O(free_form), the values of a subchart (a
    top-level key naming one of the chart's dependencies) and C(global) - nor below a key whose default is not a map.
  - Also names a value the chart's templates would replace with their own default (Helm's C(default) takes 0,
    false and the empty string for not set), after P(gpuops.sandbox.chart_values_as_given#filter) rewrote what has
    another spelling the chart keeps.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The user's values.
    type: dict
    required: true
  chart_values:
    description: The chart's C(values.yaml), as text or as a mapping.
    type: raw
    required: true
  chart:
    description: The chart's C(Chart.yaml) as a mapping (C(helm show chart)); its C(name) and the names (or aliases)
      of its C(dependencies) are read.
    type: dict
    default: {}
  where:
    description: The name of the input the values came from, the start of every path in the messages.
    type: str
    default: values
  free_form:
    description: Dotted paths of maps (or values) below which any key is accepted.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Refuse a key the chart does not have
  ansible.builtin.assert:
    that: __problems | length == 0
    fail_msg: "{{ __problems | join('; ') }}; nothing was changed"
  vars:
    __problems: >-
      {{ gpu_operator_values | gpuops.sandbox.chart_values_problems(chart_values.stdout, chart=chart_yaml.stdout | from_yaml,
                                                                 where='gpu_operator_values') }}
"""

RETURN = r"""
_value:
  description: One sentence per unknown key or replaced value; empty when the chart takes every value as given.
  type: list
  elements: str
"""

import yaml

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._chart_values import as_given, defaulted_problems, unknown_keys

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def chart_values_problems(values, chart_values, chart=None, where="values", free_form=None):
    if not isinstance(values, dict):
        raise AnsibleFilterError("chart_values_problems: %s must be a mapping of chart values, not %s"
                                 % (where, type(values).__name__))
    if isinstance(chart_values, str):
        try:
            chart_values = yaml.load(chart_values, Loader=_LOADER) or {}  # nosec B506 - a safe loader
        except yaml.YAMLError as exc:
            raise AnsibleFilterError("chart_values_problems: the chart's values.yaml is not valid YAML: %s" % exc) from exc
    if not isinstance(chart_values, dict):
        raise AnsibleFilterError("chart_values_problems: the chart's values must be a mapping, not %s"
                                 % type(chart_values).__name__)
    chart = chart if isinstance(chart, dict) else {}
    if free_form is not None and (not isinstance(free_form, list) or not all(isinstance(p, str) for p in free_form)):
        raise AnsibleFilterError("chart_values_problems: free_form must be a list of dotted key paths (strings)")
    subcharts = [d.get("alias") or d.get("name") for d in chart.get("dependencies") or [] if isinstance(d, dict)]
    name = str(chart.get("name") or "")
    return (unknown_keys(values, chart_values, where=where, free_form=free_form or (), subcharts=subcharts)
            + defaulted_problems(as_given(values, name), name, where=where))


class FilterModule:
    """The user's chart values against the chart."""

    def filters(self):
        return {"chart_values_problems": chart_values_problems}
