# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import (
    VGPU_DEFAULT_CONFIG,
    PlanError,
    desired_host_devices,
    host_workload_type,
    operator_os_tag,
    release_labels,
    untyped_host_message,
    workload_labels,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._inventory_facts import check_facts
from ansible_collections.gpuops.sandbox.plugins.module_utils._plugin_names import PluginNameError, read_pci_ids
from ansible_collections.gpuops.sandbox.plugins.module_utils._sharing import (
    DRIVER_DEPLOY_LABEL,
    MIG_CONFIG_LABEL,
    MIG_DISABLED,
    PLUGIN_CONFIG_LABEL,
)


def _config_types(device_config, name):
    configs = (device_config or {}).get("vgpu-configs") or {}
    if not name or name not in configs:
        return None
    types = []
    for entry in configs[name] or []:
        for vgpu_type in (entry or {}).get("vgpu-devices") or {}:
            if vgpu_type not in types:
                types.append(vgpu_type)
    return types


def _read_pci_ids(path):
    try:
        return read_pci_ids(path)
    except PluginNameError as exc:
        raise AnsibleFilterError(exc.msg)


def gpu_hosts(hostvars_list, vgpu_device_config=None, vgpu_configs=None, pci_vendor_ids=("10de",), resource_names=None,
              plugin_pci_ids=None, vgpu_config_default=None):
    if vgpu_device_config:
        if not isinstance(vgpu_device_config, dict) or not isinstance(vgpu_device_config.get("vgpu-configs"), dict):
            raise AnsibleFilterError("gpuops_vgpu_device_config must be a mapping with a vgpu-configs mapping "
                                     "(the vGPU Device Manager's config.yaml format)")
        vgpu_configs = list(vgpu_device_config["vgpu-configs"])
    pci_ids_text = _read_pci_ids(plugin_pci_ids)
    entries, seen = [], {}
    for hv in hostvars_list or []:
        host = hv.get("inventory_hostname")
        facts, fact_problems = check_facts(host, hv)
        if fact_problems:
            raise AnsibleFilterError("; ".join(fact_problems))
        name = hv.get("gpuops_node_name") or host
        wtype = host_workload_type(hv)
        if not wtype:
            raise AnsibleFilterError(untyped_host_message(host, hv.get("group_names")))
        config_name = hv.get("gpuops_vgpu_config_name") or None
        if name in seen:
            raise AnsibleFilterError("hosts %s and %s have the same node name %s; set gpuops_node_name" % (seen[name], host, name))
        seen[name] = host
        try:
            labels = workload_labels(wtype, config_name, vgpu_configs, vgpu_config_default)
        except PlanError as exc:
            raise AnsibleFilterError("host %s: %s" % (host, exc.msg))
        release_to = release_labels(wtype)
        sharing = {}
        if wtype == "container":
            # The node's MIG config and device plugin config (gpu_sharing_problems checks them); a MIG config the
            # collection set and no longer wants goes back to all-disabled, the MIG Manager's default.
            for var, label, key in (("gpuops_mig_config", MIG_CONFIG_LABEL, "mig_config"),
                                    ("gpuops_device_plugin_config", PLUGIN_CONFIG_LABEL, "device_plugin_config")):
                if hv.get(var):
                    labels[label] = sharing[key] = str(hv[var])
            release_to[MIG_CONFIG_LABEL] = MIG_DISABLED
        host_facts = facts.get("gpu_facts_host") or {}
        driver = (host_facts.get("nvidia_driver") or {}).get("source")
        if wtype in ("container", "dra"):
            # A driver installed on the host serves the node: the operator's driver container stays off it. When
            # the collection no longer asks that, the label goes back to the operator's true.
            if driver == "host":
                labels[DRIVER_DEPLOY_LABEL] = "false"
            release_to[DRIVER_DEPLOY_LABEL] = "true"
        taints = hv.get("gpuops_node_taints")
        os_release = host_facts.get("os") or {}
        entry = {
            "host": host, "name": name, "workload_type": wtype,
            "vgpu_config_name": config_name if wtype == "vm-vgpu" else None,
            "vgpu_type_names": _config_types(vgpu_device_config, config_name or vgpu_config_default or VGPU_DEFAULT_CONFIG)
            if wtype == "vm-vgpu" else None,
            "labels": labels,
            "release_to": release_to,
            "mig_config": sharing.get("mig_config"),
            "device_plugin_config": sharing.get("device_plugin_config"),
            "driver_source": driver,
            "taints": None if taints is None else list(taints),
            "gpus": facts.get("gpu_facts_gpus") or [],
            "mdev_parents": facts.get("gpu_facts_mdev_parents") or [],
            "os_tag": operator_os_tag(os_release.get("id"), os_release.get("version_id")),
        }
        if wtype == "container":
            entry["resources"] = ["nvidia.com/gpu"]
        else:
            try:
                pci, mdev = desired_host_devices([entry], pci_vendor_ids, resource_names or None, pci_ids_text)[:2]
            except PlanError as exc:
                raise AnsibleFilterError("host %s: %s" % (host, exc.msg))
            entry["resources"] = sorted(set(e["resourceName"] for e in pci + mdev))
        entries.append(entry)
    return entries


class FilterModule:
    """Filters for the cluster side."""

    def filters(self):
        return {"gpu_hosts": gpu_hosts}
