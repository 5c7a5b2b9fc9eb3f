# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a host runs and what this collection left on it: the ``gpu_facts_host`` fact of gpu_facts.

This file is private to the gpuops.sandbox collection: its interface may change at any time.

Everything here only reads, and never fails on a file it cannot read (the fact says less instead). The
distribution (os-release), the running kernel, the live mediated devices, the collection's own boot files found
on the host (their paths come from the module_utils that write them, the names of the module file sets from the
caller), the SR-IOV VF counts and the VFs recorded for boot, the boot fingerprint (one digest over what a GPU node's
preparation depends on at boot), and the record the host preparation left the last time it found the host ready, and
every installed kernel with what it lacks of the collection's boot settings (_kernels).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import struct

from ansible_collections.gpuops.sandbox.plugins.module_utils import (
    _bootloader,
    _cmdline,
    _kernels,
    _mdev,
    _modprobe,
    _persist,
    _sriov,
    _vfio,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path


def managed_paths(module_files=None):
    """The collection's boot files by what they do; their presence tells what a host was set up for.

    ``module_files`` names the sets of module files the host preparation writes (``nouveau``, ``vfio``: the names
    the roles give kernel_modules, _modprobe.DEFAULT_SETS when None); their paths are _modprobe's.
    """
    sets = dict(_modprobe.DEFAULT_SETS, **(module_files or {}))
    nouveau, vfio = _modprobe.set_files(sets["nouveau"]), _modprobe.set_files(sets["vfio"])
    return {
        # The record of what kernel_cmdline replaced counts too: on grubby, grub2-mkconfig and kernel-install hosts
        # it is the only file of this collection's kernel arguments.
        "kernel_cmdline": [_cmdline.GRUB_DROPIN_DIR + "/" + _bootloader.DROPIN_NAME, _cmdline.RECORD_FILE],
        "nouveau": [nouveau["modprobe"]],
        "vfio_modules": [vfio["modprobe"], vfio["load"]],
        "mdev_definitions": [_mdev.DEFINITIONS_FILE],
        "sriov_definitions": [_sriov.DEFINITIONS_FILE],
        # Left by kernel_modules / kernel_cmdline while the initramfs or grub.cfg is generated: a run cut short there.
        "pending": [_persist.pending_path(_persist.PENDING_INITRAMFS),
                    _persist.pending_path(_persist.PENDING_BOOTLOADER)],
    }


# The boot files of a host whose sets of module files have the default names.
MANAGED_FILES = managed_paths()

OS_RELEASE_FILES = ("/etc/os-release", "/usr/lib/os-release")
OS_RELEASE_KEYS = ("ID", "ID_LIKE", "VERSION_ID", "PRETTY_NAME", "VERSION_CODENAME")
KERNEL_RELEASE_FILE = _kernels.KERNEL_RELEASE_FILE
PREPARED_RECORD = "/var/lib/gpuops/prepared.json"

# What a GPU node's preparation depends on at boot: (directory, name pattern, how) - "content" hashes the
# file, "stat" only its size and modification time (large boot images). {kernel} is the running kernel.
FINGERPRINT_SOURCES = (
    ("/proc", "cmdline", "content"),
    ("/etc/default", "grub", "content"),
    (_cmdline.GRUB_DROPIN_DIR, "*", "content"),
    ("/etc/kernel", "cmdline", "content"),
    ("/etc/kernel/cmdline.d", "*", "content"),
    # The module and initramfs configuration (_modprobe's).
) + tuple((directory, pattern, "content") for directory, pattern in _modprobe.CONFIG_FILES) + (
    (_vfio.UDEV_RULES_DIR, _vfio.UDEV_RULE_PREFIX + "*", "content"),
    ("/etc/gpuops", "*", "content"),
    ("/etc/systemd/system", "gpuops-*", "content"),
    ("/etc/systemd/system/multi-user.target.wants", "gpuops-*", "content"),
    ("/boot", "initrd.img-{kernel}", "stat"),
    ("/boot", "initramfs-{kernel}.img", "stat"),
    ("/boot/grub", "grub.cfg", "stat"),
    ("/boot/grub2", "grub.cfg", "stat"),
    ("/boot/loader/entries", "*", "stat"),
)
FINGERPRINT_MODULES = ("nouveau", "nvidia*", "vfio*", "mdev", "mtty")


def read_os_release(root="/"):
    """The os-release fields that say which distribution and release the host runs."""
    info = {}
    for path in OS_RELEASE_FILES:
        text = _persist.read_text(root, path)
        if text is None:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() in OS_RELEASE_KEYS:
                info[key.strip().lower()] = value.strip().strip("\"'")
        break
    return {"id": info.get("id"), "id_like": (info.get("id_like") or "").split(),
            "version_id": info.get("version_id"), "major": (info.get("version_id") or "").split(".")[0] or None,
            "codename": info.get("version_codename"), "pretty_name": info.get("pretty_name")}


def managed_files(root="/", module_files=None):
    """The collection's boot files present on the host, by what they do (see managed_paths), and its udev rules."""
    managed = {}
    for key, paths in managed_paths(module_files).items():
        managed[key] = [p for p in paths if os.path.exists(host_path(root, p))]
    try:
        rules = sorted(name for name in os.listdir(host_path(root, _vfio.UDEV_RULES_DIR))
                       if name.startswith(_vfio.UDEV_RULE_PREFIX))
    except (IOError, OSError):
        rules = []
    managed["vfio_rules"] = [os.path.join(_vfio.UDEV_RULES_DIR, name) for name in rules]
    return managed


# The NVIDIA kernel module as the distribution (or NVIDIA's installer, or DKMS) puts it in the running kernel's
# module tree; the GPU Operator's driver container loads its own from the driver root it mounts instead. The module
# is known by its name, not its file's: Debian renames the files (nvidia-current.ko, nvidia-current-open.ko,
# nvidia-tesla-535.ko) and loads them as nvidia through its modprobe file (install nvidia modprobe -i nvidia-current).
NVIDIA_MODULE = "nvidia"
MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"
# Bounds of the .modinfo read: a module's section table and .modinfo are small, whatever the module's size.
MAX_SECTIONS = 4096
MAX_SECTION_BYTES = 1 << 20


def _module_key(name):
    """A module name as modprobe compares them (``-`` and ``_`` are the same)."""
    return name.replace("-", "_")


def _file_module_name(path):
    """The module name depmod gives a module file (its name without the suffix), or None for another file."""
    base = os.path.basename(path)
    for suffix in MODULE_SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            return base[:-len(suffix)]
    return None


def _modprobe_names(command):
    """The modules a modprobe.d ``install`` command loads with modprobe (the first name of each modprobe call)."""
    names = []
    for part in command.replace("&&", ";").replace("||", ";").replace("|", ";").split(";"):
        words = part.split()
        if not words or os.path.basename(words[0]) != "modprobe":
            continue
        rest = iter(words[1:])
        for word in rest:
            if word in ("-C", "--config", "-d", "--dirname", "-S", "--set-version"):
                next(rest, None)
            elif not word.startswith("-"):
                if not word.startswith("$"):
                    names.append(word)
                break
    return names


def nvidia_module_aliases(root="/"):
    """The module names the modprobe configuration loads when the ``nvidia`` module is asked for: the first module
    of each modprobe call of an ``install nvidia`` command, and the target of an ``alias nvidia`` line."""
    found = []
    for _path, text in _modprobe.modprobe_files(root):
        for line in _modprobe.modprobe_logical_lines(text):
            words = line.split("#", 1)[0].split()
            if len(words) < 3 or _module_key(words[1]) != NVIDIA_MODULE:
                continue
            if words[0] == "install":
                found.extend(_modprobe_names(" ".join(words[2:])))
            elif words[0] == "alias":
                found.append(words[2])
    return [_module_key(name) for name in found if _module_key(name) != NVIDIA_MODULE]


def modinfo_name(path):
    """The ``name=`` of an uncompressed kernel module's .modinfo section (what modinfo shows as ``name:``), or None
    when the file is not such a module or cannot be read. Compressed modules are not unpacked."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(64)
            if len(header) < 52 or header[:4] != b"\x7fELF" or header[4] not in (1, 2) or header[5] not in (1, 2):
                return None
            order = "<" if header[5] == 1 else ">"
            wide = header[4] == 2
            if wide and len(header) < 64:
                return None
            shoff = struct.unpack_from(order + ("Q" if wide else "I"), header, 0x28 if wide else 0x20)[0]
            shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", header, 0x3A if wide else 0x2E)
            entry = order + ("IIQQQQ" if wide else "IIIIII")
            if not 0 < shnum <= MAX_SECTIONS or shstrndx >= shnum or shentsize < struct.calcsize(entry):
                return None
            handle.seek(shoff)
            table = handle.read(shentsize * shnum)
            if len(table) < shentsize * shnum:
                return None
            sections = [struct.unpack_from(entry, table, i * shentsize) for i in range(shnum)]

            def contents(section):
                offset, size = section[4], section[5]
                if size > MAX_SECTION_BYTES:
                    return None
                handle.seek(offset)
                data = handle.read(size)
                return data if len(data) == size else None

            names = contents(sections[shstrndx])
            if names is None:
                return None
            for section in sections:
                if names[section[0]:section[0] + 9] != b".modinfo\0":
                    continue
                data = contents(section)
                for item in (data or b"").split(b"\0"):
                    if item.startswith(b"name="):
                        return item[5:].decode("ascii", "replace") or None
                return None
    except (IOError, OSError, struct.error, ValueError):
        return None
    return None


def nvidia_host_module(root="/", kernel=None):
    """The file of the nvidia module that the running kernel's modules.dep lists, as modules.dep writes it, or None.

    A file is the nvidia module when depmod names it so (``nvidia.ko*``), when the modprobe configuration loads it
    for ``nvidia`` (:func:`nvidia_module_aliases`), or when the name inside it says so (:func:`modinfo_name`)."""
    if not kernel:
        return None
    moddir = "/lib/modules/%s" % kernel
    text = _persist.read_text(root, moddir + "/modules.dep")
    candidates = []
    for line in (text or "").splitlines():
        path = line.split(":", 1)[0].strip()
        name = _file_module_name(path)
        if name and _module_key(name).startswith(NVIDIA_MODULE):
            candidates.append((path, _module_key(name)))
    aliases = None
    for path, name in candidates:
        if name == NVIDIA_MODULE:
            return path
        if aliases is None:
            aliases = nvidia_module_aliases(root)
        if name in aliases:
            return path
    for path, name in candidates:
        if path.endswith(".ko") and modinfo_name(host_path(root, path if path.startswith("/") else
                                                           moddir + "/" + path)) == NVIDIA_MODULE:
            return path
    return None


def nvidia_driver(root="/", kernel=None):
    """Which NVIDIA driver serves the host: ``{"loaded", "version", "host_module", "source"}``.

    ``host_module`` is the file of the nvidia module that modules.dep of the running kernel lists (installed on the
    host, under whichever file name: :func:`nvidia_host_module`), or None. ``source`` is ``host`` when there is
    that file (a pre-installed driver, loaded or not), ``operator`` when the module is loaded without one and the
    operator's driver root (``/run/nvidia/driver``) is there, ``other`` when it is loaded from somewhere else, None
    when there is no NVIDIA driver at all.
    """
    loaded = os.path.isdir(host_path(root, "/sys/module/nvidia"))
    version = (_persist.read_text(root, "/sys/module/nvidia/version") or "").strip() or None
    host_module = nvidia_host_module(root, kernel)
    if host_module:
        source = "host"
    elif loaded:
        source = "operator" if os.path.isdir(host_path(root, OPERATOR_DRIVER_ROOT)) else "other"
    else:
        source = None
    return {"loaded": loaded, "version": version, "host_module": host_module, "source": source}


def set_sources(module_files=None):
    """Every file the sets ``module_files`` (see managed_paths) may write that an initramfs carries: what
    _kernels compares the images with, besides the files with the collection's prefix."""
    sets = dict(_modprobe.DEFAULT_SETS, **(module_files or {}))
    return [path for kind in _modprobe.SET_KINDS for _key, path in sorted(_modprobe.set_files(sets[kind]).items())]


def host_summary(root="/", module_files=None):
    """The ``gpu_facts_host`` fact; ``module_files`` names the sets of module files (see managed_paths)."""
    kernel = (_persist.read_text(root, KERNEL_RELEASE_FILE) or "").strip() or None
    mdevs = sorted(_mdev.list_mdev_devices(root).values(), key=lambda dev: dev["uuid"])
    kernels = _kernels.installed_kernels(root, kernel, extra_sources=set_sources(module_files))
    return {"os": read_os_release(root), "kernel": kernel, "mdev_devices": mdevs,
            "managed_files": managed_files(root, module_files),
            "sriov": sriov_counts(root), "sriov_recorded": recorded_sriov_pfs(root),
            "fingerprint": boot_fingerprint(root, kernel, kernels), "prepared": read_prepared(root),
            "nvidia_driver": nvidia_driver(root, kernel), "kernels": kernels}


def boot_fingerprint(root="/", kernel=None, kernels=None):
    """SHA-256 (hex) over FINGERPRINT_SOURCES, the GPU-related loaded modules and the installed kernels; never raises.

    ``kernels`` is what _kernels.installed_kernels returned (read here when None): a kernel installed or removed, or
    one whose initramfs or boot entry lacks the collection's settings, changes the fingerprint, so a host whose other
    boot files did not change still gets its repair.
    """
    digest = hashlib.sha256()
    digest.update(("kernel %s\n" % kernel).encode("utf-8"))
    for installed in _kernels.installed_kernels(root, kernel) if kernels is None else kernels:
        digest.update(("installed %s: %s\n" % (installed["version"], "; ".join(installed["problems"])))
                      .encode("utf-8", "surrogateescape"))
    for directory, pattern, how in FINGERPRINT_SOURCES:
        pattern = pattern.format(kernel=kernel or "")
        base = host_path(root, directory)
        try:
            names = sorted(n for n in os.listdir(base) if fnmatch.fnmatchcase(n, pattern))
        except (IOError, OSError):
            continue
        for name in names:
            path = os.path.join(base, name)
            digest.update(("%s/%s\n" % (directory, name)).encode("utf-8", "surrogateescape"))
            try:
                if os.path.islink(path):
                    digest.update(("-> %s\n" % os.readlink(path)).encode("utf-8", "surrogateescape"))
                    continue
                if not os.path.isfile(path):
                    continue
                if how == "stat":
                    info = os.stat(path)
                    digest.update(("%d %d\n" % (info.st_size, info.st_mtime_ns)).encode("utf-8"))
                else:
                    with open(path, "rb") as handle:
                        digest.update(hashlib.sha256(handle.read()).hexdigest().encode("ascii"))
            except (IOError, OSError) as exc:
                digest.update(("unreadable %s\n" % exc.errno).encode("utf-8"))
    modules = _persist.read_text(root, "/proc/modules") or ""
    names = [line.split(None, 1)[0] for line in modules.splitlines() if line.strip()]
    loaded = sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in FINGERPRINT_MODULES))
    digest.update(("modules %s\n" % " ".join(loaded)).encode("utf-8"))
    return digest.hexdigest()


