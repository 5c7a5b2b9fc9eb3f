# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: the plans of the GPU nodes as a plain-text table."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: plan_table
short_description: The plans of the GPU nodes as a plain-text table that fits a terminal
version_added: 1.1.0
description:
  - Takes the plans of P(gpuops.sandbox.host_plan#filter), one per GPU node in the order of O(hosts), and returns one
    string (or with O(lines) the list of its lines) with a header line and one row per node (HOST, TYPE, REBOOT),
    each followed by its plan, an item a line (wrapped to O(width)) - what the node's preparation would refuse
    (C(REFUSED) with the fix; REBOOT is then C(-), since the preparation stops before any change), what it would
    change, and why it would reboot; C(nothing to change) for a prepared node.
  - A node without a plan (null in the list, or the list too short) gets a row saying so; a plan with C(managed)
    false (a host another tool prepares, C(gpuops_host_managed=false)) reads C(host managed elsewhere).
  - The last line counts the nodes, those refused, those that would reboot, those with nothing to change and those
    managed elsewhere.
  - With O(cluster), a section C(CLUSTER) follows with the cluster half's plan - whether the cluster was read, each
    change (labels per node, Helm releases, KubeVirt entries and feature gates) an item a line, each refusal with its
    fix, C(nothing to change) when the cluster was read and matches.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The plans, one per host of O(hosts); null for a host without one.
    type: list
    elements: raw
    required: true
  hosts:
    description: The GPU nodes' inventory names.
    type: list
    elements: str
    required: true
  width:
    description: The widest a line may be (at least 60).
    type: int
    default: 100
  lines:
    description: Return the list of the lines instead of one string (M(ansible.builtin.debug) prints it one line an item).
    type: bool
    default: false
  cluster:
    description:
      - The cluster half's plan (P(gpuops.sandbox.cluster_plan#filter)), shown under the nodes' rows - a row a node
        with the labels it would get or the changes to them, a row a Helm release with what would happen to it, the
        KubeVirt entries, and what would refuse the cluster half.
      - Null leaves the section out.
    type: dict
"""

EXAMPLES = r"""
- name: Show the plans of the GPU nodes
  ansible.builtin.debug:
    msg: "{{ groups['gpu_nodes'] | map('extract', hostvars, 'plan') | list
             | gpuops.sandbox.plan_table(groups['gpu_nodes'], lines=true) }}"
"""

RETURN = r"""
_value:
  description: The table, lines separated by newlines; with O(lines), the list of its lines.
  type: raw
"""

import textwrap
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

ELSEWHERE = "host managed elsewhere: nothing planned for it here"
PLAN_COLUMNS = (("HOST", 40), ("TYPE", 14), ("REBOOT", 6))


def _plan_rows(plans, hosts):
    if not isinstance(plans, list):
        raise AnsibleFilterError("plan_table expects a list of host plans, got %r" % (plans,))
    if not isinstance(hosts, list):
        raise AnsibleFilterError("plan_table: hosts must be a list of inventory names, got %r" % (hosts,))
    rows = []
    for host, plan in zip(hosts, plans + [None] * (len(hosts) - len(plans))):
        if not isinstance(plan, Mapping):
            rows.append((host, "?", "?", ["no plan: unreachable, managed elsewhere or failed before its facts"]))
            continue
        if plan.get("managed") is False:
            rows.append((host, str(plan.get("workload_type", "?")), "-", [ELSEWHERE]))
            continue
        refusals = ["REFUSED %s: %s; fix: %s" % (r.get("check"), r.get("problem"), r.get("fix"))
                    for r in plan.get("refusals") or []]
        if refusals:
            # The preparation stops before any change: what it would otherwise do is in the JSON, not here.
            rows.append((host, str(plan.get("workload_type", "?")), "-", refusals))
            continue
        lines = [c.get("detail", "") for c in plan.get("changes") or []]
        reboot = plan.get("reboot") or {}
        if reboot.get("required"):
            lines.append("reboots: " + ", ".join(reboot.get("reasons") or []))
        rows.append((host, str(plan.get("workload_type", "?")), "yes" if reboot.get("required") else "no",
                     lines or ["nothing to change"]))
    return rows


def _wrapped(table, items, width):
    for item in items:
        parts = textwrap.wrap(item, width - 4, break_on_hyphens=False) or [""]
        table.extend(["  - " + parts[0]] + ["    " + more for more in parts[1:]])


def _cluster_lines(cluster, width):
    if not isinstance(cluster, Mapping):
        raise AnsibleFilterError("plan_table: cluster must be the cluster_plan filter's result, got %r" % (cluster,))
    read = bool(cluster.get("read"))
    head = "CLUSTER  " + ("read: what would change there" if read else
                          "not read (no gpuops_kubeconfig): what it would set")
    if cluster.get("partial"):
        head += "; --limit: these nodes only, no Helm release"
    items = ["REFUSED %s: %s; fix: %s" % (r.get("check"), r.get("problem"), r.get("fix"))
             for r in cluster.get("refusals") or []]
    items += [c.get("detail", "") for c in cluster.get("changes") or []]
    if not items:
        items = ["nothing to change"]
    table = textwrap.wrap(head, width)
    _wrapped(table, items, width)
    return table


def plan_table(plans, hosts, width=100, lines=False, cluster=None):
    try:
        as_lines = boolean(lines, strict=True)
        width = max(int(width), 60)
    except (TypeError, ValueError):
        raise AnsibleFilterError("plan_table: width must be a number and lines a boolean, got %r and %r"
                                 % (width, lines))
    rows = _plan_rows(plans, hosts)
    sizes = [min(max([len(name)] + [len(row[i]) for row in rows]), cap) for i, (name, cap) in enumerate(PLAN_COLUMNS)]
    table = ["  ".join(name.ljust(size) for (name, dummy), size in zip(PLAN_COLUMNS, sizes)).rstrip()]
    for row in rows:
        cells = [cell if len(cell) <= size else cell[:size - 1] + "~" for cell, size in zip(row[:3], sizes)]
        table.append("  ".join(cell.ljust(size) for cell, size in zip(cells, sizes)).rstrip())
        # Each item of the plan under its row, the width of the table: a path or a list of arguments stays readable.
        _wrapped(table, row[3], width)
    refused = sum(1 for row in rows if any(item.startswith("REFUSED") for item in row[3]))
    reboots = sum(1 for row in rows if row[2] == "yes")
    unchanged = sum(1 for row in rows if row[3] == ["nothing to change"])
    elsewhere = sum(1 for row in rows if row[3] == [ELSEWHERE])
    table.extend(textwrap.wrap("%d GPU node%s: %d refused, %d would reboot, %d with nothing to change"
                               % (len(rows), "" if len(rows) == 1 else "s", refused, reboots, unchanged)
                               + (", %d managed elsewhere" % elsewhere if elsewhere else ""), width))
    if cluster is not None:
        table.extend(_cluster_lines(cluster, width))
    return table if as_lines else "\n".join(table)


class FilterModule:
    """The plans of a fleet, as a table."""

    def filters(self):
        return {"plan_table": plan_table}
