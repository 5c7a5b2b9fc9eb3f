# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: crd_apply_plan
short_description: Which of a chart's CRDs to apply, and which to leave to the cluster or to another release
version_added: 1.1.0
description:
  - Helm installs a chart's C(crds/) on a first install only (and skips a CRD the cluster already has). Takes the
    chart's CRDs (P(gpuops.sandbox.chart_crds#filter)) and the same CRDs as the cluster holds them, whatever the order
    of the chart versions, and says which to apply - those the cluster lacks, and those it holds differently from
    the chart (a value of the chart's C(spec) not in the stored one; the API server's own defaults do not count) -
    and which to leave (up to date).
  - A CRD that differs and that the chart of another Helm release on the cluster carries too (O(others), from
    P(gpuops.sandbox.helm_release_crds#filter)) is that release's and is left to it, with the reason.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The chart's CRDs.
    type: list
    elements: dict
    required: true
  stored_crds:
    description: The same CRDs as the cluster holds them (those it has).
    type: list
    elements: dict
    required: true
  others:
    description: What P(gpuops.sandbox.helm_release_crds#filter) says of the other releases on the cluster.
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Work out which CRDs to apply
  ansible.builtin.set_fact:
    crd_plan: "{{ new_crds | gpuops.sandbox.crd_apply_plan(stored_crds, others=other_releases) }}"
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    apply:
      description: The CRDs to apply (documents of the chart).
      type: list
      elements: dict
    left:
      description: The CRDs left as the cluster holds them, each with C(name) and C(reason).
      type: list
      elements: dict
    differ:
      description: The names of the CRDs the cluster holds differently from the chart (applied or left).
      type: list
      elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._chart_upgrade import crd_apply_plan as _plan


def crd_apply_plan(new_crds, stored_crds, others=None):
    for name, value in (("the chart's CRDs", new_crds), ("stored_crds", stored_crds), ("others", others or [])):
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise AnsibleFilterError("crd_apply_plan: %s must be a list of mappings" % name)
    return _plan(new_crds, stored_crds, others)


class FilterModule:
    """A chart's CRDs against the cluster's."""

    def filters(self):
        return {"crd_apply_plan": crd_apply_plan}
