#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_labels
short_description: Set labels and taints on many Kubernetes nodes with one list and only the patches needed
version_added: 1.0.0
description:
  - Lists the cluster's nodes once (in pages), works out for every given node which labels and
    taints differ from what is wanted, and sends one JSON merge patch per node that differs, several
    at a time. Nodes that already match cost no request.
  - A label given with a null value is removed when present, so a node that changes workload type
    loses the labels of its old type.
  - The labels this module sets are recorded on the node (annotation C(gpuops.sandbox/labels), label and
    value). A recorded label no longer named in O(nodes[].labels) is removed, but only while it still
    has the recorded value. A label whose value somebody else changed (the GPU Operator's
    C(nvidia.com/gpu.deploy.*=true), a user's choice), and any label this module never set, stays.
  - Every input is checked, and every named node must exist, before the first patch; a failed patch
    rolls back the nodes already patched in this run.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  nodes:
    description:
      - The nodes and what they should carry.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Node name (C(metadata.name)).
        type: str
        required: true
      labels:
        description:
          - Labels to set, as key and value; a null value removes the label.
          - Booleans and integers become their lower-case string form (C(false), C(3)).
          - Labels not named here are left alone, except those this module set in an earlier run that still
            carry the value it set (see the description).
        type: dict
        default: {}
      release_to:
        description:
          - What a label this module set earlier becomes when it is no longer named in O(nodes[].labels) and still
            has the recorded value, as key and value; it is then no longer recorded (its next owner's). Labels not
            named here are removed; a null value removes too.
          - For example a former DRA node turned container gets the GPU Operator's C(true) on the deploy labels the
            collection had set to C(false), because the operator does not relabel a node whose workload label stays.
        type: dict
        default: {}
      taints:
        description:
          - The taints wanted among the managed ones (see O(taint_key_prefixes)); an empty list removes
            every managed taint. When omitted, the node's taints are left alone.
        type: list
        elements: dict
        suboptions:
          key:
            description: Taint key.
            type: str
            required: true
          value:
            description: Taint value.
            type: str
          effect:
            description: Taint effect.
            type: str
            required: true
            choices: [NoSchedule, PreferNoSchedule, NoExecute]
  taint_key_prefixes:
    description:
      - A node's taint is managed (removed unless listed in its O(nodes[].taints)) when its key starts
        with one of these, or has the key of a wanted taint. Other taints are never touched.
    type: list
    elements: str
    default: [nvidia.com/]
  missing_nodes:
    description:
      - What to do when a named node does not exist; V(fail) fails before changing anything.
    type: str
    choices: [fail, ignore]
    default: fail
  parallel:
    description:
      - How many patches are in flight at once, a whole number from 1 to 32 (the size of the client's
        connection pool); any other value fails before the first request.
    type: int
    default: 8
extends_documentation_fragment:
  - gpuops.sandbox.kube_auth
  - gpuops.sandbox.attributes
attributes:
  diff_mode:
    support: full
seealso:
  - module: gpuops.sandbox.kubevirt_host_devices
"""

EXAMPLES = r"""
- name: Label a passthrough node and drop the vGPU config label it had as a vGPU node
  gpuops.sandbox.node_labels:
    kubeconfig: /etc/kubernetes/admin.conf
    nodes:
      - name: gpu-node-2
        labels:
          nvidia.com/gpu.workload.config: vm-passthrough
          nvidia.com/vgpu.config: null

- name: Keep ordinary pods off the VM nodes, and clear the collection's taints elsewhere
  gpuops.sandbox.node_labels:
    nodes:
      - name: gpu-node-2
        taints:
          - key: nvidia.com/gpu.workload
            value: vm
            effect: NoSchedule
      - name: gpu-node-1
        taints: []

- name: Label every GPU node of the inventory in one call
  gpuops.sandbox.node_labels:
    kubeconfig: "{{ gpuops_kubeconfig }}"
    nodes: "{{ groups['gpu_nodes'] | map('extract', hostvars) | map(attribute='cluster_nodes_spec') | list }}"
"""

RETURN = r"""
changed_nodes:
  description: Names of the nodes patched (in check mode, that would be patched).
  returned: always
  type: list
  elements: str
  sample: [gpu-node-2]
missing_nodes:
  description: Named nodes the cluster does not have (only with O(missing_nodes=ignore)).
  returned: always
  type: list
  elements: str
  sample: []
nodes:
  description: Number of nodes given.
  returned: always
  type: int
  sample: 3
api_requests:
  description: HTTP requests the module sent to the API server.
  returned: always
  type: int
  sample: 3
diff:
  description: The managed labels and taints of the changed nodes before and after (diff mode).
  returned: when diff mode is on and something changed
  type: dict
  sample:
    before: {gpu-node-2: {labels: {nvidia.com/gpu.workload.config: vm-vgpu, nvidia.com/vgpu.config: A10-4Q}}}
    after: {gpu-node-2: {labels: {nvidia.com/gpu.workload.config: vm-passthrough, nvidia.com/vgpu.config: null}}}
"""

import concurrent.futures

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._kube import (
    AUTH_ARGUMENT_SPEC,
    MAX_PARALLEL,
    KubeError,
    check_label_key,
    connect,
    label_value,
    open_api,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import (
    TAINT_EFFECTS,
    inverse_patch,
    plan_node,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    GpuopsError,
    check_range,
    create_module,
    run_module,
)

CONFLICT_RETRIES = 3


def build_module():
    """Create the AnsibleModule; the argument spec does the validation it can."""
    return create_module(
        AnsibleModule,
        dict(
            **AUTH_ARGUMENT_SPEC,
            nodes=dict(type="list", elements="dict", required=True, options=dict(
                name=dict(type="str", required=True),
                labels=dict(type="dict", default={}),
                release_to=dict(type="dict", default={}),
                taints=dict(type="list", elements="dict", options=dict(
                    key=dict(type="str", required=True, no_log=False),
                    value=dict(type="str"),
                    effect=dict(type="str", required=True, choices=list(TAINT_EFFECTS)),
                )),
            )),
            taint_key_prefixes=dict(type="list", elements="str", default=["nvidia.com/"], no_log=False),
            missing_nodes=dict(type="str", choices=["fail", "ignore"], default="fail"),
            parallel=dict(type="int", default=8),
        ),
        supports_check_mode=True,
    )


def normalise(nodes):
    """Validate every label and taint; return ``{name: (labels, taints, release_to)}``. Raises ValueError naming the bad value."""
    wanted = {}
    for node in nodes:
        name = node["name"]
        if name in wanted:
            raise ValueError("node %s is given twice" % name)
        labels = {}
        for key, value in (node.get("labels") or {}).items():
            check_label_key(key)
            labels[key] = label_value(key, value)
        taints = node.get("taints")
        if taints is not None:
            seen = set()
            for taint in taints:
                check_label_key(taint["key"])
                if taint.get("value") is not None:
                    label_value("taint %s" % taint["key"], taint["value"])
                if (taint["key"], taint["effect"]) in seen:
                    raise ValueError("node %s: taint %s:%s is given twice" % (name, taint["key"], taint["effect"]))
                seen.add((taint["key"], taint["effect"]))
        release_to = {}
        for key, value in (node.get("release_to") or {}).items():
            check_label_key(key)
            release_to[key] = None if value is None else label_value(key, value)
        wanted[name] = (labels, taints, release_to)
    return wanted


def apply(api, name, node, wanted, prefixes):
    """Patch one node, re-reading it and planning again on a conflict; return the node as it was."""
    patch = plan_node(node, wanted[0], wanted[1], prefixes, wanted[2])[0]
    for attempt in range(CONFLICT_RETRIES + 1):
        try:
            api.patch_node(name, patch)
            return node, patch
        except KubeError as exc:
            if exc.status != 409 or attempt == CONFLICT_RETRIES:
                raise
        node = api.read_node(name)
        patch = plan_node(node, wanted[0], wanted[1], prefixes, wanted[2])[0]
        if patch is None:
            return node, None
    return node, patch  # pragma: no cover


def run(module, api, wanted):
    """Plan and apply; return the result dict. Raises KubeError with a message for the user."""
    params = module.params
    prefixes = tuple(params["taint_key_prefixes"])
    existing = dict((n["metadata"]["name"], n) for n in api.list_nodes())
    missing = sorted(set(wanted) - set(existing))
    if missing and params["missing_nodes"] == "fail":
        raise KubeError("the cluster has no node named %s (check gpuops_node_name of those hosts); nothing was changed"
                        % ", ".join(missing))
    plans = {}
    before, after = {}, {}
    for name in sorted(wanted):
        if name in missing:
            continue
        patch, old, new = plan_node(existing[name], wanted[name][0], wanted[name][1], prefixes, wanted[name][2])
        if patch is not None:
            plans[name] = patch
            before[name], after[name] = old, new
    result = dict(changed=bool(plans), changed_nodes=sorted(plans), missing_nodes=missing, nodes=len(wanted))
    if module._diff and plans:
        result["diff"] = dict(before=before, after=after)
    if plans and not module.check_mode:
        api.require([("patch", "nodes", "", None)])
        done, errors = [], []
        with concurrent.futures.ThreadPoolExecutor(max_workers=params["parallel"]) as pool:
            futures = dict((pool.submit(apply, api, name, existing[name], wanted[name], prefixes), name) for name in plans)
            for future in concurrent.futures.as_completed(futures):
                try:
                    node, patch = future.result()
                    if patch is not None:
                        done.append((futures[future], node, patch))
                except GpuopsError as exc:
                    errors.append(exc.msg)
                except Exception as exc:  # pylint: disable=broad-exception-caught
                    # Whatever went wrong with one node, the nodes already patched are rolled back below.
                    errors.append("node %s: %s: %s" % (futures[future], type(exc).__name__, exc))
        if errors:
            rollback_errors = []
            for name, node, patch in done:
                try:
                    api.patch_node(name, inverse_patch(node, patch))
                except GpuopsError as exc:
                    rollback_errors.append(exc.msg)
                except Exception as exc:  # pylint: disable=broad-exception-caught
                    rollback_errors.append("node %s: %s: %s" % (name, type(exc).__name__, exc))
            raise KubeError("%d of %d node patches failed: %s; %s" % (
                len(errors), len(plans), "; ".join(sorted(errors)[:5]),
                "rolled back the %d nodes already patched" % len(done) if not rollback_errors else
                "rolling back the nodes already patched failed too: %s" % "; ".join(rollback_errors[:5])))
    result["api_requests"] = api.requests
    return result


def label_nodes(module, api_factory=connect):
    """The module's work: check every input, connect, plan and apply; the result dict or a GpuopsError."""
    params = module.params
    check_range("parallel", params["parallel"], 1, MAX_PARALLEL, "patches in flight")
    try:
        wanted = normalise(params["nodes"])
    except ValueError as exc:
        raise GpuopsError("%s; nothing was changed" % exc)
    api = open_api(module, api_factory)
    return run(module, api, wanted)


def main(api_factory=connect):
    run_module(build_module, label_nodes, api_factory)


if __name__ == "__main__":
    main()
