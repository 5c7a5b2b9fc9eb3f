# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A fake sysfs/procfs tree and a small simulated kernel for the SR-IOV writes, for unit tests of _sriov,
_mdev and the modules that write sysfs (sriov_vfs, mdev_create).

``FakeTree`` builds the tree under a temporary root (relative links, like sysfs); ``FakeKernel`` reacts to
writes of ``sriov_numvfs`` the way the kernel does; ``install_kernel`` makes _sriov write through it.
"""

from __future__ import annotations

import errno
import os
import shutil

from ansible_collections.gpuops.sandbox.plugins.module_utils import _sriov
from ansible_collections.gpuops.sandbox.plugins.module_utils import _sysfs
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import SysfsError
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sysfs_tree import relative_link, tree_snapshot

BRIDGE = "/sys/devices/pci0000:00/0000:00:01.0"
NVME_PF = "0000:01:00.0"


class FakeTree:
    """Builds a sysfs/procfs tree under a temporary root, shaped like the real one (relative links)."""

    def __init__(self, root):
        self.root = str(root)
        for path in ("/sys/bus/pci/devices", "/sys/bus/pci/drivers", "/sys/kernel/iommu_groups", "/proc"):
            os.makedirs(self.p(path), exist_ok=True)

    def p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def write(self, path, text):
        os.makedirs(os.path.dirname(self.p(path)), exist_ok=True)
        with open(self.p(path), "w") as handle:
            handle.write(text)

    def read(self, path):
        with open(self.p(path)) as handle:
            return handle.read().strip()

    def link(self, path, target):
        """Symlink host ``path`` to host ``target``, relative like sysfs links."""
        relative_link(self.p(path), self.p(target))

    def add_pci(self, address, vendor, device, cls, driver=None, bridge=BRIDGE, group=None):
        devdir = "%s/%s" % (bridge, address)
        os.makedirs(self.p(devdir), exist_ok=True)
        self.write(devdir + "/vendor", vendor + "\n")
        self.write(devdir + "/device", device + "\n")
        self.write(devdir + "/class", cls + "\n")
        self.link("/sys/bus/pci/devices/" + address, devdir)
        if driver:
            os.makedirs(self.p("/sys/bus/pci/drivers/" + driver), exist_ok=True)
            self.link(devdir + "/driver", "/sys/bus/pci/drivers/" + driver)
        if group is not None:
            os.makedirs(self.p("/sys/kernel/iommu_groups/%s" % group), exist_ok=True)
            self.link(devdir + "/iommu_group", "/sys/kernel/iommu_groups/%s" % group)
        return devdir

    def add_pf(self, address, vendor, device, cls, driver, totalvfs, offset, vf_device, autoprobe=True):
        devdir = self.add_pci(address, vendor, device, cls, driver=driver)
        self.write(devdir + "/sriov_totalvfs", "%d\n" % totalvfs)
        self.write(devdir + "/sriov_numvfs", "0\n")
        self.write(devdir + "/sriov_offset", "%d\n" % offset)
        self.write(devdir + "/sriov_stride", "1\n")
        self.write(devdir + "/sriov_vf_device", vf_device + "\n")
        self.write(devdir + "/sriov_drivers_autoprobe", "1\n" if autoprobe else "0\n")
        return devdir

    def open_fd(self, pid, comm, target):
        """Pretend process ``pid`` holds ``target`` (e.g. /dev/vfio/12) open."""
        self.write("/proc/%d/comm" % pid, comm + "\n")
        fd_dir = self.p("/proc/%d/fd" % pid)
        os.makedirs(fd_dir, exist_ok=True)
        os.symlink(target, os.path.join(fd_dir, str(len(os.listdir(fd_dir)) + 3)))

    def snapshot(self):
        """Every path, link target and file content under the root, to prove nothing changed."""
        return tree_snapshot(self.root, _entry)


def _entry(full):
    if os.path.islink(full):
        return "-> " + os.readlink(full)
    if os.path.isfile(full):
        with open(full) as handle:
            return handle.read()
    return "<dir>"


def _oserror(code, path):
    return SysfsError("writing to %s failed: %s" % (path, os.strerror(code)), path=path)


class FakeKernel:
    """Reacts to sysfs writes the way the kernel does, for the attributes the modules write.

    ``refuse`` maps a path suffix to an errno: the next matching write fails with it. Other writes go
    to the real ``write_attr`` (a plain file on the fake tree).
    """

    def __init__(self, tree):
        self.tree = tree
        self.writes = []
        self.refuse = {}
        self.hooks = []

    def rel(self, path):
        return "/" + os.path.relpath(path, self.tree.root)

    def write(self, path, value):
        rel = self.rel(path)
        self.writes.append((rel, str(value).strip()))
        for suffix, code in list(self.refuse.items()):
            if rel.endswith(suffix):
                raise _oserror(code, rel)
        for hook in self.hooks:
            if hook(self, path, rel, str(value).strip()):
                return None
        if rel.endswith("/sriov_numvfs"):
            return self.sriov_numvfs(path, rel, int(str(value).strip()))
        return _sysfs.write_attr(path, value)

    def sriov_numvfs(self, path, rel, count):
        tree = self.tree
        pf_dir = os.path.dirname(os.path.realpath(path))
        pf_rel = "/" + os.path.relpath(pf_dir, tree.root)
        total = int(tree.read(pf_rel + "/sriov_totalvfs"))
        current = int(tree.read(pf_rel + "/sriov_numvfs"))
        if count > total:
            raise _oserror(errno.ERANGE, rel)
        if count == current:
            return None
        if not os.path.islink(os.path.join(pf_dir, "driver")):
            raise _oserror(errno.ENOENT, rel)
        if count and current:
            raise _oserror(errno.EBUSY, rel)
        if count == 0:
            for name in sorted(os.listdir(pf_dir)):
                if name.startswith("virtfn"):
                    vf = os.path.basename(os.readlink(os.path.join(pf_dir, name)))
                    shutil.rmtree(os.path.join(os.path.dirname(pf_dir), vf), ignore_errors=True)
                    os.unlink(tree.p("/sys/bus/pci/devices/" + vf))
                    os.unlink(os.path.join(pf_dir, name))
        else:
            address = os.path.basename(pf_dir)
            domain_bus, slotfn = address.rsplit(":", 1)
            slot, fn = slotfn.split(".")
            base = int(slot, 16) * 8 + int(fn)
            offset = int(tree.read(pf_rel + "/sriov_offset"))
            autoprobe = tree.read(pf_rel + "/sriov_drivers_autoprobe") == "1"
            driver = os.path.basename(os.readlink(os.path.join(pf_dir, "driver")))
            for index in range(count):
                devfn = base + offset + index
                vf = "%s:%02x.%d" % (domain_bus, devfn >> 3, devfn & 7)
                vf_dir = os.path.dirname(pf_rel) + "/" + vf
                tree.add_pci(vf, tree.read(pf_rel + "/vendor"), tree.read(pf_rel + "/sriov_vf_device"),
                             tree.read(pf_rel + "/class"), driver=driver if autoprobe else None,
                             bridge=os.path.dirname(pf_rel), group=100 + devfn)
                tree.link(vf_dir + "/physfn", pf_rel)
                tree.link(pf_rel + "/virtfn%d" % index, vf_dir)
                for callback in getattr(self, "on_vf_created", []):
                    callback(tree, vf, vf_dir)
        tree.write(pf_rel + "/sriov_numvfs", "%d\n" % count)
        return None


def install_kernel(tree, monkeypatch):
    """A FakeKernel on ``tree`` that _sriov writes through, with waits that do not sleep."""
    fake = FakeKernel(tree)
    monkeypatch.setattr(_sriov, "write_attr", fake.write)
    monkeypatch.setattr(_sysfs, "_sleep", lambda _seconds: None)
    return fake


def add_nvme_pf(tree, driver="nvme", totalvfs=4):
    """The lab's QEMU nvme (1b36:0010), an SR-IOV PF with 4 VFs at offset 1."""
    return tree.add_pf(NVME_PF, "0x1b36", "0x0010", "0x010802", driver, totalvfs, 1, "0x0010")
