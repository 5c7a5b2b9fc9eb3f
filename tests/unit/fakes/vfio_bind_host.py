# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A simulated kernel for the sysfs writes of vfio binding (``VfioKernel``), and the way to run vfio_bind on a
fake host tree with it (``make_host``, ``run``), for unit tests of _vfio, vfio_bind and the preflight binding.

The host trees themselves come from sysfs_tree (build_vfio_gpu_host and the like), for kernel ``RELEASE``.
"""

from __future__ import annotations

import errno
import os
import re

from ansible.module_utils import basic

from ansible_collections.gpuops.sandbox.plugins.module_utils import _vfio
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import SysfsError
from ansible_collections.gpuops.sandbox.plugins.modules import vfio_bind
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call

RELEASE = "6.1.0-18-amd64"
_BIND_RE = re.compile(r"^/sys/bus/pci/drivers/([^/]+)/(bind|unbind)$")


class VfioKernel:
    """Reacts to the sysfs writes of vfio binding the way the kernel does.

    - ``driver_override`` stores the value (an empty line clears it to ``(null)``);
    - ``drivers/<drv>/unbind`` and ``bind`` move the ``driver`` links; bind refuses (ENODEV) a function
      whose override names another driver, and (EBUSY) a bound one; binding a vfio driver creates
      ``/dev/vfio/<group>``, unbinding the last vfio function of the group removes it;
    - ``drivers_probe`` binds the override driver, or the function's native driver (``native``);
    - ``modprobe`` (through :meth:`run_command`) registers the driver of a known module (``modules``).

    ``refuse`` maps a host path to an errno: writes to it fail with that error.
    """

    def __init__(self, tree, native=None, modules=("vfio_pci",)):
        self.tree = tree
        self.writes = []
        self.commands = []
        self.full_commands = []
        self.refuse = {}
        self.modules = set(modules)
        # Modules whose modprobe hangs: timeout(1) kills it and is killed with it (run_command says -9).
        self.hang = set()
        self.native = dict(native or {})
        for address in tree.functions:
            driver = self.driver(address)
            if driver and address not in self.native:
                self.native[address] = driver

    # -- helpers ---------------------------------------------------------------------------
    def rel(self, path):
        return "/" + os.path.relpath(path, self.tree.root)

    def devdir(self, address):
        return self.tree.functions[address]

    def driver(self, address):
        link = self.tree.path(self.devdir(address) + "/driver")
        return os.path.basename(os.readlink(link)) if os.path.islink(link) else None

    def override(self, address):
        value = self.tree.read(self.devdir(address) + "/driver_override")
        return None if value == "(null)" else value

    def group(self, address):
        link = self.tree.path(self.devdir(address) + "/iommu_group")
        return int(os.path.basename(os.readlink(link))) if os.path.islink(link) else None

    def _error(self, rel, value, code):
        return SysfsError("writing %r to %s failed: %s" % (value, rel, os.strerror(code)), path=rel)

    def _sync_vfio_node(self, group):
        if group is None:
            return
        node = self.tree.path("/dev/vfio/%d" % group)
        on_vfio = [a for a in self.tree.functions
                   if self.group(a) == group and _vfio.is_vfio_driver(self.driver(a))]
        if on_vfio and not os.path.exists(node):
            self.tree.write("/dev/vfio/%d" % group, "")
        elif not on_vfio and os.path.exists(node):
            os.unlink(node)

    def do_bind(self, address, driver, rel, value):
        if address not in self.tree.functions:
            raise self._error(rel, value, errno.ENODEV)
        if not os.path.isdir(self.tree.path("/sys/bus/pci/drivers/" + driver)):
            raise self._error(rel, value, errno.ENOENT)
        if self.driver(address) is not None:
            raise self._error(rel, value, errno.EBUSY)
        override = self.override(address)
        if override is not None and override != driver:
            raise self._error(rel, value, errno.ENODEV)
        self.tree.bind(address, driver)
        self._sync_vfio_node(self.group(address))

    def do_unbind(self, address, driver, rel, value):
        if address not in self.tree.functions or self.driver(address) != driver:
            raise self._error(rel, value, errno.ENODEV)
        os.unlink(self.tree.path(self.devdir(address) + "/driver"))
        os.unlink(self.tree.path("/sys/bus/pci/drivers/%s/%s" % (driver, address)))
        self._sync_vfio_node(self.group(address))

    # -- entry points ----------------------------------------------------------------------
    def write(self, path, value):
        rel = self.rel(path)
        value = str(value)
        shown = value.strip()
        self.writes.append((rel, shown))
        if rel in self.refuse:
            raise self._error(rel, shown, self.refuse[rel])
        if rel.endswith("/driver_override"):
            with open(path, "w") as handle:
                handle.write((shown or "(null)") + "\n")
            return
        if rel == "/sys/bus/pci/drivers_probe":
            if shown not in self.tree.functions:
                raise self._error(rel, shown, errno.ENODEV)
            if self.driver(shown) is None:
                wanted = self.override(shown) or self.native.get(shown)
                if wanted and os.path.isdir(self.tree.path("/sys/bus/pci/drivers/" + wanted)):
                    self.do_bind(shown, wanted, rel, shown)
            return
        match = _BIND_RE.match(rel)
        if match:
            if match.group(2) == "bind":
                self.do_bind(shown, match.group(1), rel, shown)
            else:
                self.do_unbind(shown, match.group(1), rel, shown)
            return
        raise AssertionError("unexpected sysfs write %r to %s" % (shown, rel))

    def run_command(self, args, **kwargs):
        """Stand-in for AnsibleModule.run_command: only modprobe [--dry-run] <module>."""
        self.full_commands.append(list(args))
        if os.path.basename(args[0]) == "timeout":
            args = args[3:]
        self.commands.append((list(args), kwargs.get("environ_update")))
        name = args[-1]
        if os.path.basename(args[0]) != "modprobe":
            raise AssertionError("unexpected command %r" % (args,))
        canonical = name.replace("-", "_")
        if canonical in self.hang:
            return -9, "", ""
        if canonical not in self.modules:
            return 1, "", "modprobe: FATAL: Module %s not found in directory /lib/modules/%s\n" % (name, RELEASE)
        if "--dry-run" not in args:
            self.tree.add_driver("vfio-pci" if canonical == "vfio_pci" else canonical)
        return 0, "", ""


def make_host(monkeypatch, tree, **kwargs):
    kernel = VfioKernel(tree, **kwargs)
    monkeypatch.setattr(_vfio, "write_attr", kernel.write)
    return tree, kernel


def run(monkeypatch, host_pair, args, check=False, diff=False):
    tree, kernel = host_pair
    full = dict(args)
    full["_ansible_check_mode"] = check
    full["_ansible_diff"] = diff
    with monkeypatch.context() as patch:
        patch.setattr(basic.AnsibleModule, "run_command", lambda self, argv, **kw: kernel.run_command(argv, **kw))
        patch.setattr(basic.AnsibleModule, "get_bin_path",
                      lambda self, name, required=False, opt_dirs=None: "/usr/sbin/" + name)
        patch.setattr(vfio_bind, "ROOT", tree.root)
        patch.setattr(vfio_bind, "RELEASE", RELEASE)
        return call(monkeypatch, vfio_bind.main, full)
