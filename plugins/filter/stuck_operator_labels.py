# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: GPU Operator deploy labels a MIG Manager or vGPU Device Manager left paused with nobody to resume them."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
---
name: stuck_operator_labels
short_description: Deploy labels left at a paused-for-* value with no manager working on the node
version_added: 1.0.0
description:
  - While the GPU Operator's MIG Manager or vGPU Device Manager reconfigures a node, it sets the node's
    C(nvidia.com/gpu.deploy.<operand>) labels of the GPU clients to C(paused-for-mig-change) or
    C(paused-for-vgpu-change), so that their DaemonSets leave the node, and sets them back to C(true) when it is done.
    A manager pod that dies in between leaves them paused, and the operator keeps a value that is not empty, so the
    operands never come back.
  - Takes Node objects and the manager pods (from M(kubernetes.core.k8s_info)) and sorts every paused deploy label
    of the nodes into one of three lists.
  - C(working) when a pod of the label's manager (label C(app=nvidia-mig-manager) or
    C(app=nvidia-vgpu-device-manager)) is bound to the node (C(spec.nodeName)), is not being deleted and has not
    finished (phase C(Pending), C(Running) or C(Unknown)), and the manager's state label on the node
    (C(nvidia.com/mig.config.state) or C(nvidia.com/vgpu.config.state)) is not C(success) or C(failed). A manager
    that is still Pending counts, as it is the one the DaemonSet started in place of the pod that died, and it goes
    through the node's configuration again when it starts.
  - C(stuck) otherwise, with the reason (no manager pod on the node, or its pod says the change ended) and the JSON
    patch that sets the labels back to C(true), the value the managers restore; the patch first tests that each
    label still holds the paused value, so a label that changed in the meantime is left alone.
  - C(unknown) for other C(paused-for-*) values (such as the driver manager's C(paused-for-driver-upgrade)),
    whose owners this filter does not know; they are never called stuck.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: Node objects.
    type: list
    elements: dict
    required: true
  pods:
    description: Pods of the managers (pods of other apps are ignored).
    type: list
    elements: dict
    required: true
  names:
    description: Names of the nodes to look at; omitted or null looks at every node given.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Fail when a node has deploy labels nobody will resume
  ansible.builtin.assert:
    that: __found.stuck | length == 0
    fail_msg: "{{ __found.stuck | map(attribute='text') | join('; ') }}"
  vars:
    __found: "{{ nodes.resources | gpuops.sandbox.stuck_operator_labels(pods.resources, ['gpu-node-1']) }}"
"""

RETURN = r"""
_value:
  description: The paused deploy labels, by what holds them; each list is sorted by node and value.
  type: dict
  contains:
    stuck:
      description:
        - One entry per node and paused value with no manager working on it. Keys C(node), C(value) (the paused
          value), C(labels) (the label names, sorted), C(manager) (the manager's C(app) label), C(state) (its state
          label on the node, or null), C(pods) (its pods on the node, C(namespace/name)), C(reason), C(text) (one
          line naming node, labels, value and reason) and C(patch) (JSON patch operations for
          M(kubernetes.core.k8s_json_patch)).
      type: list
      elements: dict
    working:
      description: The same keys (without C(patch)) for paused labels whose manager is at work on the node.
      type: list
      elements: dict
    unknown:
      description: The same keys (without C(patch); C(manager) null) for C(paused-for-*) values of unknown owners.
      type: list
      elements: dict
"""

DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
PAUSED_PREFIX = "paused-for-"
# What the managers put back when they finish: every paused label becomes "true" (only "false", which they never
# pause, stays as it is).
RESUMED = "true"
MANAGERS = {
    "paused-for-mig-change": {"app": "nvidia-mig-manager", "state_label": "nvidia.com/mig.config.state"},
    "paused-for-vgpu-change": {"app": "nvidia-vgpu-device-manager", "state_label": "nvidia.com/vgpu.config.state"},
}
# State label values a manager sets when it has ended a change (it resumes the labels before either).
ENDED_STATES = ("success", "failed")
ENDED_PHASES = ("Succeeded", "Failed")


def _object(value, kind, index):
    if not isinstance(value, dict):
        raise AnsibleFilterError("stuck_operator_labels: %s %d is not a %s object: %r" % (kind, index, kind, value))
    meta = value.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise AnsibleFilterError("stuck_operator_labels: the metadata of %s %d is not a mapping: %r" % (kind, index, meta))
    labels = meta.get("labels")
    if labels is None:
        labels = {}
    if not isinstance(labels, dict):
        raise AnsibleFilterError("stuck_operator_labels: the labels of %s %r are not a mapping: %r"
                                 % (kind, meta.get("name", index), labels))
    return meta, labels


def _node_names(nodes):
    if not isinstance(nodes, list):
        raise AnsibleFilterError("stuck_operator_labels expects a list of Node objects, got %s: %r"
                                 % (type(nodes).__name__, nodes))
    found = []
    for index, node in enumerate(nodes):
        meta, labels = _object(node, "Node", index)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise AnsibleFilterError("stuck_operator_labels: Node %d has no metadata.name: %r" % (index, node))
        found.append((name, labels))
    return found


def _manager_pods(pods):
    """{(node, app): ["namespace/name", ...]} of the pods that have not ended."""
    if not isinstance(pods, list):
        raise AnsibleFilterError("stuck_operator_labels: pods must be a list of Pod objects, got %s: %r"
                                 % (type(pods).__name__, pods))
    apps = set(manager["app"] for manager in MANAGERS.values())
    found = {}
    for index, pod in enumerate(pods):
        meta, labels = _object(pod, "Pod", index)
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        if not isinstance(spec, dict) or not isinstance(status, dict):
            raise AnsibleFilterError("stuck_operator_labels: the spec or status of Pod %r is not a mapping"
                                     % meta.get("name", index))
        app = labels.get("app")
        if app not in apps or meta.get("deletionTimestamp") or status.get("phase") in ENDED_PHASES:
            continue
        node = spec.get("nodeName")
        if not node:
            continue
        found.setdefault((node, app), []).append("%s/%s" % (meta.get("namespace", ""), meta.get("name", "")))
    return found


def _pointer(label):
    """The JSON pointer of a label (RFC 6901: ~ and / escaped)."""
    return "/metadata/labels/" + label.replace("~", "~0").replace("/", "~1")


def _entry(node, value, labels, node_labels, pods):
    manager = MANAGERS.get(value)
    entry = {"node": node, "value": value, "labels": sorted(labels), "manager": None, "state": None, "pods": [],
             "reason": ""}
    shown = "%s: %s at %s" % (node, ", ".join(entry["labels"]), value)
    if manager is None:
        entry["reason"] = "paused by a component this check does not know"
        entry["text"] = "%s (%s)" % (shown, entry["reason"])
        return "unknown", entry
    app, state_label = manager["app"], manager["state_label"]
    state = node_labels.get(state_label)
    entry.update(manager=app, state=state, pods=sorted(pods.get((node, app), [])))
    if entry["pods"] and state not in ENDED_STATES:
        verdict = "working"
        shown_state = state if state is not None else "(unset)"
        entry["reason"] = "%s pod %s is at work, %s=%s" % (app, ", ".join(entry["pods"]), state_label, shown_state)
    elif entry["pods"]:
        verdict = "stuck"
        entry["reason"] = "its %s pod %s has ended the change (%s=%s)" % (app, ", ".join(entry["pods"]), state_label, state)
    else:
        verdict = "stuck"
        entry["reason"] = "no %s pod on the node" % app
    entry["text"] = "%s (%s)" % (shown, entry["reason"])
    if verdict == "stuck":
        entry["patch"] = []
        for label in entry["labels"]:
            entry["patch"] += [{"op": "test", "path": _pointer(label), "value": value},
                               {"op": "replace", "path": _pointer(label), "value": RESUMED}]
    return verdict, entry


def stuck_operator_labels(nodes, pods, names=None):
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        raise AnsibleFilterError("stuck_operator_labels: names must be a list of node names or null, got %r" % (names,))
    wanted = set(names) if names is not None else None
    managers = _manager_pods(pods)
    found = {"stuck": [], "working": [], "unknown": []}
    for node, labels in sorted(_node_names(nodes)):
        if wanted is not None and node not in wanted:
            continue
        paused = {}
        for label, value in labels.items():
            if isinstance(label, str) and label.startswith(DEPLOY_PREFIX) and isinstance(value, str) \
                    and value.startswith(PAUSED_PREFIX):
                paused.setdefault(value, []).append(label)
        for value in sorted(paused):
            verdict, entry = _entry(node, value, paused[value], labels, managers)
            found[verdict].append(entry)
    return found


class FilterModule:
    """gpuops.sandbox.stuck_operator_labels"""

    def filters(self):
        return {"stuck_operator_labels": stuck_operator_labels}
