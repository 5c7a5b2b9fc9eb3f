# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private PCI discovery on sysfs: identities, IOMMU groups, SR-IOV, mdev and vGPU types, holders.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
Nothing here writes anything. Every function that reads the host takes its filesystem root as an
argument (default ``/``) so unit tests can build a fake tree under a temporary directory. Errors are
raised as :class:`SysfsError` (or :class:`SelectorError`); only modules turn them into ``fail_json``.
"""

from __future__ import annotations

import errno
import os
import re

from ansible_collections.gpuops.sandbox.plugins.module_utils import _plugin_names
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import (
    PCI_ADDRESS_RE,
    SysfsError,
    host_path,
    link_name,
    normalize_pci_address,
    pci_device_dir,
    read_attr,
)

NVIDIA_VENDOR_ID = "10de"
DEFAULT_VENDOR_SELECTORS = ("10de",)
DEFAULT_CLASS_SELECTORS = ("030000", "030200")
BRIDGE_CLASS_PREFIX = "0604"
VFIO_PCI_DRIVER = "vfio-pci"
# Drivers under which the kernel still lets a VFIO group be opened: vfio-pci itself, its variant
# drivers (nvgrace_gpu_vfio_pci, mlx5_vfio_pci, ...) and pci-stub, which claims a device only to keep
# other drivers off it.
_STUB_DRIVERS = ("pci-stub",)
PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")
PCI_DEVICES = "/sys/bus/pci/devices"
IOMMU_GROUPS = "/sys/kernel/iommu_groups"
MDEV_BUS_CLASS = "/sys/class/mdev_bus"
SANDBOX_RESOURCE_PREFIX = "nvidia.com/"

_HEX4_RE = re.compile(r"\A[0-9a-f]{4}\Z")
_VENDOR_SELECTOR_RE = re.compile(r"\A(?:0x)?([0-9a-f]{4})(?::(?:0x)?([0-9a-f]{4}))?\Z")
_CLASS_SELECTOR_RE = re.compile(r"\A(?:0x)?([0-9a-f]{2}|[0-9a-f]{4}|[0-9a-f]{6})\Z")
_PCI_IDS_VENDOR_RE = re.compile(r"^([0-9a-fA-F]{4})\s+(.*\S)\s*$")
_PCI_IDS_DEVICE_RE = re.compile(r"^\t([0-9a-fA-F]{4})\s+(.*\S)\s*$")
_PCI_IDS_SUBSYS_RE = re.compile(r"^\t\t([0-9a-fA-F]{4})\s+([0-9a-fA-F]{4})\s+(.*\S)\s*$")
_PCI_IDS_CLASS_RE = re.compile(r"^C\s+([0-9a-fA-F]{2})\s+(.*\S)\s*$")
_PCI_IDS_SUBCLASS_RE = re.compile(r"^\t([0-9a-fA-F]{2})\s+(.*\S)\s*$")
_PCI_IDS_PROGIF_RE = re.compile(r"^\t\t([0-9a-fA-F]{2})\s+(.*\S)\s*$")


class SelectorError(SysfsError):
    """A vendor, class or address selector given by the caller is malformed."""


def _is_number(text):
    """True for a non-empty run of ASCII digits (str.isdigit also accepts superscripts, which int() refuses)."""
    return text.isascii() and text.isdigit()


# ---------------------------------------------------------------------------------------------
# pci.ids
# ---------------------------------------------------------------------------------------------

def load_pci_ids(root="/"):
    """Return ``(path, text)`` of the first pci.ids found under ``root``, or ``(None, None)``."""
    for candidate in PCI_IDS_PATHS:
        full = host_path(root, candidate)
        try:
            with open(full, "r", encoding="utf-8", errors="replace") as handle:
                return candidate, handle.read()
        except (IOError, OSError) as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                continue
            raise SysfsError("cannot read %s: %s" % (candidate, exc.strerror or exc), path=full)
    return None, None


def parse_pci_ids(text):
    """Parse pci.ids text into nested dicts, device names scoped to their vendor.

    Returns ``{"vendors": {vid: {"name", "devices": {did: {"name", "subsystems": {"sv:sd": name}}}}},
    "classes": {cc: {"name", "subclasses": {sc: {"name", "prog_ifs": {pi: name}}}}}}`` with lower-case
    hex keys. Unknown or malformed lines are skipped.
    """
    vendors = {}
    classes = {}
    vendor = device = None
    klass = subclass = None
    for line in (text or "").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith("\t"):
            vendor = device = klass = subclass = None
            match = _PCI_IDS_CLASS_RE.match(line)
            if match:
                klass = {"name": match.group(2), "subclasses": {}}
                classes[match.group(1).lower()] = klass
                continue
            match = _PCI_IDS_VENDOR_RE.match(line)
            if match:
                vendor = {"name": match.group(2), "devices": {}}
                vendors[match.group(1).lower()] = vendor
            continue
        if klass is not None:
            match = _PCI_IDS_PROGIF_RE.match(line)
            if match and subclass is not None:
                subclass["prog_ifs"][match.group(1).lower()] = match.group(2)
                continue
            match = _PCI_IDS_SUBCLASS_RE.match(line)
            if match:
                subclass = {"name": match.group(2), "prog_ifs": {}}
                klass["subclasses"][match.group(1).lower()] = subclass
            continue
        if vendor is None:
            continue
        match = _PCI_IDS_SUBSYS_RE.match(line)
        if match:
            if device is not None:
                key = "%s:%s" % (match.group(1).lower(), match.group(2).lower())
                device["subsystems"][key] = match.group(3)
            continue
        match = _PCI_IDS_DEVICE_RE.match(line)
        if match:
            device = {"name": match.group(2), "subsystems": {}}
            vendor["devices"][match.group(1).lower()] = device
    return {"vendors": vendors, "classes": classes}


def pci_names(db, vendor, device=None, subsystem_vendor=None, subsystem_device=None, pci_class=None):
    """Look names up in a :func:`parse_pci_ids` result; every missing name is None.

    Returns ``{"vendor_name", "device_name", "subsystem_name", "class_name"}``; the class name is the
    most specific of prog-if, subclass and class that pci.ids knows.
    """
    db = db or {"vendors": {}, "classes": {}}
    result = {"vendor_name": None, "device_name": None, "subsystem_name": None, "class_name": None}
    ven = db["vendors"].get((vendor or "").lower())
    if ven:
        result["vendor_name"] = ven["name"]
        dev = ven["devices"].get((device or "").lower())
        if dev:
            result["device_name"] = dev["name"]
            if subsystem_vendor and subsystem_device:
                key = "%s:%s" % (subsystem_vendor.lower(), subsystem_device.lower())
                result["subsystem_name"] = dev["subsystems"].get(key)
    code = (pci_class or "").lower()
    if len(code) >= 2:
        klass = db["classes"].get(code[:2])
        if klass:
            result["class_name"] = klass["name"]
            sub = klass["subclasses"].get(code[2:4]) if len(code) >= 4 else None
            if sub:
                result["class_name"] = sub["name"]
                prog = sub["prog_ifs"].get(code[4:6]) if len(code) >= 6 else None
                if prog:
                    result["class_name"] = prog
    return result


def sandbox_resource_name(pci_ids_text, device_id, vendor_scoped=True):
    """Return the resource name the NVIDIA sandbox (KubeVirt GPU) device plugin advertises.

    An exact port of the plugin's rule (see ``_plugin_names``): ``device_id`` is the 4-hex device ID as
    read from sysfs (``0x`` and case are tolerated); its line in ``pci_ids_text`` is trimmed,
    upper-cased, ``/`` and ``.`` become ``_``, whitespace runs become ``_`` and characters outside
    ``[A-Za-z0-9_.]`` are dropped: ``2236  GA102GL [A10]`` gives ``nvidia.com/GA102GL_A10``. With no name
    the bare device ID is used (``nvidia.com/2236``).

    The plugin reads the pci.ids inside its own image: ``pci_ids_text`` None uses the table of the
    plugin version the GPU Operator deploys; the host's pci.ids (an older or newer file) may name
    devices differently.

    ``vendor_scoped=True`` follows the current plugin (``getDeviceName`` after ``locateVendor``): only
    device lines of the first line that starts with ``10de`` count, comments are skipped and the first
    line not starting with a tab ends the search. ``vendor_scoped=False`` reproduces older plugin
    images, which scan every trimmed line: a line containing the ID twice or more ends the search with
    no name; the first line starting with the ID matches, whatever its vendor.
    """
    try:
        did = _plugin_names.normalize_device_id(device_id)
    except _plugin_names.PluginNameError as exc:
        raise SelectorError(exc.msg)
    if pci_ids_text is None:
        if not vendor_scoped:
            raise SelectorError("the naming table follows the current sandbox device plugin; older (not vendor "
                                "scoped) plugin images need their pci.ids content")
        return _plugin_names.passthrough_resource_name(did)
    return SANDBOX_RESOURCE_PREFIX + (_plugin_names.plugin_device_name(pci_ids_text, did, vendor_scoped) or did)


def vgpu_resource_name(type_name, pci_ids_text=None):
    """Return the sandbox device plugin's resource name for an mdev type from its raw ``name`` content.

    Leading and trailing newlines are trimmed and ASCII whitespace runs become ``_`` (give the file's
    content as read, bytes or text: other blanks are kept). ``pci_ids_text``: the plugin's pci.ids,
    in which the plugin also looks the name up (default: the deployed version's table).
    """
    try:
        return _plugin_names.vgpu_resource_name(type_name, pci_ids_text)
    except _plugin_names.PluginNameError as exc:
        raise SelectorError(exc.msg)


def _read_raw_attr(path):
    """Return the content of a sysfs attribute as bytes, unstripped; None when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (IOError, OSError) as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise SysfsError("cannot read %s: %s" % (path, exc.strerror or exc), path=path)


# ---------------------------------------------------------------------------------------------
# Selectors
# ---------------------------------------------------------------------------------------------

def _match_selectors(values, pattern, message):
    """The match of ``pattern`` for each of ``values`` (stripped, lower-case), in order; the first value that is not a
    string or does not match raises ``SelectorError(message % (value,))``."""
    matches = []
    for value in values or []:
        text = value.strip().lower() if isinstance(value, str) else None
        match = pattern.match(text) if text is not None else None
        if not match:
            raise SelectorError(message % (value,))
        matches.append(match)
    return matches


def parse_vendor_selectors(values):
    """Parse ``VVVV`` or ``VVVV:DDDD`` selectors into ``[(vendor, device_or_None)]`` (lower-case)."""
    return [(match.group(1), match.group(2)) for match in _match_selectors(
        values, _VENDOR_SELECTOR_RE,
        "vendor selector %r is not valid; expected VVVV or VVVV:DDDD in hex, e.g. 10de or 10de:2236")]


def parse_class_selectors(values):
    """Parse class selectors (2, 4 or 6 hex digits: class, class+subclass, full) into prefixes."""
    return [match.group(1) for match in _match_selectors(
        values, _CLASS_SELECTOR_RE,
        "class selector %r is not valid; expected 2, 4 or 6 hex digits (class, class+subclass or "
        "class+subclass+prog-if), e.g. 03, 0302 or 030200")]


def matches_selectors(info, vendor_selectors, class_prefixes):
    """True when ``info`` (vendor/device/class keys) matches one vendor and one class selector.

    An empty selector list matches everything.
    """
    if vendor_selectors:
        if not any(info.get("vendor") == ven and (dev is None or info.get("device") == dev)
                   for ven, dev in vendor_selectors):
            return False
    if class_prefixes:
        if not any((info.get("class") or "").startswith(prefix) for prefix in class_prefixes):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Single functions
# ---------------------------------------------------------------------------------------------

def _hex_attr(devdir, name):
    """Read a ``0x....`` sysfs id attribute as lower-case hex without ``0x``; None when absent."""
    value = read_attr(os.path.join(devdir, name), default="")
    if not value:
        return None
    value = value.lower()
    return value[2:] if value.startswith("0x") else value


def _int_attr(devdir, name):
    value = read_attr(os.path.join(devdir, name), default="")
    if value == "":
        return None
    try:
        return int(value, 0)
    except ValueError:
        raise SysfsError("%s holds %r, not an integer" % (os.path.join(devdir, name), value),
                         path=os.path.join(devdir, name))


def _sysfs_rel(root, path):
    """The host path (``/sys/...``) of ``path``, a real path under ``root``."""
    top = os.path.realpath(root or "/")
    real = os.path.realpath(path)
    if top == os.sep:
        return real
    return "/" + os.path.relpath(real, top)


def _list_dir(top, shown):
    """The names in directory ``top``, sorted, or None when it does not exist; any other failure is a SysfsError
    naming ``shown`` (the host path)."""
    try:
        return sorted(os.listdir(top))
    except (IOError, OSError) as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise SysfsError("cannot list %s: %s" % (shown, exc.strerror or exc), path=top)


def list_functions(root="/"):
    """Return the sorted addresses in ``/sys/bus/pci/devices`` (empty when it does not exist)."""
    names = _list_dir(host_path(root, PCI_DEVICES), PCI_DEVICES) or []
    return sorted(name.lower() for name in names if PCI_ADDRESS_RE.fullmatch(name))


def read_identity(address, root="/"):
    """Return ``{address, vendor, device, subsystem_vendor, subsystem_device, class, driver, is_bridge}``."""
    devdir = pci_device_dir(address, root)
    addr = normalize_pci_address(address)
    klass = _hex_attr(devdir, "class")
    return {
        "address": addr,
        "vendor": _hex_attr(devdir, "vendor"),
        "device": _hex_attr(devdir, "device"),
        "subsystem_vendor": _hex_attr(devdir, "subsystem_vendor"),
        "subsystem_device": _hex_attr(devdir, "subsystem_device"),
        "class": klass,
        "driver": link_name(os.path.join(devdir, "driver")),
        "is_bridge": bool(klass and klass.startswith(BRIDGE_CLASS_PREFIX)),
    }


def iommu_group_of(address, root="/"):
    """Return the IOMMU group number of a PCI function, or None when it has none (IOMMU off)."""
    devdir = pci_device_dir(address, root)
    name = link_name(os.path.join(devdir, "iommu_group"))
    if name is None:
        return None
    try:
        return int(name)
    except ValueError:
        raise SysfsError("iommu_group of %s points at %r, not a group number" % (address, name),
                         path=os.path.join(devdir, "iommu_group"))


def iommu_groups(root="/"):
    """Return the sorted IOMMU group numbers in ``/sys/kernel/iommu_groups`` (empty: IOMMU off)."""
    names = _list_dir(host_path(root, IOMMU_GROUPS), IOMMU_GROUPS) or []
    return sorted(int(name) for name in names if _is_number(name))


def iommu_group_members(group, root="/"):
    """Return every member of IOMMU group ``group`` with its identity, sorted by address.

    Members that are not PCI functions (platform devices on some systems) carry ``pci: false`` and
    only their name and driver.
    """
    rel = "%s/%s/devices" % (IOMMU_GROUPS, int(group))
    top = host_path(root, rel)
    names = _list_dir(top, rel)
    if names is None:
        raise SysfsError("IOMMU group %s does not exist (no %s)" % (group, rel), path=top)
    members = []
    for name in names:
        if PCI_ADDRESS_RE.fullmatch(name):
            member = read_identity(name, root)
            member["pci"] = True
        else:
            member = {"address": name, "vendor": None, "device": None, "subsystem_vendor": None,
                      "subsystem_device": None, "class": None, "is_bridge": False, "pci": False,
                      "driver": link_name(os.path.join(top, name, "driver"))}
        members.append(member)
    return members


def driver_allows_vfio(driver):
    """True when a function on ``driver`` does not stop its IOMMU group being used through VFIO."""
    if driver is None:
        return True
    return driver == VFIO_PCI_DRIVER or driver.endswith("_vfio_pci") or driver in _STUB_DRIVERS


def group_viability(group, root="/"):
    """Decide whether IOMMU group ``group`` can be passed through to a VM.

    Every endpoint must be bound to vfio-pci (or a vfio-pci variant driver or pci-stub) or have no
    driver; PCI bridges (class 0x0604) are exempt. Returns ``{"group", "viable", "members",
    "blockers"}``; each blocker is ``{"address", "driver", "class", "reason"}``.
    """
    members = iommu_group_members(group, root)
    blockers = []
    for member in members:
        if member["is_bridge"] or driver_allows_vfio(member["driver"]):
            continue
        ident = ""
        if member["pci"]:
            ident = " (%s:%s, class %s)" % (member["vendor"], member["device"], member["class"])
        blockers.append({
            "address": member["address"],
            "driver": member["driver"],
            "class": member["class"],
            "reason": "%s%s in IOMMU group %s is bound to %s, not vfio-pci; bind it to vfio-pci (or unbind "
                      "it) so the group is viable" % (member["address"], ident, group, member["driver"]),
        })
    return {"group": int(group), "viable": not blockers, "members": members, "blockers": blockers}


def device_viability(address, root="/"):
    """:func:`group_viability` for the group of one function; a function without a group is not viable."""
    group = iommu_group_of(address, root)
    if group is None:
        addr = normalize_pci_address(address)
        return {"group": None, "viable": False, "members": [], "blockers": [{
            "address": addr, "driver": None, "class": None,
            "reason": "%s has no IOMMU group: the IOMMU is not enabled (enable VT-d/AMD-Vi in the firmware; "
                      "on Intel also boot with intel_iommu=on, AMD-Vi is on by default)" % addr,
        }]}
    return group_viability(group, root)


def sriov_info(address, root="/"):
    """Return ``{"totalvfs", "numvfs", "physfn", "virtfns"}`` (None / [] where not applicable)."""
    devdir = pci_device_dir(address, root)
    virtfns = []
    try:
        entries = os.listdir(devdir)
    except (IOError, OSError) as exc:
        raise SysfsError("cannot list %s: %s" % (devdir, exc.strerror or exc), path=devdir)
    indexed = []
    for entry in entries:
        if entry.startswith("virtfn") and _is_number(entry[6:]):
            target = link_name(os.path.join(devdir, entry))
            if target:
                indexed.append((int(entry[6:]), target.lower()))
    virtfns = [target for _index, target in sorted(indexed)]
    physfn = link_name(os.path.join(devdir, "physfn"))
    return {
        "totalvfs": _int_attr(devdir, "sriov_totalvfs"),
        "numvfs": _int_attr(devdir, "sriov_numvfs"),
        "physfn": physfn.lower() if physfn else None,
        "virtfns": virtfns,
    }


def read_mdev_types(parent_dir):
    """Return the mdev types under ``<parent_dir>/mdev_supported_types`` sorted by type id.

    Each is ``{"id", "name", "available_instances", "device_api", "description", "resource_name"}``
    (the sandbox device plugin's name for the type); missing optional attributes are None, and so is an
    ``available_instances`` that is not a number. The one reader of mdev types (gpu_facts, mdev_create).
    """
    top = os.path.join(parent_dir, "mdev_supported_types")
    names = _list_dir(top, top) or []
    types = []
    for type_id in names:
        tdir = os.path.join(top, type_id)
        if not os.path.isdir(tdir):
            continue
        try:
            available = _int_attr(tdir, "available_instances")
        except SysfsError:
            available = None   # not a number: reported as unknown; mdev_create treats it as none available
        types.append({
            "id": type_id,
            "name": read_attr(os.path.join(tdir, "name"), default="") or None,
            "available_instances": available,
            "device_api": read_attr(os.path.join(tdir, "device_api"), default="") or None,
            "description": read_attr(os.path.join(tdir, "description"), default="") or None,
        })
        # The plugin names the type from the raw file (only newlines trimmed), not the stripped name.
        raw_name = _read_raw_attr(os.path.join(tdir, "name"))
        types[-1]["resource_name"] = vgpu_resource_name(raw_name) if raw_name is not None else None
    return types


def mdev_types(address, root="/"):
    """Return the legacy mdev types a PCI function offers (see :func:`read_mdev_types`)."""
    return read_mdev_types(pci_device_dir(address, root))


def mdev_parents(root="/"):
    """Return every mdev parent in ``/sys/class/mdev_bus`` with its types, sorted by name.

    Each is ``{"name", "address", "sysfs_path", "types"}``; ``address`` is set when the parent is a PCI
    function. An absent ``/sys/class/mdev_bus`` gives an empty list (no mdev-capable driver loaded).
    """
    top = host_path(root, MDEV_BUS_CLASS)
    names = _list_dir(top, MDEV_BUS_CLASS) or []
    parents = []
    for name in names:
        pdir = os.path.join(top, name)
        parents.append({
            "name": name,
            "address": name.lower() if PCI_ADDRESS_RE.fullmatch(name) else None,
            "sysfs_path": _sysfs_rel(root, pdir),
            "types": read_mdev_types(pdir),
        })
    return parents


# One ``ID : vGPU Name`` line of ``creatable_vgpu_types``: ASCII digits only (``\d`` takes any script's),
# at most 9 of them (vGPU type ids are small integers), \A/\Z so a newline cannot slip through.
VGPU_LINE_RE = re.compile(r"\A\s*([0-9]{1,9})\s*:\s*(.*?)\s*\Z")


def parse_creatable_vgpu_types(text):
    """Parse ``creatable_vgpu_types`` (``ID : vGPU Name`` lines, maybe a header) into ``[{id, name}]``.

    The one parser of that file (gpu_facts, mdev_create). Id 0 is not a type (it is what
    ``current_vgpu_type`` holds when no vGPU is created) and is left out, as are header and junk lines.
    """
    types = []
    for line in (text or "").splitlines():
        match = VGPU_LINE_RE.fullmatch(line)
        if match and int(match.group(1)) > 0:
            types.append({"id": int(match.group(1)), "name": match.group(2)})
    return types


def vgpu_info(address, root="/"):
    """Return NVIDIA vendor-specific vGPU state of a function, or None when it has no ``nvidia/`` dir.

    ``{"creatable_types": [{id, name}], "current_type": int or None}``; 0 means no vGPU is created.
    """
    devdir = pci_device_dir(address, root)
    ndir = os.path.join(devdir, "nvidia")
    creatable_path = os.path.join(ndir, "creatable_vgpu_types")
    current_path = os.path.join(ndir, "current_vgpu_type")
    if not (os.path.exists(creatable_path) or os.path.exists(current_path)):
        return None
    current = read_attr(current_path, default="")
    current_type = None
    if current != "":
        try:
            current_type = int(current, 0)
        except ValueError:
            raise SysfsError("%s holds %r, not a vGPU type ID" % (current_path, current), path=current_path)
    return {
        "creatable_types": parse_creatable_vgpu_types(read_attr(creatable_path, default="")),
        "current_type": current_type,
    }


def describe_function(address, root="/", pci_ids_db=None):
    """Return everything this module knows about one PCI function, as plain data.

    Keys: the :func:`read_identity` keys, ``vendor_name``, ``device_name``, ``subsystem_name``,
    ``class_name`` (from ``pci_ids_db``, a :func:`parse_pci_ids` result; None without one),
    ``sysfs_path``, ``numa_node`` (None when unknown; the kernel's -1 is kept), ``boot_vga``,
    ``iommu_group``, ``iommu_group_members``, ``viable``, ``blockers``, ``sriov_totalvfs``,
    ``sriov_numvfs``, ``physfn``, ``virtfns``, ``is_vf``, ``mdev_types``, ``vgpu``,
    ``sandbox_resource_name`` (NVIDIA functions only: the name the sandbox device plugin version the
    GPU Operator deploys advertises, from the pci.ids in its image, not this host's).
    """
    devdir = pci_device_dir(address, root)
    info = read_identity(address, root)
    info.update(pci_names(pci_ids_db, info["vendor"], info["device"], info["subsystem_vendor"],
                          info["subsystem_device"], info["class"]))
    info["sysfs_path"] = _sysfs_rel(root, devdir)
    info["numa_node"] = _int_attr(devdir, "numa_node")
    info["boot_vga"] = _int_attr(devdir, "boot_vga") == 1
    viability = device_viability(address, root)
    info["iommu_group"] = viability["group"]
    info["iommu_group_members"] = viability["members"]
    info["viable"] = viability["viable"]
    info["blockers"] = viability["blockers"]
    sriov = sriov_info(address, root)
    info["sriov_totalvfs"] = sriov["totalvfs"]
    info["sriov_numvfs"] = sriov["numvfs"]
    info["physfn"] = sriov["physfn"]
    info["virtfns"] = sriov["virtfns"]
    info["is_vf"] = sriov["physfn"] is not None
    info["mdev_types"] = read_mdev_types(devdir)
    info["vgpu"] = vgpu_info(address, root)
    info["sandbox_resource_name"] = None
    if info["vendor"] == NVIDIA_VENDOR_ID and info["device"] and _HEX4_RE.match(info["device"]):
        # The plugin names GPUs from the pci.ids in its own image, never the host's: the table of names it gives.
        info["sandbox_resource_name"] = sandbox_resource_name(None, info["device"])
    return info


def pci_ids_db_text(db):
    """Return the raw pci.ids text stored in a database built by :func:`load_pci_ids_db`, or ''."""
    return (db or {}).get("text") or ""


def load_pci_ids_db(root="/"):
    """Load and parse the host's pci.ids: a :func:`parse_pci_ids` dict plus ``path`` and ``text``."""
    path, text = load_pci_ids(root)
    db = parse_pci_ids(text or "")
    db["path"] = path
    db["text"] = text or ""
    return db


# ---------------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------------

def select_functions(root="/", addresses=None, vendors=None, classes=None, include_all=False):
    """Return the sorted, de-duplicated addresses selected by the caller.

    - ``addresses``: exactly these functions (each must exist and resolve under /sys/devices);
      vendor and class selectors are ignored.
    - ``include_all``: every PCI function.
    - otherwise functions matching one of ``vendors`` (``VVVV[:DDDD]``, default ``10de``) and one of
      ``classes`` (2/4/6 hex digit prefixes, default ``030000`` and ``030200``); an empty list
      matches everything.
    """
    if addresses:
        chosen = []
        for address in addresses:
            pci_device_dir(address, root)
            addr = normalize_pci_address(address)
            if addr not in chosen:
                chosen.append(addr)
        return sorted(chosen)
    if include_all:
        return [addr for addr in list_functions(root) if pci_device_dir(addr, root)]
    vendor_selectors = parse_vendor_selectors(DEFAULT_VENDOR_SELECTORS if vendors is None else vendors)
    class_prefixes = parse_class_selectors(DEFAULT_CLASS_SELECTORS if classes is None else classes)
    chosen = []
    for addr in list_functions(root):
        if matches_selectors(read_identity(addr, root), vendor_selectors, class_prefixes):
            chosen.append(addr)
    return chosen


# Argument spec of the selector options documented by the gpuops.sandbox.pci_selectors doc fragment.
SELECTOR_ARGUMENT_SPEC = dict(
    addresses=dict(type="list", elements="str"),
    vendors=dict(type="list", elements="str"),
    classes=dict(type="list", elements="str"),
)
# Addresses name the functions outright, so they exclude the other selectors.
SELECTOR_MUTUALLY_EXCLUSIVE = [("addresses", "vendors"), ("addresses", "classes")]
# The selector options plus include_all, for the modules that only read (gpu_facts, iommu_check).
SELECTION_ARGUMENT_SPEC = dict(SELECTOR_ARGUMENT_SPEC, include_all=dict(type="bool", default=False))
# include_all selects every function, so it excludes the other selectors too.
SELECTION_MUTUALLY_EXCLUSIVE = SELECTOR_MUTUALLY_EXCLUSIVE + [
    ("addresses", "include_all"),
    ("include_all", "vendors"),
    ("include_all", "classes"),
]


def select_from_params(params, root="/"):
    """Return the functions a module's validated selector options pick (:func:`select_functions`).

    ``params`` holds the :data:`SELECTOR_ARGUMENT_SPEC` options and, optionally, ``include_all``.
    """
    return select_functions(
        root=root,
        addresses=params.get("addresses"),
        vendors=params.get("vendors"),
        classes=params.get("classes"),
        include_all=params.get("include_all") or False,
    )
