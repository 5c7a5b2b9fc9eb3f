# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: a GPU node's plan from its inputs and facts."""

from __future__ import annotations

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
    if vgpu is not None or problem:
        # The vGPU inputs the sriov and mdev calls were worked out from: host_prepare checks its own against them.
        plan["settings"]["vgpu"] = vgpu_settings(settings)
    return plan


def vgpu_settings(settings):
    """A vm-vgpu node's vGPU inputs, normalised as host_prepare compares them."""
    try:
        numvfs = int(settings.get("sriov_numvfs") or 0)
    except (TypeError, ValueError):
        numvfs = settings.get("sriov_numvfs")
    return {"config": settings.get("vgpu_device_config") or {"version": "v1", "vgpu-configs": {}},
            "config_name": str(settings.get("vgpu_config_name") or ""),
            "mdev_parents": [str(p) for p in settings.get("mdev_parents") or []],
            "sriov_pfs": [str(p) for p in settings.get("sriov_pfs") or []],
            "sriov_numvfs": numvfs}


class FilterModule:
    """A GPU node's plan."""

    def filters(self):
        return {"host_plan": host_plan}
