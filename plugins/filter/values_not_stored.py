# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: values_not_stored
short_description: The values of rendered objects that the API server did not keep
version_added: 1.0.0
description:
  - Compares the objects a chart rendered (what Helm sent) with the same objects read back from the cluster, and
    names every value the stored object lacks or holds differently. The API server prunes a field its stored
    CRD's schema does not know without an error, so a chart upgraded over an old CRD can lose values silently.
  - Objects are matched by kind, namespace and name (a rendered object without a namespace matches by kind and
    name). C(apiVersion), C(kind), C(metadata) and C(status) are not compared; a null value is never stored and is
    not compared either. Lists of the same length are compared element by element, others as a whole.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The rendered objects.
    type: list
    elements: dict
    required: true
  stored:
    description: The objects read back (the C(resources) of M(kubernetes.core.k8s_info)).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Check the ClusterPolicy kept every value
  ansible.builtin.assert:
    that: __lost | length == 0
    fail_msg: "{{ __lost | join('; ') }}"
  vars:
    __lost: "{{ [rendered_policy] | gpuops.sandbox.values_not_stored(stored.resources) }}"
"""

RETURN = r"""
_value:
  description: One sentence per object that lost or changed a value (naming each path), or that is missing.
  type: list
  elements: str
"""

from ansible_collections.gpuops.sandbox.plugins.module_utils._chart_upgrade import values_not_stored as _compare
from ansible_collections.gpuops.sandbox.plugins.plugin_utils._filter_input import require_lists_of_mappings


def values_not_stored(rendered, stored):
    require_lists_of_mappings("values_not_stored", "objects (mappings)", ("the rendered objects", rendered),
                              ("stored", stored))
    return _compare(rendered, stored)


class FilterModule:
    """Rendered objects against what the API server stored."""

    def filters(self):
        return {"values_not_stored": values_not_stored}
