# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""An in-memory stand-in for _kube.KubeApi: JSON merge patches, resourceVersion conflicts, denials."""

from __future__ import annotations

import copy

from ansible_collections.gpuops.sandbox.plugins.module_utils._kube import KubeError


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class FakeKube:
    def __init__(self, nodes=(), kubevirts=None, denied=(), fail_patch=(), conflict_once=()):
        self.nodes = dict((n["metadata"]["name"], copy.deepcopy(n)) for n in nodes)
        for node in self.nodes.values():
            node["metadata"].setdefault("resourceVersion", "1")
        self.kubevirts = None if kubevirts is None else [copy.deepcopy(k) for k in kubevirts]
        self.denied = set(denied)
        self.fail_patch = set(fail_patch)
        self.conflict_once = set(conflict_once)
        self.requests = 0
        self.patches = []
        self.server = "https://127.0.0.1:6443"

    def version(self):
        self.requests += 1
        return "v1.35.4"

    def list_nodes(self):
        self.requests += 1
        return [copy.deepcopy(n) for n in self.nodes.values()]

    def read_node(self, name):
        self.requests += 1
        return copy.deepcopy(self.nodes[name])

    def require(self, checks):
        self.requests += len(checks)
        denied = [c for c in checks if (c[0], c[1]) in self.denied]
        if denied:
            raise KubeError("the kubeconfig's user may not %s %s; nothing was changed" % denied[0][:2], status=403)

    def _patch(self, obj, patch):
        rv = (patch.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != obj["metadata"]["resourceVersion"]:
            raise KubeError("conflict", status=409)
        new = merge_patch(obj, patch)
        new["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return new

    def patch_node(self, name, patch):
        self.requests += 1
        self.patches.append((name, copy.deepcopy(patch)))
        if name in self.fail_patch:
            raise KubeError("forbidden to patch node %s" % name, status=403)
        if name in self.conflict_once:
            self.conflict_once.discard(name)
            self.nodes[name]["metadata"]["resourceVersion"] = str(int(self.nodes[name]["metadata"]["resourceVersion"]) + 1)
            raise KubeError("conflict", status=409)
        self.nodes[name] = self._patch(self.nodes[name], patch)
        return copy.deepcopy(self.nodes[name])

    def list_kubevirts(self, namespace):
        self.requests += 1
        if self.kubevirts is None:
            raise KubeError("KubeVirt is not installed: the API server has no kubevirt.io/v1 resource kubevirts", status=404)
        return [copy.deepcopy(k) for k in self.kubevirts if not namespace or k["metadata"]["namespace"] == namespace]

    def patch_kubevirt(self, namespace, name, patch):
        self.requests += 1
        self.patches.append((name, copy.deepcopy(patch)))
        for index, cr in enumerate(self.kubevirts):
            if cr["metadata"]["name"] == name and cr["metadata"]["namespace"] == namespace:
                self.kubevirts[index] = self._patch(cr, patch)
                return copy.deepcopy(self.kubevirts[index])
        raise KubeError("not found", status=404)
