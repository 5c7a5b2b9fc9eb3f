# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A GPU node's plan, worked out from its inputs and its facts: what its preparation would change, whether it would
reboot and why, what refuses it, and the arguments of each module call it needs.

This file is private to the gpuops.sandbox collection: its interface may change at any time.

Pure: it takes the inputs of the host roles (``settings``) and the facts of gpu_facts (``gpu_facts_gpus``,
``gpu_facts_iommu``, ``gpu_facts_host``, and the vGPU plan of the vgpu_plan filter on a vm-vgpu node), and returns
plain data. Nothing here reads the host. What only the modules can decide on the host (a process holding a VFIO
group, a function's IOMMU group before the IOMMU is on, a service holding a DRA node's GPUs) is left to them: the
plan names the call that decides it. ``host_plan`` raises ``PlanError`` for a setting of the wrong kind.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpuops.sandbox.plugins.module_utils import _modprobe
from ansible_collections.gpuops.sandbox.plugins.module_utils._pci import driver_allows_vfio
from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import (
    IOMMU_WORKLOAD_TYPES,
    WORKLOAD_TYPES,
    PlanError,
)

OWNERS = ("host", "operator")
IOMMU_ARGUMENTS = {"intel": "intel_iommu=on"}
IOMMU_PT = "iommu=pt"
# What a container node takes off the kernel command line when this collection's record of its arguments is there.
IOMMU_ARGUMENTS_OFF = ("intel_iommu=on", "amd_iommu=on", "iommu=pt")
VFIO_DRIVERS = ("vfio-pci",)

DEFAULTS = {
    "vendor_ids": ["10de"],
    "device_ids": [],
    "class_ids": ["030000", "030200"],
    "vfio_binding": "host",
    "vgpu_devices": "host",
    "iommu_pt": True,
    "require_gpus": True,
    "supported_os": {},
    "vfio_group_drivers": ["snd_hda_intel", "xhci_hcd", "nvidia-gpu", "ucsi_ccg"],
    "remove_vfio_claims": False,
    "dra_stop_blockers": [],
    "dra_driver_version": "",
    "vfio_modules": ["vfio", "vfio_iommu_type1", "vfio_pci"],
    "vfio_softdeps": ["nvidia", "nouveau"],
    # The names host_prepare gives kernel_modules for its sets of module files (the stems of
    # /etc/modprobe.d/<name>.conf and /etc/modules-load.d/<name>.conf); gpu_facts is given the same names
    # (module_files) to find them by. The roles take them from gpuops_module_files.
    "module_files": dict(_modprobe.DEFAULT_SETS),
}


# The settings the plan's calls depend on, returned with the plan (the vendor and device IDs as their selectors).
PLANNED_SETTINGS = ("workload_type", "vendors", "class_ids", "vfio_binding", "vgpu_devices", "iommu_pt",
                    "vfio_group_drivers", "remove_vfio_claims", "dra_stop_blockers", "dra_driver_version",
                    "vfio_modules", "vfio_softdeps", "module_files")


def gpu_selectors(vendor_ids, device_ids=None):
    """The vendors argument of gpu_facts and vfio_bind: the vendor IDs, or each vendor with each device ID."""
    vendor_ids = [str(v) for v in _strings("gpuops_gpu_vendor_ids", vendor_ids)]
    device_ids = [str(d) for d in _strings("gpuops_gpu_device_ids", device_ids or [])]
    if not device_ids:
        return vendor_ids
    return ["%s:%s" % (vendor, device) for vendor in vendor_ids for device in device_ids]


def _strings(name, value):
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise PlanError("%s must be a list of strings, got %r" % (name, value))
    bad = [item for item in value if not isinstance(item, (str, int)) or isinstance(item, bool)]
    if bad:
        raise PlanError("%s must be a list of strings; %r is not one" % (name, bad[0]))
    return list(value)


def _flag(name, value):
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise PlanError("%s must be true or false, got %r" % (name, value))


