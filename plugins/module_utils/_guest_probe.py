# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A real guest with the devices passed through: the owner of starting QEMU for a proof (module
guest_attach_probe).

This file is private to the gpuops.sandbox collection: its interface may change at any time.

Before anything starts, every device is checked on the host: a PCI function must be on a VFIO driver
(vfio-pci or a vendor ``*_vfio_pci`` driver) and in an IOMMU group, a mediated device must exist and have a
group, and no process may hold the device's VFIO nodes (``/dev/vfio/<group>``, ``/dev/vfio/devices/vfioN``).
A refused device is never handed to QEMU.

Then QEMU runs once with the accepted devices as ``-device vfio-pci`` (each at a fixed slot of the guest's
root bus, ``id=gpuopsN``), through the collection's command runner (``_module.run_timed``: ``module.run_command``
under ``timeout --kill-after``); the module waits for it to exit:

- ``paused``: with ``-S`` (no guest code runs) and QMP on QEMU's standard input and output (``-qmp stdio``). Its
  standard input is ``qmp_capabilities``, ``query-pci`` and ``quit``, one command a line; QEMU answers them in
  order on its standard output once it has realized the devices (what the guest's PCI bus holds), then exits.
  A device QEMU cannot realize makes it exit with an error naming the device, before any answer.
- ``boot``: a kernel and an initramfs (by default the host's kernel and an initramfs made here, in a private
  temporary directory, from a static busybox) boot; the guest's ``/init`` prints every PCI function it sees on
  the serial console (QEMU's standard output), between markers, and powers off, and QEMU exits (``-no-reboot``).

A QEMU still running at the time limit (the ``timeout`` option) gets SIGTERM from timeout(1), and SIGKILL
``KILL_AFTER`` seconds later; nothing else stops it. The temporary directory is removed whatever happens.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import struct
import tempfile
import time

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    TIMED_OUT_RCS,
    GpuopsError,
    check_range,
    check_timeout,
    run_timed,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import (
    MAX_WAIT,
    SysfsError,
    host_path,
    link_name,
    normalize_pci_address,
    pci_device_dir,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._pci import read_identity
from ansible_collections.gpuops.sandbox.plugins.module_utils._mdev import (
    MDEV_DEVICES,
    list_mdev_devices,
    normalize_uuid,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._vfio import is_vfio_driver
from ansible_collections.gpuops.sandbox.plugins.module_utils._vfio_probe import device_target, target_holders

MODES = ("paused", "boot")
ACCELS = ("auto", "kvm", "tcg")
# The QEMU binaries tried in order when none is given: a name looked up on PATH, then RHEL's path.
QEMU_NAME = "qemu-system-x86_64"
QEMU_LIBEXEC = "/usr/libexec/qemu-kvm"
DEFAULT_MEMORY_MB = {"paused": 64, "boot": 256}
MEMORY_MB_LOW = 32
MEMORY_MB_HIGH = 65536
DEFAULT_TIMEOUT = 300
# The devices go to the guest's root bus from this slot on, one slot each (q35 keeps 00.0 and 1f.x).
FIRST_SLOT = 0x08
MAX_DEVICES = 16
DEVICE_ID = "gpuops%d"
KVM_GET_API_VERSION = 0xAE00
KVM_CREATE_VM = 0xAE01
KVM_API_VERSION = 12
# Seconds a QEMU gets to exit after timeout(1)'s SIGTERM at the time limit before SIGKILL.
KILL_AFTER = 10
# The paused guest's QMP session, QEMU's whole standard input: one command a line, answered in order.
QMP_COMMANDS = ("qmp_capabilities", "query-pci", "quit")
QMP_INPUT = "".join(json.dumps({"execute": name}, separators=(",", ":")) + "\n" for name in QMP_COMMANDS)
# The booting guest's serial console goes to QEMU's standard output, which QEMU opens as a file; QEMU then never
# reads its standard input.
SERIAL_TO_STDOUT = "file:/dev/stdout"
OUTPUT_LIMIT = 4000
CONSOLE_LINES = 40

MARK_BEGIN = "GPUOPS-GUEST-BEGIN"
MARK_END = "GPUOPS-GUEST-END"
MARK_PCI = "GPUOPS-PCI"
GUEST_APPEND = "console=ttyS0 panic=-1 rdinit=/init loglevel=4"
# The guest's /init: busybox applets, sysfs, one line per PCI function (vendor, device, class, tty ports of
# a serial function such as mtty's), then power off. Kernel messages are silenced first so none interleaves.
INIT_SCRIPT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
dmesg -n 1
echo %(begin)s
for d in /sys/bus/pci/devices/*; do
  t=""
  if [ -d "$d/tty" ]; then t=$(ls "$d/tty" | tr '\\n' ' '); fi
  echo "%(pci)s ${d##*/} $(cat $d/vendor) $(cat $d/device) $(cat $d/class) $t"
done
echo %(end)s
poweroff -f
""" % {"begin": MARK_BEGIN, "end": MARK_END, "pci": MARK_PCI}

_PCI_LINE_RE = re.compile(r"%s ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) 0x([0-9a-fA-F]{4}) "
                          r"0x([0-9a-fA-F]{4}) 0x([0-9a-fA-F]{6})(.*)$" % MARK_PCI)


class GuestError(GpuopsError):
    """The proof could not be run as asked (bad input, no QEMU, no kernel); ``msg`` says why and what is accepted."""


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

def _entries(params, option, normalize, what):
    values = params.get(option) or []
    found = []
    for value in values:
        try:
            name = normalize(value)
        except GpuopsError as exc:
            raise GuestError("%s: %s; nothing was started" % (option, exc.msg)) from exc
        if name in found:
            raise GuestError("%s lists %s twice; give each %s once; nothing was started" % (option, name, what))
        found.append(name)
    return found


def check_params(params):
    """The validated inputs: ``{devices, mdevs, mode, accel, memory_mb, timeout, qemu, kernel, initrd}``."""
    devices = _entries(params, "devices", normalize_pci_address, "PCI address")
    mdevs = _entries(params, "mdevs", normalize_uuid, "UUID")
    if not devices and not mdevs:
        raise GuestError("nothing to pass through: give devices (PCI addresses such as 0000:65:00.0, each on a VFIO "
                         "driver) or mdevs (UUIDs of mediated devices), or both; nothing was started")
    if len(devices) + len(mdevs) > MAX_DEVICES:
        raise GuestError("%d devices given; one guest takes at most %d here (one slot of its root bus each); "
                         "nothing was started" % (len(devices) + len(mdevs), MAX_DEVICES))
    mode = params.get("mode") or "paused"
    timeout = check_timeout(params.get("timeout"), 1, MAX_WAIT, GuestError)
    memory_mb = params.get("memory_mb")
    if memory_mb is None:
        memory_mb = DEFAULT_MEMORY_MB[mode]
    try:
        check_range("memory_mb", memory_mb, MEMORY_MB_LOW, MEMORY_MB_HIGH, what="MiB")
    except GpuopsError as exc:
        raise GuestError(exc.msg.replace("nothing was changed", "nothing was started")) from exc
    for option in ("kernel", "initrd"):
        value = params.get(option)
        if value is not None and mode != "boot":
            raise GuestError("%s=%s is used only with mode=boot (mode is %s); leave it out or set mode=boot; "
                             "nothing was started" % (option, value, mode))
        if value is not None and (not isinstance(value, str) or not value.startswith("/")):
            raise GuestError("%s %r is not an absolute path; give the path of the guest's %s on the host; nothing "
                             "was started" % (option, value, "kernel image" if option == "kernel" else "initramfs"))
    qemu = params.get("qemu")
    if qemu is not None and (not isinstance(qemu, str) or not qemu.strip() or "\n" in qemu):
        raise GuestError("qemu %r is not a path or a command name; give e.g. /usr/bin/qemu-system-x86_64; nothing "
                         "was started" % (qemu,))
    return {"devices": devices, "mdevs": mdevs, "mode": mode, "accel": params.get("accel") or "auto",
            "memory_mb": memory_mb, "timeout": timeout, "qemu": qemu,
            "kernel": params.get("kernel"), "initrd": params.get("initrd")}


def find_qemu(qemu, get_bin_path, root="/"):
    """The QEMU binary: ``qemu`` (a path, or a name on PATH), else qemu-system-x86_64 on PATH, else qemu-kvm."""
    if qemu is not None:
        path = qemu if "/" in qemu else get_bin_path(qemu)
        if path is None:
            raise GuestError("qemu %s was not found on PATH; give its full path; nothing was started" % qemu)
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            raise GuestError("qemu %s is not an executable file; give the path of qemu-system-x86_64 (or qemu-kvm); "
                             "nothing was started" % path)
        return path
    path = get_bin_path(QEMU_NAME)
    if path:
        return path
    libexec = host_path(root, QEMU_LIBEXEC)
    if os.path.isfile(libexec) and os.access(libexec, os.X_OK):
        return libexec
    raise GuestError("no QEMU on this host: neither %s on PATH nor %s; install it (Debian/Ubuntu: qemu-system-x86, "
                     "RHEL: qemu-kvm) or set qemu; nothing was started" % (QEMU_NAME, QEMU_LIBEXEC))


def kvm_state(root="/"):
    """``(usable, reason)``: KVM is usable when ``/dev/kvm`` opens read-write, speaks API 12 and creates a VM."""
    path = host_path(root, "/dev/kvm")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return False, "/dev/kvm cannot be opened (%s)" % (exc.strerror or exc)
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION, 0)
        if version != KVM_API_VERSION:
            return False, "/dev/kvm speaks KVM API %s, not %d" % (version, KVM_API_VERSION)
        os.close(fcntl.ioctl(fd, KVM_CREATE_VM, 0))
    except OSError as exc:
        return False, "/dev/kvm does not create a VM (%s)" % (exc.strerror or exc)
    finally:
        os.close(fd)
    return True, "/dev/kvm creates VMs"


def choose_accel(accel, root="/"):
    """``(accel, reason)`` for ``auto``, ``kvm`` (refused when KVM is not usable) or ``tcg``."""
    usable, reason = kvm_state(root) if accel in ("auto", "kvm") else (False, None)
    if accel == "kvm" and not usable:
        raise GuestError("accel=kvm, but %s; use accel=auto (falls back to software emulation, tcg) or accel=tcg; "
                         "nothing was started" % reason)
    if accel == "tcg":
        return "tcg", "asked for (accel=tcg)"
    if usable:
        return "kvm", reason if accel == "auto" else "asked for (accel=kvm); " + reason
    return "tcg", "%s: software emulation" % reason


# ---------------------------------------------------------------------------------------------
# The devices on the host
# ---------------------------------------------------------------------------------------------

def _holders_text(holders):
    return ", ".join("pid %d (%s) holds %s" % (h["pid"], h["cmdline"] or h["comm"] or "?", h["device"])
                     for h in holders)


def device_checks(devices, mdevs, root="/"):
    """One report per device (``devices`` then ``mdevs``), with ``problem_kind``/``problem`` set when it is refused.

    A PCI address or a UUID that names nothing on the host is an input error (GuestError).
    """
    reports = []
    for address in devices:
        try:
            devdir = pci_device_dir(address, root)
            ident = read_identity(address, root)
        except SysfsError as exc:
            raise GuestError("devices: %s; nothing was started" % exc.msg) from exc
        target = device_target(address, "pci", devdir, {"driver": ident["driver"]})
        report = _report(target)
        if not is_vfio_driver(ident["driver"]):
            report["problem_kind"] = "wrong-driver"
            report["problem"] = ("%s (%s:%s) is on %s, not on a VFIO driver (vfio-pci or a vendor *_vfio_pci driver); "
                                 "bind it first (gpuops.sandbox.vfio_bind); it was not passed to QEMU"
                                 % (address, ident["vendor"], ident["device"],
                                    ident["driver"] or "no driver"))
        elif target["group"] is None:
            report["problem_kind"] = "no-iommu"
            report["problem"] = ("%s has no IOMMU group: the IOMMU is off, so no VM can take it; it was not passed "
                                 "to QEMU" % address)
        reports.append(_busy(report, target, root))
    existing = None
    for uuid in mdevs:
        path = host_path(root, "%s/%s" % (MDEV_DEVICES, uuid))
        if not os.path.exists(path):
            existing = existing if existing is not None else sorted(list_mdev_devices(root))
            raise GuestError("mdevs: mediated device %s does not exist on this host (no %s/%s); existing ones: %s; "
                             "nothing was started" % (uuid, MDEV_DEVICES, uuid, ", ".join(existing) or "none"))
        parent = os.path.basename(os.path.dirname(os.path.realpath(path)))
        target = device_target(uuid, "mdev", path, {"parent": parent,
                                                    "mdev_type": link_name(os.path.join(path, "mdev_type"))})
        report = _report(target)
        if target["group"] is None:
            report["problem_kind"] = "no-iommu"
            report["problem"] = ("mediated device %s has no IOMMU group (its parent's driver has not given it to "
                                 "VFIO); it was not passed to QEMU" % uuid)
        reports.append(_busy(report, target, root))
    return reports


def _report(target):
    report = {"driver": None, "parent": None, "mdev_type": None}
    report.update(target)
    report.update(holders=[], guest=None, seen=False, problem_kind=None, problem=None)
    return report


def _busy(report, target, root):
    if report["problem_kind"] is None:
        holders = target_holders(target, root)
        if holders:
            report.update(holders=holders, problem_kind="busy",
                          problem="%s is in use: %s; it was not passed to QEMU (a device a process holds is never "
                                  "touched)" % (target["name"], _holders_text(holders)))
    return report


# ---------------------------------------------------------------------------------------------
# The guest's initramfs
# ---------------------------------------------------------------------------------------------

def elf_interpreter(path):
    """Whether the ELF executable ``path`` asks for a program interpreter (dynamically linked); GuestError when
    it is not an ELF executable."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
                raise GuestError("%s is not an ELF executable" % path)
            order = "<" if head[5] == 1 else ">"
            if head[4] == 2:
                phoff, = struct.unpack(order + "Q", head[32:40])
                phentsize, phnum = struct.unpack(order + "HH", head[54:58])
            else:
                phoff, = struct.unpack(order + "I", head[28:32])
                phentsize, phnum = struct.unpack(order + "HH", head[42:46])
            for index in range(min(phnum, 256)):
                handle.seek(phoff + index * phentsize)
                entry = handle.read(4)
                if len(entry) == 4 and struct.unpack(order + "I", entry)[0] == 3:  # PT_INTERP
                    return True
    except (IOError, OSError) as exc:
        raise GuestError("cannot read %s: %s" % (path, exc.strerror or exc)) from exc
    return False


def cpio_newc(entries):
    """An uncompressed ``newc`` cpio archive (what the kernel unpacks as an initramfs) of ``entries``:
    ``(name, mode, data, rdev_major, rdev_minor)``, directories before what they hold."""
    out = bytearray()

    def pad():
        out.extend(b"\0" * (-len(out) % 4))

    for ino, (name, mode, data, major, minor) in enumerate(list(entries) + [("TRAILER!!!", 0, b"", 0, 0)], 1):
        raw_name = name.encode("utf-8") + b"\0"
        nlink = 2 if stat.S_ISDIR(mode) else 1
        fields = (ino, mode, 0, 0, nlink, 0, len(data), 0, 0, major, minor, len(raw_name), 0)
        out.extend(b"070701" + "".join("%08X" % value for value in fields).encode("ascii"))
        out.extend(raw_name)
        pad()
        out.extend(data)
        pad()
    return bytes(out)


def build_initramfs(busybox, path):
    """Write the guest's initramfs to ``path``: the static ``busybox``, ``/init`` (INIT_SCRIPT), ``/dev/console``."""
    if elf_interpreter(busybox):
        raise GuestError("%s is dynamically linked, and the guest's initramfs has no libraries; install a static "
                         "busybox (Debian/Ubuntu: busybox-static) or give initrd; nothing was started" % busybox)
    with open(busybox, "rb") as handle:
        binary = handle.read()
    directory = stat.S_IFDIR | 0o755
    entries = [
        ("bin", directory, b"", 0, 0), ("dev", directory, b"", 0, 0), ("proc", directory, b"", 0, 0),
        ("sys", directory, b"", 0, 0), ("tmp", stat.S_IFDIR | 0o1777, b"", 0, 0),
        ("dev/console", stat.S_IFCHR | 0o600, b"", 5, 1),
        ("bin/busybox", stat.S_IFREG | 0o755, binary, 0, 0),
        ("bin/sh", stat.S_IFLNK | 0o777, b"busybox", 0, 0),
        ("init", stat.S_IFREG | 0o755, INIT_SCRIPT.encode("ascii"), 0, 0),
    ]
    with open(path, "wb") as handle:
        handle.write(cpio_newc(entries))
    return path


def boot_files(params, get_bin_path, root="/", release=None):
    """``(kernel, initrd, busybox)`` of a boot: the kernel image (the given one or the host's running kernel's),
    the given initramfs or None, and the static busybox to make one from (None when an initramfs is given)."""
    kernel = params["kernel"] or "/boot/vmlinuz-%s" % (release or os.uname().release)
    kernel_path = host_path(root, kernel)
    if not os.path.isfile(kernel_path):
        raise GuestError("no kernel image at %s%s; give kernel (the path of a bzImage/vmlinuz on the host); nothing "
                         "was started" % (kernel, "" if params["kernel"] else " (the running kernel's)"))
    if params["initrd"]:
        initrd = host_path(root, params["initrd"])
        if not os.path.isfile(initrd):
            raise GuestError("initrd %s is not a file; give the path of an initramfs on the host, or leave it out to "
                             "have one made from a static busybox; nothing was started" % params["initrd"])
        return kernel_path, initrd, None
    busybox = get_bin_path("busybox")
    if not busybox:
        raise GuestError("mode=boot needs busybox (static) for the guest's initramfs and none is on PATH; install it "
                         "(Debian/Ubuntu: busybox-static) or give initrd; nothing was started")
    return kernel_path, None, busybox


# ---------------------------------------------------------------------------------------------
# QEMU
# ---------------------------------------------------------------------------------------------

def guest_slot(index):
    return FIRST_SLOT + index


def guest_address(index):
    return "0000:00:%02x.0" % guest_slot(index)


def qemu_argv(qemu, reports, mode, accel, memory_mb, kernel=None, initrd=None):
    """QEMU's arguments: a q35 machine with nothing but the accepted devices (``reports`` without a problem).

    Paused: QMP on QEMU's standard input and output (``-qmp stdio``) and nothing else there. Boot: the serial
    console on QEMU's standard output; QEMU never reads its standard input then (``-serial stdio`` would, and would
    put a terminal there into raw mode).
    """
    argv = [qemu, "-name", "gpuops-guest-probe", "-nodefaults", "-no-user-config", "-display", "none",
            "-machine", "q35", "-accel", accel, "-m", str(memory_mb), "-smp", "1"]
    if accel == "kvm":
        argv += ["-cpu", "host"]
    if mode == "paused":
        argv += ["-qmp", "stdio"]
    for index, report in enumerate(reports):
        if report["problem_kind"] is not None:
            continue
        source = ("host=%s" % report["name"] if report["type"] == "pci"
                  else "sysfsdev=%s/%s" % (MDEV_DEVICES, report["name"]))
        argv += ["-device", "vfio-pci,%s,id=%s,bus=pcie.0,addr=0x%02x" % (source, DEVICE_ID % index,
                                                                          guest_slot(index))]
    if mode == "paused":
        argv.append("-S")
    else:
        argv += ["-kernel", kernel, "-initrd", initrd, "-append", GUEST_APPEND, "-serial", SERIAL_TO_STDOUT,
                 "-no-reboot"]
    return argv


def qmp_replies(text):
    """QEMU's replies on its QMP output, in order: every JSON object that is neither the greeting nor an event.

    A last line without its newline (QEMU was stopped while writing it) is left out; any other line that is not
    JSON is an error.
    """
    lines = text.split("\n")
    replies = []
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            if number == len(lines) - 1:
                break
            raise GuestError("QEMU's QMP output (its standard output) has a line that is not JSON: %r"
                             % line.strip()[:200]) from None
        if isinstance(message, dict) and "event" not in message and "QMP" not in message:
            replies.append(message)
    return replies


def paused_functions(text):
    """The guest's PCI functions from QEMU's answers to QMP_COMMANDS, or None when no answer to ``query-pci`` came;
    GuestError when QEMU refused a command."""
    replies = qmp_replies(text)
    for name, reply in zip(QMP_COMMANDS, replies):
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            raise GuestError("QEMU refused the QMP command %s: %s" % (name, error.get("desc") or reply["error"]))
    answer = QMP_COMMANDS.index("query-pci")
    if len(replies) <= answer:
        return None
    return flatten_query_pci(replies[answer].get("return"))


def _hex4(value):
    return "%04x" % value if isinstance(value, int) and not isinstance(value, bool) else None


def flatten_query_pci(buses):
    """The functions of a ``query-pci`` answer, bridges' buses included: ``{address, vendor_id, device_id, class,
    qdev_id}`` each, ``class`` as 4 hex digits (class and subclass)."""
    found = []

    def walk(bus, devices):
        for device in devices or []:
            if not isinstance(device, dict):
                continue
            ids = device.get("id") or {}
            found.append({
                "address": "0000:%02x:%02x.%x" % (device.get("bus", bus) or 0, device.get("slot") or 0,
                                                  device.get("function") or 0),
                "vendor_id": _hex4(ids.get("vendor")), "device_id": _hex4(ids.get("device")),
                "class": _hex4((device.get("class_info") or {}).get("class")),
                "qdev_id": device.get("qdev_id") or None,
            })
            bridge = device.get("pci_bridge") or {}
            walk((bridge.get("bus") or {}).get("secondary", bus), bridge.get("devices"))

    for entry in buses if isinstance(buses, list) else []:
        if isinstance(entry, dict):
            walk(entry.get("bus") or 0, entry.get("devices"))
    return found


def parse_console(text):
    """``(functions, complete)`` from the guest's serial console: the ``GPUOPS-PCI`` lines, and whether the end
    marker came."""
    functions = []
    for line in text.replace("\r", "").splitlines():
        match = _PCI_LINE_RE.search(line)
        if match:
            functions.append({"address": match.group(1).lower(), "vendor_id": match.group(2).lower(),
                              "device_id": match.group(3).lower(), "class": match.group(4).lower()[:4],
                              "ttys": match.group(5).split()})
    return functions, MARK_END in text


def console_tail(text):
    """The last CONSOLE_LINES lines of the guest's serial console."""
    return "\n".join(text.replace("\r", "").splitlines()[-CONSOLE_LINES:])


def _tail(text):
    return text if len(text) <= OUTPUT_LIMIT else "..." + text[-OUTPUT_LIMIT:]


# ---------------------------------------------------------------------------------------------
# The proof
# ---------------------------------------------------------------------------------------------

def _qemu_lines(text):
    return [line.strip() for line in text.splitlines() if line.strip()]


def assign_results(reports, functions, mode, error, qemu_text, rc, timed_out, timeout):
    """Fill in each accepted device's ``guest``, ``seen`` and problem from what the guest (or QEMU) said."""
    by_qdev = dict((f["qdev_id"], f) for f in functions or [] if f.get("qdev_id"))
    by_address = dict((f["address"], f) for f in functions or [])
    lines = _qemu_lines(qemu_text)
    for index, report in enumerate(reports):
        if report["problem_kind"] is not None:
            continue
        if functions is not None:
            seen = by_qdev.get(DEVICE_ID % index) if mode == "paused" else by_address.get(guest_address(index))
            if seen is None and mode == "paused":
                seen = by_address.get(guest_address(index))
            if seen is not None:
                report["guest"] = dict((k, v) for k, v in seen.items() if k != "qdev_id")
                report["seen"] = True
            else:
                report["problem_kind"] = "not-seen"
                report["problem"] = ("the guest has no function at %s where QEMU was to put %s"
                                     % (guest_address(index), report["name"]))
            continue
        if timed_out:
            report["problem_kind"] = "timeout"
            report["problem"] = ("the guest did not %s within %d seconds (timeout); QEMU was stopped then"
                                 % ("answer over QMP" if mode == "paused" else "print its device list", timeout))
            continue
        named = [line for line in lines if re.search(r"id=%s(?![0-9])" % (DEVICE_ID % index), line)]
        if named:
            report["problem_kind"] = "qemu"
            report["problem"] = "; ".join(named)
        elif error == "exited" and mode == "boot" and rc == 0:
            report["problem_kind"] = "not-seen"
            report["problem"] = "the guest stopped before it printed its device list (see console_tail)"
        else:
            report["problem_kind"] = "qemu"
            report["problem"] = ("QEMU exited (rc %s) before the guest ran: %s"
                                 % (rc, "; ".join(lines[-5:]) or "it printed nothing"))


def run_qemu(module, argv, mode, timeout):
    """Run QEMU once through run_timed, bounded by ``timeout``; ``(rc, out, err, seconds, timed_out)``.

    Paused: QMP_INPUT is QEMU's standard input, so QEMU answers the commands in order once it has realized the
    devices and then quits. Boot: QEMU exits by itself when the guest powers off (``-no-reboot``).
    timeout(1) ends a QEMU that is still running at ``timeout`` seconds. An exit status that timeout(1) gives
    for that counts as a timeout only when the time has passed: SIGKILL from elsewhere (the OOM killer) is an exit.
    """
    begun = time.monotonic()
    rc, out, err = run_timed(module, argv, timeout, option="timeout", kill_after=KILL_AFTER,
                             data=QMP_INPUT if mode == "paused" else None)
    seconds = time.monotonic() - begun
    return rc, out, err, round(seconds, 2), rc in TIMED_OUT_RCS and seconds >= timeout


def prove(module, root="/", release=None):
    """The module's work: the result dict (``changed`` false); GuestError for inputs that cannot run at all."""
    params = module.params
    options = check_params(params)
    qemu_path = find_qemu(options["qemu"], module.get_bin_path, root)
    if not module.get_bin_path("timeout"):
        raise GuestError("timeout (coreutils) is not on PATH; it ends QEMU at the time limit (timeout); install "
                         "coreutils; nothing was started")
    accel, accel_reason = choose_accel(options["accel"], root)
    reports = device_checks(options["devices"], options["mdevs"], root)
    mode = options["mode"]
    result = {"changed": False, "mode": mode, "qemu": qemu_path, "accel": accel,
              "accel_reason": accel_reason, "memory_mb": options["memory_mb"], "started": False,
              "qemu_rc": None, "qemu_end": None, "qemu_error": None, "qemu_output": None, "qemu_command": None,
              "guest_functions": [], "console_tail": None, "seconds": 0.0}
    refused = [r for r in reports if r["problem_kind"] is not None]
    if refused and params.get("fail_on_problem", True):
        return _finish(result, reports, params)
    if len(refused) == len(reports):
        return _finish(result, reports, params)
    workdir = None
    try:
        kernel = initrd = None
        if mode == "boot":
            kernel, initrd, busybox = boot_files(options, module.get_bin_path, root, release)
            if initrd is None:
                # The only file the probe makes; the directory is removed whatever happens.
                workdir = tempfile.mkdtemp(prefix="gpuops-guest-")
                initrd = build_initramfs(busybox, os.path.join(workdir, "initrd.cpio"))
        argv = qemu_argv(qemu_path, reports, mode, accel, options["memory_mb"], kernel, initrd)
        result["qemu_command"] = argv
        result["started"] = True
        run = run_qemu(module, argv, mode, options["timeout"])
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    rc, out, err, result["seconds"], timed_out = run
    result["qemu_rc"] = rc
    result["qemu_output"] = _tail(err)
    if mode == "paused":
        functions = paused_functions(out)
        ended = "quit"
    else:
        functions, complete = parse_console(out)
        functions = functions if complete else None
        ended = "poweroff"
        result["console_tail"] = console_tail(out)
    if functions is not None:
        error = None
        result["qemu_end"] = "killed" if timed_out else ended
        if timed_out:
            module.warn("the guest %s, but QEMU did not exit afterwards; timeout(1) stopped it at the time limit "
                        "(timeout=%d)" % ("answered over QMP" if mode == "paused" else "printed its device list",
                                          options["timeout"]))
    elif timed_out:
        error, result["qemu_end"] = "timeout", "killed"
    else:
        error, result["qemu_end"] = "exited", "exited"
        if rc != 0 or mode == "paused":
            result["qemu_error"] = _tail(err).strip() or "QEMU exited with rc %s and printed nothing" % rc
    result["guest_functions"] = [dict((k, v) for k, v in f.items() if k != "qdev_id") for f in functions or []]
    assign_results(reports, functions, mode, error, err, rc, timed_out, options["timeout"])
    return _finish(result, reports, params)


def _finish(result, reports, params):
    result["devices"] = reports
    result["all_ok"] = bool(reports) and all(r["seen"] for r in reports)
    failures = ["%s (%s): %s" % (r["name"], r["problem_kind"], r["problem"]) for r in reports if not r["seen"]]
    if failures and params.get("fail_on_problem", True):
        extra = dict((k, v) for k, v in result.items() if k != "changed")
        raise GuestError("the guest did not get %d of %d device(s)%s: %s"
                         % (len(failures), len(reports), "" if result["started"] else " (QEMU was not started)",
                            "; ".join(failures)), **extra)
    return result
