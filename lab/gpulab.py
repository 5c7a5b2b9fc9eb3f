#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpulab: a local lab of QEMU virtual machines that behave like GPU hosts.

Each lab host is a Debian 12 VM (q35 machine with an emulated Intel IOMMU) carrying stand-in devices
where a GPU server has its GPUs; by default (a host's gpulab_layout in the inventory gives it another shape,
see lab/layout.py):

* 00:01.0  QEMU standard VGA (1234:1111, class 030000), the boot VGA device;
* 00:03.0  edu (1234:11e8) with an HDA audio function (8086:293e) at 00:03.1 in the same IOMMU
           group, like a GPU and its HDMI audio function;
* a second edu behind its own PCIe root port, alone in its IOMMU group;
* an NVMe controller behind a PCIe root port with SR-IOV (4 VFs), standing in for an SR-IOV GPU;
* the kernel's `mtty` sample driver, loaded at boot, as a mediated-device (mdev) parent.

The image boots through grub from a partitioned disk with ``intel_iommu=off`` on its command line, so
turning the IOMMU on is a real bootloader change and a real reboot.

Commands: image, start, stop, reset, status, ssh, info, inventory. Run with --help for details.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# labcommon.py lies beside this script: importable whether the script runs or is loaded from its path.
LAB_DIR = os.path.dirname(os.path.abspath(__file__))
if LAB_DIR not in sys.path:
    sys.path.insert(0, LAB_DIR)
from labcommon import (Progress, Lab, add_command, free_ports, inventory_entries, inventory_host_vars,  # noqa: E402
                       port_free, read_json, utc_now)
import layout as layout_mod  # noqa: E402

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("GPUOPS_LAB_CACHE") or os.path.join(TOP, ".cache", "lab")
STATE = os.environ.get("GPUOPS_LAB_STATE") or os.path.join(TOP, ".lab")
INVENTORY_DIR = os.environ.get("GPUOPS_LAB_INVENTORY") or os.path.join(TOP, "inventories", "lab")
INVENTORY_HOSTS = os.path.join(INVENTORY_DIR, "hosts.yml")
INVENTORY_CONNECTION = os.path.join(INVENTORY_DIR, "zz-lab-connection.yml")
IMAGE_FILES = os.path.join(TOP, "lab", "image")

# Bump when the image recipe changes: a cached image built by an older recipe is rebuilt.
RECIPE_VERSION = "11"
SUITE = "bookworm"
IMAGE_NAME = "debian12-gpulab"
DISK_SIZE = 4 * 1024 ** 3
PART_OFFSET = 1024 * 1024
PACKAGES = [
    "systemd-sysv", "udev", "openssh-server", "python3", "kmod", "iproute2", "initramfs-tools",
    "linux-image-amd64", "grub-pc", "pciutils", "procps", "sudo", "dbus",
    # A nested guest on a prepared host (issue: proof that a VM can take the devices): QEMU to start it and
    # busybox for the small initramfs a full guest boot runs.
    "qemu-system-x86", "busybox-static",
]
# Kernel arguments the pristine image boots with. intel_iommu=off is deliberate (see the docstring).
# no_timer_check: under emulation on a loaded machine the kernel's boot-time check of the timer interrupt can
# miss its few ticks, and with the IOMMU's interrupt remapping on (intel_iommu=on after preparation) the kernel
# then panics ("timer doesn't work through Interrupt-remapped IO-APIC") instead of falling back; seen in the
# lab on a reboot beside four other emulated hosts. intel_iommu=off stays last (molecule's distro_grub.yml).
IMAGE_CMDLINE = "console=ttyS0,115200 no_timer_check intel_iommu=off"
SSH_USER = "root"
MEMORY_MB = int(os.environ.get("GPUOPS_LAB_MEMORY", "1536"))
CPUS = int(os.environ.get("GPUOPS_LAB_CPUS", "1"))
BOOT_TIMEOUT = int(os.environ.get("GPUOPS_LAB_BOOT_TIMEOUT", "900"))
FINALISE_MARKER = "GPULAB-FINALISE-OK"


class LabError(Exception):
    """An error the user can act on; printed without a traceback."""


# Log lines go to stdout; a failed command's error carries the last 15 lines of its output.
LAB = Lab("gpulab", LabError, log_to="stdout", run_tail=15)
log, run, locked = LAB.log, LAB.run, LAB.locked


def need_tools(*names):
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise LabError(
            "missing tools: %s. Run `make hostdeps` (as root it installs them with apt-get) or install "
            "qemu-system-x86, qemu-utils, debootstrap, fdisk, e2fsprogs and openssh-client." % ", ".join(missing)
        )


# ---------------------------------------------------------------------------------------------
# Lab hosts, read from the tracked inventory
# ---------------------------------------------------------------------------------------------

def load_inventory():
    """The YAML data of inventories/lab/hosts.yml."""
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise LabError("PyYAML is missing: run the lab through `make` (it creates the .venv) or pip install pyyaml")
    try:
        with open(INVENTORY_HOSTS) as handle:
            return yaml.safe_load(handle) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise LabError("cannot read the lab inventory %s: %s" % (INVENTORY_HOSTS, exc))


def lab_hosts():
    """Return the host names of inventories/lab/hosts.yml, in file order."""
    names = []
    for name, _hostvars, _groups in inventory_entries(load_inventory()):
        if name not in names:
            names.append(name)
    if not names:
        raise LabError("the lab inventory %s names no hosts" % INVENTORY_HOSTS)
    return names


