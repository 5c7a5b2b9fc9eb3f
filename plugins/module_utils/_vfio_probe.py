# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The VFIO user API, as a VMM uses it, done and undone at once: the owner of the ``/dev/vfio`` and
``/dev/iommu`` ioctls (module vfio_probe).

A device handed to VMs is "ready" only when the calls QEMU makes succeed on it:

- legacy (container) path: open ``/dev/vfio/vfio``, check the API version and the Type1v2 extension, open
  ``/dev/vfio/<group>``, ``VFIO_GROUP_GET_STATUS`` (viable?), ``VFIO_GROUP_SET_CONTAINER``, ``VFIO_SET_IOMMU``
  (refused with EPERM when the platform has no interrupt remapping and ``allow_unsafe_interrupts`` is off),
  ``VFIO_GROUP_GET_DEVICE_FD`` by device name, ``VFIO_DEVICE_GET_INFO``;
- iommufd path (kernel 6.6 or later with the device's ``/dev/vfio/devices/vfioN``): open ``/dev/iommu``,
  allocate an IOAS, open the cdev, ``VFIO_DEVICE_BIND_IOMMUFD``, ``VFIO_DEVICE_ATTACH_IOMMUFD_PT``,
  ``VFIO_DEVICE_GET_INFO``.

Every descriptor is closed before the next device, so nothing stays attached. A device whose nodes a process
holds open is never opened (the holder is named instead); opening a free device makes vfio-pci enable and
reset it, as every VM start does. The system calls go through ``Kernel`` so unit tests can play the kernel.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path, link_name, read_attr
from ansible_collections.gpuops.sandbox.plugins.module_utils._pci import (
    group_viability,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._holders import find_holders, vfio_cdevs, vfio_group_node

# ioctl numbers: _IO(';', nr), no size or direction bits (include/uapi/linux/vfio.h, iommufd.h).
_TYPE = ord(";")


def _io(nr):
    return (_TYPE << 8) | nr


VFIO_API_VERSION = 0
VFIO_TYPE1V2_IOMMU = 3
VFIO_GET_API_VERSION = _io(100)
VFIO_CHECK_EXTENSION = _io(101)
VFIO_SET_IOMMU = _io(102)
VFIO_GROUP_GET_STATUS = _io(103)
VFIO_GROUP_SET_CONTAINER = _io(104)
VFIO_GROUP_UNSET_CONTAINER = _io(105)
VFIO_GROUP_GET_DEVICE_FD = _io(106)
VFIO_DEVICE_GET_INFO = _io(107)
VFIO_DEVICE_BIND_IOMMUFD = _io(118)
VFIO_DEVICE_ATTACH_IOMMUFD_PT = _io(119)
IOMMU_IOAS_ALLOC = _io(0x81)

VFIO_GROUP_FLAGS_VIABLE = 1 << 0
VFIO_GROUP_FLAGS_CONTAINER_SET = 1 << 1
VFIO_DEVICE_FLAGS_RESET = 1 << 0
VFIO_DEVICE_FLAGS_PCI = 1 << 1

CONTAINER = "/dev/vfio/vfio"
IOMMUFD = "/dev/iommu"
UNSAFE_INTERRUPTS = "/sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts"

# Backend names of the DRA driver's VFIO settings (its KubeVirt passthrough guide).
LEGACY_ONLY = "LegacyOnly"
PREFER_IOMMUFD = "PreferIommuFD"


class Kernel:
    """The system calls of the probe. ``root`` prefixes every path (unit tests replace the whole class)."""

    def __init__(self, root="/"):
        self.root = root

    def exists(self, path):
        return os.path.exists(host_path(self.root, path))

    def open(self, path):
        return os.open(host_path(self.root, path), os.O_RDWR | os.O_CLOEXEC)

    def close(self, fd):
        os.close(fd)

    def ioctl(self, fd, request, arg=0):
        """``ioctl(fd, request, arg)``: an int is passed by value, a bytearray by address (filled in place)."""
        if isinstance(arg, bytearray):
            return fcntl.ioctl(fd, request, arg, True)
        return fcntl.ioctl(fd, request, arg)


class ProbeFailure(GpuopsError):
    """One call of the probe failed: ``step`` names it, ``kind`` classifies it, ``msg`` says why.

    Caught per device by :func:`probe_device` (a device problem is a result, not a module failure).
    """

    def __init__(self, step, kind, msg, err=None):
        super().__init__(msg, step=step, kind=kind)
        self.step = step
        self.kind = kind
        self.errno = err


def _os_reason(exc):
    return "%s (%s)" % (exc.strerror or exc, errno.errorcode.get(exc.errno, exc.errno))


class _Fds:
    """Descriptors opened during one probe, closed in reverse order whatever happens."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.fds = []

    def open(self, path, step, kinds):
        try:
            fd = self.kernel.open(path)
        except OSError as exc:
            kind, hint = kinds.get(exc.errno, ("error", ""))
            raise ProbeFailure(step, kind, "opening %s failed: %s%s" % (path, _os_reason(exc), hint), exc.errno)
        self.fds.append(fd)
        return fd

    def keep(self, fd):
        self.fds.append(fd)
        return fd

    def call(self, fd, request, arg, step, kinds=None):
        try:
            return self.kernel.ioctl(fd, request, arg)
        except OSError as exc:
            kind, hint = (kinds or {}).get(exc.errno, ("error", ""))
            raise ProbeFailure(step, kind, "%s failed: %s%s" % (step, _os_reason(exc), hint), exc.errno)

    def close_all(self):
        while self.fds:
            fd = self.fds.pop()
            try:
                self.kernel.close(fd)
            except OSError:
                pass


def _device_info(fds, fd):
    buf = bytearray(struct.pack("=6I", 24, 0, 0, 0, 0, 0))
    fds.call(fd, VFIO_DEVICE_GET_INFO, buf, "VFIO_DEVICE_GET_INFO")
    _argsz, flags, regions, irqs, _cap, _pad = struct.unpack("=6I", bytes(buf))
    return {"flags": flags, "regions": regions, "irqs": irqs, "pci": bool(flags & VFIO_DEVICE_FLAGS_PCI),
            "reset": bool(flags & VFIO_DEVICE_FLAGS_RESET)}


_UNSAFE_HINT = (": the platform offers no interrupt remapping (isolated MSI) for this group and "
                "vfio_iommu_type1.allow_unsafe_interrupts is off; turn interrupt remapping on in the firmware "
                "(VT-d/AMD-Vi with interrupt remapping; do not boot with intremap=off). Setting "
                "allow_unsafe_interrupts=1 would let a VM's device forge interrupts and is never done here")
_BUSY_HINT = ": another process holds it (a VM is using the device)"


def probe_legacy(kernel, target, root="/"):
    """The container/group path; returns the device info or raises ProbeFailure."""
    group = target["group"]
    if group is None:
        raise ProbeFailure("iommu_group", "no-iommu",
                           "%s has no IOMMU group: the IOMMU is off, so no VMM can use it" % target["name"])
    fds = _Fds(kernel)
    try:
        container = fds.open(CONTAINER, "open container", {
            errno.ENOENT: ("no-vfio", ": the vfio module is not loaded")})
        version = fds.call(container, VFIO_GET_API_VERSION, 0, "VFIO_GET_API_VERSION")
        if version != VFIO_API_VERSION:
            raise ProbeFailure("VFIO_GET_API_VERSION", "api",
                               "the VFIO API version is %s, not %d" % (version, VFIO_API_VERSION))
        if not fds.call(container, VFIO_CHECK_EXTENSION, VFIO_TYPE1V2_IOMMU, "VFIO_CHECK_EXTENSION"):
            raise ProbeFailure("VFIO_CHECK_EXTENSION", "no-type1v2",
                               "the VFIO container has no Type1v2 IOMMU backend (vfio_iommu_type1 not loaded, "
                               "or no IOMMU driver)")
        node = "/dev/vfio/%s" % group
        group_fd = fds.open(node, "open group", {
            errno.EBUSY: ("busy", _BUSY_HINT),
            errno.ENOENT: ("no-group-node", ": the device is not bound to a VFIO driver")})
        status = bytearray(struct.pack("=2I", 8, 0))
        fds.call(group_fd, VFIO_GROUP_GET_STATUS, status, "VFIO_GROUP_GET_STATUS")
        flags = struct.unpack("=2I", bytes(status))[1]
        if not flags & VFIO_GROUP_FLAGS_VIABLE:
            raise ProbeFailure("VFIO_GROUP_GET_STATUS", "not-viable", not_viable_reason(group, root))
        if flags & VFIO_GROUP_FLAGS_CONTAINER_SET:
            raise ProbeFailure("VFIO_GROUP_GET_STATUS", "busy", "IOMMU group %s is already in a container%s"
                               % (group, _BUSY_HINT))
        fds.call(group_fd, VFIO_GROUP_SET_CONTAINER, bytearray(struct.pack("=i", container)),
                 "VFIO_GROUP_SET_CONTAINER", {errno.EBUSY: ("busy", _BUSY_HINT)})
        fds.call(container, VFIO_SET_IOMMU, VFIO_TYPE1V2_IOMMU, "VFIO_SET_IOMMU",
                 {errno.EPERM: ("interrupt-remapping", _UNSAFE_HINT)})
        name = bytearray(target["name"].encode("ascii") + b"\0")
        device = fds.keep(fds.call(group_fd, VFIO_GROUP_GET_DEVICE_FD, name, "VFIO_GROUP_GET_DEVICE_FD", {
            errno.EBUSY: ("busy", _BUSY_HINT),
            errno.ENODEV: ("no-device", ": the group has no device of that name (unbound meanwhile?)")}))
        return _device_info(fds, device)
    finally:
        fds.close_all()


def probe_iommufd(kernel, target):
    """The iommufd/cdev path; returns the device info or raises ProbeFailure (kind ``unavailable`` when the
    kernel or the device offers no such path)."""
    if not kernel.exists(IOMMUFD):
        raise ProbeFailure("open /dev/iommu", "unavailable",
                           "no /dev/iommu: the kernel has no iommufd (6.2 or later, CONFIG_IOMMUFD) or it is not "
                           "loaded")
    if not target["cdevs"]:
        raise ProbeFailure("open cdev", "unavailable",
                           "%s has no /dev/vfio/devices/vfioN (kernel before 6.6 or without CONFIG_VFIO_DEVICE_CDEV)"
                           % target["name"])
    fds = _Fds(kernel)
    try:
        iommufd = fds.open(IOMMUFD, "open /dev/iommu", {})
        alloc = bytearray(struct.pack("=3I", 12, 0, 0))
        fds.call(iommufd, IOMMU_IOAS_ALLOC, alloc, "IOMMU_IOAS_ALLOC")
        ioas = struct.unpack("=3I", bytes(alloc))[2]
        device = fds.open(target["cdevs"][0], "open cdev", {errno.EBUSY: ("busy", _BUSY_HINT)})
        fds.call(device, VFIO_DEVICE_BIND_IOMMUFD, bytearray(struct.pack("=IIiI", 16, 0, iommufd, 0)),
                 "VFIO_DEVICE_BIND_IOMMUFD", {errno.EBUSY: ("busy", _BUSY_HINT),
                                              errno.EPERM: ("interrupt-remapping", _UNSAFE_HINT)})
        fds.call(device, VFIO_DEVICE_ATTACH_IOMMUFD_PT, bytearray(struct.pack("=3I", 12, 0, ioas)),
                 "VFIO_DEVICE_ATTACH_IOMMUFD_PT", {errno.EPERM: ("interrupt-remapping", _UNSAFE_HINT)})
        return _device_info(fds, device)
    finally:
        fds.close_all()


def not_viable_reason(group, root="/"):
    """Why the kernel calls ``group`` not viable: its members on other drivers."""
    try:
        viability = group_viability(group, root)
    except (OSError, ValueError):
        viability = {"blockers": []}
    if not viability["blockers"]:
        return "IOMMU group %s is not viable (the kernel says so; no member on a host driver was found)" % group
    return "IOMMU group %s is not viable: %s" % (group, "; ".join(
        "%s is on %s" % (b["address"], b["driver"]) for b in viability["blockers"]))


def interrupt_remapping(root="/"):
    """``{"remapping": bool or None, "allow_unsafe_interrupts": bool or None}``.

    Remapping is on when ``/proc/interrupts`` names remapped interrupt chips (``IR-IO-APIC``, ``IR-PCI-MSI``,
    on Intel and AMD alike); None when it cannot be read. The module parameter is None when vfio_iommu_type1
    is not loaded.
    """
    text = None
    try:
        with open(host_path(root, "/proc/interrupts")) as handle:
            text = handle.read()
    except (IOError, OSError):
        pass
    remapping = None if text is None else any(word.startswith("IR-") for word in text.split())
    unsafe = read_attr(host_path(root, UNSAFE_INTERRUPTS), default="")
    return {"remapping": remapping,
            "allow_unsafe_interrupts": None if not unsafe else unsafe in ("Y", "y", "1")}


def device_target(name, device_type, devdir, extra=None):
    """What the probe needs to know about one device: its VFIO group and cdev nodes, from sysfs."""
    group = link_name(os.path.join(devdir, "iommu_group"))
    cdevs = vfio_cdevs(devdir)
    target = {"name": name, "type": device_type, "group": int(group) if group is not None and group.isdigit() else None,
              "cdevs": cdevs}
    target.update(extra or {})
    return target


def target_holders(target, root):
    """The processes holding the VFIO nodes of a :func:`device_target` (``_holders.find_holders`` entries)."""
    nodes = ([vfio_group_node(target["group"])] if target["group"] is not None else []) + target["cdevs"]
    return find_holders(nodes, root)


def probe_device(kernel, target, root="/"):
    """Probe one device on both paths; returns its report (never raises for a device problem)."""
    report = dict(target)
    holders = target_holders(target, root)
    if holders:
        listed = ", ".join("pid %d (%s) holds %s" % (h["pid"], h["cmdline"] or h["comm"] or "?", h["device"])
                           for h in holders)
        reason = "%s is in use: %s; it was not opened" % (target["name"], listed)
        report.update(ok=False, problem_kind="busy", problem=reason, holders=holders,
                      legacy={"ok": False, "kind": "busy", "step": "holder scan", "reason": reason},
                      iommufd={"ok": False, "kind": "busy", "step": "holder scan", "reason": reason})
        return report
    report["holders"] = []
    try:
        info = probe_legacy(kernel, target, root)
        report["legacy"] = dict(ok=True, **info)
    except ProbeFailure as exc:
        report["legacy"] = {"ok": False, "kind": exc.kind, "step": exc.step, "reason": exc.msg}
    try:
        info = probe_iommufd(kernel, target)
        report["iommufd"] = dict(ok=True, **info)
    except ProbeFailure as exc:
        report["iommufd"] = {"ok": False, "kind": exc.kind, "step": exc.step, "reason": exc.msg}
    legacy, iommufd = report["legacy"], report["iommufd"]
    report["ok"] = legacy["ok"] or iommufd["ok"]
    if report["ok"]:
        report["problem_kind"] = None
        report["problem"] = None
    else:
        failed = legacy if legacy["kind"] != "unavailable" or iommufd["kind"] == "unavailable" else iommufd
        report["problem_kind"] = failed["kind"]
        report["problem"] = failed["reason"]
    return report


def backends(reports):
    """Which VFIO paths worked for every probed device, and the DRA driver setting that follows."""
    probed = [r for r in reports if r["problem_kind"] != "busy"]
    legacy = bool(probed) and all(r["legacy"]["ok"] for r in probed)
    iommufd = bool(probed) and all(r["iommufd"]["ok"] for r in probed)
    return {"legacy": legacy, "iommufd": iommufd,
            "dra_setting": PREFER_IOMMUFD if iommufd else (LEGACY_ONLY if legacy else None)}
