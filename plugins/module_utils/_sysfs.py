# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private helpers for reading and writing sysfs, shared by the host modules.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
Every function takes the filesystem root as an argument (default ``/``) so unit tests can build a
fake tree under a temporary directory instead of patching ``open``.
"""

from __future__ import annotations

import errno
import math
import os
import re
import time

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError

# Anchored with \A and \Z (not ^ and $, which let a trailing newline through) for callers using .match.
PCI_ADDRESS_RE = re.compile(r"\A[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\Z")
SHORT_PCI_ADDRESS_RE = re.compile(r"\A[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\Z")


class SysfsError(GpuopsError):
    """A sysfs read or write failed, or an input did not name a real object.

    ``path`` is the sysfs path involved (relative to the root), when there is one.
    """

    def __init__(self, msg, path=None):
        super().__init__(msg)
        self.msg = msg
        self.path = path


# The longest wait, in seconds, any timeout option of the host modules accepts (they check it up front); the
# wait helpers also clamp to it, so no value (inf, nan, an integer too large for a float) can raise there.
MAX_WAIT = 3600
POLL_INTERVAL = 0.1
# The clock of every wait of the collection (unit tests replace these two).
_sleep = time.sleep
_monotonic = time.monotonic


def bounded_seconds(timeout, high=MAX_WAIT):
    """``timeout`` as float seconds within 0..``high``: None, junk and nan are 0; inf and huge numbers ``high``."""
    try:
        value = float(timeout or 0)
    except OverflowError:
        value = float(high) if timeout > 0 else 0.0
    except (TypeError, ValueError):
        value = 0.0
    if math.isnan(value):
        value = 0.0
    return min(max(value, 0.0), float(high))


def host_path(root, path):
    """Return ``path`` (an absolute host path such as ``/sys/bus/pci``) placed under ``root``."""
    return os.path.join(root or "/", path.lstrip("/"))


def normalize_pci_address(address):
    """Return the canonical lower-case ``DDDD:BB:SS.F`` form of a PCI address.

    Accepts the short ``BB:SS.F`` form (domain 0000). Raises SysfsError naming the bad value and
    the accepted form otherwise.
    """
    if not isinstance(address, str):
        raise SysfsError("PCI address %r is not a string; expected DDDD:BB:SS.F, e.g. 0000:65:00.0" % (address,))
    text = address.strip()
    if SHORT_PCI_ADDRESS_RE.fullmatch(text):
        text = "0000:" + text
    if not PCI_ADDRESS_RE.fullmatch(text):
        raise SysfsError(
            "PCI address %r is not valid; expected DDDD:BB:SS.F (hex domain, bus, slot, function 0-7), "
            "e.g. 0000:65:00.0" % (address,)
        )
    return text.lower()


def pci_device_dir(address, root="/"):
    """Return the sysfs directory of a PCI function, checking it exists and resolves under /sys/devices."""
    addr = normalize_pci_address(address)
    link = host_path(root, "/sys/bus/pci/devices/" + addr)
    if not os.path.exists(link):
        raise SysfsError("PCI device %s does not exist on this host (no %s)" % (addr, "/sys/bus/pci/devices/" + addr),
                         path=link)
    real = os.path.realpath(link)
    devices_top = os.path.realpath(host_path(root, "/sys/devices"))
    if not (real == devices_top or real.startswith(devices_top + os.sep)):
        raise SysfsError("PCI device %s resolves outside /sys/devices; refusing to use it" % addr, path=link)
    return link


class FileTooLarge(GpuopsError):
    """A file longer than the limit its reader set."""


def read_file(path, errors="replace", limit=None):
    """The text of file ``path`` (a full path) as UTF-8, or None when it does not exist.

    The one reader of whole text files: ``errors`` is how an undecodable byte is read (``replace``: as U+FFFD;
    ``surrogateescape``: kept, so the text can be written back byte for byte); with ``limit`` (bytes), a longer
    file raises FileTooLarge. Line ends are read as Python's text mode reads them (``\r\n`` and ``\r`` as
    ``\n``). Any other failure to read raises the OSError.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read() if limit is None else handle.read(limit + 1)
    except FileNotFoundError:
        return None
    if limit is not None and len(data) > limit:
        raise FileTooLarge("%s is larger than %d bytes" % (path, limit), path=path)
    return data.decode("utf-8", errors=errors).replace("\r\n", "\n").replace("\r", "\n")


def read_attr(path, default=None):
    """Read a sysfs attribute as stripped text; ``default`` when it does not exist (None: raise)."""
    try:
        with open(path, "r") as handle:
            return handle.read().strip()
    except (IOError, OSError) as exc:
        if default is not None and exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return default
        raise SysfsError("cannot read %s: %s" % (path, exc.strerror or exc), path=path)


def write_attr(path, value):
    """Write ``value`` to a sysfs attribute in one write call; raise SysfsError with the errno text."""
    data = value if isinstance(value, str) else str(value)
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        raise SysfsError("cannot open %s for writing: %s" % (path, exc.strerror or exc), path=path)
    try:
        os.write(fd, data.encode("utf-8"))
    except OSError as exc:
        raise SysfsError("writing %r to %s failed: %s" % (data.strip(), path, exc.strerror or exc), path=path)
    finally:
        os.close(fd)


def link_name(path):
    """Return the last component of a symlink's target (e.g. the driver name), or None if no link."""
    if not os.path.islink(path):
        return None
    return os.path.basename(os.readlink(path))


def wait_until(predicate, timeout, interval=None):
    """Call ``predicate`` until it returns a true value or ``timeout`` seconds have passed; return its last value.

    The predicate is always called at least once. ``timeout`` is clamped to 0..MAX_WAIT seconds, so no value
    (inf, nan, an integer too large for a float) raises here, in the middle of a change.
    """
    deadline = _monotonic() + bounded_seconds(timeout, MAX_WAIT)
    while True:
        value = predicate()
        if value or _monotonic() >= deadline:
            return value
        _sleep(POLL_INTERVAL if interval is None else interval)