def lab_host_settings(name):
    """The lab settings of one host from inventories/lab/hosts.yml (host variables named gpulab_*)."""
    return {k: v for k, v in inventory_host_vars(load_inventory(), name).items() if k.startswith("gpulab_")}


def autostarts(name):
    """False for a host with gpulab_autostart: false (started only when named, e.g. a test-only host)."""
    return lab_host_settings(name).get("gpulab_autostart", True) is not False


def select_hosts(requested, starting=False):
    """The named hosts (all must be known), or by default every host; `starting` leaves out by default
    the hosts that do not start unless named."""
    known = lab_hosts()
    if not requested:
        return [h for h in known if autostarts(h)] if starting else known
    unknown = [h for h in requested if h not in known]
    if unknown:
        raise LabError("unknown lab host(s) %s; the lab has: %s" % (", ".join(unknown), ", ".join(known)))
    return list(requested)


# ---------------------------------------------------------------------------------------------
# The cached base image
# ---------------------------------------------------------------------------------------------

def image_path():
    return os.path.join(CACHE, IMAGE_NAME + ".img")


def manifest_path():
    return os.path.join(CACHE, IMAGE_NAME + ".json")


def head_digest(path, size=64 * 1024 * 1024):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        remaining = size
        while remaining > 0:
            chunk = handle.read(min(remaining, 1024 * 1024))
            if not chunk:
                break
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()


def image_problem():
    """Return None when the cached image is usable, else why it is not (missing or corrupt)."""
    img, man = image_path(), manifest_path()
    if not os.path.exists(img) and not os.path.exists(man):
        return "missing"
    try:
        with open(man) as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as exc:
        return "corrupt: its manifest cannot be read (%s)" % exc
    if manifest.get("recipe") != RECIPE_VERSION:
        return "outdated: built by recipe %s, this lab uses %s" % (manifest.get("recipe"), RECIPE_VERSION)
    try:
        size = os.path.getsize(img)
        with open(img, "rb") as handle:
            mbr = handle.read(512)
            handle.seek(PART_OFFSET + 1080)
            magic = handle.read(2)
    except OSError as exc:
        return "corrupt: %s" % exc
    if size != manifest.get("size"):
        return "corrupt: size %s, expected %s" % (size, manifest.get("size"))
    if mbr[510:512] != b"\x55\xaa" or magic != b"\x53\xef":
        return "corrupt: no boot sector or no ext4 file system"
    if head_digest(img) != manifest.get("head_sha256"):
        return "corrupt: its first 64 MiB do not match the recorded checksum"
    return None


def image_manifest():
    with open(manifest_path()) as handle:
        return json.load(handle)


def ensure_image(rebuild=False):
    """Build the base image unless a valid one is cached; return its manifest."""
    with locked(os.path.join(CACHE, "image.lock")):
        problem = "rebuild requested" if rebuild else image_problem()
        if problem is None:
            return image_manifest()
        if problem != "missing":
            log("cached image %s is %s; rebuilding it" % (image_path(), problem))
        build_image()
        problem = image_problem()
        if problem:
            raise LabError("the image just built is %s" % problem)
        return image_manifest()


def write_file(root, path, text, mode=0o644):
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as handle:
        handle.write(text)
    os.chmod(full, mode)


