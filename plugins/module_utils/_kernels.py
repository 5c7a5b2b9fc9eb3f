# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The installed kernels and whether each still boots with this collection's settings.

This file is private to the gpuops.sandbox collection: its interface may change at any time.

One reader, used by gpu_facts (``gpu_facts_host.kernels``), kernel_modules (``rebuild_kernels``) and the grub backend
of kernel_cmdline (a generated grub.cfg older than its files). A kernel is installed when it has both a
``/lib/modules/<version>`` directory and a ``/boot/vmlinuz-<version>``. For each: its initramfs
(``/boot/initrd.img-<version>`` or ``/boot/initramfs-<version>.img``) and whether it is older than one of this
collection's files that go into an initramfs (by modification time: unpacking images is far too slow), and the
arguments of each boot entry of the kernel (grub.cfg ``linux`` lines while a grub.cfg generator is installed, BLS
entries in /boot/loader/entries and on the ESP) against the arguments kernel_cmdline recorded as its own.

Everything here only reads and never raises: a file that cannot be read says less, and a kernel whose files vanish
while it is read (removed meanwhile) is left out.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpuops.sandbox.plugins.module_utils import _cmdline, _modprobe
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path

KERNEL_RELEASE_FILE = "/proc/sys/kernel/osrelease"
MODULES_DIR = "/lib/modules"
BOOT_DIR = "/boot"
# The initramfs of a kernel, by generator: initramfs-tools (Debian, Ubuntu), then dracut (RHEL family).
INITRAMFS_NAMES = ("initrd.img-%s", "initramfs-%s.img")
# The generated grub configuration (Debian, RHEL) and the grubenv RHEL 8's BLS entries take $kernelopts from.
GRUB_CFG_FILES = ("/boot/grub/grub.cfg", "/boot/grub2/grub.cfg")
# What generates grub.cfg: without one of these a grub.cfg is what an earlier boot loader left (a host moved to
# systemd-boot keeps /boot/grub/grub.cfg when grub's packages are purged), and nothing boots its entries.
GRUB_MKCONFIG = ("/usr/sbin/grub-mkconfig", "/usr/sbin/grub2-mkconfig", "/sbin/grub-mkconfig", "/sbin/grub2-mkconfig",
                 "/usr/bin/grub-mkconfig", "/usr/bin/grub2-mkconfig")
# The BLS entries systemd-boot boots live on the EFI system partition (or XBOOTLDR), mounted at /efi, /boot/efi or
# /boot (bootctl's order); /boot/loader/entries is _cmdline's (grubby's and RHEL's grub2).
ESP_ENTRY_DIRS = ("/efi/loader/entries", "/boot/efi/loader/entries")
GRUBENV_FILES = ("/boot/grub2/grubenv", "/boot/grub/grubenv")

_SECTION_RE = re.compile(r"^### (BEGIN|END) /etc/grub\.d/(\S+) ###\s*$")
_MENUENTRY_RE = re.compile(r"""^\s*menuentry\s+(?:'([^']*)'|"([^"]*)"|(\S+))""")
_LINUX_RE = re.compile(r"^\s*(?:linux|linux16|linuxefi)\s+(\S+)(.*)$")


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except (IOError, OSError):
        return None


def running_kernel(root="/"):
    """The running kernel's release, or None."""
    return (_read(host_path(root, KERNEL_RELEASE_FILE)) or "").strip() or None


def kernel_versions(root="/"):
    """Versions with a ``/lib/modules/<version>`` directory, sorted (not yet checked for a ``vmlinuz``)."""
    base = host_path(root, MODULES_DIR)
    try:
        names = os.listdir(base)
    except (IOError, OSError):
        return []
    return sorted(name for name in names if not name.startswith(".") and os.path.isdir(os.path.join(base, name)))


def kernel_present(root, version):
    """True when ``version`` is installed: its modules directory and its ``/boot/vmlinuz-<version>`` exist."""
    return (os.path.isdir(host_path(root, "%s/%s" % (MODULES_DIR, version)))
            and os.path.isfile(host_path(root, "%s/vmlinuz-%s" % (BOOT_DIR, version))))


def initramfs_sources(root="/", extra=()):
    """``[(path, mtime_ns)]`` of this collection's files an initramfs carries (and of ``extra`` paths present)."""
    found = dict.fromkeys(_modprobe.own_files(root))
    for path in extra:
        found[path] = None
    result = []
    for path in sorted(found):
        try:
            result.append((path, os.stat(host_path(root, path)).st_mtime_ns))
        except (IOError, OSError):
            continue
    return result