def _settings(settings):
    if not isinstance(settings, Mapping):
        raise PlanError("the plan's settings must be a mapping, got %r" % (settings,))
    merged = dict(DEFAULTS)
    merged.update({key: value for key, value in settings.items() if value is not None})
    kind = merged.get("workload_type")
    if kind not in WORKLOAD_TYPES:
        raise PlanError("workload type %r is not one of %s" % (kind, ", ".join(WORKLOAD_TYPES)))
    for name in ("vfio_binding", "vgpu_devices"):
        if merged[name] not in OWNERS:
            raise PlanError("%s %r is not one of %s" % (name, merged[name], ", ".join(OWNERS)))
    for name in ("iommu_pt", "require_gpus", "remove_vfio_claims"):
        merged[name] = _flag(name, merged[name])
    for name in ("class_ids", "vfio_group_drivers", "dra_stop_blockers", "vfio_modules", "vfio_softdeps"):
        merged[name] = [str(item) for item in _strings(name, merged[name])]
    if not isinstance(merged["supported_os"], Mapping):
        raise PlanError("supported_os must map an os-release ID to its releases, got %r" % (merged["supported_os"],))
    if isinstance(merged["module_files"], Mapping):
        merged["module_files"] = dict(merged["module_files"])
    problem = _modprobe.sets_problem(merged["module_files"])
    if problem:
        raise PlanError("module_files: %s" % problem)
    merged["vendors"] = gpu_selectors(merged["vendor_ids"], merged["device_ids"])
    merged["dra_driver_version"] = str(merged["dra_driver_version"])
    return merged


class _Plan:
    """The plan being built: its changes (each with whether it needs a reboot), refusals and calls."""

    def __init__(self):
        self.changes, self.refusals, self.calls, self.deferred = [], [], {}, []

    def change(self, what, detail, reboot=None):
        self.changes.append({"what": what, "detail": detail, "reboot": reboot})

    def refuse(self, check, problem, fix):
        self.refusals.append({"check": check, "problem": problem, "fix": fix})


def _os_refusals(plan, host, supported):
    os_ = host.get("os") or {}
    if not supported:
        return
    os_id, version, major = os_.get("id"), os_.get("version_id"), os_.get("major")
    releases = [str(r) for r in supported.get(os_id) or []]
    if os_id in supported and (version in releases or major in releases):
        return
    plan.refuse("operating system",
                "%s (ID=%s, VERSION_ID=%s) is not supported" % (os_.get("pretty_name") or os_id, os_id, version),
                "use one of: %s" % ", ".join("%s %s" % (k, "/".join(str(r) for r in v)) for k, v in supported.items()))


def _gpu_refusals(plan, s, gpus, iommu, host):
    kind = s["workload_type"]
    if kind not in IOMMU_WORKLOAD_TYPES:
        return
    vendor = iommu.get("platform_vendor")
    if vendor not in ("intel", "amd"):
        plan.refuse("CPU vendor", "the CPU vendor %s is neither Intel nor AMD" % (iommu.get("cpu_vendor_id") or "unknown"),
                    "make the host a container node")
    elif not iommu.get("firmware_tables"):
        plan.refuse("IOMMU in the firmware", "the firmware has no IOMMU table (no ACPI DMAR or IVRS)",
                    "turn on %s in the firmware setup, or make the host a container node"
                    % ("VT-d" if vendor == "intel" else "AMD-Vi (IOMMU)"))
    if not gpus and s["require_gpus"]:
        plan.refuse("GPUs", "no PCI function matches the GPU selectors (vendors %s, classes %s)"
                    % (",".join(s["vendors"]), ",".join(s["class_ids"])),
                    "check gpuops_gpu_vendor_ids, gpuops_gpu_device_ids and gpuops_gpu_class_ids")
    driver = host.get("nvidia_driver") or {}
    held = [g["address"] for g in gpus if g.get("driver") == "nvidia"] if driver.get("source") == "host" else []
    operator_binds = kind == "vm-passthrough" and s["vfio_binding"] == "operator"
    operator_vgpu = kind == "vm-vgpu" and s["vgpu_devices"] == "operator"
    # The operator's vfio-manager skips GPUs a host driver holds, without a word, and its vGPU Manager cannot load
    # beside that driver; with the collection binding the GPUs, vfio_bind takes them off it and keeps them off.
    if held and (operator_binds or operator_vgpu):
        plan.refuse("host driver", "the GPUs %s are held by the NVIDIA driver installed on the host (%s%s), %s"
                    % (", ".join(held), driver.get("host_module"),
                       ", version %s" % driver["version"] if driver.get("version") else "",
                       "which the GPU Operator's vfio-manager leaves alone, so they would never reach VMs"
                       if operator_binds else "beside which the GPU Operator's vGPU Manager cannot load"),
                    "remove the host's NVIDIA driver packages" + (
                        ", or let the collection bind the GPUs (gpuops_vfio_binding: host)" if operator_binds else ""))
    mig = [g["address"] for g in gpus if g.get("mig_instances")]
    if mig:
        plan.refuse("MIG mode", "the GPUs %s have MIG GPU instances (MIG mode, from the host's time as a container "
                    "node)" % ", ".join(mig),
                    "keep the host a container node with gpuops_mig_config: all-disabled, run the cluster play and "
                    "wait until its node's nvidia.com/mig.config.state is success; then switch it")