def build_mtty(kver):
    """Build the kernel's mtty sample driver for `kver`; return the path of the cached mtty.ko."""
    ko = os.path.join(CACHE, "mtty", kver, "mtty.ko")
    if os.path.exists(ko):
        return ko
    headers = "/usr/src/linux-headers-%s" % kver
    if not os.path.isdir(headers):
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            raise LabError("kernel headers %s are missing: install linux-headers-%s" % (headers, kver))
        log("installing linux-headers-%s to build the mtty sample driver" % kver)
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "linux-headers-" + kver],
            timeout=1200, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
            progress="installing linux-headers-" + kver)
    series = ".".join(kver.split(".")[:2])
    src_dir = os.path.join(CACHE, "src")
    os.makedirs(src_dir, exist_ok=True)
    debs = [f for f in os.listdir(src_dir) if f.startswith("linux-source-%s_" % series) and f.endswith(".deb")]
    if not debs:
        log("downloading linux-source-%s for samples/vfio-mdev/mtty.c" % series)
        proc = subprocess.run(["apt-get", "download", "linux-source-" + series], cwd=src_dir, timeout=1200,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
        if proc.returncode != 0:
            raise LabError("apt-get download linux-source-%s failed: %s" % (series, proc.stderr.strip()))
        debs = [f for f in os.listdir(src_dir) if f.startswith("linux-source-%s_" % series)]
    build = os.path.join(CACHE, "mtty", kver, "build")
    shutil.rmtree(build, ignore_errors=True)
    os.makedirs(build)
    member = "linux-source-%s/samples/vfio-mdev/mtty.c" % series
    pipeline = "dpkg-deb --fsys-tarfile %s | tar -xO ./usr/src/linux-source-%s.tar.xz | tar -xJO %s > %s" % (
        os.path.join(src_dir, sorted(debs)[-1]), series, member, os.path.join(build, "mtty.c"))
    run(["bash", "-o", "pipefail", "-c", pipeline], timeout=600)
    write_file(build, "Kbuild", "obj-m := mtty.o\n")
    run(["make", "-s", "-C", headers, "M=" + build, "modules"], timeout=600)
    shutil.copy2(os.path.join(build, "mtty.ko"), ko)
    shutil.rmtree(build, ignore_errors=True)
    return ko


def configure_rootfs(rootfs, kver, mtty_ko):
    """Write the lab's configuration into the debootstrapped tree."""
    write_file(rootfs, "/etc/hostname", "gpulab\n")
    write_file(rootfs, "/etc/hosts", "127.0.0.1 localhost\n127.0.1.1 gpulab\n")
    write_file(rootfs, "/etc/fstab", "LABEL=gpulab-root / ext4 errors=remount-ro 0 1\n")
    write_file(rootfs, "/etc/machine-id", "")
    write_file(rootfs, "/etc/systemd/network/20-lab.network",
               "[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n")
    grub = open(os.path.join(rootfs, "etc/default/grub")).read()
    lines = []
    for line in grub.splitlines():
        if line.startswith("GRUB_TIMEOUT="):
            line = "GRUB_TIMEOUT=0"
        elif line.startswith("GRUB_CMDLINE_LINUX_DEFAULT="):
            line = 'GRUB_CMDLINE_LINUX_DEFAULT="%s"' % IMAGE_CMDLINE
        lines.append(line)
    lines += ["GRUB_TERMINAL=console", "GRUB_DISABLE_OS_PROBER=true"]
    write_file(rootfs, "/etc/default/grub", "\n".join(lines) + "\n")
    # The per-lab SSH key comes from QEMU's fw_cfg at every boot, so the image holds no key.
    write_file(rootfs, "/usr/local/sbin/gpulab-keys", """#!/bin/sh
set -e
modprobe qemu_fw_cfg 2>/dev/null || true
src=/sys/firmware/qemu_fw_cfg/by_name/opt/gpuops/authorized_keys/raw
[ -r "$src" ] || exit 0
install -d -m 0700 /root/.ssh
install -m 0600 "$src" /root/.ssh/authorized_keys
""", 0o755)
    write_file(rootfs, "/etc/systemd/system/gpulab-keys.service", """[Unit]
Description=Install the lab's SSH key from QEMU fw_cfg
Before=ssh.service
After=systemd-modules-load.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpulab-keys

[Install]
WantedBy=multi-user.target
""")
    # One boot at build time installs grub on the partitioned disk through the real tools.
    write_file(rootfs, "/etc/gpulab/finalise", "")
    write_file(rootfs, "/usr/local/sbin/gpulab-finalise", """#!/bin/sh
set -e
grub-install --target=i386-pc /dev/vda
update-grub
# An initramfs with the modules this VM mounts its root with and no busybox (klibc's tools do): every later
# rebuild (host preparation does them) and every boot is much quicker under emulation than with Debian's
# MODULES=most (or dep, which walks sysfs for them on every rebuild). What the collection adds
# (/usr/share/initramfs-tools/modules.d, /etc/modprobe.d) goes in as with any other setting.
sed -i 's/^MODULES=.*/MODULES=list/; s/^BUSYBOX=.*/BUSYBOX=n/' /etc/initramfs-tools/initramfs.conf
printf '%%s\\n' virtio_pci virtio_blk ext4 >> /etc/initramfs-tools/modules
update-initramfs -u -k all
rm -f /etc/gpulab/finalise
sync
echo %s > /dev/ttyS0
systemctl poweroff
""" % FINALISE_MARKER, 0o755)
    write_file(rootfs, "/etc/systemd/system/gpulab-finalise.service", """[Unit]
Description=Finish the gpulab image: install grub on the disk, build a small initramfs
ConditionPathExists=/etc/gpulab/finalise
After=local-fs.target systemd-udev-settle.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpulab-finalise
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
""")
    # Under emulation on a loaded machine a boot can wait minutes for its disk or a service: systemd's 90 s
    # limits then failed the boot (seen: the root device's wait timed out, / stayed read-only). A slow host
    # should be slow, not broken.
    write_file(rootfs, "/etc/systemd/system.conf.d/gpulab.conf",
               "[Manager]\nDefaultTimeoutStartSec=600s\nDefaultDeviceTimeoutSec=600s\n")
    # The guest's Python keeps the bytecode of the module payloads Ansible sends (lab/guest_pycache.py).
    write_file(rootfs, "/usr/lib/python3/dist-packages/gpulab-pycache.pth",
               "import gpulab_pycache; gpulab_pycache.install()\n")
    shutil.copy2(os.path.join(LAB_DIR, "guest_pycache.py"),
                 os.path.join(rootfs, "usr/lib/python3/dist-packages/gpulab_pycache.py"))
    # mtty: the kernel's sample mdev parent, loaded at boot.
    dest = os.path.join(rootfs, "lib/modules", kver, "updates")
    os.makedirs(dest, exist_ok=True)
    shutil.copy2(mtty_ko, os.path.join(dest, "mtty.ko"))
    write_file(rootfs, "/etc/modules-load.d/gpulab.conf", "mtty\n")
    run(["chroot", rootfs, "depmod", kver], timeout=120)
    run(["systemctl", "--root", rootfs, "enable", "systemd-networkd", "gpulab-keys.service",
         "gpulab-finalise.service"], timeout=120)
    # Services a lab host does not need; under software emulation each costs seconds of boot.
    run(["systemctl", "--root", rootfs, "mask", "systemd-networkd-wait-online.service",
         "apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "e2scrub_reap.service",
         "fstrim.timer", "getty-static.service", "getty@tty1.service", "systemd-binfmt.service",
         "proc-sys-fs-binfmt_misc.automount", "man-db.timer", "dpkg-db-backup.timer"], timeout=120)
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        path = os.path.join(rootfs, sub)
        for name in os.listdir(path):
            full = os.path.join(path, name)
            if os.path.isfile(full) and name != "lock":
                os.unlink(full)


def build_image():
    """Build the base disk image: debootstrap, mtty, a partitioned disk, grub installed in one boot."""
    if os.geteuid() != 0:
        raise LabError("building the lab image needs root (debootstrap and chroot); run it as root once")
    need_tools("debootstrap", "sfdisk", "mkfs.ext4", "qemu-system-x86_64", "make", "gcc", "dpkg-deb")
    started = time.time()
    work = os.path.join(CACHE, "build")
    shutil.rmtree(work, ignore_errors=True)
    rootfs = os.path.join(work, "rootfs")
    debs = os.path.join(CACHE, "debs")
    os.makedirs(rootfs)
    os.makedirs(debs, exist_ok=True)
    log("debootstrap %s (a few minutes the first time; packages are cached)" % SUITE)
    cmd = ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), "--cache-dir=" + debs,
           SUITE, rootfs]
    if os.environ.get("GPUOPS_LAB_MIRROR"):
        cmd.append(os.environ["GPUOPS_LAB_MIRROR"])
    run(cmd, timeout=1800, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), progress="debootstrap " + SUITE)
    kvers = sorted(os.listdir(os.path.join(rootfs, "lib/modules")))
    if len(kvers) != 1:
        raise LabError("expected one kernel in the image, found: %s" % kvers)
    kver = kvers[0]
    log("building the mtty sample driver for %s" % kver)
    mtty_ko = build_mtty(kver)
    configure_rootfs(rootfs, kver, mtty_ko)
    kernel = os.path.join(work, "vmlinuz")
    initrd = os.path.join(work, "initrd.img")
    shutil.copy2(os.path.join(rootfs, "boot", "vmlinuz-" + kver), kernel)
    shutil.copy2(os.path.join(rootfs, "boot", "initrd.img-" + kver), initrd)
    disk = os.path.join(work, "disk.img")
    with open(disk, "wb") as handle:
        handle.truncate(DISK_SIZE)
    run(["sfdisk", "-q", disk], input_text="label: dos\nstart=2048, type=83, bootable\n", timeout=60)
    fs_kib = (DISK_SIZE - PART_OFFSET) // 1024
    log("writing the root file system into the disk image")
    run(["mkfs.ext4", "-q", "-F", "-L", "gpulab-root", "-E", "offset=%d" % PART_OFFSET, "-d", rootfs,
         disk, "%dk" % fs_kib], timeout=900, progress="writing the root file system")
    shutil.rmtree(rootfs, ignore_errors=True)
    log("first boot: installing grub on the disk with the image's own tools")
    serial = os.path.join(work, "finalise.log")
    accel = choose_accel(kernel, initrd)
    cmd = qemu_base_cmd("gpulab-build", accel) + [
        "-drive", "file=%s,if=virtio,format=raw" % disk,
        "-kernel", kernel, "-initrd", initrd,
        "-append", "root=/dev/vda1 ro " + IMAGE_CMDLINE,
        "-serial", "file:" + serial, "-no-reboot", "-nic", "none",
    ]
    try:
        with Progress(LAB, "installing grub in the first boot", status=lambda: tail_text(serial, 1)):
            subprocess.run(cmd, timeout=BOOT_TIMEOUT, check=False, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LabError("the image's first boot did not finish in %ss; see %s" % (BOOT_TIMEOUT, serial))
    if FINALISE_MARKER not in read_text(serial):
        raise LabError("installing grub in the image failed; last console lines:\n%s" % tail_text(serial))
    final = image_path()
    os.replace(disk, final)
    manifest = {
        "recipe": RECIPE_VERSION, "kernel": kver, "size": os.path.getsize(final),
        "head_sha256": head_digest(final), "built": utc_now(),
        "build_seconds": round(time.time() - started, 1), "cmdline": IMAGE_CMDLINE,
        "id": hashlib.sha256(("%s-%s" % (time.time(), os.getpid())).encode()).hexdigest()[:12],
    }
    with open(manifest_path() + ".tmp", "w") as handle:
        json.dump(manifest, handle, indent=2)
    os.replace(manifest_path() + ".tmp", manifest_path())
    shutil.rmtree(work, ignore_errors=True)
    log("image ready: kernel %s, built in %.0fs" % (kver, time.time() - started))


def read_text(path):
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def tail_text(path, lines=20):
    return "\n".join(read_text(path).strip().splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# QEMU
# ---------------------------------------------------------------------------------------------

def qemu_base_cmd(name, accel, iommu=True):
    """The machine: q35 with an emulated Intel IOMMU (its ACPI DMAR table), unless ``iommu`` is false, which
    stands for a host whose firmware has VT-d turned off."""
    machine = "q35,accel=%s" % accel
    if accel == "kvm":
        machine += ",kernel-irqchip=split"
    cmd = [
        "qemu-system-x86_64", "-name", name, "-machine", machine, "-cpu", "max" if accel == "tcg" else "host",
        "-smp", str(CPUS), "-m", str(MEMORY_MB), "-display", "none", "-monitor", "none",
    ]
    if iommu:
        cmd += ["-device", "intel-iommu,intremap=on"]
    return cmd


def stand_in_devices(nvme_serial, layout=None, host="lab host"):
    """The devices that stand in for GPUs: the host's gpulab_layout, or the default (see lab/layout.py)."""
    try:
        return layout_mod.qemu_args(layout, nvme_serial, host)
    except layout_mod.LayoutError as exc:
        raise LabError("%s (inventory %s)" % (exc, INVENTORY_HOSTS))


def accel_cache_key():
    qemu = run(["qemu-system-x86_64", "--version"], timeout=30).stdout.splitlines()[0]
    return "%s|%s" % (os.uname().release, qemu)


def choose_accel(kernel=None, initrd=None):
    """KVM when it boots a kernel here, software emulation (TCG) otherwise; the probe is cached."""
    forced = os.environ.get("GPUOPS_LAB_ACCEL")
    if forced:
        if forced not in ("kvm", "tcg"):
            raise LabError("GPUOPS_LAB_ACCEL=%s: expected kvm or tcg" % forced)
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    cache = os.path.join(CACHE, "accel.json")
    key = accel_cache_key()
    known = read_json(cache)
    if known.get("key") == key and known.get("accel") in ("kvm", "tcg"):
        return known["accel"]
    # Without a loose kernel at hand, the probe boots the cached image itself through grub.
    accel = "kvm" if probe_kvm(kernel, initrd) else "tcg"
    log("KVM %s; using %s" % ("works" if accel == "kvm" else "did not boot a kernel in time", accel))
    os.makedirs(CACHE, exist_ok=True)
    with open(cache, "w") as handle:
        json.dump({"key": key, "accel": accel}, handle)
    return accel


def probe_kvm(kernel, initrd, seconds=25):
    """Boot a kernel under KVM and watch the console for init starting."""
    with tempfile.TemporaryDirectory() as tmp:
        serial = os.path.join(tmp, "serial.log")
        cmd = qemu_base_cmd("gpulab-kvm-probe", "kvm") + ["-serial", "file:" + serial, "-no-reboot", "-nic", "none"]
        if kernel:
            cmd += ["-kernel", kernel, "-initrd", initrd, "-append", "console=ttyS0 panic=-1"]
        else:
            cmd += ["-drive", "file=%s,if=virtio,format=raw,readonly=on" % image_path()]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        ok = False
        deadline = time.time() + seconds
        while time.time() < deadline and proc.poll() is None:
            text = read_text(serial)
            if "Run /init as init process" in text or "Freeing unused kernel" in text:
                ok = True
                break
            time.sleep(0.5)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        return ok


class Vm:
    """One lab host: its overlay disk, QEMU process, SSH port and console log under .lab/<name>."""

    def __init__(self, name):
        self.name = name
        self.dir = os.path.join(STATE, name)
        self.disk = os.path.join(self.dir, "disk.qcow2")
        self.pidfile = os.path.join(self.dir, "qemu.pid")
        self.qmp = os.path.join(self.dir, "qmp.sock")
        self.serial = os.path.join(self.dir, "console.log")
        self.events = os.path.join(self.dir, "events.sock")
        self.follow_log = os.path.join(self.dir, "reboots.log")
        self.meta_path = os.path.join(self.dir, "vm.json")

    # -- recorded state -----------------------------------------------------------------------
    def meta(self):
        return read_json(self.meta_path)

    def save_meta(self, **values):
        data = self.meta()
        data.update(values)
        os.makedirs(self.dir, exist_ok=True)
        with open(self.meta_path + ".tmp", "w") as handle:
            json.dump(data, handle, indent=2)
        os.replace(self.meta_path + ".tmp", self.meta_path)

    def pid(self):
        try:
            with open(self.pidfile) as handle:
                return int(handle.read().strip())
        except (OSError, ValueError):
            return None

    def process_alive(self):
        pid = self.pid()
        if not pid:
            return False
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as handle:
                cmdline = handle.read().split(b"\0")
        except OSError:
            return False
        return b"qemu-system-x86_64" in os.path.basename(cmdline[0]) and self.name.encode() in cmdline

    @contextlib.contextmanager
    def _qmp_session(self, path, timeout):
        """A QMP connection on the unix socket `path`, past the greeting and the capabilities' answer: (socket,
        line reader)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            reader = sock.makefile("r")
            json.loads(reader.readline())  # greeting
            sock.sendall(b'{"execute": "qmp_capabilities"}\n')
            self._qmp_reply(reader)
            yield sock, reader

    def qmp_command(self, command, timeout=10):
        """Send one QMP command; return its answer dict, or None when QEMU does not answer."""
        try:
            with self._qmp_session(self.qmp, timeout) as (sock, reader):
                sock.sendall(json.dumps({"execute": command}).encode() + b"\n")
                return self._qmp_reply(reader)
        except (OSError, ValueError):
            return None

    @staticmethod
    def _qmp_reply(reader):
        while True:
            line = reader.readline()
            if not line:
                raise ValueError("QMP closed")
            msg = json.loads(line)
            if "return" in msg or "error" in msg:
                return msg

    def state(self):
        """running, stale (pid file but no live QEMU), hung (QEMU alive, not running) or stopped."""
        if self.process_alive():
            reply = self.qmp_command("query-status")
            if reply and reply.get("return", {}).get("status") == "running":
                return "running"
            return "hung"
        if os.path.exists(self.pidfile):
            return "stale"
        return "stopped"

    # -- lifecycle -----------------------------------------------------------------------------
    def ensure_overlay(self, manifest):
        if os.path.exists(self.disk) and self.meta().get("image_id") == manifest["id"]:
            return
        if os.path.exists(self.disk):
            log("%s: the base image changed; starting from a fresh copy of it" % self.name)
        os.makedirs(self.dir, exist_ok=True)
        tmp = self.disk + ".tmp"
        run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", image_path(), tmp], timeout=60)
        os.replace(tmp, self.disk)
        self.save_meta(image_id=manifest["id"], created=time.time())

    def launch(self, manifest, accel, pubkey_file, rebooting=False):
        """Start QEMU; its SSH port. ``rebooting``: the guest asked for a restart (follow_reboots), so the host
        keeps its port and its console log goes on in the same file."""
        self.ensure_overlay(manifest)
        for attempt in range(1 if rebooting else 3):
            port = self.meta().get("ssh_port")
            if port and not attempt and not rebooting and not port_free(port):
                log("%s: port %d is taken by another program; using a free one" % (self.name, port))
                port = None
            if not port or attempt:
                port = free_ports(1)[0]
            for path in (self.pidfile, self.qmp, self.events):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            # Keep the previous console log for post-mortems.
            if os.path.exists(self.serial) and not rebooting:
                os.replace(self.serial, self.serial + ".previous")
            settings = lab_host_settings(self.name)
            iommu = settings.get("gpulab_iommu", True) is not False
            cmd = qemu_base_cmd(self.name, accel, iommu=iommu) + [
                "-drive", "file=%s,if=none,id=disk0,format=qcow2" % self.disk,
                "-device", "virtio-blk-pci,drive=disk0,addr=06.0",
                "-netdev", "user,id=net0,hostfwd=tcp:127.0.0.1:%d-:22" % port,
                "-device", "virtio-net-pci,netdev=net0,addr=07.0",
                "-fw_cfg", "name=opt/gpuops/authorized_keys,file=%s" % pubkey_file,
                "-chardev", "file,id=console,path=%s,append=on" % self.serial, "-serial", "chardev:console",
                "-qmp", "unix:%s,server=on,wait=off" % self.qmp,
                # A guest's reboot ends this QEMU; follow_reboots starts the host again (see there why).
                "-qmp", "unix:%s,server=on,wait=off" % self.events, "-action", "reboot=shutdown",
                "-pidfile", self.pidfile, "-daemonize",
            ] + stand_in_devices("gpulab-" + self.name, settings.get("gpulab_layout"), self.name)
            proc = subprocess.run(cmd, timeout=120, check=False, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            if proc.returncode == 0:
                keep_priority(self.pid())
                self.save_meta(ssh_port=port, accel=accel, started=time.time())
                self.follow()
                return port
            err = proc.stderr.strip()
            if "hostfwd" in err or "Could not set up host forwarding" in err:
                log("%s: port %d was taken; trying another" % (self.name, port))
                continue
            raise LabError("%s: QEMU did not start (rc=%s): %s" % (self.name, proc.returncode, err))
        raise LabError("%s: no free SSH port found after 3 tries" % self.name)

    def kill(self, graceful_seconds=0):
        """Power the VM off: ACPI power button first (when graceful), then QEMU quit, then SIGKILL."""
        if self.process_alive():
            if graceful_seconds:
                self.qmp_command("system_powerdown")
                deadline = time.time() + graceful_seconds
                while time.time() < deadline and self.process_alive():
                    time.sleep(1)
            if self.process_alive():
                self.qmp_command("quit")
                deadline = time.time() + 10
                while time.time() < deadline and self.process_alive():
                    time.sleep(0.5)
            if self.process_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid(), signal.SIGKILL)
                time.sleep(1)
        for path in (self.pidfile, self.qmp, self.events):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    # -- reboots -------------------------------------------------------------------------------
    def follow(self):
        """Start this host's reboot follower (`gpulab follow-reboots HOST`, in a session of its own): it lives
        as long as this QEMU does."""
        os.makedirs(self.dir, exist_ok=True)
        with open(self.follow_log, "a", encoding="utf-8") as out:
            subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, os.path.abspath(__file__), "follow-reboots", self.name], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)

    def shutdown_reason(self):
        """Wait on QEMU's event monitor until this QEMU stops: the SHUTDOWN event's reason ("guest-reset" when
        the guest asked for a restart), or None when QEMU went without one (killed) or never answered."""
        try:
            with self._qmp_session(self.events, 30) as (sock, reader):
                sock.settimeout(None)
                for line in reader:
                    msg = json.loads(line)
                    if msg.get("event") == "SHUTDOWN":
                        return msg.get("data", {}).get("reason")
        except (OSError, ValueError):
            return None
        return None


def follow_reboots(vm):
    """Wait until the host's QEMU stops; when its guest asked for a restart, start the host again on the same
    port, from a new QEMU: a cold start. What the guest sees is what a reboot through the firmware shows it
    (SeaBIOS, grub, the kernel and initramfs grub loads, devices reset); what it saves is QEMU's own in-place
    reset under emulation, where grub loading the kernel and initramfs into the memory the last boot ran in
    took 25-50 s against about 12 s after a cold start (measured 2026-11-27: code translated from the pages
    it overwrites is thrown away piece by piece). Returns the reason QEMU stopped."""
    pid = vm.pid()
    reason = vm.shutdown_reason()
    if reason != "guest-reset":
        return reason
    deadline = time.time() + 60
    while pid and time.time() < deadline and os.path.exists("/proc/%d" % pid):
        time.sleep(0.2)
    with locked(os.path.join(STATE, "lab.lock")):
        state = vm.state()
        if state == "running":
            log("%s: the guest rebooted and the host was started again meanwhile" % vm.name)
            return reason
        if state != "stopped":
            vm.kill()
        meta = vm.meta()
        vm.launch(image_manifest(), meta.get("accel") or choose_accel(), ssh_key()[1], rebooting=True)
        log("%s: the guest rebooted; started again (ssh port %s)" % (vm.name, vm.meta().get("ssh_port")))
    return reason


def keep_priority(pid):
    """Give a daemonized QEMU the priority of the command that started it. -daemonize starts a session of its
    own, and where the kernel groups processes by session for scheduling (autogroup, on by default in most
    distributions) a session's share of the CPU is set by its group's nice value, not by its processes' own:
    a lab host started at a lower priority (`nice gpulab start`) would compete as an equal. True when the
    group took the value; False when there was nothing to carry over or no autogroup to set."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if not pid or nice <= 0:
        return False
    try:
        with open("/proc/%d/autogroup" % pid, "w", encoding="ascii") as handle:
            handle.write(str(nice))
    except OSError:
        return False
    return True


def ssh_key():
    """Return (private, public) paths of the lab's own SSH key, generating it on first use."""
    key = os.path.join(STATE, "id_ed25519")
    if not (os.path.exists(key) and os.path.exists(key + ".pub")):
        need_tools("ssh-keygen")
        os.makedirs(STATE, exist_ok=True)
        for path in (key, key + ".pub"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpulab", "-f", key], timeout=30)
    return key, key + ".pub"


def ssh_cmd(port, *remote, connect_timeout=10):
    key = ssh_key()[0]
    return ["ssh", "-i", key, "-p", str(port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=%d" % connect_timeout, SSH_USER + "@127.0.0.1"] + list(remote)


def wait_ssh(vm, port, timeout):
    """Wait until SSH answers; fail early (with the console tail) when QEMU dies."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not vm.process_alive():
            raise LabError("%s: QEMU exited while booting; last console lines:\n%s" % (vm.name, tail_text(vm.serial)))
        try:
            proc = subprocess.run(ssh_cmd(port, "true"), timeout=30, check=False, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if proc.returncode == 0:
                return
        except subprocess.TimeoutExpired:
            pass
        time.sleep(2)
    raise LabError("%s: no SSH on 127.0.0.1:%d after %ss; last console lines:\n%s"
                   % (vm.name, port, timeout, tail_text(vm.serial)))


def write_inventory(hosts):
    """Write the connection part of inventories/lab (git-ignored; ports change from run to run)."""
    key = ssh_key()[0]
    rel_key = os.path.relpath(key, INVENTORY_DIR)
    lines = [
        "---",
        "# Written by lab/gpulab.py at every start: how to reach the running lab VMs. Do not edit.",
        "all:",
        "  hosts:",
    ]
    for name in hosts:
        port = Vm(name).meta().get("ssh_port")
        if not port:
            continue
        lines += [
            "    %s:" % name,
            "      ansible_host: 127.0.0.1",
            "      ansible_port: %d" % port,
            "      ansible_user: %s" % SSH_USER,
            "      ansible_ssh_private_key_file: \"{{ inventory_dir }}/%s\"" % rel_key,
            "      ansible_python_interpreter: /usr/bin/python3",
        ]
    tmp = INVENTORY_CONNECTION + ".tmp"
    with open(tmp, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(tmp, INVENTORY_CONNECTION)


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def cmd_image(args):
    need_tools("qemu-system-x86_64", "qemu-img")
    if args.verify:
        problem = image_problem()
        if problem:
            raise LabError("cached image is %s" % problem)
        log("cached image is valid: %s" % json.dumps(image_manifest()))
        return
    started = time.time()
    manifest = ensure_image(rebuild=args.rebuild)
    log("image %s (kernel %s) ready in %.1fs" % (manifest["id"], manifest["kernel"], time.time() - started))


def cmd_start(args):
    need_tools("qemu-system-x86_64", "qemu-img", "ssh", "ssh-keygen")
    hosts = select_hosts(args.hosts, starting=True)
    manifest = ensure_image()
    pub = ssh_key()[1]
    with locked(os.path.join(STATE, "lab.lock")):
        accel = choose_accel()
        booting = []
        for name in hosts:
            vm = Vm(name)
            state = vm.state()
            if state == "running":
                log("%s: already running (ssh port %s)" % (name, vm.meta().get("ssh_port")))
                booting.append((vm, vm.meta().get("ssh_port"), None))
                continue
            if state in ("stale", "hung"):
                log("%s: found %s (QEMU %s); restarting it" % (
                    name, state, "gone, pid file left behind" if state == "stale" else "not running the guest"))
                vm.kill()
            port = vm.launch(manifest, accel, pub)
            log("%s: booting (%s, ssh on 127.0.0.1:%d)" % (name, accel, port))
            booting.append((vm, port, time.time()))
    # SSH is awaited outside the lock, so other lab commands are not held up by a slow boot.
    errors = []

    def waiter(vm, port, t0):
        try:
            if t0 is None:
                wait_ssh(vm, port, args.timeout)
            else:
                with Progress(LAB, vm.name + ": booting", status=lambda: tail_text(vm.serial, 1), say_done=False):
                    wait_ssh(vm, port, args.timeout)
            if t0 is not None:  # None: it was already running (maybe still booting for another command)
                vm.save_meta(boot_to_ssh=round(time.time() - t0, 1))
                log("%s: ssh up after %.0fs" % (vm.name, time.time() - t0))
        except LabError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=waiter, args=item) for item in booting]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with locked(os.path.join(STATE, "lab.lock")):
        write_inventory(lab_hosts())
    if errors:
        raise LabError("\n".join(errors))


def cmd_stop(args):
    hosts = select_hosts(args.hosts)
    with locked(os.path.join(STATE, "lab.lock")):
        threads = []
        for name in hosts:
            vm = Vm(name)
            if vm.state() == "stopped":
                log("%s: not running" % name)
                continue
            thread = threading.Thread(target=vm.kill, kwargs={"graceful_seconds": 0 if args.force else 60})
            thread.start()
            threads.append((name, thread))
        for name, thread in threads:
            thread.join()
            log("%s: stopped" % name)


def cmd_reset(args):
    hosts = select_hosts(args.hosts)
    running = []
    with locked(os.path.join(STATE, "lab.lock")):
        for name in hosts:
            vm = Vm(name)
            if vm.state() != "stopped":
                running.append(name)
            vm.kill()
            for path in (vm.disk, vm.meta_path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            log("%s: back to the pristine image" % name)
    if running and not args.no_start:
        args.hosts = running
        cmd_start(args)


def cmd_status(args):
    hosts = select_hosts(args.hosts)
    rows = [("HOST", "STATE", "PID", "SSH", "ACCEL", "BOOT-TO-SSH", "DISK")]
    result = {}
    for name in hosts:
        vm = Vm(name)
        meta = vm.meta()
        state = vm.state()
        disk = "%.0fM" % (os.path.getsize(vm.disk) / 1048576.0) if os.path.exists(vm.disk) else "-"
        rows.append((name, state, str(vm.pid() or "-") if state != "stopped" else "-",
                     "127.0.0.1:%s" % meta["ssh_port"] if meta.get("ssh_port") else "-",
                     meta.get("accel", "-"), "%ss" % meta["boot_to_ssh"] if meta.get("boot_to_ssh") else "-", disk))
        result[name] = dict(meta, state=state, pid=vm.pid() if state != "stopped" else None, autostart=autostarts(name))
    problem = image_problem()
    if args.json:
        print(json.dumps({"hosts": result, "image": problem or "ok"}, indent=2))
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    print("image: %s" % ("ok" if problem is None else problem))


def cmd_info(args):
    vm = Vm(select_hosts([args.host])[0])
    key = ssh_key()[0]
    print(json.dumps({"instance": vm.name, "address": "127.0.0.1", "user": SSH_USER,
                      "port": vm.meta().get("ssh_port"), "identity_file": key, "state": vm.state()}))


def cmd_ssh(args):
    vm = Vm(select_hosts([args.host])[0])
    if vm.state() != "running":
        raise LabError("%s is not running; start it with `gpulab start %s`" % (vm.name, vm.name))
    os.execvp("ssh", ssh_cmd(vm.meta()["ssh_port"], *args.command))


def cmd_follow_reboots(args):
    follow_reboots(Vm(args.host))


def cmd_inventory(_args):
    write_inventory(lab_hosts())
    log("wrote %s" % os.path.relpath(INVENTORY_CONNECTION, TOP))


def main(argv=None):
    parser, sub = LAB.parser(__doc__)
    p = add_command(sub, "image", cmd_image, "build the base image unless a valid one is cached")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when a valid image is cached")
    p.add_argument("--verify", action="store_true", help="only check the cached image")
    for name, func, text in (("start", cmd_start, "start lab hosts (a no-op for running ones)"),
                             ("stop", cmd_stop, "power lab hosts off"),
                             ("reset", cmd_reset, "discard a host's changes: back to the pristine image"),
                             ("status", cmd_status, "show the state of every lab host")):
        p = add_command(sub, name, func, text, timeout=BOOT_TIMEOUT)
        p.add_argument("hosts", nargs="*", help="lab hosts (default: all in inventories/lab/hosts.yml%s)" % (
            "; hosts with gpulab_autostart: false only when named" if name == "start" else ""))
        if name in ("start", "reset"):
            p.add_argument("--timeout", type=int, default=BOOT_TIMEOUT, help="seconds to wait for SSH")
        if name == "stop":
            p.add_argument("--force", action="store_true", help="pull the plug instead of an ACPI shutdown")
        if name == "reset":
            p.add_argument("--no-start", action="store_true", help="leave reset hosts stopped")
        if name == "status":
            p.add_argument("--json", action="store_true")
    add_command(sub, "info", cmd_info, "connection details of one host, as JSON").add_argument("host")
    p = add_command(sub, "ssh", cmd_ssh, "open a shell (or run a command) on a lab host")
    p.add_argument("host")
    p.add_argument("command", nargs=argparse.REMAINDER)
    add_command(sub, "inventory", cmd_inventory, "rewrite inventories/lab/zz-lab-connection.yml")
    add_command(sub, "follow-reboots", cmd_follow_reboots,
                "(started with each host) start the host again when its guest reboots").add_argument("host")
    return LAB.main(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
