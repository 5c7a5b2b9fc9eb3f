# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: the readiness report of the GPU nodes as a document, for a JSON file."""

from __future__ import annotations

from ansible_collections.gpuops.sandbox.plugins.filter.readiness_table import _rows

DOCUMENTATION = r"""
---
name: readiness_document
short_description: The readiness of the GPU nodes as one document, for a JSON file or monitoring
version_added: 1.0.0
description:
  - Takes what P(gpuops.sandbox.readiness_table#filter) takes and returns a dict with C(nodes) (every GPU
    node's C(host_verify_report), or C(ready=false, checked=false) for a node without one), C(ready) (how
    many are ready), C(total) and C(all_ready), and C(managed_elsewhere), how many nodes' hosts another tool
    prepares (C(gpuops_host_managed=false); their report has C(managed=false) and C(ready=null), and they are
    not in C(total)).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The C(host_verify_report) facts.
    type: list
    elements: dict
    required: true
  hosts:
    description: Every GPU node's inventory name.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Write the readiness report
  ansible.builtin.copy:
    content: "{{ reports | gpuops.sandbox.readiness_document(groups['gpu_nodes']) | to_nice_json }}"
    dest: /var/tmp/gpuops-readiness.json
    mode: "0644"
"""

RETURN = r"""
_value:
  description: The document.
  type: dict
"""


def readiness_document(reports, hosts):
    """The report for a file: every node's report (or a placeholder), and the totals."""
    rows = _rows(reports, hosts)
    by_host = dict((r.get("host"), r) for r in reports)
    nodes = []
    for row in rows:
        report = dict(by_host.get(row[0]) or {"host": row[0], "ready": False, "checked": False})
        report.setdefault("checked", True)
        nodes.append(report)
    # A node whose host another tool prepares (managed false) is listed but neither counted nor checked here.
    counted = [n for n in nodes if n.get("managed") is not False]
    return {"ready": sum(1 for n in counted if n.get("ready") is True), "total": len(counted),
            "all_ready": all(n.get("ready") is True for n in counted), "managed_elsewhere": len(nodes) - len(counted),
            "nodes": nodes}


class FilterModule:
    """gpuops.sandbox.readiness_document"""

    def filters(self):
        return {"readiness_document": readiness_document}
