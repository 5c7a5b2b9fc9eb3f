# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The NVIDIA kernel driver as the ways of installing it lay it out in a host's tree, for gpu_facts' nvidia_driver.

Each layout puts the files its packages (or installer) put there: the module files under /lib/modules/<kernel>, the
running kernel's modules.dep listing them as depmod writes it (paths relative to the module directory), the DKMS
source and build trees, and the modprobe configuration that makes ``modprobe nvidia`` load the renamed files.

Debian 12 (bookworm) renames the modules so that several driver flavours can be installed side by side:
nvidia-kernel-dkms builds /usr/src/nvidia-current-<version> into updates/dkms/nvidia-current{,-modeset,-drm,-uvm,
-peermem}.ko (uncompressed: bookworm's kernel compresses no module), nvidia-open-kernel-dkms into
nvidia-current-open*.ko, nvidia-tesla-535-kernel-dkms into nvidia-tesla-535*.ko. The module inside keeps its
upstream name (``name=nvidia`` in its .modinfo, /sys/module/nvidia once loaded), and the flavour's kernel-support
package's /etc/modprobe.d/nvidia.conf redirects the upstream names to the files
(``install nvidia modprobe -i nvidia-current $CMDLINE_OPTS``, unloading through the upstream names).
"""

from __future__ import annotations

import os
import struct

DEBIAN_KERNEL = "6.1.0-28-amd64"
DEBIAN_VERSION = "535.216.01"
SUFFIXES = ("", "-modeset", "-drm", "-uvm", "-peermem")
UPSTREAM = ("nvidia", "nvidia-modeset", "nvidia-drm", "nvidia-uvm", "nvidia-peermem")


def module_elf(modinfo):
    """The bytes of a minimal ELF64 relocatable object (what a .ko is) whose .modinfo section holds ``modinfo``
    (``[(key, value)]``, NUL-separated ``key=value`` strings as modpost writes them)."""
    info = b"".join(("%s=%s" % (key, value)).encode("ascii") + b"\0" for key, value in modinfo)
    shstrtab = b"\0.modinfo\0.shstrtab\0"
    info_offset = 64
    strtab_offset = info_offset + len(info)
    shoff = (strtab_offset + len(shstrtab) + 7) // 8 * 8
    header = (b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
              + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2))
    body = header + info + shstrtab
    body += bytes(shoff - len(body))
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, info_offset, len(info), 0, 0, 1, 0),
                struct.pack("<IIQQQQIIQQ", 10, 3, 0, 0, strtab_offset, len(shstrtab), 0, 0, 1, 0)]
    return body + b"".join(sections)


def _write_bytes(tree, host, data):
    full = tree.path(host)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as handle:
        handle.write(data)


def _modinfo(upstream, version):
    return [("version", version), ("license", "NVIDIA" if upstream == "nvidia" else "Dual MIT/GPL"),
            ("supported", "external"), ("depends", "" if upstream == "nvidia" else "nvidia"),
            ("retpoline", "Y"), ("name", upstream), ("vermagic", DEBIAN_KERNEL + " SMP preempt mod_unload modversions ")]


def debian_modprobe_conf(prefix):
    """/etc/modprobe.d/nvidia.conf of a Debian kernel-support package whose modules are ``<prefix>*.ko``."""
    return "".join([
        "install nvidia modprobe -i %s $CMDLINE_OPTS\n\n" % prefix,
        "install nvidia-modeset modprobe nvidia ; modprobe -i %s-modeset $CMDLINE_OPTS\n\n" % prefix,
        "install nvidia-drm modprobe nvidia-modeset ; modprobe -i %s-drm $CMDLINE_OPTS\n\n" % prefix,
        "install nvidia-uvm modprobe nvidia ; modprobe -i %s-uvm $CMDLINE_OPTS\n\n" % prefix,
        "install nvidia-peermem modprobe nvidia ; modprobe -i %s-peermem $CMDLINE_OPTS\n\n" % prefix,
        "# unloading needs the upstream names of the renamed modules\n\n",
        "remove nvidia modprobe -r -i nvidia-drm nvidia-modeset nvidia-peermem nvidia-uvm nvidia\n\n",
        "remove nvidia-modeset modprobe -r -i nvidia-drm nvidia-modeset\n\n",
        "alias char-major-195* nvidia\n\n",
        "alias   pci:v000010DEd*sv*sd*bc03sc02i00*               nvidia\n",
        "alias   pci:v000010DEd*sv*sd*bc03sc00i00*               nvidia\n",
    ])


def install_debian_dkms(tree, prefix="nvidia-current", kernel=DEBIAN_KERNEL, version=DEBIAN_VERSION,
                        modprobe_conf=True, loaded=True):
    """A Debian 12 host with the DKMS flavour whose modules are ``<prefix>*.ko`` (nvidia-current: nvidia-kernel-dkms,
    nvidia-current-open: nvidia-open-kernel-dkms, nvidia-tesla-535: nvidia-tesla-535-kernel-dkms) built for
    ``kernel``; ``modprobe_conf`` false leaves out the kernel-support package's modprobe file (removed by hand)."""
    tree.write("/proc/sys/kernel/osrelease", kernel + "\n")
    tree.write("/usr/src/%s-%s/dkms.conf" % (prefix, version),
               'PACKAGE_NAME="%s"\nPACKAGE_VERSION="%s"\nAUTOINSTALL=yes\n' % (prefix, version)
               + "".join('BUILT_MODULE_NAME[%d]="%s%s"\nDEST_MODULE_LOCATION[%d]="/updates/dkms"\n'
                         % (i, prefix, suffix, i) for i, suffix in enumerate(SUFFIXES)))
    modules = "/lib/modules/%s" % kernel
    dep = ["kernel/drivers/net/ethernet/intel/e1000e/e1000e.ko:",
           "kernel/drivers/gpu/drm/drm.ko:",
           "kernel/drivers/gpu/drm/drm_kms_helper.ko: kernel/drivers/gpu/drm/drm.ko"]
    for suffix, upstream in zip(SUFFIXES, UPSTREAM):
        name = "%s%s.ko" % (prefix, suffix)
        elf = module_elf(_modinfo(upstream, version))
        _write_bytes(tree, "/var/lib/dkms/%s/%s/%s/x86_64/module/%s" % (prefix, version, kernel, name), elf)
        _write_bytes(tree, "%s/updates/dkms/%s" % (modules, name), elf)
        needs = {"": "", "-modeset": " updates/dkms/%s.ko" % prefix,
                 "-drm": " updates/dkms/%s-modeset.ko updates/dkms/%s.ko kernel/drivers/gpu/drm/drm_kms_helper.ko "
                         "kernel/drivers/gpu/drm/drm.ko" % (prefix, prefix),
                 "-uvm": " updates/dkms/%s.ko" % prefix, "-peermem": " updates/dkms/%s.ko" % prefix}[suffix]
        dep.append("updates/dkms/%s:%s" % (name, needs))
    tree.write(modules + "/modules.dep", "\n".join(dep) + "\n")
    tree.write("/etc/modprobe.d/nvidia-blacklists-nouveau.conf", "# see #580894\nblacklist nouveau\n")
    if modprobe_conf:
        tree.write("/etc/modprobe.d/nvidia.conf", debian_modprobe_conf(prefix))
    if loaded:
        tree.write("/sys/module/nvidia/version", version + "\n")
