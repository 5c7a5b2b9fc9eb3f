# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: what the cluster half would change (labels, Helm releases, KubeVirt entries), before it runs."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import PlanError
from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster_plan import cluster_plan as _cluster_plan
from ansible_collections.gpuops.sandbox.plugins.module_utils._plugin_names import PluginNameError, read_pci_ids


def cluster_plan(nodes, releases=None, kubevirt=None, live=None, taint_key_prefixes=None, unread=None):
    settings = kubevirt
    if isinstance(kubevirt, dict) and kubevirt.get("plugin_pci_ids"):
        # The path on the controller of the sandbox device plugin's pci.ids, as role kubevirt_devices takes it.
        try:
            settings = dict(kubevirt, plugin_pci_ids=read_pci_ids(kubevirt["plugin_pci_ids"]))
        except PluginNameError as exc:
            raise AnsibleFilterError("cluster_plan: %s" % exc.msg)
    try:
        return _cluster_plan(nodes, releases or [], settings, live,
                             ("nvidia.com/",) if taint_key_prefixes is None else taint_key_prefixes, list(unread or []))
    except PlanError as exc:
        raise AnsibleFilterError("cluster_plan: %s" % exc.msg)


class FilterModule:
    """The cluster half's plan."""

    def filters(self):
        return {"cluster_plan": cluster_plan}
