# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: helm_foreign_objects
short_description: Objects a chart would create that already exist outside the Helm release
version_added: 1.0.0
description:
  - Helm refuses to install a release over an object that already exists unless the object carries the
    release's ownership marks (label C(app.kubernetes.io/managed-by=Helm), annotations
    C(meta.helm.sh/release-name) and C(meta.helm.sh/release-namespace)). Takes the objects read from the
    cluster and the documents of C(helm template), and returns the rendered objects that exist without those
    marks or with another release's, as C(Kind/name) (C(Kind/namespace/name) when namespaced).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: Objects read from the cluster, for example the C(resources) of M(kubernetes.core.k8s_info).
    type: list
    elements: dict
    required: true
  rendered:
    description: The documents of C(helm template); values that are not objects are skipped.
    type: list
    elements: raw
    required: true
  release_name:
    description: Name of the Helm release.
    type: str
    required: true
  release_namespace:
    description: Namespace of the Helm release.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Fail before installing when a DeviceClass of the chart was made by hand
  ansible.builtin.assert:
    that: __foreign | length == 0
    fail_msg: "{{ __foreign | join(', ') }} exist outside the release"
  vars:
    __foreign: >-
      {{ device_classes.resources
         | gpuops.sandbox.helm_foreign_objects(render.stdout | from_yaml_all, 'dra-driver', 'dra-driver') }}
"""

RETURN = r"""
_value:
  description: The rendered objects that exist outside the release, sorted; empty when Helm can install.
  type: list
  elements: str
"""

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import helm_foreign_objects


class FilterModule:
    """A chart's objects against what the cluster already holds."""

    def filters(self):
        return {"helm_foreign_objects": helm_foreign_objects}
