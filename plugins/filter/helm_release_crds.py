# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: helm_release_crds
short_description: The CRDs the charts of Helm releases carry, read from the releases' Secrets
version_added: 1.1.0
description:
  - Helm stores each revision of a release in a Secret (type C(helm.sh/release.v1)) holding the chart it installed.
    Takes such Secrets and returns, per release, its name, its chart and the names of the CRDs under the chart's
    C(crds/) (what Helm installed when the release was first installed).
  - Only the CRD names, the release and the chart are returned; the release's values (which may hold secrets) are
    not.
  - A Secret whose record cannot be read is skipped; so is the release O(exclude) names.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: Helm release Secrets (the C(resources) of M(kubernetes.core.k8s_info), label C(owner=helm)).
    type: list
    elements: dict
    required: true
  exclude:
    description: A release to leave out, as C(namespace/name).
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: The CRDs the other releases' charts carry
  ansible.builtin.set_fact:
    other_releases: >-
      {{ query('kubernetes.core.k8s', kind='Secret', label_selector='owner=helm,status=deployed')
         | gpuops.sandbox.helm_release_crds(exclude='gpu-operator/gpu-operator') }}
  no_log: true
"""

RETURN = r"""
_value:
  description: One entry per release.
  type: list
  elements: dict
  contains:
    release:
      description: The release as C(namespace/name).
      type: str
    chart:
      description: The chart as C(name-version).
      type: str
    crds:
      description: The names of the CRDs under the chart's C(crds/).
      type: list
      elements: str
"""

import binascii
import json
import zlib

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._chart_upgrade import decode_release, release_crds


def helm_release_crds(secrets, exclude=""):
    if not isinstance(secrets, list):
        raise AnsibleFilterError("helm_release_crds takes a list of Helm release Secrets, not %s" % type(secrets).__name__)
    found = []
    for secret in secrets:
        if not isinstance(secret, dict) or secret.get("type") != "helm.sh/release.v1":
            continue
        data = (secret.get("data") or {}).get("release")
        if not data:
            continue
        try:
            record = decode_release(data)
        except (ValueError, binascii.Error, zlib.error, OSError, EOFError, json.JSONDecodeError):
            continue
        if not isinstance(record, dict):
            continue
        entry = release_crds(record)
        if entry["release"] != exclude:
            found.append(entry)
    return found


class FilterModule:
    """The CRDs of the charts of Helm releases."""

    def filters(self):
        return {"helm_release_crds": helm_release_crds}