def _module_files(plan, s, host, gpus):
    """The nouveau and vfio module files, and which initramfs images a change of them rebuilds."""
    managed = host.get("managed_files") or {}
    kind = s["workload_type"]
    rebuild = False
    names = s["module_files"]
    plan.calls["nouveau"] = {"name": names["nouveau"], "blacklist": ["nouveau"], "options": {"nouveau": "modeset=0"},
                             "rebuild": "never" if kind == "vm-passthrough" else "changed"}
    if not managed.get("nouveau"):
        plan.change("module files", "blacklist nouveau (%s)" % _modprobe.set_files(names["nouveau"])["modprobe"],
                    "nouveau settings changed")
        rebuild = True
    if any(g.get("driver") == "nouveau" for g in gpus):
        plan.change("driver", "nouveau holds GPUs until the reboot", "nouveau is loaded")
    vfio_files = managed.get("vfio_modules") or []
    if kind == "vm-passthrough":
        plan.calls["vfio_modules"] = {
            "name": names["vfio"], "load": s["vfio_modules"], "initramfs": s["vfio_modules"],
            "softdeps": {driver: ["vfio-pci"] for driver in s["vfio_softdeps"]}}
        if len(vfio_files) < 2:
            plan.change("module files", "load %s at boot, in the initramfs, before %s (%s)"
                        % (", ".join(s["vfio_modules"]), ", ".join(s["vfio_softdeps"]), names["vfio"]),
                        "vfio boot settings changed")
            rebuild = True
    else:
        plan.calls["vfio_modules"] = {"name": names["vfio"], "state": "absent"}
        rules = managed.get("vfio_rules") or []
        if vfio_files or rules:
            plan.change("module files", "remove the vfio boot settings of an earlier workload type (%s)"
                        % ", ".join(vfio_files + rules), "vfio boot settings changed")
            rebuild = True
    return rebuild


def _initramfs(plan, host, rebuild):
    kernels = host.get("kernels") or []
    running = [k for k in kernels if k.get("running")]
    if rebuild:
        plan.change("initramfs", "rebuild the initramfs of the running kernel %s" % host.get("kernel"))
    elif any(k.get("initramfs_stale") for k in running):
        plan.change("initramfs", "rebuild the initramfs of the running kernel %s, older than the collection's files"
                    % host.get("kernel"), "initramfs of the running kernel rebuilt")
    for kernel in kernels:
        if kernel.get("running"):
            continue
        if kernel.get("initramfs_stale") or rebuild:
            plan.change("initramfs", "rebuild the initramfs of the installed kernel %s" % kernel.get("version"))
        missing = sorted({arg for entry in kernel.get("entries") or [] for arg in entry.get("missing") or []})
        if missing:
            plan.change("kernel arguments", "write %s into the boot entries of kernel %s"
                        % (" ".join(missing), kernel.get("version")))
    if (host.get("managed_files") or {}).get("pending"):
        plan.change("initramfs", "finish the initramfs or boot loader generation a run cut short (%s)"
                    % ", ".join(host["managed_files"]["pending"]), "an interrupted boot file generation finished")


