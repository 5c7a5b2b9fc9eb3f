# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A VFIO kernel for unit tests of the probe: the ioctls of /dev/vfio and /dev/iommu with the kernel's rules.

It keeps the rules the probe relies on (a group node opens once, the Type1v2 IOMMU needs a group in the
container, a device fd needs the IOMMU set, a cdev binds to an open iommufd before it attaches) and lets a test
make any call fail with an errno. Every call is recorded; ``open_fds`` is what the probe left open.
"""

from __future__ import annotations

import errno
import os
import struct

from ansible_collections.gpuops.sandbox.plugins.module_utils import _vfio_probe as vp


def _fail(code):
    return OSError(code, os.strerror(code))


class FakeVfioKernel:
    """``groups``: ``{group: {"devices": [names], "viable": bool}}``; ``cdevs``: ``{path: device name}``."""

    def __init__(self, groups=None, cdevs=None, iommufd=False):
        self.groups = groups or {}
        self.cdevs = cdevs or {}
        self.iommufd = iommufd
        self.container_missing = False
        self.type1v2 = True
        self.interrupt_remapping = True
        self.busy = set()          # group numbers or cdev paths another process has open
        self.errors = {}           # {(request or "open:<path>"): errno}
        self.calls = []
        self.fds = {}
        self.next_fd = 100

    # -- helpers ------------------------------------------------------------------------------
    def _new(self, **what):
        self.next_fd += 1
        self.fds[self.next_fd] = what
        return self.next_fd

    def open_fds(self):
        return dict(self.fds)

    # -- the Kernel interface -----------------------------------------------------------------
    def exists(self, path):
        return path == vp.IOMMUFD and self.iommufd

    def open(self, path):
        self.calls.append(("open", path))
        if "open:" + path in self.errors:
            raise _fail(self.errors["open:" + path])
        if path == vp.CONTAINER:
            if self.container_missing:
                raise _fail(errno.ENOENT)
            return self._new(kind="container", groups=[], iommu=False)
        if path == vp.IOMMUFD:
            if not self.iommufd:
                raise _fail(errno.ENOENT)
            return self._new(kind="iommufd", ioas=[])
        if path in self.cdevs:
            if path in self.busy or any(f.get("path") == path for f in self.fds.values()):
                raise _fail(errno.EBUSY)
            return self._new(kind="cdev", path=path, name=self.cdevs[path], bound=None, attached=False)
        name = path.rsplit("/", 1)[-1]
        if path.startswith("/dev/vfio/") and name.isdigit() and int(name) in self.groups:
            group = int(name)
            if group in self.busy or any(f.get("group") == group for f in self.fds.values()):
                raise _fail(errno.EBUSY)
            return self._new(kind="group", group=group, container=None)
        raise _fail(errno.ENOENT)

    def close(self, fd):
        self.calls.append(("close", fd))
        if fd not in self.fds:
            raise _fail(errno.EBADF)
        del self.fds[fd]

    def ioctl(self, fd, request, arg=0):  # pylint: disable=too-many-return-statements,too-many-branches
        self.calls.append(("ioctl", fd, request))
        if request in self.errors:
            raise _fail(self.errors[request])
        what = self.fds.get(fd)
        if what is None:
            raise _fail(errno.EBADF)
        kind = what["kind"]
        if kind == "container" and request == vp.VFIO_GET_API_VERSION:
            return vp.VFIO_API_VERSION
        if kind == "container" and request == vp.VFIO_CHECK_EXTENSION:
            return 1 if arg == vp.VFIO_TYPE1V2_IOMMU and self.type1v2 else 0
        if kind == "container" and request == vp.VFIO_SET_IOMMU:
            if not what["groups"]:
                raise _fail(errno.EINVAL)
            if not self.interrupt_remapping:
                raise _fail(errno.EPERM)
            what["iommu"] = True
            return 0
        if kind == "group" and request == vp.VFIO_GROUP_GET_STATUS:
            flags = vp.VFIO_GROUP_FLAGS_VIABLE if self.groups[what["group"]].get("viable", True) else 0
            if what["container"] is not None:
                flags |= vp.VFIO_GROUP_FLAGS_CONTAINER_SET
            arg[:] = struct.pack("=2I", struct.unpack("=2I", bytes(arg))[0], flags)
            return 0
        if kind == "group" and request == vp.VFIO_GROUP_SET_CONTAINER:
            container = struct.unpack("=i", bytes(arg))[0]
            if self.fds.get(container, {}).get("kind") != "container":
                raise _fail(errno.EBADF)
            if not self.groups[what["group"]].get("viable", True):
                raise _fail(errno.EPERM)
            what["container"] = container
            self.fds[container]["groups"].append(what["group"])
            return 0
        if kind == "group" and request == vp.VFIO_GROUP_GET_DEVICE_FD:
            container = self.fds.get(what["container"])
            if container is None or not container["iommu"]:
                raise _fail(errno.EINVAL)
            name = bytes(arg).split(b"\0", 1)[0].decode()
            if name not in self.groups[what["group"]]["devices"]:
                raise _fail(errno.ENODEV)
            return self._new(kind="device", name=name)
        if kind in ("device", "cdev") and request == vp.VFIO_DEVICE_GET_INFO:
            if kind == "cdev" and not what["attached"]:
                raise _fail(errno.EINVAL)
            argsz = struct.unpack("=6I", bytes(arg))[0]
            arg[:] = struct.pack("=6I", argsz, vp.VFIO_DEVICE_FLAGS_PCI | vp.VFIO_DEVICE_FLAGS_RESET, 9, 5, 0, 0)
            return 0
        if kind == "iommufd" and request == vp.IOMMU_IOAS_ALLOC:
            ioas = 1 + len(what["ioas"])
            what["ioas"].append(ioas)
            size, flags, _out = struct.unpack("=3I", bytes(arg))
            arg[:] = struct.pack("=3I", size, flags, ioas)
            return 0
        if kind == "cdev" and request == vp.VFIO_DEVICE_BIND_IOMMUFD:
            _argsz, _flags, iommufd, _out = struct.unpack("=IIiI", bytes(arg))
            if self.fds.get(iommufd, {}).get("kind") != "iommufd":
                raise _fail(errno.EBADF)
            if not self.interrupt_remapping:
                raise _fail(errno.EPERM)
            what["bound"] = iommufd
            return 0
        if kind == "cdev" and request == vp.VFIO_DEVICE_ATTACH_IOMMUFD_PT:
            pt_id = struct.unpack("=3I", bytes(arg))[2]
            if what["bound"] is None or pt_id not in self.fds.get(what["bound"], {}).get("ioas", []):
                raise _fail(errno.EINVAL)
            what["attached"] = True
            return 0
        raise _fail(errno.ENOTTY)