def initramfs_of(root, version):
    """``(path, mtime_ns)`` of the kernel's initramfs, or ``(None, None)`` when it has none."""
    for pattern in INITRAMFS_NAMES:
        path = "%s/%s" % (BOOT_DIR, pattern % version)
        try:
            return path, os.stat(host_path(root, path)).st_mtime_ns
        except (IOError, OSError):
            continue
    return None, None


def grub_in_use(root="/"):
    """True when a grub.cfg generator is installed (see GRUB_MKCONFIG)."""
    return any(os.path.isfile(host_path(root, path)) for path in GRUB_MKCONFIG)


def grub_cfg_entries(root="/", files=GRUB_CFG_FILES):
    """The Linux entries grub-mkconfig's ``10_linux`` wrote into grub.cfg: ``[{"file", "title", "kernel", "args"}]``.

    ``kernel`` is the version of the ``vmlinuz-<version>`` the ``linux`` line boots (None for another image),
    ``args`` the tokens after it. Entries of other scripts (Xen, ``40_custom`` written by hand) are left out when the
    file marks its sections, and so are recovery entries (grub gives them ``GRUB_CMDLINE_LINUX`` only).
    """
    entries = []
    for path in files:
        text = _read(host_path(root, path))
        if text is None:
            continue
        lines = text.splitlines()
        marked = any(_SECTION_RE.match(line) for line in lines)
        section = None
        title = None
        for line in lines:
            match = _SECTION_RE.match(line)
            if match:
                section = match.group(2) if match.group(1) == "BEGIN" else None
                continue
            if marked and not (section or "").startswith("10_linux"):
                continue
            match = _MENUENTRY_RE.match(line)
            if match:
                title = next(group for group in match.groups() if group is not None)
                continue
            match = _LINUX_RE.match(line)
            if not match or "(recovery mode)" in (title or ""):
                continue
            image = os.path.basename(match.group(1))
            entries.append({"file": path, "title": title,
                            "kernel": image[len("vmlinuz-"):] if image.startswith("vmlinuz-") else None,
                            "args": _cmdline.split_cmdline(match.group(2))})
    return entries


def _grubenv_kernelopts(root):
    for path in GRUBENV_FILES:
        text = _read(host_path(root, path))
        for line in (text or "").splitlines():
            if line.startswith("kernelopts="):
                return _cmdline.split_cmdline(line[len("kernelopts="):])
    return None


def _bls_files(root):
    """``[(path on the host, full path)]`` of the BLS entries in /boot/loader/entries and on the ESP, sorted per
    directory; a directory seen twice (/boot/efi a link to /boot, say) is read once."""
    found, seen = [], set()
    for directory in (_cmdline.BLS_ENTRIES_DIR,) + ESP_ENTRY_DIRS:
        full_dir = host_path(root, directory)
        try:
            real = os.path.realpath(full_dir)
            names = sorted(n for n in os.listdir(full_dir) if n.endswith(".conf"))
        except (IOError, OSError):
            continue
        if real in seen:
            continue
        seen.add(real)
        found.extend(("%s/%s" % (directory, name), os.path.join(full_dir, name)) for name in names)
    return found


def _entry_kernel(version, image):
    """The kernel version a BLS entry boots, from its ``linux`` path: ``vmlinuz-<version>`` (RHEL: a rescue entry's
    ``vmlinuz-0-rescue-<id>`` names no installed kernel), else its ``version`` key or, without one, the directory
    of ``<entry token>/<version>/linux`` as kernel-install lays the ESP out (Debian's systemd-boot)."""
    name = os.path.basename(image or "")
    if name.startswith("vmlinuz-"):
        return name[len("vmlinuz-"):]
    if not name:
        return None
    return version or (os.path.basename(os.path.dirname(image)) if name == "linux" else None) or None


def bls_entries(root="/"):
    """The BLS entries (``/boot/loader/entries/*.conf``, and ``loader/entries`` on an ESP mounted at /efi or
    /boot/efi, where systemd-boot boots them): ``[{"file", "title", "kernel", "args"}]``.

    ``$kernelopts`` in an entry's options (RHEL 8) is taken from grubenv.
    """
    entries = []
    kernelopts = None
    for path, full in _bls_files(root):
        text = _read(full)
        if text is None:
            continue
        title = image = version = initrd = None
        options = []
        for line in text.splitlines():
            key, _sep, value = line.strip().partition(" ")
            if key == "title":
                title = value.strip()
            elif key == "version":
                version = value.strip()
            elif key == "linux":
                image = value.strip()
            elif key == "options":
                options = _cmdline.split_cmdline(value)
            elif key == "initrd" and initrd is None:
                initrd = value.strip()
        if "$kernelopts" in options:
            kernelopts = _grubenv_kernelopts(root) if kernelopts is None else kernelopts
            at = options.index("$kernelopts")
            options[at:at + 1] = kernelopts or []
        entry = {"file": path, "title": title, "kernel": _entry_kernel(version, image), "args": options}
        esp = [d for d in ESP_ENTRY_DIRS if path.startswith(d + "/")]
        if esp and initrd:
            # On the ESP the entry boots a copy of the image (kernel-install's), under the ESP's mount point.
            entry["initrd"] = esp[0][:-len("/loader/entries")] + "/" + initrd.lstrip("/")
        entries.append(entry)
    return entries


