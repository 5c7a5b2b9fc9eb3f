# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: gpu_hosts
short_description: What the cluster side needs to know of each GPU host, from its host variables and facts
version_added: 1.0.0
description:
  - Takes the host variables of the GPU hosts (C(groups['gpu_nodes'] | map('extract', hostvars))) and
    returns one entry per host with its Kubernetes node name, workload type, vGPU config, the labels
    and taints its node should carry (see P(gpuops.sandbox.gpu_node_labels#filter)), and its GPU facts.
  - Reads C(gpuops_node_name) (default the inventory name), the workload type (C(gpuops_workload_type), or else
    the type the host's inventory group stands for, by P(gpuops.sandbox.workload_type_of#filter)),
    C(gpuops_vgpu_config_name), C(gpuops_mig_config) and C(gpuops_device_plugin_config) (container nodes; checked
    by P(gpuops.sandbox.gpu_sharing_problems#filter)), C(gpuops_node_taints) (default null, taints left alone),
    C(gpu_facts_gpus) and C(gpu_facts_mdev_parents) (facts of M(gpuops.sandbox.gpu_facts)).
  - Fails naming the host and the value for an unknown workload type or none, a vGPU config name that the vGPU
    device configuration does not hold, two hosts with the same node name, or GPU facts (C(gpu_facts_gpus),
    C(gpu_facts_host), C(gpu_facts_mdev_parents), as an inventory gives them for a host the collection does not
    read) of another shape than M(gpuops.sandbox.gpu_facts) returns; an ID written as a number of four digits
    (a C(device) of C(2236) unquoted) is read as that ID.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: Host variables of the GPU hosts.
    type: list
    elements: dict
    required: true
  vgpu_device_config:
    description:
      - The vGPU Device Manager configuration (C(version), C(vgpu-configs)) when the collection
        provides it; used to check the config names and to know each vGPU host's vGPU types.
    type: dict
  vgpu_configs:
    description:
      - Config names the vGPU Device Manager knows, when O(vgpu_device_config) is not given (read from
        the cluster's ConfigMap); null skips the check.
    type: list
    elements: str
  vgpu_config_default:
    description:
      - The config the vGPU Device Manager applies to a vm-vgpu node without C(nvidia.com/vgpu.config) (the GPU
        Operator's C(vgpuDeviceManager.config.default)); empty means C(default). A vm-vgpu host without
        C(gpuops_vgpu_config_name) fails when the known configs do not include it.
    type: str
  pci_vendor_ids:
    description: Vendor IDs of the passthrough GPUs, for RV(_value[].resources).
    type: list
    elements: str
    default: ["10de"]
  resource_names:
    description: Resource names of passthrough GPUs by device ID (C(10de:2330) or C(2330)), overriding the naming
      table of the sandbox device plugin version the GPU Operator deploys.
    type: dict
  plugin_pci_ids:
    description: Path on the controller of the sandbox device plugin image's pci.ids, to name passthrough GPUs from.
    type: path
"""

EXAMPLES = r"""
- name: Node names, labels and taints of every GPU host
  ansible.builtin.set_fact:
    gpu_host_entries: "{{ groups['gpu_nodes'] | map('extract', hostvars) | gpuops.sandbox.gpu_hosts(gpuops_vgpu_device_config) }}"
"""

RETURN = r"""
_value:
  description: One entry per host.
  type: list
  elements: dict
  contains:
    host:
      description: Inventory name.
      type: str
    name:
      description: Kubernetes node name.
      type: str
    workload_type:
      description: Workload type.
      type: str
    vgpu_config_name:
      description: vGPU config name (vm-vgpu hosts), else null.
      type: str
    vgpu_type_names:
      description: vGPU types of that config, or null when unknown (every type of the host is permitted).
      type: list
      elements: str
    labels:
      description: Labels of the node; null values are labels to remove.
      type: dict
    mig_config:
      description: The node's MIG config (C(gpuops_mig_config), its C(nvidia.com/mig.config) label) on container nodes,
        else null.
      type: str
    device_plugin_config:
      description: The node's device plugin config (C(gpuops_device_plugin_config), its C(nvidia.com/device-plugin.config)
        label) on container nodes, else null.
      type: str
    driver_source:
      description:
        - Which NVIDIA driver serves the host, from C(gpu_facts_host.nvidia_driver.source) (V(host) a driver
          installed on the host, V(operator) the GPU Operator's driver container, V(other), or null). A container or
          dra node with a V(host) driver gets C(nvidia.com/gpu.deploy.driver=false), so the operator's driver
          container stays off it.
      type: str
    release_to:
      description:
        - What the labels the collection set earlier become when it no longer wants them, for O(gpuops.sandbox.node_labels#module:nodes[].release_to).
          On C(container) nodes the C(false) deploy labels of a former C(dra) node become C(true), as the GPU Operator
          would set them (it does not relabel a node whose workload label stays C(container)).
      type: dict
    taints:
      description: Taints of the node among the managed ones, or null to leave taints alone.
      type: list
      elements: dict
    gpus:
      description: The host's C(gpu_facts_gpus) fact (empty when not gathered).
      type: list
      elements: dict
    mdev_parents:
      description: The host's C(gpu_facts_mdev_parents) fact (empty when not gathered).
      type: list
      elements: dict
    os_tag:
      description:
        - The OS part the GPU Operator appends to the vGPU Manager image tag for this node (C(ID) and C(VERSION_ID)
          of os-release, the major version only for C(rhel), C(rocky) and C(ol)), from C(gpu_facts_host); null when the
          host's facts were not gathered.
      type: str
    resources:
      description: Resource names the node should advertise in C(status.allocatable) (C(nvidia.com/gpu) on
        container nodes, the sandbox device plugin's names on VM nodes, none on DRA nodes).
      type: list
      elements: str
"""

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