def read_prepared(root="/"):
    """The record the host preparation left at its last ready run, or None."""
    try:
        record = json.loads(_persist.read_text(root, PREPARED_RECORD) or "null")
    except (ValueError, RecursionError):  # nested deeper than the parser recurses: damaged all the same
        return None
    return record if isinstance(record, dict) else None


def recorded_sriov_pfs(root="/"):
    """PF addresses recorded for boot by sriov_vfs (persistent=true), read by the rules sriov_vfs reads them with."""
    return sorted(_sriov.parse_definitions(_persist.read_text(root, _sriov.DEFINITIONS_FILE)))


def sriov_counts(root="/"):
    """``{pf_address: {"numvfs", "totalvfs"}}`` for every SR-IOV capable function of the host."""
    base = host_path(root, "/sys/bus/pci/devices")
    counts = {}
    try:
        names = sorted(os.listdir(base))
    except (IOError, OSError):
        return counts
    for name in names:
        try:
            with open(os.path.join(base, name, "sriov_numvfs")) as handle:
                numvfs = int(handle.read().strip() or 0)
            with open(os.path.join(base, name, "sriov_totalvfs")) as handle:
                totalvfs = int(handle.read().strip() or 0)
        except (IOError, OSError, ValueError):
            continue
        counts[name] = {"numvfs": numvfs, "totalvfs": totalvfs}
    return counts
