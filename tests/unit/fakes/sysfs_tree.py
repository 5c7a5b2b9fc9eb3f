# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Build fake host trees (sysfs, procfs, /dev, pci.ids) under a temporary directory for unit tests.

Real directories, files and relative symlinks shaped like a real host, so the code under test follows
links and reads attributes exactly as it does on ``/``:

- ``/sys/devices/pci0000:BB/<bridge>/<bdf>`` function directories with ``vendor``, ``device``, ...
- ``/sys/bus/pci/devices/<bdf>`` -> the function directory
- ``/sys/bus/pci/drivers/<name>/<bdf>`` -> the function directory, ``<fn>/driver`` -> the driver
- ``<fn>/iommu_group`` -> ``/sys/kernel/iommu_groups/N``, ``.../N/devices/<bdf>`` -> the function
- ``<pf>/virtfnN`` and ``<vf>/physfn`` links, ``mdev_supported_types``, ``nvidia/`` vGPU files
- ``/proc/<pid>/{comm,fd/N}``, ``/proc/cmdline``, ``/proc/cpuinfo``, pci.ids

Usage::

    tree = SysfsTree(tmp_path)
    tree.add_function("0000:65:00.0", "10de", "2236", "030200", driver="nvidia", iommu_group=12)

or one of the ready hosts: :func:`build_gpu_host` (A10 + audio, A100 with SR-IOV and mdev types,
L40S with vendor-specific vGPU VFs, an ASPEED BMC VGA behind a bridge) or :func:`build_lab_host`.
"""

from __future__ import annotations

import os

PCI_IDS_TEXT = """\
# Excerpt shaped like the real pci.ids; the 1013 entry shows a device line of another vendor that
# starts with an NVIDIA device ID (only unscoped lookups are fooled by it).
#
# Vendors, devices and subsystems. Please keep sorted.
1013  Cirrus Logic
\t20b5  Made-up device with an NVIDIA-looking ID
1234  Technical Corp.
\t1111  QEMU Virtual Video Controller
\t11e8  QEMU PCI Test Device (edu)
1a03  ASPEED Technology, Inc.
\t1150  AST1150 PCI-to-PCI Bridge
\t2000  ASPEED Graphics Family
8086  Intel Corporation
\t347a  Ice Lake Xeon PCI Express Root Port A
10de  NVIDIA Corporation
\t1aef  GA102 High Definition Audio Controller
\t20b5  GA100 [A100 PCIe 80GB]
\t\t10de 1533  A100 PCIe 80GB
\t2236  GA102GL [A10]
\t\t10de 1482  GA102GL [A10]
# a comment inside the vendor block
\t26b9  AD102GL [L40S]
10df  Emulex Corporation
\t1ae5  LP6000 Fibre Channel Host Adapter
C 03  Display controller
\t00  VGA compatible controller
\t\t00  VGA controller
\t02  3D controller
C 04  Multimedia controller
\t03  Audio device
C 06  Bridge
\t04  PCI bridge
\t\t00  Normal decode
"""

CPUINFO_INTEL = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz
flags\t\t: fpu vme de pse tsc msr pae mce vmx ssse3 sse4_1 sse4_2

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz
flags\t\t: fpu vme de pse tsc msr pae mce vmx ssse3 sse4_1 sse4_2
"""

CPUINFO_AMD = """\
processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7543 32-Core Processor
flags\t\t: fpu vme de pse tsc msr pae mce svm sse4_1
"""

