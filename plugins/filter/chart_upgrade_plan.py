# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: chart_upgrade_plan
short_description: What moving a Helm release to a chart version means, and what stops it
version_added: 1.0.0
description:
  - Takes the history of a Helm release (the list C(helm history --output json) prints; empty when there is no such
    release) and the C(Chart.yaml) of the chart about to be installed, and says whether this is an install, the same
    version, an upgrade or a downgrade (semantic version order; a leading C(v) is allowed).
  - A release whose latest revision is C(pending-install), C(pending-upgrade) or C(pending-rollback) was left so by
    a run that was stopped, and Helm refuses every further change to it. With O(pending_action=rollback) the plan
    says to roll it back to its last deployed revision; otherwise (or without a deployed revision) it is a problem
    naming the fix.
  - A downgrade, or versions that cannot be ordered, is a problem unless O(allow_downgrade) is true.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The release's revisions as C(helm history --output json) gives them.
    type: list
    elements: dict
    required: true
  chart:
    description: The new chart's C(Chart.yaml) (C(helm show chart)), as a mapping; its C(name) and C(version) are read.
    type: dict
    required: true
  release:
    description: The release's name.
    type: str
    required: true
  namespace:
    description: The release's namespace.
    type: str
    required: true
  allow_downgrade:
    description: A lower chart version than the installed one is installed without a problem.
    type: bool
    default: false
  pending_action:
    description: What to do with a release a stopped run left pending, V(fail) or V(rollback).
    type: str
    default: fail
  variables:
    description: The names of the inputs the messages point at, under the keys C(allow_downgrade) and
      C(pending_release).
    type: dict
  helm:
    description: The helm command the messages show.
    type: str
    default: helm
"""

EXAMPLES = r"""
- name: Work out the upgrade
  ansible.builtin.set_fact:
    upgrade: >-
      {{ (history.stdout | from_json if history.rc == 0 else [])
         | gpuops.sandbox.chart_upgrade_plan(chart_yaml.stdout | from_yaml, release='gpu-operator',
                                             namespace='gpu-operator', pending_action='rollback') }}
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    change:
      description: V(install) (no release), V(same), V(upgrade), V(downgrade) or V(unknown) (versions that cannot be
        ordered).
      type: str
    installed_version:
      description: The chart version of the last deployed revision (of the latest one when none was deployed).
      type: str
    target_version:
      description: The new chart's version.
      type: str
    chart:
      description: The new chart's name.
      type: str
    status:
      description: The latest revision's status.
      type: str
    revision:
      description: The latest revision's number (0 without a release).
      type: int
    pending:
      description: Whether the latest revision is pending (install, upgrade or rollback).
      type: bool
    rollback_revision:
      description: The last deployed revision (0 when none).
      type: int
    rollback:
      description: Whether the release is to be rolled back to RV(_value.rollback_revision) first.
      type: bool
    problems:
      description: Why the run must stop before any change, one sentence each; empty when it may go on.
      type: list
      elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._chart_upgrade import PENDING_ACTIONS, upgrade_plan


def chart_upgrade_plan(history, chart, release, namespace, allow_downgrade=False, pending_action="fail",
                       variables=None, helm="helm"):
    if history is not None and not isinstance(history, list):
        raise AnsibleFilterError("chart_upgrade_plan takes the list helm history --output json prints, not %s"
                                 % type(history).__name__)
    if not isinstance(chart, dict):
        raise AnsibleFilterError("chart_upgrade_plan: chart must be the chart's Chart.yaml as a mapping, not %s"
                                 % type(chart).__name__)
    if pending_action not in PENDING_ACTIONS:
        raise AnsibleFilterError("chart_upgrade_plan: pending_action %r is not one of %s"
                                 % (pending_action, ", ".join(PENDING_ACTIONS)))
    return upgrade_plan(history, chart, release, namespace, allow_downgrade=bool(allow_downgrade),
                        pending_action=pending_action, variables=variables, helm=helm)


class FilterModule:
    """A Helm release's upgrade, worked out before anything changes."""

    def filters(self):
        return {"chart_upgrade_plan": chart_upgrade_plan}
