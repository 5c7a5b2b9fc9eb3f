#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kube_access
short_description: Check that the API server is reachable, accepts the credentials and allows what a play will do
version_added: 1.0.0
description:
  - Reads the server version (which proves the server is reachable and accepts the kubeconfig's
    credentials), then asks the server, through one SelfSubjectAccessReview per entry of
    O(permissions), whether the kubeconfig's user may do each thing.
  - Fails with one message naming every permission missing, so a play can stop before it changes
    anything. Changes nothing.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  permissions:
    description: What the play needs to do.
    type: list
    elements: dict
    default: []
    suboptions:
      verb:
        description: API verb, such as C(get), C(list), C(patch), C(create).
        type: str
        required: true
      resource:
        description: Resource (plural), such as C(nodes) or C(kubevirts).
        type: str
        required: true
      group:
        description: API group; empty for the core group.
        type: str
        default: ""
      namespace:
        description: Namespace, for namespaced resources.
        type: str
extends_documentation_fragment:
  - gpuops.sandbox.kube_auth
  - gpuops.sandbox.attributes
attributes:
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check the cluster can be labelled and the KubeVirt CR patched
  gpuops.sandbox.kube_access:
    kubeconfig: /etc/kubernetes/admin.conf
    permissions:
      - {verb: patch, resource: nodes}
      - {verb: patch, resource: kubevirts, group: kubevirt.io, namespace: kubevirt}
"""

RETURN = r"""
server_version:
  description: The API server's version.
  returned: success
  type: str
  sample: v1.35.4
server:
  description: URL of the API server.
  returned: success
  type: str
  sample: https://127.0.0.1:6443
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._kube import AUTH_ARGUMENT_SPEC, connect, open_api
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import create_module, run_module


def build_module():
    return create_module(
        AnsibleModule,
        dict(
            **AUTH_ARGUMENT_SPEC,
            permissions=dict(type="list", elements="dict", default=[], options=dict(
                verb=dict(type="str", required=True),
                resource=dict(type="str", required=True),
                group=dict(type="str", default=""),
                namespace=dict(type="str"),
            )),
        ),
        supports_check_mode=True,
    )


def check_access(module, api_factory=connect):
    """The module's work: the result dict, or a GpuopsError (KubeError) naming what is missing."""
    api = open_api(module, api_factory)
    version = api.version()
    api.require([(p["verb"], p["resource"], p["group"], p["namespace"]) for p in module.params["permissions"]])
    return dict(changed=False, server_version=version, server=api.server)


def main(api_factory=connect):
    run_module(build_module, check_access, api_factory)


if __name__ == "__main__":
    main()
