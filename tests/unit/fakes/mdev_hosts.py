# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Fake mdev hosts for unit tests of _mdev and mdev_create: an A100 whose VFs are mdev parents, an L40S with the
NVIDIA vendor-specific vGPU interface, and the kernel's mtty sample parent.

``MdevKernel`` extends the fake SR-IOV kernel (sriov_kernel.FakeKernel) with what the kernel does on writes to
``create``, ``remove`` and ``current_vgpu_type``; ``build_a100``, ``build_l40s`` and ``build_mtty`` add the
devices to a FakeTree, ``install`` makes _sriov and _mdev write through the kernel.
"""

from __future__ import annotations

import errno
import os
import shutil

from ansible_collections.gpuops.sandbox.plugins.module_utils import _mdev, _sysfs
from ansible_collections.gpuops.sandbox.plugins.module_utils import _sriov
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sriov_kernel import FakeKernel, _oserror

A100_PF = "0000:3b:00.0"
A100_VFS = ["0000:3b:00.4", "0000:3b:00.5", "0000:3b:00.6", "0000:3b:00.7"]
L40S_PF = "0000:c1:00.0"
L40S_VFS = ["0000:c1:00.4", "0000:c1:00.5", "0000:c1:00.6", "0000:c1:00.7"]
A100_TYPES = {"nvidia-692": ("NVIDIA A100-4C", 1), "nvidia-693": ("NVIDIA A100-5C", 1),
              "nvidia-699": ("NVIDIA A100-40C", 1)}
MTTY_TYPES = {"mtty-1": ("Single port serial", 1), "mtty-2": ("Dual port serial", 2)}
# L40S (48 GB): id -> (name, frame buffer in GB)
L40S_TYPES = {1153: ("NVIDIA L40S-4Q", 4), 1155: ("NVIDIA L40S-8Q", 8), 1158: ("NVIDIA L40S-24Q", 24),
              1159: ("NVIDIA L40S-48Q", 48)}
VGPU_HEADER = "ID    : vGPU Name\n"


class MdevKernel(FakeKernel):
    """The fake kernel, plus mdev parents with a capacity, mdev create/remove and vendor vGPUs."""

    def __init__(self, tree):
        super().__init__(tree)
        self.parents = {}  # real parent dir -> {"capacity": n, "costs": {type: cost}}
        self.gpus = {}  # real PF dir -> {"memory": GB}
        self.create_without_device = False

    # ---- mdev bus
    def add_mdev_parent(self, name, devdir, types, capacity):
        for type_id, (type_name, _cost) in types.items():
            base = "%s/mdev_supported_types/%s" % (devdir, type_id)
            self.tree.write(base + "/name", type_name + "\n")
            self.tree.write(base + "/device_api", "vfio-pci\n")
            self.tree.write(base + "/description", "fake %s\n" % type_id)
            self.tree.write(base + "/create", "")
            os.makedirs(self.tree.p(base + "/devices"), exist_ok=True)
        self.tree.link("/sys/class/mdev_bus/" + name, devdir)
        os.makedirs(self.tree.p("/sys/bus/mdev/devices"), exist_ok=True)
        self.parents[os.path.realpath(self.tree.p(devdir))] = {
            "capacity": capacity, "costs": {t: c for t, (_n, c) in types.items()}}
        self.refresh(os.path.realpath(self.tree.p(devdir)))

    def _children(self, parent_dir):
        out = []
        for name in os.listdir(parent_dir):
            link = os.path.join(parent_dir, name, "mdev_type")
            if os.path.islink(link):
                out.append((name, os.path.basename(os.readlink(link))))
        return out

    def refresh(self, parent_dir):
        info = self.parents[parent_dir]
        used = sum(info["costs"][t] for _u, t in self._children(parent_dir))
        for type_id, cost in info["costs"].items():
            with open(os.path.join(parent_dir, "mdev_supported_types", type_id, "available_instances"), "w") as fh:
                fh.write("%d\n" % ((info["capacity"] - used) // cost))

    def write(self, path, value):
        rel = self.rel(path)
        text = str(value).strip()
        if rel.endswith("/create") and "/mdev_supported_types/" in rel:
            self.writes.append((rel, text))
            for suffix, code in list(self.refuse.items()):
                if rel.endswith(suffix):
                    raise _oserror(code, rel)
            return self.mdev_create(path, rel, text)
        if rel.startswith("/sys/bus/mdev/devices/") and rel.endswith("/remove"):
            self.writes.append((rel, text))
            for suffix, code in list(self.refuse.items()):
                if rel.endswith(suffix):
                    raise _oserror(code, rel)
            return self.mdev_remove(path, rel)
        if rel.endswith("/nvidia/current_vgpu_type"):
            self.writes.append((rel, text))
            for suffix, code in list(self.refuse.items()):
                if rel.endswith(suffix):
                    raise _oserror(code, rel)
            return self.vgpu_write(path, rel, text)
        return super().write(path, value)

    def mdev_create(self, path, rel, dev_uuid):
        type_dir = os.path.dirname(os.path.realpath(path))
        type_id = os.path.basename(type_dir)
        parent_dir = os.path.dirname(os.path.dirname(type_dir))
        if len(dev_uuid) != 36:
            raise _oserror(errno.EINVAL, rel)
        with open(os.path.join(type_dir, "available_instances")) as fh:
            if int(fh.read()) < 1:
                raise _oserror(errno.ENOSPC, rel)
        if os.path.lexists(self.tree.p("/sys/bus/mdev/devices/" + dev_uuid)):
            raise _oserror(errno.EEXIST, rel)
        if self.create_without_device:
            return None
        dev_dir = os.path.join(parent_dir, dev_uuid)
        os.makedirs(dev_dir)
        os.symlink("../mdev_supported_types/" + type_id, os.path.join(dev_dir, "mdev_type"))
        with open(os.path.join(dev_dir, "remove"), "w") as fh:
            fh.write("")
        os.makedirs(self.tree.p("/sys/bus/mdev/devices"), exist_ok=True)
        dev_rel = "/" + os.path.relpath(dev_dir, self.tree.root)
        self.tree.link("/sys/bus/mdev/devices/" + dev_uuid, dev_rel)
        self.refresh(parent_dir)
        return None

    def mdev_remove(self, path, rel):
        link = os.path.dirname(path)
        dev_dir = os.path.realpath(link)
        parent_dir = os.path.dirname(dev_dir)
        shutil.rmtree(dev_dir)
        os.unlink(link)
        self.refresh(parent_dir)

    # ---- vendor-specific vGPU
    def vgpu_refresh(self, pf_dir):
        vfs = [os.path.realpath(os.path.join(pf_dir, n)) for n in os.listdir(pf_dir) if n.startswith("virtfn")]
        current = {}
        for vf in vfs:
            with open(os.path.join(vf, "nvidia", "current_vgpu_type")) as fh:
                current[vf] = int(fh.read())
        used_types = {t for t in current.values() if t}
        free = self.gpus[pf_dir]["memory"] - sum(L40S_TYPES[t][1] for t in current.values() if t)
        for vf in vfs:
            lines = [VGPU_HEADER]
            if not current[vf]:
                for tid, (name, size) in sorted(L40S_TYPES.items()):
                    if size <= free and (not used_types or tid in used_types):
                        lines.append("%-6d: %s\n" % (tid, name))
            with open(os.path.join(vf, "nvidia", "creatable_vgpu_types"), "w") as fh:
                fh.write("".join(lines))

    def vgpu_write(self, path, rel, text):
        vf_dir = os.path.dirname(os.path.dirname(os.path.realpath(path)))
        pf_dir = os.path.realpath(os.path.join(vf_dir, "physfn"))
        wanted = int(text)
        with open(path) as fh:
            now = int(fh.read())
        if wanted:
            if now:
                raise _oserror(errno.EBUSY, rel)
            creatable = _mdev.parse_vgpu_types(open(os.path.join(vf_dir, "nvidia", "creatable_vgpu_types")).read())
            if wanted not in creatable:
                raise _oserror(errno.EINVAL, rel)
        with open(path, "w") as fh:
            fh.write("%d\n" % wanted)
        self.vgpu_refresh(pf_dir)


def install(monkeypatch, kernel):
    monkeypatch.setattr(_sriov, "write_attr", kernel.write)
    monkeypatch.setattr(_mdev, "write_attr", kernel.write)
    monkeypatch.setattr(_sysfs, "_sleep", lambda _seconds: None)


def build_a100(tree, kernel, vfs=4):
    """A100 (10de:20b5) with SR-IOV VFs; each VF is an mdev parent holding one vGPU of any type."""
    tree.add_pf(A100_PF, "0x10de", "0x20b5", "0x030200", "nvidia", 16, 4, "0x20b5")

    def register(tree_, vf, vf_dir):
        kernel.add_mdev_parent(vf, vf_dir, A100_TYPES, capacity=1)

    kernel.on_vf_created = [register]
    kernel.sriov_numvfs(tree.p("/sys/bus/pci/devices/%s/sriov_numvfs" % A100_PF), "", vfs)
    kernel.on_vf_created = []


def build_mtty(tree, kernel):
    """The kernel's mtty sample: parent 'mtty', 24 serial ports shared by mtty-1 (1 port) and mtty-2 (2)."""
    devdir = "/sys/devices/virtual/mtty/mtty"
    os.makedirs(tree.p(devdir), exist_ok=True)
    kernel.add_mdev_parent("mtty", devdir, MTTY_TYPES, capacity=24)


def build_l40s(tree, kernel, vfs=4):
    """L40S (10de:26b9), vGPU 17+ on kernel >= 6.8: VFs with nvidia/ attributes, no mdev bus."""
    tree.add_pf(L40S_PF, "0x10de", "0x26b9", "0x030200", "nvidia", 32, 4, "0x26b9")
    pf_dir = os.path.realpath(tree.p("/sys/bus/pci/devices/" + L40S_PF))
    kernel.gpus[pf_dir] = {"memory": 48}

    def register(tree_, vf, vf_dir):
        tree_.write(vf_dir + "/nvidia/current_vgpu_type", "0\n")
        tree_.write(vf_dir + "/nvidia/creatable_vgpu_types", VGPU_HEADER)

    kernel.on_vf_created = [register]
    kernel.sriov_numvfs(tree.p("/sys/bus/pci/devices/%s/sriov_numvfs" % L40S_PF), "", vfs)
    kernel.on_vf_created = []
    kernel.vgpu_refresh(pf_dir)


def avail(tree, parent, type_id):
    return int(tree.read("/sys/class/mdev_bus/%s/mdev_supported_types/%s/available_instances" % (parent, type_id)))
