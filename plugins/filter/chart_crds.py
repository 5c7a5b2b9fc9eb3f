# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: chart_crds
short_description: The CRDs of a chart's crds/ directories, from the output of helm template --include-crds
version_added: 1.0.0
description:
  - Helm installs the files under a chart's C(crds/) directories (its own and those of the subcharts the values
    enable) on the first install only, and never upgrades them. Takes the text C(helm template --include-crds)
    prints and returns the CustomResourceDefinitions that came from such a directory (by each document's
    C(# Source:) line), in the order printed. CRDs a chart renders from its templates are release objects, which
    Helm upgrades itself, and are left out.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The output of C(helm template --include-crds).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Keep the CRDs the chart's upgrade needs
  ansible.builtin.set_fact:
    new_crds: "{{ render.stdout | gpuops.sandbox.chart_crds }}"
"""

RETURN = r"""
_value:
  description: The CRD documents, as mappings.
  type: list
  elements: dict
"""

import re

import yaml

from ansible.errors import AnsibleFilterError

_SOURCE = re.compile(r"^# Source: (\S+)\s*$", re.M)
_DOCUMENT = re.compile(r"^---[ \t]*$", re.M)
# A chart's CRDs run to thousands of lines: LibYAML's loader when PyYAML has it.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def chart_crds(text):
    if not isinstance(text, str):
        raise AnsibleFilterError("chart_crds takes the text helm template --include-crds prints, not %s"
                                 % type(text).__name__)
    found = []
    source = ""
    for part in _DOCUMENT.split(text):
        # A file of crds/ is printed after a document holding only its Source line, and may hold several
        # documents; a template's documents each carry their own Source line.
        named = _SOURCE.search(part)
        if named:
            source = named.group(1)
        if "crds" not in source.split("/")[:-1]:
            continue
        try:
            doc = yaml.load(part, Loader=_LOADER)  # nosec B506 - a safe loader
        except yaml.YAMLError as exc:
            raise AnsibleFilterError("chart_crds: %s is not valid YAML: %s" % (source, exc)) from exc
        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
            found.append(doc)
    return found


class FilterModule:
    """A chart's own CRDs, which Helm never upgrades."""

    def filters(self):
        return {"chart_crds": chart_crds}
