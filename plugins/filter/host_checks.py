# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: the checks of a prepared GPU node against its workload type (the role host_verify)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import WORKLOAD_TYPES, IOMMU_WORKLOAD_TYPES
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import SysfsError, normalize_pci_address
from ansible_collections.gpuops.sandbox.plugins.module_utils._vfio import is_vfio_driver

NAME = "host_checks"
STAGES = ("after-reboot", "final")
MODES = ("host", "operator")
CPU_VENDORS = ("intel", "amd", "unknown")
READ_ATTRIBUTES = ("uevent", "driver_override")
NULL_OVERRIDE = "(null)"


def _fail(text, *args):
    raise AnsibleFilterError("%s: %s" % (NAME, text % args))


def _choice(name, value, choices):
    if not isinstance(value, str) or value not in choices:
        _fail("%s must be one of %s, got %r", name, ", ".join(choices), value)
    return str(value)


def _flag(name, value):
    try:
        return boolean(value, strict=True)
    except TypeError:
        _fail("%s must be a boolean, got %r", name, value)
    return False  # not reached


def _mapping(name, value):
    if not isinstance(value, Mapping):
        _fail("%s must be a dict, got %r", name, value)
    return value


def _plain(value):
    """Plain str, list and dict copies of template data, so that details read as the Jinja template wrote them."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return dict((_plain(k), _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _address(name, value):
    try:
        return normalize_pci_address(value)
    except SysfsError as exc:
        _fail("%s: %s", name, exc)
    return None  # not reached


def _driver_name(name, value):
    if value is not None and (not isinstance(value, str) or not value):
        _fail("%s must be a driver name or null, got %r", name, value)
    return None if value is None else str(value)


def _override(value):
    """A read driver_override: None when unset (empty, or the kernel's "(null)")."""
    if value is None:
        return None
    value = str(value).strip()
    return None if value in ("", NULL_OVERRIDE) else value


def _label(driver):
    return driver if driver else "no driver"


def _gpus(value):
    if not isinstance(value, (list, tuple)) or not all(isinstance(g, Mapping) for g in value):
        _fail("expects the GPUs (gpu_facts_gpus of gpu_facts, a list of dicts), got %r", value)
    for gpu in value:
        if "address" not in gpu or "driver" not in gpu:
            _fail("a GPU without address or driver (not gpu_facts_gpus of gpu_facts): %r", gpu)
    return value


def _expected(value):
    expected = _mapping("expected", {} if value is None else value)
    result = {}
    for key, kind in (("vfio", list), ("mdev_uuids", list), ("sriov", dict), ("restored", dict)):
        item = expected.get(key)
        if item is None:
            item = kind()
        if kind is list and not isinstance(item, (list, tuple)):
            _fail("expected.%s must be a list, got %r", key, item)
        if kind is dict and not isinstance(item, Mapping):
            _fail("expected.%s must be a dict, got %r", key, item)
        result[key] = _plain(item)
    restored = {}
    for address, driver in result["restored"].items():
        restored[_address("expected.restored", address)] = _driver_name("expected.restored[%s]" % address, driver)
    result["restored"] = restored
    return result


def _decode(result):
    try:
        return base64.b64decode(result.get("content") or "").decode("utf-8", "replace")
    except (binascii.Error, ValueError, TypeError):
        _fail("reads: the content of %r is not base64 (not a result of ansible.builtin.slurp)", result.get("item"))
    return ""  # not reached


def _read_functions(reads):
    """{address: {"address", "driver", "driver_override"}} from the slurp results; a failed uevent read: absent."""
    if not isinstance(reads, (list, tuple)) or not all(isinstance(r, Mapping) for r in reads):
        _fail("reads must be the results (a list of dicts) of ansible.builtin.slurp, got %r", reads)
    found = {}
    for result in reads:
        if result.get("skipped"):
            continue
        item = result.get("item")
        if not isinstance(item, (list, tuple)) or len(item) != 2 or item[1] not in READ_ATTRIBUTES:
            _fail("reads: each result needs item [address, attribute] with attribute uevent or driver_override, got %r",
                  item)
        address = _address("reads", item[0])
        entry = found.setdefault(address, {"address": address, "driver": None, "driver_override": None, "seen": False})
        if result.get("failed") or "content" not in result:
            continue
        text = _decode(result)
        if item[1] == "uevent":
            entry["seen"] = True
            for line in text.splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip() == "DRIVER":
                    entry["driver"] = value.strip() or None
        else:
            entry["driver_override"] = _override(text)
    return dict((a, e) for a, e in found.items() if e.pop("seen"))


def _functions(gpus, reads):
    """Every function the checks see - the GPUs, the members of their IOMMU groups, the read ones - by address."""
    seen = {}
    for gpu in gpus:
        seen[str(gpu["address"])] = {"address": str(gpu["address"]), "driver": gpu.get("driver"),
                                     "driver_override": _override(gpu.get("driver_override"))}
    for gpu in gpus:
        for member in gpu.get("iommu_group_members") or []:
            if isinstance(member, Mapping) and member.get("address") and str(member["address"]) not in seen:
                seen[str(member["address"])] = {"address": str(member["address"]), "driver": member.get("driver"),
                                                "driver_override": _override(member.get("driver_override"))}
    for address, entry in _read_functions(reads).items():
        seen.setdefault(address, entry)
    return seen


def _check(name, ok, detail):
    return {"check": name, "ok": bool(ok), "detail": detail}


GPUS_CHECK = "GPUs matching the selectors"
SELECTOR_KEYS = ("vendors", "devices", "classes")


def _selectors(value):
    """The selectors named for a detail: "the GPU selectors (vendors 10de, classes 030000,030200)"."""
    selectors = _mapping("selectors", {} if value is None else value)
    named = []
    for key in SELECTOR_KEYS:
        ids = selectors.get(key)
        if ids is None:
            continue
        if isinstance(ids, str) or not isinstance(ids, (list, tuple)):
            _fail("selectors.%s must be a list of IDs, got %r", key, ids)
        if ids:
            named.append("%s %s" % (key, ",".join(str(i) for i in ids)))
    return "the GPU selectors" + (" (%s)" % ", ".join(named) if named else "")


def _gpus_check(gpus, workload_type, selectors, optional):
    """At least one GPU: none hides a wrong selector or a dead GPU, unless the inventory says the host may have none."""
    if len(gpus) == 1:
        return _check(GPUS_CHECK, True, "1 GPU matches %s" % selectors)
    if gpus:
        return _check(GPUS_CHECK, True, "%d GPUs match %s" % (len(gpus), selectors))
    if optional:
        return _check(GPUS_CHECK, True, "no GPU found: no PCI function matches %s; allowed by the inventory "
                      "(gpuops_gpus_optional)" % selectors)
    return _check(GPUS_CHECK, False,
                  "no GPU found: no PCI function of this %s node matches %s. Either a selector is wrong or the GPU is "
                  "dead or missing: fix the selectors (gpuops_gpu_vendor_ids, gpuops_gpu_device_ids, gpuops_gpu_class_ids), "
                  "or set gpuops_gpus_optional: true if the node may have no GPU" % (workload_type, selectors))


def _unique(values):
    result = []
    for value in values:
        if value not in result:
            result.append(value)
    return result


def _plan(value, workload_type):
    """What the host's plan (the host_plan filter's result) says the host must show; None without a plan."""
    plan = _plain(_mapping("plan", {} if value is None else value))
    if not plan:
        return None
    if plan.get("workload_type") != workload_type:
        _fail("plan is the plan of a %s node, but the host is checked as a %s node (give the plan of this run's "
              "preflight role, preflight_plan)", plan.get("workload_type"), workload_type)
    expected = _mapping("plan.expected", plan.get("expected"))
    result = {}
    for key, kind in (("kernel_arguments", list), ("vfio", list), ("sriov", dict)):
        item = expected.get(key)
        item = kind() if item is None else item
        if not isinstance(item, kind) or (kind is list and not all(isinstance(i, str) for i in item)):
            _fail("plan.expected.%s must be a %s, got %r", key, "list of strings" if kind is list else "dict", item)
        result[key] = item
    result["vfio"] = [_address("plan.expected.vfio", a) for a in result["vfio"]]
    return result


def _has_argument(flags, cmdline, argument):
    key, sep, value = argument.partition("=")
    return flags.get(key) == value if sep else argument in (cmdline or "").split()


def _boot_checks(iommu, vm, cpu_vendor, iommu_pt, workload_type, plan):
    flags = _mapping("iommu.cmdline_flags", iommu.get("cmdline_flags") or {})
    cmdline = iommu.get("cmdline")
    # unknown (neither Intel nor AMD, e.g. an Arm container node): no vendor-specific argument.
    arg = None if cpu_vendor == "unknown" else cpu_vendor + "_iommu"
    checks = []
    if vm:
        # Intel turns VT-d on with intel_iommu=on; AMD-Vi is on with the firmware's IVRS table, and the kernel has
        # no amd_iommu=on (host_prepare never writes it), so an AMD host is only asked for iommu=pt. The host's plan
        # names the arguments it adds; without a plan they follow from the CPU vendor and iommu_pt.
        if plan is not None:
            wanted = plan["kernel_arguments"]
        else:
            wanted = (["intel_iommu=on"] if cpu_vendor == "intel" else []) + (["iommu=pt"] if iommu_pt else [])
        ok = all(_has_argument(flags, cmdline, argument) for argument in wanted)
        if arg is None:
            # The preflight role refuses such a VM node; a host prepared anyway is not ready.
            ok = False
            detail = "the CPU vendor is neither Intel nor AMD, so this collection cannot turn the IOMMU on: %s" % cmdline
        elif wanted:
            source = " (the host's plan)" if plan else ""
            detail = "/proc/cmdline should have %s%s: %s" % (" ".join(wanted), source, cmdline)
        else:
            detail = "/proc/cmdline needs no IOMMU argument (AMD-Vi is on with the firmware's IVRS table): %s" % cmdline
        checks.append(_check("kernel command line", ok, detail))
        checks.append(_check("IOMMU groups", iommu.get("enabled"), "%s IOMMU groups" % iommu.get("group_count")))
    if workload_type == "container":
        unwanted = ([arg + "=on"] if arg else []) + ["iommu=pt"]
        checks.append(_check("no IOMMU arguments of a VM node",
                             (arg is None or flags.get(arg, "") != "on") and flags.get("iommu", "") != "pt",
                             "/proc/cmdline should not have %s: %s" % (" or ".join(unwanted), cmdline)))
    return checks


def _stranded(function):
    address, driver, override = function["address"], function["driver"], function["driver_override"]
    text = "%s has driver_override=%s" % (address, override)
    if driver is None:
        return text + " and no driver: it will not come back to its host driver until the override is cleared"
    if is_vfio_driver(driver):
        return text + " and is on %s: it will not go back to its host driver until the override is cleared" % driver
    return text + " while on %s: it will go to %s at its next probe until the override is cleared" % (driver, override)


def _restored_checks(restored, seen):
    checks = []
    for address in sorted(restored):
        wanted = restored[address]
        name = "%s back on %s" % (address, _label(wanted))
        function = seen.get(address)
        if function is None:
            checks.append(_check(name, False, "%s is missing: no such PCI function on this host (%s expected)"
                                 % (address, _label(wanted))))
            continue
        driver, override = function["driver"], function["driver_override"]
        found = "%s is on %s, %s" % (address, _label(driver),
                                     "driver_override=%s" % override if override else "no driver_override")
        ok = driver == wanted and override is None
        checks.append(_check(name, ok, found if ok else "%s; %s wanted, with no driver_override" % (found, _label(wanted))))
    return checks


GENERATED_CHECK = "initramfs and boot loader generated"
# Every installed kernel but the running one boots with the collection's settings (gpu_facts_host.kernels).
KERNELS_CHECK = "other installed kernels"


def _leftover_checks(gpus, managed, seen, expected, workload_type):
    checks = []
    drivers = dict((str(g["address"]), g["driver"]) for g in gpus)
    if workload_type != "vm-passthrough":
        # On a dra node the DRA driver itself moves a GPU to vfio-pci while a VM's claim holds it: only this
        # collection's files count there, not the live binding or its driver_override.
        claims = workload_type == "dra"
        vfio_files = list(managed.get("vfio_rules") or []) + list(managed.get("vfio_modules") or [])
        checks.append(_check("no vfio-pci binding left",
                             (claims or not any(is_vfio_driver(d) for d in drivers.values())) and not vfio_files,
                             "GPU drivers %s; vfio files %s" % (drivers, vfio_files)))
        if not claims:
            stranded = [_stranded(f) for f in seen.values() if is_vfio_driver(f["driver_override"])]
            checks.append(_check("no vfio driver_override left", not stranded, "; ".join(stranded) or
                                 "no GPU or function of a GPU's IOMMU group has a vfio driver_override"))
        checks.extend(_restored_checks(expected["restored"], seen))
    if workload_type != "vm-vgpu":
        mdev_definitions = list(managed.get("mdev_definitions") or [])
        sriov_definitions = list(managed.get("sriov_definitions") or [])
        checks.append(_check("no vGPU devices or VF records left", not mdev_definitions and not sriov_definitions,
                             "mdev definitions %s, SR-IOV records %s" % (mdev_definitions, sriov_definitions)))
    return checks


def _count(name, value):
    try:
        return int(value)
    except (TypeError, ValueError):
        _fail("%s must be a VF count, got %r", name, value)
    return 0  # not reached


def _vgpu_checks(host, expected, stage, plan):
    live = [str(m.get("uuid")) for m in host.get("mdev_devices") or [] if isinstance(m, Mapping)]
    missing = [u for u in _unique(expected["mdev_uuids"]) if u not in live]
    checks = [_check("vGPU devices", not missing and (stage == "after-reboot" or live),
                     "missing %s of %d expected; %d live" % (missing, len(expected["mdev_uuids"]), len(live)))]
    sriov = _mapping("host.sriov", host.get("sriov") or {})
    # The VFs the plan sets, and those the preparation recorded setting (the same PFs when both are there).
    counts = dict(plan["sriov"] if plan else {})
    counts.update(expected["sriov"])
    for pf, count in sorted(counts.items()):
        wanted = _count("expected.sriov[%s]" % pf, count)
        numvfs = (sriov.get(pf) or {}).get("numvfs", 0)
        checks.append(_check("SR-IOV VFs of %s" % pf, numvfs == wanted, "%s has %s VFs, %s wanted" % (pf, numvfs, count)))
    return checks


DRA_BLOCKERS_CHECK = "nothing holds the GPUs' device nodes"


def _dra_blocker_checks(result):
    """The check of a dra_blockers result: no blocker (and the run itself did not fail)."""
    result = _plain(_mapping("dra_blockers", result or {}))
    if not result or result.get("skipped"):
        return []
    if result.get("failed"):
        return [_check(DRA_BLOCKERS_CHECK, False, "dra_blockers failed: %s" % result.get("msg", "no message"))]
    blockers = result.get("blockers")
    if not isinstance(blockers, list) or not all(isinstance(b, Mapping) for b in blockers):
        _fail("dra_blockers.blockers must be a list of dicts (the blockers of the dra_blockers module), got %r",
              blockers)
    named = ["%s pid %s%s holds %s" % (b.get("kind"), b.get("pid"), " (%s)" % b["unit"] if b.get("unit") else "",
                                       ", ".join(b.get("paths") or [])) for b in blockers]
    return [_check(DRA_BLOCKERS_CHECK, not blockers,
                   "; ".join(named) + " (see the dra_blockers remedies)" if named else
                   "no process holds a /dev/nvidia* node that the DRA driver needs free")]


def _kernel_checks(kernels):
    """The check of the installed kernels other than the running one (gpu_facts_host.kernels); none without the key."""
    if kernels is None:
        return []
    if not isinstance(kernels, list) or not all(isinstance(k, dict) for k in kernels):
        _fail("host.kernels must be a list of dicts (gpu_facts_host.kernels of gpu_facts), got %r", kernels)
    bad = ["%s: %s" % (k.get("version"), "; ".join(str(p) for p in k.get("problems") or []))
           for k in kernels if not k.get("running") and k.get("problems")]
    others = [str(k.get("version")) for k in kernels if not k.get("running")]
    return [_check(KERNELS_CHECK, not bad, " | ".join(bad) + "; run the preparation again to repair them" if bad else
                   "%s boot with the collection's settings" % ", ".join(others) if others else
                   "no other kernel is installed")]


PLANNED_VFIO_CHECK = "functions on vfio-pci as planned"


def _planned_vfio_check(plan, seen):
    """Every function the plan binds to vfio-pci is there and on a vfio driver."""
    off = ["%s is on %s" % (a, _label(seen[a]["driver"])) if a in seen else "%s is missing" % a
           for a in plan["vfio"] if a not in seen or not is_vfio_driver(seen[a]["driver"])]
    return _check(PLANNED_VFIO_CHECK, not off, "; ".join(off) + " (the host's plan binds %s)" % ", ".join(plan["vfio"])
                  if off else "%s on vfio-pci, as the host's plan said" % (", ".join(plan["vfio"]) or "no function"))


def host_checks(gpus, iommu, host, workload_type, cpu_vendor="intel", stage="final", reboot_pending=False,
                iommu_pt=True, vfio_binding="host", vgpu_devices="host", expected=None, reads=None,
                dra_blockers=None, gpus_optional=False, selectors=None, plan=None):
    gpus = _plain(_gpus(gpus))
    iommu = _plain(_mapping("iommu (gpu_facts_iommu of gpu_facts)", iommu))
    host = _plain(_mapping("host (gpu_facts_host of gpu_facts)", host))
    workload_type = _choice("workload_type", workload_type, WORKLOAD_TYPES)
    cpu_vendor = _choice("cpu_vendor", cpu_vendor, CPU_VENDORS)
    stage = _choice("stage", stage, STAGES)
    pending = _flag("reboot_pending", reboot_pending)
    iommu_pt = _flag("iommu_pt", iommu_pt)
    vfio_binding = _choice("vfio_binding", vfio_binding, MODES)
    vgpu_devices = _choice("vgpu_devices", vgpu_devices, MODES)
    expected = _expected(expected)
    gpus_optional = _flag("gpus_optional", gpus_optional)
    selectors = _selectors(_plain(selectors))
    plan = _plan(plan, workload_type)
    managed = _mapping("host.managed_files", host.get("managed_files") or {})
    seen = _functions(gpus, _plain(reads or []))
    drivers = dict((str(g["address"]), g["driver"]) for g in gpus)

    checks = [_gpus_check(gpus, workload_type, selectors, gpus_optional)]
    if not pending:
        checks.extend(_boot_checks(iommu, workload_type in IOMMU_WORKLOAD_TYPES, cpu_vendor, iommu_pt, workload_type,
                                   plan))
    # kernel_modules and kernel_cmdline keep a pending record while the initramfs or grub.cfg is generated from
    # their files: one left behind means a run was cut short there, and the host boots without the settings.
    unfinished = list(managed.get("pending") or [])
    checks.append(_check(GENERATED_CHECK, not unfinished,
                         "left by a run cut short before it finished: %s; run the preparation again" % unfinished
                         if unfinished else "no pending initramfs or grub.cfg generation"))
    checks.extend(_leftover_checks(gpus, managed, seen, expected, workload_type))
    checks.extend(_kernel_checks(host.get("kernels")))
    if workload_type == "vm-passthrough" and vfio_binding == "host" and not pending and stage == "final":
        checks.append(_check("GPUs on vfio-pci",
                             gpus and all(is_vfio_driver(g["driver"]) for g in gpus) and all(g.get("viable") for g in gpus),
                             "GPU drivers %s; groups viable: %s" % (drivers, [g.get("viable") for g in gpus])))
        modules, rules = list(managed.get("vfio_modules") or []), list(managed.get("vfio_rules") or [])
        checks.append(_check("vfio boot settings", modules and len(rules) >= len(gpus), "vfio files %s" % (modules + rules)))
        if plan is not None:
            checks.append(_planned_vfio_check(plan, seen))
    if workload_type == "vm-vgpu" and vgpu_devices == "host":
        checks.extend(_vgpu_checks(host, expected, stage, plan))
    if workload_type == "dra":
        checks.extend(_dra_blocker_checks(dra_blockers))
    if stage == "after-reboot":
        for address in expected["vfio"]:
            if address in drivers:
                checks.append(_check("%s back on vfio-pci after the reboot" % address, is_vfio_driver(drivers[address]),
                                     "%s is on %s" % (address, _label(drivers[address]))))
    return checks


class FilterModule:
    """gpuops.sandbox.host_checks"""

    def filters(self):
        return {"host_checks": host_checks}
