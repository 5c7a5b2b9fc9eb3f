# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: crd_upgrade_problems
short_description: What applying a chart's newer CRDs would lose of the objects the cluster stores
version_added: 1.0.0
description:
  - Before a chart's CRDs are applied over the ones the cluster holds, checks each stored custom resource against
    the new CRD's C(openAPIV3Schema) for the object's version. A field of a stored object that the new schema does
    not know (not among the C(properties), no C(additionalProperties), no C(x-kubernetes-preserve-unknown-fields))
    would be pruned by the API server, so it is named, as a dotted path (C(spec.a.b), C(spec.list[].c)) at its
    first unknown level.
  - Also names a version the cluster still stores objects in (the stored CRD's C(status.storedVersions)) that the
    new CRD no longer lists (the API server refuses that update).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The new chart's CRDs (for example from P(gpuops.sandbox.chart_crds#filter)).
    type: list
    elements: dict
    required: true
  stored_crds:
    description: The same CRDs as the cluster holds them (the C(resources) of M(kubernetes.core.k8s_info)); CRDs
      the cluster does not have yet are simply not given.
    type: list
    elements: dict
    required: true
  objects:
    description: The stored custom resources of those CRDs' kinds.
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Refuse a CRD upgrade that would drop a field the stored objects use
  ansible.builtin.assert:
    that: __lost | length == 0
    fail_msg: "{{ __lost | join('; ') }}; nothing was changed"
  vars:
    __lost: "{{ new_crds | gpuops.sandbox.crd_upgrade_problems(stored_crds, stored_objects) }}"
"""

RETURN = r"""
_value:
  description: One sentence per CRD or object that would lose something; empty when the new CRDs keep everything.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._chart_upgrade import schema_problems


def crd_upgrade_problems(new_crds, stored_crds, objects):
    for name, value in (("the new CRDs", new_crds), ("stored_crds", stored_crds), ("objects", objects)):
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise AnsibleFilterError("crd_upgrade_problems: %s must be a list of objects (mappings)" % name)
    return schema_problems(new_crds, stored_crds, objects)


class FilterModule:
    """New CRDs against the objects stored under the old ones."""

    def filters(self):
        return {"crd_upgrade_problems": crd_upgrade_problems}
