# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: gpu_sharing_problems
short_description: What is wrong with the GPU sharing and driver upgrade settings of container nodes
version_added: 1.0.0
description:
  - Checks the inventory's GPU sharing settings before anything changes and returns one sentence per problem
    (empty when all is well). Each sentence names the host, the GPU and the value, and what would be accepted.
  - Per host (from the host variables given as input), C(gpuops_mig_config) (the node's C(nvidia.com/mig.config))
    must be a configuration of O(mig_configs) (or, without them, of the GPU Operator's default mig-parted
    configuration) whose profiles exist on each GPU the host's C(gpu_facts_gpus) fact lists and fit in it (the
    compute and memory slices of the instances add up to no more than the GPU has; the MIG Manager has the
    final word on placement). With O(mig_strategy) V(single) a node's GPUs must get one MIG device type.
    C(gpuops_device_plugin_config) (the node's C(nvidia.com/device-plugin.config)) must be a key of
    O(plugin_configs). Both are for C(container) nodes only, and both are names (a list or a mapping is refused).
  - A host's GPU facts (C(gpu_facts_gpus), C(gpu_facts_host), C(gpu_facts_mdev_parents), which an inventory gives for
    a node the collection does not read) must have the shape M(gpuops.sandbox.gpu_facts) returns; each bad value is a
    problem naming the host and the key (see P(gpuops.sandbox.inventory_gpu_facts#filter)).
  - A MIG config asked of a GPU that neither the collection nor the GPU Operator's default MIG configuration knows
    MIG profiles for (an L40S, L4, A10, ...) is refused, since such a GPU has no MIG; it is shared with time-slicing or
    MPS.
  - Globally, the shape of O(mig_configs), O(mig_profiles), O(plugin_configs) (time-slicing and MPS, replicas
    from 2, resources the device plugin shares) and O(upgrade_policy) (the chart's C(driver.upgradePolicy)).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: Host variables of the GPU hosts (mappings, as C(map('extract', hostvars)) gives them).
    type: list
    elements: dict
    required: true
  mig_strategy:
    description: The GPU Operator's C(mig.strategy).
    type: str
    default: single
  mig_configs:
    description: The user's mig-parted C(mig-configs); empty means the GPU Operator's default configuration.
    type: dict
  mig_profiles:
    description: MIG profiles of GPUs the collection does not know, by PCI ID (C(10de:2335)); each C(model),
      C(compute) and C(memory) slices and C(profiles) (name to C(max), C(compute), C(memory)).
    type: dict
  plugin_configs:
    description: The device plugin's configurations by name (C(version), C(flags), C(sharing)).
    type: dict
  plugin_config_default:
    description: The device plugin configuration of nodes without C(nvidia.com/device-plugin.config).
    type: str
  upgrade_policy:
    description: The driver upgrade policy (C(driver.upgradePolicy) keys).
    type: dict
"""

EXAMPLES = r"""
- name: Check the GPU sharing settings
  ansible.builtin.assert:
    that: __problems | length == 0
    fail_msg: "{{ __problems | join('; ') }}"
  vars:
    __problems: >-
      {{ groups['gpu_nodes'] | map('extract', hostvars)
         | gpuops.sandbox.gpu_sharing_problems(mig_strategy='mixed', mig_configs=gpuops_mig_configs | default({})) }}
"""

RETURN = r"""
_value:
  description: One sentence per problem; empty when the settings are fine.
  type: list
  elements: str
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils import _sharing
from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import host_workload_type
from ansible_collections.gpuops.sandbox.plugins.module_utils._inventory_facts import check_facts, shown


def _not_a_name(value):
    """Whether a config name given in the inventory is a list, a mapping or a boolean, which no config is named."""
    return isinstance(value, (list, tuple, Mapping, bool))


def sharing_problems(hostvars_list, mig_strategy="single", mig_configs=None, mig_profiles=None, plugin_configs=None,
                     plugin_config_default=None, upgrade_policy=None):
    if not isinstance(hostvars_list, list):
        raise AnsibleFilterError("gpu_sharing_problems takes the list of the GPU hosts' host variables")
    problems = []
    if mig_strategy not in _sharing.MIG_STRATEGIES:
        problems.append("gpuops_mig_strategy is %r; accepted: %s" % (mig_strategy, ", ".join(_sharing.MIG_STRATEGIES)))
    user_configs = None
    if mig_configs:
        config_problems = _sharing.check_mig_configs(mig_configs)
        if isinstance(mig_configs, dict) and _sharing.MIG_DISABLED not in mig_configs:
            config_problems.append("gpuops_mig_configs has no %s config: the MIG Manager applies it to nodes without "
                                   "nvidia.com/mig.config, and a node the collection no longer gives a MIG config goes "
                                   "back to it" % _sharing.MIG_DISABLED)
        problems.extend(config_problems)
        user_configs = None if config_problems else mig_configs
    table, table_problems = _sharing.profile_table(mig_profiles if isinstance(mig_profiles, dict) else None)
    if mig_profiles and not isinstance(mig_profiles, dict):
        table_problems.append("gpuops_mig_profiles must be a mapping of PCI IDs to GPU descriptions")
    problems.extend(table_problems)
    plugin_configs = plugin_configs or {}
    if not isinstance(plugin_configs, dict):
        problems.append("gpuops_device_plugin_configs must be a mapping of config names to device plugin configs")
        plugin_configs = {}
    for name, config in plugin_configs.items():
        problems.extend(_sharing.check_plugin_config(name, config))
    if plugin_config_default and _not_a_name(plugin_config_default):
        problems.append("gpuops_device_plugin_config_default is %s, which is not the name of one of "
                        "gpuops_device_plugin_configs; accepted: one of their names as a string (it has: %s)"
                        % (shown(plugin_config_default), ", ".join(sorted(plugin_configs)) or "none"))
    elif plugin_config_default and plugin_config_default not in plugin_configs:
        problems.append("gpuops_device_plugin_config_default is %r, which gpuops_device_plugin_configs does not have "
                        "(it has: %s)" % (plugin_config_default, ", ".join(sorted(plugin_configs)) or "none"))
    if upgrade_policy:
        problems.extend(_sharing.check_upgrade_policy(upgrade_policy))
    for hv in hostvars_list:
        # A play hands each host's variables as a Mapping (ansible-core 2.19: HostVarsVars), which is not a dict.
        if not isinstance(hv, Mapping):
            continue
        host = hv.get("inventory_hostname")
        facts, fact_problems = check_facts(host, hv)
        if fact_problems:
            problems.extend(fact_problems)
            continue
        node = hv.get("gpuops_node_name") or host
        wtype = host_workload_type(hv)
        if not wtype:
            continue  # gpu_hosts refuses the host, naming it
        mig_config = hv.get("gpuops_mig_config") or None
        plugin_config = hv.get("gpuops_device_plugin_config") or None
        asked = [n for n, v in (("gpuops_mig_config", mig_config), ("gpuops_device_plugin_config", plugin_config)) if v]
        if asked and wtype != "container":
            verb = "are" if len(asked) > 1 else "is"
            problems.append("host %s: %s %s for container nodes, where the GPU Operator's MIG Manager and device plugin "
                            "run; this host is a %s node" % (host, " and ".join(asked), verb, wtype))
            continue
        if mig_config and _not_a_name(mig_config):
            problems.append("host %s: gpuops_mig_config is %s, which is not the name of a MIG config; accepted: the "
                            "name of one, as a string" % (host, shown(mig_config)))
        elif mig_config and not (mig_configs and user_configs is None):
            found, _summary = _sharing.check_mig_config(node, facts.get("gpu_facts_gpus") or [], str(mig_config),
                                                        user_configs, table, mig_strategy)
            problems.extend("host %s: %s" % (host, p) for p in found)
        if plugin_config and _not_a_name(plugin_config):
            problems.append("host %s: gpuops_device_plugin_config is %s, which is not the name of one of "
                            "gpuops_device_plugin_configs; accepted: one of their names as a string (it has: %s)"
                            % (host, shown(plugin_config), ", ".join(sorted(plugin_configs)) or "none"))
        elif plugin_config and plugin_config not in plugin_configs:
            problems.append("host %s: gpuops_device_plugin_config is %r, which gpuops_device_plugin_configs does not "
                            "have (it has: %s)" % (host, plugin_config, ", ".join(sorted(plugin_configs)) or "none"))
    return problems


class FilterModule:
    """Filters for the cluster side."""

    def filters(self):
        return {"gpu_sharing_problems": sharing_problems}