def _cmdline(plan, s, iommu, host, cpu_vendor):
    flags = iommu.get("cmdline_flags") or {}
    running = set((iommu.get("cmdline") or "").split())
    kind = s["workload_type"]
    recorded = bool((host.get("managed_files") or {}).get("kernel_cmdline"))
    entries = [e for k in host.get("kernels") or [] if k.get("running") for e in k.get("entries") or []]
    if kind in IOMMU_WORKLOAD_TYPES:
        wanted = ([IOMMU_ARGUMENTS[cpu_vendor]] if cpu_vendor in IOMMU_ARGUMENTS else []) + (
            [IOMMU_PT] if s["iommu_pt"] else [])
        if not wanted:
            return []
        plan.calls["cmdline"] = {"arguments": wanted}
        absent = [arg for arg in wanted if arg not in running and flags.get(arg.split("=")[0]) != arg.split("=")[1]]
        if not absent:
            return wanted
        if recorded and entries and not any(set(absent) & set(e.get("missing") or []) for e in entries):
            plan.change("kernel arguments", "boot with %s, already in the boot entries" % " ".join(absent),
                        "kernel command line changed")
        else:
            plan.change("kernel arguments", "add %s to the kernel command line" % " ".join(absent),
                        "kernel command line changed")
        return wanted
    if kind == "container" and recorded:
        plan.calls["cmdline_remove"] = {"arguments": list(IOMMU_ARGUMENTS_OFF), "state": "absent"}
        present = [arg for arg in IOMMU_ARGUMENTS_OFF if arg in running]
        if present:
            plan.change("kernel arguments", "take %s off the kernel command line" % " ".join(present),
                        "kernel command line changed")
    return []


def _vfio_functions(gpus):
    """The GPUs and their IOMMU group members, by address (members carry their driver and driver_override)."""
    seen = {}
    for gpu in gpus:
        seen.setdefault(gpu["address"], gpu)
        for member in gpu.get("iommu_group_members") or []:
            seen.setdefault(member.get("address"), member)
    return seen


def _bound_by_vfio_bind(address, function, gpus):
    """Whether vfio_bind (include_group) puts the function on vfio-pci: every GPU it selects, and of their groups'
    other functions each PCI function that is no bridge and not parked on a stub driver (pci-stub leaves the group
    usable through VFIO, so vfio_bind leaves it there)."""
    if function.get("is_bridge"):
        return False
    if any(g["address"] == address for g in gpus):
        return True
    driver = function.get("driver")
    if function.get("pci") is False:
        return False
    return driver is None or not driver_allows_vfio(driver) or driver in VFIO_DRIVERS or driver.endswith("_vfio_pci")


def _on_vfio(function):
    return function.get("driver") in VFIO_DRIVERS or (function.get("driver_override") or "") in VFIO_DRIVERS


def _bindings(plan, s, gpus, iommu, host):
    kind = s["workload_type"]
    selection = {"vendors": s["vendors"], "classes": s["class_ids"], "include_group": True}
    functions = _vfio_functions(gpus)
    if kind == "vm-passthrough" and s["vfio_binding"] == "host" and gpus:
        plan.calls["vfio_bind"] = dict(selection, allowed_group_drivers=s["vfio_group_drivers"], persistent=True)
        bound = sorted(a for a, f in functions.items() if _bound_by_vfio_bind(a, f, gpus))
        off = [a for a in bound if not _on_vfio(functions[a])]
        if off and not iommu.get("enabled"):
            plan.deferred.append("vfio-pci binding (the IOMMU is not on yet)")
            plan.change("binding", "bind %s to vfio-pci after the reboot turns the IOMMU on" % ", ".join(off))
        elif off:
            plan.change("binding", "bind %s to vfio-pci" % ", ".join(off))
        return bound
    if kind != "vm-passthrough":
        left = sorted(a for a, f in functions.items() if _on_vfio(f))
        if left or (host.get("managed_files") or {}).get("vfio_rules"):
            plan.calls["vfio_release"] = dict(selection, state="absent", remove_claims=s["remove_vfio_claims"])
        if left and kind != "dra":
            plan.change("binding", "give %s back from vfio-pci to their host drivers" % ", ".join(left))
    return []