CPUINFO_NO_VIRT = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: QEMU Virtual CPU version 2.5+
flags\t\t: fpu de pse tsc msr pae mce sse4_1
"""

L40S_CREATABLE = """\
ID    : vGPU Name
1155  : NVIDIA L40S-1B
1156  : NVIDIA L40S-2B
1161  : NVIDIA L40S-1Q
"""


class SysfsTree:
    """A fake host filesystem rooted at ``root``; every path argument is an absolute host path."""

    def __init__(self, root):
        self.root = str(root)
        self.functions = {}

    # -- low level -------------------------------------------------------------------------
    def path(self, host):
        return os.path.join(self.root, host.lstrip("/"))

    def mkdir(self, host):
        os.makedirs(self.path(host), exist_ok=True)
        return host

    def write(self, host, content=""):
        full = self.path(host)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as handle:
            handle.write(content)
        return host

    def link(self, host, target):
        """Make ``host`` a relative symlink to the host path ``target`` (which may not exist)."""
        relative_link(self.path(host), self.path(target))
        return host

    def raw_link(self, host, target):
        """Make ``host`` a symlink whose text is exactly ``target`` (as /proc/<pid>/fd links are)."""
        full = self.path(host)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        os.symlink(target, full)
        return host

    # -- PCI -------------------------------------------------------------------------------
    def add_function(self, address, vendor, device, pci_class, parent=None, driver=None, iommu_group=None,
                     subsystem_vendor=None, subsystem_device=None, numa_node=-1, boot_vga=None,
                     sriov_totalvfs=None, sriov_numvfs=None, revision="a1", parent_dir=None, driver_override=None):
        """Add a PCI function under ``parent`` (address of an added bridge), ``parent_dir`` or the root bus.

        ``driver_override`` is what its ``driver_override`` attribute shows (the kernel's ``(null)`` when None).
        """
        if parent_dir is not None:
            devdir = "%s/%s" % (parent_dir, address)
        elif parent is None:
            devdir = "/sys/devices/pci%s:%s/%s" % (address[:4], address[5:7], address)
        else:
            devdir = "%s/%s" % (self.functions[parent], address)
        self.functions[address] = devdir
        self.write(devdir + "/vendor", "0x%s\n" % vendor)
        self.write(devdir + "/device", "0x%s\n" % device)
        self.write(devdir + "/class", "0x%s\n" % pci_class)
        self.write(devdir + "/subsystem_vendor", "0x%s\n" % (subsystem_vendor or vendor))
        self.write(devdir + "/subsystem_device", "0x%s\n" % (subsystem_device or "0000"))
        self.write(devdir + "/revision", "0x%s\n" % revision)
        self.write(devdir + "/numa_node", "%d\n" % numa_node)
        self.write(devdir + "/driver_override", "%s\n" % (driver_override or "(null)"))
        self.write(devdir + "/enable", "1\n")
        if boot_vga is not None:
            self.write(devdir + "/boot_vga", "%d\n" % boot_vga)
        if sriov_totalvfs is not None:
            self.write(devdir + "/sriov_totalvfs", "%d\n" % sriov_totalvfs)
            self.write(devdir + "/sriov_numvfs", "%d\n" % (sriov_numvfs or 0))
            self.write(devdir + "/sriov_drivers_autoprobe", "1\n")
        self.link("/sys/bus/pci/devices/" + address, devdir)
        if driver:
            self.bind(address, driver)
        if iommu_group is not None:
            self.set_group(address, iommu_group)
        return devdir

    def add_driver(self, name):
        base = "/sys/bus/pci/drivers/" + name
        self.mkdir(base)
        for attr in ("bind", "unbind", "new_id", "remove_id"):
            if not os.path.exists(self.path(base + "/" + attr)):
                self.write(base + "/" + attr, "")
        return base

    def bind(self, address, driver):
        devdir = self.functions[address]
        base = self.add_driver(driver)
        self.link(base + "/" + address, devdir)
        self.link(devdir + "/driver", base)

    def set_group(self, address, group):
        devdir = self.functions[address]
        gdir = "/sys/kernel/iommu_groups/%d" % group
        self.mkdir(gdir + "/devices")
        self.write(gdir + "/type", "DMA\n")
        self.link(gdir + "/devices/" + address, devdir)
        self.link(devdir + "/iommu_group", gdir)

    def add_vf(self, pf, index, address, **kwargs):
        """Add an SR-IOV VF of ``pf`` as a sibling directory with ``physfn``/``virtfnN`` links."""
        pf_dir = self.functions[pf]
        parent_dir = os.path.dirname(pf_dir)
        ident = {key: self.read(pf_dir + "/" + key)[2:] for key in ("vendor", "device", "class")}
        kwargs.setdefault("subsystem_vendor", self.read(pf_dir + "/subsystem_vendor")[2:])
        kwargs.setdefault("subsystem_device", self.read(pf_dir + "/subsystem_device")[2:])
        vf_dir = self.add_function(address, ident["vendor"], ident["device"], ident["class"],
                                   parent_dir=parent_dir, **kwargs)
        self.link(vf_dir + "/physfn", pf_dir)
        self.link(pf_dir + "/virtfn%d" % index, vf_dir)
        return vf_dir

    def add_mdev_type(self, parent_dir, type_id, name, available, device_api="vfio-pci", description=None):
        tdir = "%s/mdev_supported_types/%s" % (parent_dir, type_id)
        if name is not None:
            self.write(tdir + "/name", name + "\n")
        self.write(tdir + "/available_instances", "%d\n" % available)
        self.write(tdir + "/device_api", device_api + "\n")
        if description is not None:
            self.write(tdir + "/description", description + "\n")
        self.write(tdir + "/create", "")
        self.mkdir(tdir + "/devices")
        return tdir

    def add_mdev_parent(self, name, parent_dir):
        self.link("/sys/class/mdev_bus/" + name, parent_dir)

    def set_vgpu(self, address, creatable_text, current="0"):
        ndir = self.functions[address] + "/nvidia"
        self.write(ndir + "/creatable_vgpu_types", creatable_text)
        self.write(ndir + "/current_vgpu_type", current + "\n")

    # -- other host state ------------------------------------------------------------------
    def add_process(self, pid, comm, fds):
        """Add ``/proc/<pid>`` with ``comm`` and ``fd/N`` links to each of ``fds`` (``{N: target}``)."""
        self.write("/proc/%d/comm" % pid, comm + "\n")
        self.mkdir("/proc/%d/fd" % pid)
        for fd, target in fds.items():
            self.raw_link("/proc/%d/fd/%d" % (pid, fd), target)

    def set_cmdline(self, text):
        self.write("/proc/cmdline", text + "\n")

    def set_cpuinfo(self, text):
        self.write("/proc/cpuinfo", text)

    def set_iommu(self, table="DMAR", units=("dmar0", "dmar1"), iommufd=True):
        if table:
            self.write("/sys/firmware/acpi/tables/" + table, "binary table\n")
        for unit in units:
            self.mkdir("/sys/devices/virtual/iommu/" + unit)
            self.link("/sys/class/iommu/" + unit, "/sys/devices/virtual/iommu/" + unit)
        if iommufd:
            self.write("/dev/iommu", "")

    def write_pci_ids(self, text=PCI_IDS_TEXT, location="/usr/share/misc/pci.ids"):
        self.write(location, text)

    def read(self, host):
        with open(self.path(host)) as handle:
            return handle.read().strip()

    def snapshot(self):
        """Return every path under the root with its kind and content (file text or link target)."""
        return tree_snapshot(self.root, _entry)


def relative_link(full, target):
    """Make ``full`` a symlink to ``target``, relative to its directory as sysfs links are, in place of what is there."""
    os.makedirs(os.path.dirname(full), exist_ok=True)
    if os.path.lexists(full):
        os.unlink(full)
    os.symlink(os.path.relpath(target, os.path.dirname(full)), full)


def tree_snapshot(root, entry):
    """Every path under ``root`` (relative to it) with what ``entry`` makes of its full path."""
    state = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(top, name)
            state[os.path.relpath(full, root)] = entry(full)
    return state


def _entry(full):
    if os.path.islink(full):
        return ("link", os.readlink(full))
    if os.path.isdir(full):
        return ("dir", None)
    with open(full, "rb") as handle:
        return ("file", handle.read(), os.stat(full).st_mtime_ns)


# Argument values that have broken modules before, for the fuzz tests of every host module: what
# ansible-core's int conversion turns into exceptions (inf, nan, integers of thousands of digits), what
# Python takes as a number although it is not ASCII, booleans (ints to Python), and strings a line-based
# file would misread (a trailing newline, a trailing backslash).
HOSTILE_VALUES = [
    "inf", "-inf", "nan", "Infinity", "-Infinity", "NaN", float("inf"), float("-inf"), float("nan"),
    "1e400", "-1e400", 1e300, "1" + "0" * 400, "9" * 5000, 10 ** 30, -10 ** 30, 10 ** 400,
    True, False, "true", "\u0661\u0662", "\uff11\uff12", "\u0661" * 3000, "12\n", "0000:65:00.0\n", "x\\",
    "modeset=0\\", "a=1\tb=2", "\x1b[31m", "", " ", "\n",
]


def failing_atomic_move(monkeypatch, suffix, errno_code=36):
    """Make AnsibleModule.atomic_move fail for destinations ending in ``suffix``, as ansible-core 2.19 does.

    2.19 raises a bare ``Exception`` chained to the OSError (here ENAMETOOLONG, the error a 300-character
    file name gives); the message names only the file's base name, so tests can compare it exactly.
    """
    from ansible.module_utils import basic  # pylint: disable=import-outside-toplevel

    real = basic.AnsibleModule.atomic_move

    def atomic_move(self, src, dest, *args, **kwargs):
        if dest.endswith(suffix):
            try:
                raise OSError(errno_code, os.strerror(errno_code), dest)
            except OSError as exc:
                raise Exception("Could not replace %r." % os.path.basename(dest)) from exc
        return real(self, src, dest, *args, **kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "atomic_move", atomic_move)


# Addresses of the ready-made host.
A10 = "0000:65:00.0"
A10_AUDIO = "0000:65:00.1"
A10_PORT = "0000:64:00.0"
A100 = "0000:b1:00.0"
A100_VFS = ("0000:b1:00.4", "0000:b1:00.5")
L40S = "0000:cb:00.0"
L40S_VFS = ("0000:cb:00.4", "0000:cb:00.5")
BMC_BRIDGE = "0000:01:00.0"
BMC_VGA = "0000:02:00.0"


def build_gpu_host(root, iommu=True, cmdline="BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/sda1 ro "
                                             "intel_iommu=on iommu=pt", cpuinfo=CPUINFO_INTEL):
    """Build a host with an A10 (+audio), an A100 (SR-IOV, mdev), an L40S (vendor vGPU) and a BMC VGA.

    ``iommu=False`` builds the same host booted with the IOMMU off: no groups, no units, no iommufd
    (the DMAR table stays, as the firmware still has it).
    """
    tree = SysfsTree(root)

    def group(number):
        return number if iommu else None

    # BMC display behind its own bridge, both in one group (bridge exempt from viability).
    tree.add_function("0000:00:1c.0", "8086", "a190", "060400", driver="pcieport", iommu_group=group(8))
    tree.add_function(BMC_BRIDGE, "1a03", "1150", "060400", parent="0000:00:1c.0", iommu_group=group(20))
    tree.add_function(BMC_VGA, "1a03", "2000", "030000", parent=BMC_BRIDGE, driver="ast",
                      iommu_group=group(20), boot_vga=1)
    # A10 and its audio function in one group.
    tree.add_function(A10_PORT, "8086", "347a", "060400", driver="pcieport", iommu_group=group(11))
    tree.add_function(A10, "10de", "2236", "030200", parent=A10_PORT, driver="nvidia", iommu_group=group(12),
                      subsystem_device="1482", numa_node=0)
    tree.add_function(A10_AUDIO, "10de", "1aef", "040300", parent=A10_PORT, driver="snd_hda_intel",
                      iommu_group=group(12), subsystem_device="1482", numa_node=0)
    # A100 PF with two VFs, each VF an mdev parent.
    tree.add_function("0000:b0:00.0", "8086", "347a", "060400", driver="pcieport", iommu_group=group(29))
    tree.add_function(A100, "10de", "20b5", "030200", parent="0000:b0:00.0", driver="nvidia",
                      iommu_group=group(30), subsystem_device="1533", numa_node=1, sriov_totalvfs=20,
                      sriov_numvfs=2)
    for index, vf in enumerate(A100_VFS):
        vf_dir = tree.add_vf(A100, index, vf, driver="nvidia", iommu_group=group(31 + index), numa_node=1)
        tree.add_mdev_type(vf_dir, "nvidia-692", "NVIDIA A100-4C", 1,
                           description="num_heads=1, frl_config=60, framebuffer=4096M")
        tree.add_mdev_type(vf_dir, "nvidia-700", "NVIDIA A100-80C", 0)
        tree.add_mdev_parent(vf, vf_dir)
    # L40S PF with two VFs using the vendor-specific vGPU interface (no mdev).
    tree.add_function("0000:ca:00.0", "8086", "347a", "060400", driver="pcieport", iommu_group=group(39))
    tree.add_function(L40S, "10de", "26b9", "030200", parent="0000:ca:00.0", driver="nvidia",
                      iommu_group=group(40), subsystem_device="1851", numa_node=1, sriov_totalvfs=32,
                      sriov_numvfs=2)
    for index, vf in enumerate(L40S_VFS):
        tree.add_vf(L40S, index, vf, driver="nvidia", iommu_group=group(41 + index), numa_node=1)
    tree.set_vgpu(L40S_VFS[0], L40S_CREATABLE, "0")
    tree.set_vgpu(L40S_VFS[1], "ID    : vGPU Name\n", "1161")
    tree.add_driver("vfio-pci")
    tree.mkdir("/sys/kernel/iommu_groups")
    tree.set_iommu(table="DMAR", units=("dmar0", "dmar1") if iommu else (), iommufd=iommu)
    tree.set_cmdline(cmdline)
    tree.set_cpuinfo(cpuinfo)
    tree.write_pci_ids()
    tree.add_process(1, "systemd", {0: "/dev/null", 1: "/dev/null"})
    tree.add_process(1234, "nvidia-persiste", {3: "/dev/nvidia0", 4: "/dev/nvidiactl"})
    tree.add_process(2345, "nv-hostengine", {5: "/dev/nvidia0", 6: "/dev/nvidia1", 7: "/dev/nvidia0"})
    tree.add_process(3456, "qemu-kvm", {20: "/dev/vfio/vfio", 21: "/dev/vfio/12"})
    return tree


def build_lab_host(root, iommu=True):
    """Build a tree like the QEMU q35 lab VM (intel-iommu), for tests that mirror the integration ones."""
    tree = SysfsTree(root)

    def group(number):
        return number if iommu else None

    tree.add_function("0000:00:01.0", "1234", "1111", "030000", driver="bochs-drm", iommu_group=group(1),
                      boot_vga=1, subsystem_vendor="1af4", subsystem_device="1100")
    tree.add_function("0000:00:03.0", "1234", "11e8", "00ff00", iommu_group=group(3))
    tree.add_function("0000:00:03.1", "8086", "293e", "040300", driver="snd_hda_intel", iommu_group=group(3))
    tree.add_function("0000:00:1c.0", "1b36", "000c", "060400", driver="pcieport", iommu_group=group(4))
    tree.add_function("0000:01:00.0", "1234", "11e8", "00ff00", parent="0000:00:1c.0", iommu_group=group(5))
    tree.add_function("0000:00:1c.1", "1b36", "000c", "060400", driver="pcieport", iommu_group=group(6))
    tree.add_function("0000:02:00.0", "1b36", "0010", "010802", parent="0000:00:1c.1", driver="nvme",
                      iommu_group=group(7), sriov_totalvfs=4)
    tree.mkdir("/sys/devices/virtual/mtty/mtty")
    tree.add_mdev_type("/sys/devices/virtual/mtty/mtty", "mtty-1", "Single port serial", 24)
    tree.add_mdev_type("/sys/devices/virtual/mtty/mtty", "mtty-2", "Dual port serial", 12)
    tree.add_mdev_parent("mtty", "/sys/devices/virtual/mtty/mtty")
    tree.add_driver("vfio-pci")
    tree.mkdir("/sys/kernel/iommu_groups")
    tree.set_iommu(table="DMAR", units=("dmar0",) if iommu else (), iommufd=iommu)
    tree.set_cmdline("BOOT_IMAGE=/boot/vmlinuz-6.1.0-18-amd64 root=/dev/vda1 ro console=ttyS0 "
                     + ("intel_iommu=on iommu=pt" if iommu else "intel_iommu=off"))
    tree.set_cpuinfo(CPUINFO_NO_VIRT)
    return tree


# -- vfio binding --------------------------------------------------------------------------------

VFIO_ALIASES_TEXT = """\
# Excerpt shaped like /lib/modules/<release>/modules.alias: the generic vfio_pci alias and a variant.
alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia
alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci
alias vfio_pci:v000010DEd00002342sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci
alias vfio_pci:v000015B3d0000101Esv*sd*bc*sc*i* mlx5_vfio_pci
"""


def modalias_of(tree, address):
    """The ``modalias`` the kernel shows for a function of ``tree`` (upper-case hex, like the kernel)."""
    devdir = tree.functions[address]

    def hexval(name):
        return int(tree.read(devdir + "/" + name), 16)

    klass = hexval("class")
    return "pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X" % (
        hexval("vendor"), hexval("device"), hexval("subsystem_vendor"), hexval("subsystem_device"),
        klass >> 16, (klass >> 8) & 0xFF, klass & 0xFF)


def add_modaliases(tree):
    """Write ``modalias`` for every function of ``tree``."""
    for address, devdir in tree.functions.items():
        tree.write(devdir + "/modalias", modalias_of(tree, address) + "\n")


def add_modules_alias(tree, release, text=VFIO_ALIASES_TEXT):
    tree.write("/lib/modules/%s/modules.alias" % release, text)


def add_driver_module(tree, driver, module=None):
    """Give ``/sys/bus/pci/drivers/<driver>`` its ``module`` link to ``/sys/module/<module>``, as the kernel does for
    a loaded module (or a built-in driver); ``module`` defaults to the driver's name with ``-`` as ``_``."""
    module = module or driver.replace("-", "_")
    tree.mkdir("/sys/module/%s/drivers" % module)
    tree.add_driver(driver)
    tree.link("/sys/bus/pci/drivers/%s/module" % driver, "/sys/module/" + module)


def add_nvidia_nodes(tree, minors):
    """Add ``/dev/nvidiaN`` and ``/proc/driver/nvidia/gpus/<BDF>/information`` for ``{address: minor}``."""
    for address, minor in minors.items():
        tree.write("/dev/nvidia%d" % minor, "")
        tree.write("/proc/driver/nvidia/gpus/%s/information" % address,
                   "Model: \t\t NVIDIA GPU\nIRQ:   \t\t 150\nBus Location: \t %s\nDevice Minor: \t %d\n"
                   "GPU Excluded:\t No\n" % (address, minor))
    tree.write("/dev/nvidiactl", "")


def remove_process(tree, pid):
    """Remove ``/proc/<pid>`` (the process exited)."""
    for top, dirs, files in os.walk(tree.path("/proc/%d" % pid), topdown=False):
        for name in files:
            os.unlink(os.path.join(top, name))
        for name in dirs:
            full = os.path.join(top, name)
            if os.path.islink(full):
                os.unlink(full)
            else:
                os.rmdir(full)
    os.rmdir(tree.path("/proc/%d" % pid))


def build_vfio_gpu_host(root, release, holders=False):
    """:func:`build_gpu_host` plus what vfio binding reads: modalias files, modules.alias, nvidia nodes.

    The A10 is minor 0 and the A100 minor 1. ``holders=False`` removes the processes that hold
    ``/dev/nvidia*`` and ``/dev/vfio/12`` open (nvidia-persistenced, nv-hostengine, qemu-kvm).
    """
    tree = build_gpu_host(root)
    add_modaliases(tree)
    add_modules_alias(tree, release)
    add_nvidia_nodes(tree, {A10: 0, A100: 1})
    tree.mkdir("/dev/vfio")
    tree.write("/dev/vfio/vfio", "")
    if not holders:
        for pid in (1234, 2345, 3456):
            remove_process(tree, pid)
    return tree


# Addresses of the slot host (build_vfio_slot_host).
SLOT_PORT = "0000:00:01.0"
SLOT_GPU = "0000:01:00.0"
SLOT_AUDIO = "0000:01:00.1"
SLOT_USB = "0000:01:00.2"
SLOT_NIC = "0000:02:00.0"


def build_vfio_slot_host(root, release):
    """A pristine Intel host, booted with the IOMMU off (no groups): a GPU whose slot also holds its HDMI audio
    (snd_hda_intel) and a USB controller on uhci_hcd, and a NIC in another slot; vfio binding files as in
    :func:`build_vfio_gpu_host` (nothing holds the GPU)."""
    tree = SysfsTree(root)
    tree.add_function(SLOT_PORT, "8086", "347a", "060400", driver="pcieport")
    tree.add_function(SLOT_GPU, "10de", "2236", "030200", parent=SLOT_PORT, driver="nvidia", subsystem_device="1482")
    tree.add_function(SLOT_AUDIO, "10de", "1aef", "040300", parent=SLOT_PORT, driver="snd_hda_intel",
                      subsystem_device="1482")
    tree.add_function(SLOT_USB, "8086", "2934", "0c0300", parent=SLOT_PORT, driver="uhci_hcd")
    tree.add_function("0000:00:1c.0", "8086", "a190", "060400", driver="pcieport")
    tree.add_function(SLOT_NIC, "8086", "10d3", "020000", parent="0000:00:1c.0", driver="e1000e")
    tree.add_driver("vfio-pci")
    tree.mkdir("/sys/kernel/iommu_groups")
    tree.set_iommu(table="DMAR", units=(), iommufd=False)
    tree.set_cmdline("BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/sda1 ro")
    tree.set_cpuinfo(CPUINFO_INTEL)
    tree.add_process(1, "systemd", {0: "/dev/null"})
    add_modaliases(tree)
    add_modules_alias(tree, release)
    add_nvidia_nodes(tree, {SLOT_GPU: 0})
    tree.mkdir("/dev/vfio")
    tree.write("/dev/vfio/vfio", "")
    return tree


def unload_driver(tree, name):
    """Remove ``/sys/bus/pci/drivers/<name>`` (its module is not loaded); no function may be bound to it."""
    base = tree.path("/sys/bus/pci/drivers/" + name)
    for entry in os.listdir(base):
        os.unlink(os.path.join(base, entry))
    os.rmdir(base)


def build_vfio_lab_host(root, release, vfio_loaded=False):
    """:func:`build_lab_host` plus modalias files and modules.alias; vfio-pci not loaded unless asked."""
    tree = build_lab_host(root)
    add_modaliases(tree)
    add_modules_alias(tree, release)
    if not vfio_loaded:
        unload_driver(tree, "vfio-pci")
    tree.mkdir("/dev/vfio")
    tree.write("/dev/vfio/vfio", "")
    return tree


def selector_fuzz_args(options, samples, max_size=4):
    """Hypothesis strategies of module arguments for the read-only GPU selector modules (gpu_facts, iommu_check):
    ``(any_args, typed_args)``. ``any_args`` is random values of every shape (``samples`` among them) for
    ``options`` and a bogus one, or ``typed_args``: well-typed selector lists and booleans that reach the
    selection and sysfs code rather than stopping at validation."""
    from hypothesis import strategies as hs  # pylint: disable=import-outside-toplevel

    hostile = ["inf", "-inf", "nan", "Infinity", "1e400", "9" * 40, "-" + "9" * 30, "10de\n", A10 + "\n", "0302\n",
               "\n", "10d\u00e9", "\uff11\uff10de", "0000:65:00.\u0660", "yes", "on", "~"]
    leaf = (hs.none() | hs.booleans() | hs.integers() | hs.integers(min_value=10 ** 30) | hs.floats()
            | hs.text(alphabet=hs.characters(blacklist_categories=("Cs",)), max_size=12) | hs.sampled_from(hostile)
            | hs.sampled_from(samples))
    values = hs.recursive(leaf, lambda inner: hs.lists(inner, max_size=4)
                          | hs.dictionaries(hs.text(max_size=4), inner, max_size=3), max_leaves=8)
    random_args = hs.dictionaries(hs.sampled_from(list(options) + ["bogus"]), values, max_size=max_size)
    selector = hs.lists(hs.sampled_from(["10de", "10de:2236", "1a03", "8086:347a", "0x10de", "10de:", "", "03",
                                         "0302", "030200", "060400", "zz", A10, "65:00.1", "0000:99:00.0",
                                         "0000:65:00.8"] + hostile) | hs.text(max_size=9), max_size=3)
    typed_args = hs.fixed_dictionaries({}, optional={
        name: (hs.booleans() if name.startswith(("include", "require")) else selector) for name in options})
    return hs.one_of(random_args, typed_args), typed_args