def esp_kernels(root="/"):
    """The installed kernels with a BLS entry on the ESP (systemd-boot boots a copy of their initramfs there, which
    kernel-install makes), sorted."""
    return sorted(set(e["kernel"] for e in bls_entries(root)
                      if e.get("initrd") and e["kernel"] and kernel_present(root, e["kernel"])))


def recorded_arguments(root="/"):
    """The kernel arguments kernel_cmdline recorded as its own (the ``set`` values of its record), in key order.

    An unreadable or invalid record gives none (kernel_cmdline itself names the fault when it runs).
    """
    try:
        keys = _cmdline.load_record(_read(host_path(root, _cmdline.RECORD_FILE)))
    except _cmdline.CmdlineError:
        return []
    return [token for key in sorted(keys) for token in keys[key]["set"]]


def missing_arguments(args, wanted):
    """The tokens of ``wanted`` that the command line ``args`` lacks (keys compared as the kernel does)."""
    try:
        requested = _cmdline.parse_args(list(wanted), "present", replace_values=False)
    except _cmdline.CmdlineError:
        return []
    return [arg.text for arg in requested if not _cmdline.satisfies(args, [arg], "present", replace_values=False)]


def _entry_where(entry):
    return "%s entry %r" % (entry["file"], entry["title"]) if entry["title"] else entry["file"]


def read_kernel(root, version, running, sources, entries, wanted):
    """One kernel's report (see installed_kernels), or None when it is not installed (or was removed meanwhile)."""
    if not kernel_present(root, version):
        return None
    problems = []
    initramfs, built = initramfs_of(root, version)
    stale = initramfs is None
    if initramfs is None:
        problems.append("has no initramfs (%s)" % " or ".join("%s/%s" % (BOOT_DIR, n % version) for n in INITRAMFS_NAMES))
    else:
        newer = [path for path, mtime in sources if mtime > built]
        if newer:
            stale = True
            problems.append("initramfs %s is older than %s" % (initramfs, ", ".join(newer)))
    own = []
    for entry in entries:
        if entry["kernel"] != version:
            continue
        missing = missing_arguments(entry["args"], wanted)
        own.append({"file": entry["file"], "title": entry["title"], "missing": missing})
        if missing:
            problems.append("boot entry %s lacks %s" % (_entry_where(entry), " ".join(missing)))
        if entry.get("initrd"):
            try:
                copied = os.stat(host_path(root, entry["initrd"])).st_mtime_ns
            except (IOError, OSError):
                copied = None
            newer = [path for path, mtime in sources if copied is None or mtime > copied]
            if copied is None or newer:
                stale = True
                problems.append("boot entry %s boots %s, %s" % (
                    _entry_where(entry), entry["initrd"],
                    "which is missing" if copied is None else "older than %s" % ", ".join(newer)))
    # Files that vanished while they were read belong to a kernel being removed: that is not a problem of the host.
    if not kernel_present(root, version):
        return None
    return {"version": version, "running": version == running, "initramfs": initramfs, "initramfs_stale": stale,
            "entries": own, "problems": problems}


def installed_kernels(root="/", running=None, extra_sources=()):
    """Every installed kernel: ``[{"version", "running", "initramfs", "initramfs_stale", "entries", "problems"}]``.

    ``initramfs`` is the path of its image or None; ``initramfs_stale`` is true when it has none or it is older than
    one of this collection's files an initramfs carries (see _modprobe.own_files; ``extra_sources`` adds paths);
    ``entries`` are its boot entries (``file``, ``title``, ``missing``: the recorded arguments the entry lacks);
    ``problems`` says each of these in a sentence. ``running`` defaults to the running kernel's release. Never
    raises; a kernel removed while it is read is left out.
    """
    try:
        running = running or running_kernel(root)
        sources = initramfs_sources(root, extra_sources)
        wanted = recorded_arguments(root)
        entries = (grub_cfg_entries(root) if grub_in_use(root) else []) + bls_entries(root)
        result = []
        for version in kernel_versions(root):
            kernel = read_kernel(root, version, running, sources, entries, wanted)
            if kernel is not None:
                result.append(kernel)
        return result
    except Exception:  # pylint: disable=broad-exception-caught
        # A fact reader: a host this code did not foresee gives no kernel list rather than a failed gpu_facts.
        return []
