# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: a GPU node's plan from its inputs and facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: host_plan
short_description: What the preparation of a GPU node would change, reboot and refuse, from its facts
version_added: 1.1.0
description:
  - Takes the facts of M(gpuops.sandbox.gpu_facts) and the host's preparation inputs and returns the host's plan,
    without reading or changing the host. C(playbooks/plan.yml) shows it for every GPU node before anything
    changes.
  - C(refusals), each with C(check), C(problem) and C(fix) - what the preflight role stops the preparation for
    that the facts show (an unsupported operating system; on a VM or dra node a CPU that is neither Intel nor AMD,
    firmware with no IOMMU table, no GPU matching the selectors, GPUs held by a host NVIDIA driver while the GPU
    Operator would bind them or create their vGPU devices, GPUs in MIG mode; a vGPU configuration that does not
    resolve on this host).
  - C(changes), each with C(what), C(detail) and C(reboot) (the reason it needs a reboot, or null) - module files
    written or removed, initramfs images rebuilt, kernel arguments added or taken off, boot entries written,
    functions bound to vfio-pci or given back, SR-IOV VFs and vGPU devices created or removed.
  - C(reboot) with C(required) and C(reasons); C(deferred), what waits for the reboot (a binding that needs the
    IOMMU on); C(empty), true when there is nothing to change and nothing refused (a prepared host).
  - C(calls), the arguments of the module calls the preparation needs (C(nouveau) and C(vfio_modules) for
    M(gpuops.sandbox.kernel_modules), C(cmdline) and C(cmdline_remove) for M(gpuops.sandbox.kernel_cmdline),
    C(vfio_bind) and C(vfio_release) for M(gpuops.sandbox.vfio_bind), C(sriov) and C(sriov_remove) for
    M(gpuops.sandbox.sriov_vfs), C(mdev) and C(mdev_remove) for M(gpuops.sandbox.mdev_create), C(dra_blockers));
    a call not needed is left out. What only a module can decide on the host (a process holding a VFIO group, the
    IOMMU groups before the IOMMU is on, a service holding a DRA node's GPUs) is left to that call.
  - C(expected) - what the host must show afterwards (C(vfio), the functions on vfio-pci; C(kernel_arguments);
    C(mdev), the vGPU device count by parent and type; C(sriov), the VF count by physical function).
  - C(selectors) - the C(vendors) and C(classes) arguments of gpu_facts and vfio_bind, from the vendor, device and
    class IDs.
  - C(settings) - the inputs the calls were worked out from, normalised (C(workload_type), C(vendors), C(class_ids),
    C(vfio_binding), C(vgpu_devices), C(iommu_pt), C(vfio_group_drivers), C(remove_vfio_claims),
    C(dra_stop_blockers), C(dra_driver_version), C(vfio_modules), C(vfio_softdeps)); the host_prepare role checks
    its own inputs against them.
  - A setting of the wrong kind (an unknown workload type or device owner, a list that is not one) raises an
    error naming it.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The C(gpu_facts_gpus) fact.
    type: list
    elements: dict
    required: true
  iommu:
    description: The C(gpu_facts_iommu) fact.
    type: dict
    required: true
  host:
    description: The C(gpu_facts_host) fact.
    type: dict
    required: true
  settings:
    description:
      - The host's inputs - C(workload_type) (required), C(vendor_ids), C(device_ids), C(class_ids),
        C(vfio_binding) and C(vgpu_devices) (V(host) or V(operator)), C(iommu_pt), C(require_gpus),
        C(supported_os) (os-release ID to releases; empty checks none), C(vfio_group_drivers),
        C(remove_vfio_claims), C(dra_stop_blockers), C(dra_driver_version), C(vfio_modules), C(vfio_softdeps),
        and on a vm-vgpu node C(vgpu_device_config), C(vgpu_config_name), C(mdev_parents), C(sriov_pfs),
        C(sriov_numvfs). A key left out or null takes the preparation's default.
    type: dict
    required: true
  mdev_parents:
    description: The C(gpu_facts_mdev_parents) fact (the types a vm-vgpu node's configuration names).
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Work out the plan of the host
  ansible.builtin.set_fact:
    plan: >-
      {{ gpu_facts_gpus | gpuops.sandbox.host_plan(gpu_facts_iommu, gpu_facts_host,
           {'workload_type': 'vm-passthrough', 'vendor_ids': ['10de']}, mdev_parents=gpu_facts_mdev_parents) }}

- name: Say why the host would reboot
  ansible.builtin.debug:
    msg: "{{ plan.reboot.reasons | join(', ') if plan.reboot.required else 'no reboot' }}"
"""

RETURN = r"""
_value:
  description: The plan, as described above.
  type: dict
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.vgpu_plan import vgpu_plan
from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import PlanError
from ansible_collections.gpuops.sandbox.plugins.module_utils._host_plan import host_plan as _host_plan

VGPU_KEYS = ("vgpu_device_config", "vgpu_config_name", "mdev_parents", "sriov_pfs", "sriov_numvfs")


def host_plan(gpus, iommu, host, settings, mdev_parents=None):
    if not isinstance(settings, Mapping):
        raise AnsibleFilterError("host_plan: settings must be a mapping, got %r" % (settings,))
    vgpu, problem = None, None
    if settings.get("workload_type") == "vm-vgpu" and (settings.get("vgpu_devices") or "host") == "host":
        facts = {"gpus": gpus or [], "mdev_parents": mdev_parents or [], "host": host or {}}
        config = settings.get("vgpu_device_config") or {"version": "v1", "vgpu-configs": {}}
        try:
            vgpu = vgpu_plan(facts, config, settings.get("vgpu_config_name") or "",
                             parents=settings.get("mdev_parents") or [], sriov_pfs=settings.get("sriov_pfs") or [],
                             numvfs=settings.get("sriov_numvfs") or 0)
        except AnsibleFilterError as exc:
            problem = str(exc.message)
    try:
        plan = _host_plan({k: v for k, v in settings.items() if k not in VGPU_KEYS}, gpus, iommu, host, vgpu=vgpu)
    except PlanError as exc:
        raise AnsibleFilterError("host_plan: %s" % exc.msg)
    if problem:
        plan["refusals"].append({"check": "vGPU configuration", "problem": problem,
                                 "fix": "set gpuops_vgpu_config_name to a configuration of gpuops_vgpu_device_config "
                                        "that fits the host"})
        plan["empty"] = False
    return plan


class FilterModule:
    """A GPU node's plan."""

    def filters(self):
        return {"host_plan": host_plan}