def _vgpu(plan, s, host, vgpu):
    kind = s["workload_type"]
    live = host.get("mdev_devices") or []
    sriov = host.get("sriov") or {}
    managed = host.get("managed_files") or {}
    expected = {"mdev": {}, "sriov": {}}
    if kind == "vm-vgpu" and s["vgpu_devices"] == "host" and vgpu is not None:
        plan.calls["sriov"] = [{"pf": pf, "count": count, "persistent": True}
                               for pf, count in sorted((vgpu.get("sriov") or {}).items())]
        for pf, count in sorted((vgpu.get("sriov") or {}).items()):
            expected["sriov"][pf] = count
            now = (sriov.get(pf) or {}).get("numvfs") or 0
            if now != count:
                plan.change("VFs", "set %s to %d SR-IOV VFs (now %d)" % (pf, count, now))
        types = vgpu.get("types") or []
        stale = sorted({(m.get("parent"), m.get("type_id")) for m in live if m.get("type_id") not in types})
        plan.calls["mdev_remove"] = [{"type": t, "parents": [p], "state": "absent"} for p, t in stale]
        for parent, type_id in stale:
            plan.change("vGPU devices", "remove the %s devices of %s (no longer in the configuration)" % (type_id, parent))
        plan.calls["mdev"] = []
        for entry in vgpu.get("mdev") or []:
            call = {"type": entry["type"], "count": entry["count"], "persistent": True}
            call.update({"pf": entry["parent"]} if entry.get("pf") else {"parents": [entry["parent"]]})
            plan.calls["mdev"].append(call)
            key = "%s %s" % (entry["parent"], entry["type"])
            expected["mdev"][key] = entry["count"]
            if entry.get("pf"):
                # Counted over the PF's VFs, which may not exist yet.
                have = sum(1 for m in live if m.get("type_id") == entry["type"] and m.get("parent") != entry["parent"])
                want = entry["count"] * ((vgpu.get("sriov") or {}).get(entry["parent"]) or 1)
            else:
                have = sum(1 for m in live if m.get("type_id") == entry["type"] and m.get("parent") == entry["parent"])
                want = entry["count"]
            if have < want:
                plan.change("vGPU devices", "create %d %s device(s) on %s" % (want - have, entry["type"], entry["parent"]))
        return expected
    if kind != "vm-vgpu":
        if managed.get("mdev_definitions"):
            pairs = sorted({(m.get("parent"), m.get("type_id")) for m in live})
            plan.calls["mdev_remove"] = [{"type": t, "parents": [p], "state": "absent"} for p, t in pairs]
            plan.change("vGPU devices", "remove the vGPU devices of an earlier workload type (%d live) and their boot "
                        "definitions" % len(live))
        recorded = list(host.get("sriov_recorded") or [])
        if recorded:
            plan.calls["sriov_remove"] = [{"pf": pf, "state": "absent", "persistent": True} for pf in recorded]
            plan.change("VFs", "turn the SR-IOV VFs of %s off" % ", ".join(recorded))
    return expected


def host_plan(settings, gpus, iommu, host, vgpu=None):
    """The plan of one host; see the module docstring. ``vgpu`` is the vgpu_plan filter's result on a vm-vgpu node
    whose vGPU devices the host creates (None elsewhere, or when its configuration did not resolve)."""
    s = _settings(settings)
    gpus = [g for g in gpus or [] if isinstance(g, Mapping)]
    iommu, host = iommu or {}, host or {}
    if not isinstance(iommu, Mapping) or not isinstance(host, Mapping):
        raise PlanError("the facts of gpu_facts (gpu_facts_iommu, gpu_facts_host) must be mappings")
    plan = _Plan()
    cpu_vendor = iommu.get("platform_vendor") or "unknown"
    _os_refusals(plan, host, s["supported_os"])
    _gpu_refusals(plan, s, gpus, iommu, host)
    rebuild = _module_files(plan, s, host, gpus)
    _initramfs(plan, host, rebuild)
    arguments = _cmdline(plan, s, iommu, host, cpu_vendor)
    vfio = _bindings(plan, s, gpus, iommu, host)
    expected = _vgpu(plan, s, host, vgpu)
    if s["workload_type"] == "dra":
        plan.calls["dra_blockers"] = {"stop": s["dra_stop_blockers"], "dra_driver_version": s["dra_driver_version"]}
    reasons = []
    for change in plan.changes:
        if change["reboot"] and change["reboot"] not in reasons:
            reasons.append(change["reboot"])
    return {
        "workload_type": s["workload_type"],
        "cpu_vendor": cpu_vendor,
        "selectors": {"vendors": s["vendors"], "classes": s["class_ids"]},
        "gpus": [{"address": g["address"], "driver": g.get("driver"), "name": g.get("device_name")} for g in gpus],
        "refusals": plan.refusals,
        "changes": plan.changes,
        "reboot": {"required": bool(reasons), "reasons": reasons},
        "deferred": plan.deferred,
        "calls": plan.calls,
        "expected": {"vfio": vfio, "kernel_arguments": arguments, "mdev": expected["mdev"],
                     "sriov": expected["sriov"]},
        "empty": not plan.changes and not plan.refusals,
        # What the calls were worked out from: host_prepare checks that its own inputs are these.
        "settings": {name: s[name] for name in PLANNED_SETTINGS},
    }
