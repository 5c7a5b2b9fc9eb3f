# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private helpers that read the IOMMU state of a host: firmware, kernel, command line, CPU.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
Nothing here writes anything. Every function takes the filesystem root (default ``/``) so unit tests
can use a fake tree. Only ``/sys/kernel/iommu_groups`` being non-empty proves the IOMMU is on; a flag on
the kernel command line is reported but is not proof.
"""

from __future__ import annotations

import errno
import os

from ansible_collections.gpuops.sandbox.plugins.module_utils._cmdline import parse_cmdline
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import SysfsError, host_path, read_file

FIRMWARE_TABLES = (("DMAR", "intel"), ("IVRS", "amd"))
ACPI_TABLES = "/sys/firmware/acpi/tables"
IOMMU_CLASS = "/sys/class/iommu"
IOMMU_GROUPS = "/sys/kernel/iommu_groups"
IOMMUFD_DEVICE = "/dev/iommu"
# Command line keys reported, by their canonical spelling. The kernel treats "-" and "_" alike in
# parameter names, so they are compared with "-" folded to "_".
CMDLINE_KEYS = ("intel_iommu", "amd_iommu", "iommu", "iommu.passthrough", "vfio-pci.ids")
CPU_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "amd"}


def _fold(key):
    return key.replace("-", "_")


_CANONICAL = {_fold(key): key for key in CMDLINE_KEYS}


def _listdir(root, path):
    full = host_path(root, path)
    try:
        return sorted(os.listdir(full))
    except (IOError, OSError) as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return []
        raise SysfsError("cannot list %s: %s" % (path, exc.strerror or exc), path=full)


def _read_text(root, path):
    """Read a whole file as text (``_sysfs.read_file``); None when it or a directory on its way does not exist."""
    full = host_path(root, path)
    try:
        return read_file(full)
    except (IOError, OSError) as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise SysfsError("cannot read %s: %s" % (path, exc.strerror or exc), path=full)


def firmware_tables(root="/"):
    """Return the IOMMU ACPI tables present: ``DMAR`` (Intel VT-d) and/or ``IVRS`` (AMD-Vi)."""
    return [name for name, _vendor in FIRMWARE_TABLES
            if os.path.exists(host_path(root, "%s/%s" % (ACPI_TABLES, name)))]


def iommu_units(root="/"):
    """Return the IOMMU units the kernel registered in ``/sys/class/iommu`` (e.g. ``dmar0``)."""
    return _listdir(root, IOMMU_CLASS)


def iommu_group_count(root="/"):
    """Return how many IOMMU groups exist; 0 means the kernel has no IOMMU enabled."""
    return len([name for name in _listdir(root, IOMMU_GROUPS) if name.isdigit()])


def cmdline_flags(text):
    """Return the IOMMU-related flags of a command line: ``{canonical_key: value}``.

    The last occurrence of a key wins; a key without ``=`` has the value ``""``. ``vfio-pci.ids``
    is returned as a list of ``VVVV:DDDD`` strings (all occurrences, in order). The command line is split
    by _cmdline.parse_cmdline, the collection's one kernel command-line tokenizer.
    """
    flags = {}
    for key, value in parse_cmdline(text):
        canonical = _CANONICAL.get(_fold(key))
        if canonical is None:
            continue
        if canonical == "vfio-pci.ids":
            ids = flags.setdefault(canonical, [])
            ids.extend(item for item in (value or "").split(",") if item)
        else:
            flags[canonical] = "" if value is None else value
    return flags


def cpu_info(root="/"):
    """Return ``{"vendor_id", "vendor", "virt_flag", "model_name"}`` from ``/proc/cpuinfo``.

    ``vendor`` is ``intel``/``amd`` or None; ``virt_flag`` is ``vmx`` or ``svm`` when the CPU
    shows hardware virtualisation, else None.
    """
    text = _read_text(root, "/proc/cpuinfo") or ""
    vendor_id = model = None
    flags = set()
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, value = (part.strip() for part in line.split(":", 1))
        if key == "vendor_id" and vendor_id is None:
            vendor_id = value
        elif key == "model name" and model is None:
            model = value
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    virt = "vmx" if "vmx" in flags else ("svm" if "svm" in flags else None)
    return {"vendor_id": vendor_id, "vendor": CPU_VENDORS.get(vendor_id or ""), "virt_flag": virt,
            "model_name": model}


def platform_vendor(tables, cpu):
    """``intel`` or ``amd`` from the firmware table, else from the CPU; None when unknown."""
    for name, vendor in FIRMWARE_TABLES:
        if name in tables:
            return vendor
    return cpu.get("vendor")


def kernel_args_to_add(vendor):
    """The kernel arguments that turn the IOMMU on for DMA remapping with host devices in passthrough mode.

    Intel needs ``intel_iommu=on`` (off by default on most distribution kernels). AMD needs no argument:
    the kernel enables AMD-Vi by default when the firmware provides the IVRS table, and ``amd_iommu`` has
    no ``on`` value (it takes ``off``, ``force_isolation``, ``fullflush``, ``pgtbl_v1``, ...).
    ``iommu=pt`` keeps the host's own devices in passthrough mode on both.
    """
    if vendor == "intel":
        return ["intel_iommu=on", "iommu=pt"]
    return ["iommu=pt"]


AMD_DEFAULT_NOTE = ("the kernel enables AMD-Vi by itself when the firmware provides the IVRS table; "
                    "there is no amd_iommu=on")


def kernel_argument_fix(vendor, flags, tables=None):
    """Return the sentence telling how to turn the IOMMU on: firmware setting and/or kernel arguments.

    ``tables`` are the IOMMU ACPI tables present (None when unknown); on AMD a missing IVRS table means
    the IOMMU is off in the firmware, which no kernel argument can change.
    """
    offending = ["%s=%s" % (key, flags[key]) for key in ("intel_iommu", "amd_iommu", "iommu")
                 if key in flags and flags[key] in ("off", "0")]
    removal = "remove %s from the kernel command line, " % " ".join(offending) if offending else ""
    wanted = " ".join(kernel_args_to_add(vendor))
    if vendor == "intel":
        return "%sadd %s to the kernel command line and reboot" % (removal, wanted)
    if vendor == "amd":
        steps = []
        if tables is not None and "IVRS" not in tables:
            steps.append("enable the IOMMU in the BIOS/UEFI setup (named IOMMU or AMD-Vi, often next to SVM Mode) "
                         "so that the firmware provides the IVRS ACPI table")
        elif not offending:
            steps.append("the firmware provides the IVRS table, so check that the kernel is built with "
                         "CONFIG_AMD_IOMMU and look for AMD-Vi errors in dmesg")
        steps.append("%sadd %s to the kernel command line and reboot (%s)" % (removal, wanted, AMD_DEFAULT_NOTE))
        return "; ".join(steps)
    return ("%sadd %s to the kernel command line, plus intel_iommu=on on Intel, and reboot (on AMD %s)"
            % (removal, wanted, AMD_DEFAULT_NOTE))


def iommu_state(root="/"):
    """Collect the IOMMU state of the host as plain data (see iommu_check's RETURN for the keys)."""
    tables = firmware_tables(root)
    cmdline_text = (_read_text(root, "/proc/cmdline") or "").strip()
    flags = cmdline_flags(cmdline_text)
    cpu = cpu_info(root)
    groups = iommu_group_count(root)
    state = {
        "enabled": groups > 0,
        "group_count": groups,
        "firmware_tables": tables,
        "firmware_table": tables[0] if tables else None,
        "iommu_units": iommu_units(root),
        "iommufd": os.path.exists(host_path(root, IOMMUFD_DEVICE)),
        "cmdline": cmdline_text,
        "cmdline_flags": flags,
        "cpu_vendor": cpu["vendor"],
        "cpu_vendor_id": cpu["vendor_id"],
        "cpu_model": cpu["model_name"],
        "cpu_virt_flag": cpu["virt_flag"],
        "cpu_virtualization": cpu["virt_flag"] is not None,
        "platform_vendor": platform_vendor(tables, cpu),
    }
    state["problems"] = iommu_problems(state)
    return state


def iommu_problems(state):
    """Return what stops the IOMMU being usable, each ``{"item", "reason", "fix"}``; [] when usable."""
    problems = []
    vendor = state.get("platform_vendor")
    if not state["cpu_virtualization"]:
        problems.append({
            "item": "cpu_virtualization",
            "reason": "the CPU shows no hardware virtualisation flag (vmx or svm) in /proc/cpuinfo",
            "fix": "enable Intel VT-x or AMD-V (SVM) in the BIOS/UEFI setup (for a VM, expose the host CPU "
                   "features to it)",
        })
    if not state["firmware_tables"]:
        problems.append({
            "item": "firmware_table",
            "reason": "no DMAR or IVRS ACPI table in /sys/firmware/acpi/tables: the firmware does not "
                      "describe an IOMMU",
            "fix": "enable VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the BIOS/UEFI setup",
        })
    if not state["enabled"]:
        problems.append({
            "item": "iommu_groups",
            "reason": "/sys/kernel/iommu_groups is empty: the kernel has not enabled the IOMMU",
            "fix": kernel_argument_fix(vendor, state.get("cmdline_flags") or {}, state.get("firmware_tables")),
        })
    return problems
