# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: vgpu_plan
short_description: Turn a vGPU Device Manager configuration into the VFs and vGPU devices of one host
version_added: 1.0.0
description:
  - Takes the host's facts from M(gpuops.sandbox.gpu_facts) and a configuration in the format of the NVIDIA
    vGPU Device Manager's C(config.yaml) (C(version), C(vgpu-configs)), and returns what the host needs - the
    SR-IOV VF count of each physical function, and one entry per parent and vGPU type for
    M(gpuops.sandbox.mdev_create).
  - C(devices) of a configuration entry is C(all) or a list of indices into the parents, which are the host's
    GPUs in PCI address order (as the vGPU Device Manager counts them) unless O(parents) names them.
  - A type is matched against the parents' mdev types by id, by name, or by name with the C(NVIDIA ) prefix
    (C(A10-8Q) matches C(NVIDIA A10-8Q)); a type not visible yet (vendor-specific vGPU, types that appear after
    the VFs) is passed on as C(NVIDIA <type>) for the module to resolve.
  - Fails naming the problem (unknown configuration name, bad index, bad count) before anything is changed.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: A dict with C(gpus) (C(gpu_facts_gpus)), C(mdev_parents) (C(gpu_facts_mdev_parents)) and C(host) (C(gpu_facts_host)).
    type: dict
    required: true
  config:
    description: The vGPU device configuration (C(version) and C(vgpu-configs)).
    type: dict
    required: true
  name:
    description: The name of the configuration to apply, a key of C(vgpu-configs).
    type: str
    required: true
  parents:
    description: mdev parents (names in C(/sys/class/mdev_bus) or PCI addresses) instead of the GPUs.
    type: list
    elements: str
    default: []
  sriov_pfs:
    description: SR-IOV physical functions to enable VFs on; empty selects the GPUs that are SR-IOV capable.
    type: list
    elements: str
    default: []
  numvfs:
    description: VFs per physical function; V(0) means its C(sriov_totalvfs).
    type: int
    default: 0
"""

EXAMPLES = r"""
- name: Work out the vGPU devices of a host
  ansible.builtin.set_fact:
    plan: >-
      {{ {'gpus': gpu_facts_gpus, 'mdev_parents': gpu_facts_mdev_parents, 'host': gpu_facts_host}
         | gpuops.sandbox.vgpu_plan(gpuops_vgpu_device_config, 'A10-8Q') }}
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    sriov:
      description: VF count per physical function address.
      type: dict
    mdev:
      description: One entry per parent and type - C(parent), C(type), C(count), C(pf) (true when C(parent) is an
        SR-IOV physical function whose VFs carry the devices).
      type: list
      elements: dict
    types:
      description: The mdev type ids (or names) the configuration uses.
      type: list
      elements: str
"""

import re

from ansible.errors import AnsibleFilterError

PCI_RE = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _resolve_type(spec, known):
    for info in known:
        if info.get("id") == spec:
            return spec
    for candidate in (spec, "NVIDIA " + spec):
        for info in known:
            if info.get("name") == candidate:
                return info["id"]
    return spec if spec.startswith("NVIDIA ") else "NVIDIA " + spec


def _count(value, where):
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value), 10)
        except ValueError:
            raise AnsibleFilterError("%s: count %r is not a whole number" % (where, value))
    if value < 0:
        raise AnsibleFilterError("%s: count %d is negative" % (where, value))
    return value


def vgpu_plan(facts, config, name, parents=None, sriov_pfs=None, numvfs=0):
    facts = facts or {}
    # VFs of SR-IOV GPUs show up among the GPUs once enabled; the parents are the physical GPUs.
    gpus = [gpu for gpu in (facts.get("gpus") or []) if not gpu.get("is_vf")]
    host = facts.get("host") or {}
    known = [t for parent in (facts.get("mdev_parents") or []) for t in (parent.get("types") or [])]
    configs = (config or {}).get("vgpu-configs")
    if not isinstance(configs, dict):
        raise AnsibleFilterError("the vGPU device configuration has no 'vgpu-configs' mapping")
    if name not in configs:
        raise AnsibleFilterError("vGPU configuration %r is not defined; defined: %s"
                                 % (name, ", ".join(sorted(configs)) or "none"))
    entries = configs[name]
    if not isinstance(entries, list):
        raise AnsibleFilterError("vGPU configuration %r must be a list of entries with devices and vgpu-devices" % name)

    pick_from = list(parents or []) or [gpu["address"] for gpu in gpus]
    sriov = {}
    for pf in list(sriov_pfs or []) or [g["address"] for g in gpus if g.get("sriov_totalvfs")]:
        total = ((host.get("sriov") or {}).get(pf) or {}).get("totalvfs", 0)
        if not total:
            raise AnsibleFilterError("%s is not an SR-IOV physical function (no sriov_totalvfs) on this host" % pf)
        wanted = _count(numvfs, "numvfs") or total
        if wanted > total:
            raise AnsibleFilterError("numvfs %d is more than the %d VFs %s supports (sriov_totalvfs)" % (wanted, total, pf))
        sriov[pf] = wanted

    calls, types = [], []
    for index, entry in enumerate(entries):
        where = "vGPU configuration %r entry %d" % (name, index)
        if not isinstance(entry, dict) or not isinstance(entry.get("vgpu-devices"), dict):
            raise AnsibleFilterError("%s: needs a 'vgpu-devices' mapping of type to count" % where)
        devices = entry.get("devices", "all")
        if devices == "all":
            picked = pick_from
        elif isinstance(devices, list):
            picked = []
            for item in devices:
                idx = _count(item, where + " devices")
                if idx >= len(pick_from):
                    raise AnsibleFilterError("%s: device index %d is out of range; the host has %d parent(s): %s"
                                             % (where, idx, len(pick_from), ", ".join(pick_from) or "none"))
                picked.append(pick_from[idx])
        else:
            raise AnsibleFilterError("%s: devices must be 'all' or a list of indices, got %r" % (where, devices))
        for spec, count in entry["vgpu-devices"].items():
            count = _count(count, "%s type %s" % (where, spec))
            resolved = _resolve_type(str(spec), known)
            if resolved not in types:
                types.append(resolved)
            if count == 0:
                continue
            for parent in picked:
                calls.append({"parent": parent, "type": resolved, "count": count,
                              "pf": bool(PCI_RE.match(parent)) and not parents and parent in sriov})
    return {"sriov": sriov, "mdev": calls, "types": types}


class FilterModule:
    """Filters for vGPU host preparation."""

    def filters(self):
        return {"vgpu_plan": vgpu_plan}
