# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Who holds a device node open: the one scan of ``/proc/<pid>/fd`` and the VFIO nodes of a device.

This file is private to the gpuops.sandbox collection: its interface may change at any time.

vfio_bind refuses to unbind a function whose nodes are held, sriov_vfs and mdev_create refuse to remove a VF or a
mediated device a VM uses, dra_blockers names what keeps the DRA driver from a GPU, and the two probes name what
makes a device busy: all of them ask :func:`find_holders`, and the ones that ask about a VMM's nodes ask through
:func:`vfio_nodes`. Nothing here writes anything.
"""

from __future__ import annotations

import fnmatch
import os

from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import SysfsError, host_path, link_name, read_attr


def _is_number(text):
    """True for a non-empty run of ASCII digits (str.isdigit also accepts superscripts, which int() refuses)."""
    return text.isascii() and text.isdigit()


def vfio_group_node(group):
    """The VFIO group node of IOMMU group ``group`` (a number or its text): ``/dev/vfio/<group>``."""
    return "/dev/vfio/%s" % group


def vfio_cdevs(device_dir):
    """The iommufd character devices of a device (``/dev/vfio/devices/vfioN``), as listed in its ``vfio-dev``."""
    cdev_dir = os.path.join(device_dir, "vfio-dev")
    if not os.path.isdir(cdev_dir):
        return []
    return ["/dev/vfio/devices/" + name for name in sorted(os.listdir(cdev_dir))]


def vfio_nodes(device_dir):
    """The VFIO nodes a VMM opens to use a device (a PCI function's or a mediated device's sysfs directory): its
    group's node and its iommufd character devices. A device outside any IOMMU group has no group node."""
    group = link_name(os.path.join(device_dir, "iommu_group"))
    return ([vfio_group_node(group)] if group is not None else []) + vfio_cdevs(device_dir)


def vfio_holders(device_dir, root="/"):
    """Return ``[(pid, command)]`` of the processes holding a device's VFIO nodes open, one per process;
    ``command`` is the process's full command line, else its ``comm``, else ``?``."""
    commands = {}
    for holder in find_holders(vfio_nodes(device_dir), root):
        commands.setdefault(holder["pid"], holder["cmdline"] or holder["comm"] or "?")
    return sorted(commands.items())


def find_holders(device_paths, root="/", patterns=None):
    """Return the processes holding any of ``device_paths`` open (``/dev/nvidia0``, ``/dev/vfio/12``).

    ``patterns``: absolute shell-style patterns (``fnmatch``: ``*`` also crosses ``/``) matched against
    every descriptor's target as well, e.g. ``/dev/nvidia*`` for all NVIDIA nodes, ``nvidia-caps/*``
    included.

    Scans ``/proc/<pid>/fd``; each result is ``{"pid", "comm", "cmdline", "device"}``, one per process
    and device, sorted by pid then device. ``cmdline`` is the process's full command line, its arguments
    joined by spaces (at most ``CMDLINE_LIMIT`` characters, then ``...``), or None when unreadable.
    Processes that exit during the scan, or whose fds cannot be read, are skipped.
    """
    wanted = set()
    for path in device_paths or []:
        if not isinstance(path, str) or not path.startswith("/"):
            raise SysfsError("device path %r is not valid; expected an absolute path such as /dev/nvidia0"
                             % (path,))
        wanted.add(os.path.normpath(path))
    globs = []
    for pattern in patterns or []:
        if not isinstance(pattern, str) or not pattern.startswith("/"):
            raise SysfsError("device pattern %r is not valid; expected an absolute pattern such as /dev/nvidia*"
                             % (pattern,))
        globs.append(os.path.normpath(pattern))
    if not wanted and not globs:
        return []
    proc = host_path(root, "/proc")
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if _is_number(name))
    except (IOError, OSError) as exc:
        raise SysfsError("cannot list /proc: %s" % (exc.strerror or exc), path=proc)
    found = set()
    comms = {}
    cmdlines = {}
    for pid in pids:
        fd_dir = os.path.join(proc, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except (IOError, OSError):
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except (IOError, OSError):
                continue
            if target in wanted or any(fnmatch.fnmatchcase(target, pattern) for pattern in globs):
                found.add((pid, target))
                if pid not in comms:
                    try:
                        comms[pid] = read_attr(os.path.join(proc, str(pid), "comm"), default="") or None
                    except SysfsError:
                        comms[pid] = None
                    cmdlines[pid] = process_cmdline(os.path.join(proc, str(pid), "cmdline"))
    return [{"pid": pid, "comm": comms.get(pid), "cmdline": cmdlines.get(pid), "device": device}
            for pid, device in sorted(found)]


# Characters of a holder's command line kept in messages.
CMDLINE_LIMIT = 400


def process_cmdline(path):
    """The command line in ``path`` (a ``/proc/<pid>/cmdline``), arguments joined by spaces, or None.

    Control characters are shown as ``?`` so a message stays one line; longer than ``CMDLINE_LIMIT``
    characters is cut with ``...``.
    """
    try:
        with open(path, "rb") as handle:
            raw = handle.read(CMDLINE_LIMIT * 4 + 1)
    except (IOError, OSError):
        return None
    args = [arg.decode("utf-8", "replace") for arg in raw.split(b"\0") if arg]
    if not args:
        return None
    text = "".join(ch if ch.isprintable() else "?" for ch in " ".join(args))
    return text if len(text) <= CMDLINE_LIMIT else text[:CMDLINE_LIMIT] + "..."
