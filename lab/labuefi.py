# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""labuefi: a lab host that boots the way RHEL-family hosts do (``gpulab_boot: uefi`` in inventories/lab/hosts.yml).

Such a host boots through UEFI firmware (OVMF, from Debian's ``ovmf`` package on the controller) and systemd-boot
from Boot Loader Specification entries that ``kernel-install`` writes on an EFI system partition, each entry with
its own kernel arguments (from ``/etc/kernel/cmdline`` when the entry was written), and dracut builds its
initramfs. No RHEL package can be installed here; Debian's packages carry the same mechanisms.

The host shares the lab's base image (a grub and initramfs-tools system) and is converted at its first start:

1. a cold BIOS boot of the base image with an empty ESP disk beside it (GPT with one EFI system partition, made on
   the controller with sfdisk; attached to the q35 machine's own SATA controller, so it takes no PCI slot of the
   host's layout);
2. over SSH, the guest formats and mounts the ESP, keeps the kernel arguments grub gave it in /etc/kernel/cmdline,
   installs dracut (which replaces initramfs-tools and builds the image), then systemd-boot (which installs itself
   on the ESP and writes an entry for the kernel with kernel-install), and purges grub;
3. it powers off, and the host boots again through OVMF, with its firmware variables in a file of its own.

That boot is saved as the boot of its shape (lab/labstate.py), with the ESP disk and the variables file beside the
overlay disk: later starts of a host of that shape are restored from it in seconds. The conversion costs about
five minutes of a core under emulation, once per machine and image.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

from labconfig import CACHE, LabError, log, run

BOOTS = ("bios", "uefi")
FIRMWARE_DIR = os.environ.get("GPUOPS_LAB_OVMF_DIR") or "/usr/share/OVMF"
FIRMWARE_CODE = "OVMF_CODE_4M.fd"
FIRMWARE_VARS = "OVMF_VARS_4M.fd"
ESP_MB = 256
# The GPT type of an EFI system partition.
ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
# What the guest installs from Debian's packages (downloaded once on the controller into the lab's cache; the image
# has every dependency but these).
GUEST_PACKAGES = ("dosfstools", "dracut-core", "dracut", "kpartx", "systemd-boot-efi", "systemd-boot")
GUEST_DEBS = os.path.join(CACHE, "uefi-debs")
GUEST_DIR = "/var/tmp/gpulab-uefi"
# The guest's dracut configuration: an image for this host only, as RHEL's dracut builds by default, gzip at its
# quickest, and without the dracut modules a lab guest's boot does not use. Measured 2026-11-29 under emulation, one
# image of the image's kernel: Debian's default (a generic image) 6 min; hostonly with gzip -1 103 s (20 MB); with
# the modules below left out 63 s (17.5 MB). Leaving out systemd's modules makes the initramfs run dracut's own init
# instead of systemd (RHEL's runs systemd): what the collection puts in (/etc/modprobe.d files, force_drivers) goes
# in through dracut's kernel-modules module either way. Not stripping binaries (--nostrip) saved nothing.
DRACUT_CONF = """# The lab's dracut settings (lab/labuefi.py): an image for this host only, as RHEL's default, gzip at its quickest,
# without the modules a lab guest's boot does not use.
hostonly="yes"
compress="gzip -1"
omit_dracutmodules+=" systemd systemd-initrd dracut-systemd terminfo virtiofs overlay-root shutdown usrmount "
omit_dracutmodules+=" kernel-modules-extra qemu "
"""


def boot_of(settings, host):
    """The boot path of a host from its gpulab_boot setting: "bios" (grub and initramfs-tools, the default) or
    "uefi" (OVMF, systemd-boot, kernel-install and dracut)."""
    value = settings.get("gpulab_boot", "bios")
    if value not in BOOTS:
        raise LabError("%s: gpulab_boot %r is not a boot path of the lab; expected one of: %s"
                       % (host, value, ", ".join(BOOTS)))
    return value


def firmware():
    """The OVMF code and variables templates on the controller: (code, vars)."""
    code, template = (os.path.join(FIRMWARE_DIR, name) for name in (FIRMWARE_CODE, FIRMWARE_VARS))
    missing = [path for path in (code, template) if not os.path.isfile(path)]
    if missing:
        raise LabError("a lab host with gpulab_boot: uefi needs the UEFI firmware %s: run `make hostdeps` (as root it "
                       "installs Debian's ovmf package) or install ovmf" % ", ".join(missing))
    return code, template


def firmware_digest(code):
    """What identifies the firmware in a saved boot's key: its file's name and a digest of its content."""
    with open(code, "rb") as handle:
        return "%s@%s" % (os.path.basename(code), hashlib.sha256(handle.read()).hexdigest()[:16])


def firmware_args(code, variables):
    """QEMU's flash drives: the firmware's code (read-only) and the host's own copy of its variables."""
    return ["-drive", "if=pflash,format=raw,unit=0,readonly=on,file=%s" % code,
            "-drive", "if=pflash,format=raw,unit=1,file=%s" % variables]


def esp_args(path, bootindex=None):
    """The ESP disk on the q35 machine's own SATA controller (no PCI slot of the layout), first to boot when
    `bootindex` is given."""
    device = "ide-hd,drive=esp0,bus=ide.0"
    if bootindex is not None:
        device += ",bootindex=%d" % bootindex
    return ["-drive", "file=%s,if=none,id=esp0,format=qcow2" % path, "-device", device]


def shape_args():
    """The arguments a converted host adds to its machine, as its saved boot's key sees them (no host's paths), and
    what the conversion did (a changed script or package set makes another saved boot)."""
    code, _template = firmware()
    conversion = hashlib.sha256(conversion_script(["%s_.deb" % name for name in GUEST_PACKAGES]).encode())
    return (firmware_args(firmware_digest(code), "vars") + esp_args("esp", bootindex=0)
            + ["conversion@" + conversion.hexdigest()[:16]])


def new_esp(path):
    """An empty ESP disk at `path` (qcow2): a GPT with one EFI system partition over the whole disk, formatted by the
    guest (the controller has sfdisk, the guest has mkfs.vfat once dosfstools is in)."""
    raw = path + ".raw"
    with open(raw, "wb") as handle:
        handle.truncate(ESP_MB * 1024 * 1024)
    try:
        run(["sfdisk", "--quiet", raw], timeout=60, input_text="label: gpt\nstart=2048, type=%s, name=ESP\n" % ESP_TYPE)
        run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", raw, path + ".tmp"], timeout=120)
        os.replace(path + ".tmp", path)
    finally:
        for name in (raw, path + ".tmp"):
            if os.path.exists(name):
                os.unlink(name)


def new_variables(path):
    """A fresh copy of the firmware's variables template for one host."""
    shutil.copyfile(firmware()[1], path + ".tmp")
    os.replace(path + ".tmp", path)


def guest_debs():
    """The .deb files the guest installs, downloaded once with apt-get into the lab's cache (a cached one is used as
    it is, as with the kernel package). Their paths, in install order."""
    os.makedirs(GUEST_DEBS, exist_ok=True)
    found = {}
    for name in os.listdir(GUEST_DEBS):
        if name.endswith(".deb"):
            found.setdefault(name.split("_")[0], os.path.join(GUEST_DEBS, name))
    missing = [package for package in GUEST_PACKAGES if package not in found]
    if missing:
        if not shutil.which("apt-get"):
            raise LabError("%s are not cached in %s and apt-get is missing to download them"
                           % (", ".join(missing), GUEST_DEBS))
        log("downloading %s (the boot path of a gpulab_boot: uefi host)" % ", ".join(missing))
        proc = subprocess.run(["apt-get", "download"] + missing, cwd=GUEST_DEBS, timeout=1200,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
        if proc.returncode != 0:
            raise LabError("apt-get download %s failed: %s" % (" ".join(missing), proc.stderr.strip()))
        return guest_debs()
    return [found[package] for package in GUEST_PACKAGES]


def conversion_script(debs):
    """The guest's part of the conversion (run as root over SSH once the debs are in GUEST_DIR)."""
    names = [os.path.basename(path) for path in debs]
    first = " ".join("./" + n for n in names if n.split("_")[0] in ("dosfstools", "dracut-core", "dracut", "kpartx"))
    second = " ".join("./" + n for n in names if n.split("_")[0] in ("systemd-boot-efi", "systemd-boot"))
    return r"""set -eu
exec 2>&1
cd {guest_dir}
export DEBIAN_FRONTEND=noninteractive
apt_install() {{ apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-unsafe-io "$@"; }}
esp=$(for d in /sys/block/sd*; do [ -e "$d/${{d##*/}}1" ] && echo "/dev/${{d##*/}}1"; done | head -n1)
[ -n "$esp" ] || {{ echo "no ESP partition on a SATA disk"; exit 1; }}
# The kernel arguments grub gave this boot, without grub's own: what kernel-install puts into every entry.
sed -e 's/^BOOT_IMAGE=[^ ]* //' /proc/cmdline > /etc/kernel/cmdline
# Entries under the ESP's debian/ directory whatever the host's machine id (the image has none; each host makes its
# own), and the Boot Loader Specification layout.
echo debian > /etc/kernel/entry-token
echo layout=bls > /etc/kernel/install.conf
mkdir -p /etc/dracut.conf.d
cat > /etc/dracut.conf.d/50-gpulab.conf <<'EOF'
{dracut_conf}EOF
# dracut replaces initramfs-tools and builds this kernel's image (its trigger, at the end of the install).
apt_install {first}
mkfs.vfat -F 32 -n ESP "$esp" >/dev/null
mkdir -p /boot/efi
# Not checked at boot, as the image's root is not (fsck.vfat of the ESP took 30 s of each boot on a quiet machine and
# 3 min beside the tier's work, 2026-11-29); a RHEL host's fstab has 0 2 here.
echo "UUID=$(blkid -s UUID -o value "$esp") /boot/efi vfat umask=0077,noatime 0 0" >> /etc/fstab
mount /boot/efi
# kernel-install runs depmod for the kernel at each call (its 50-depmod plugin), about 25 s of an emulated guest
# each; the kernel packages run it themselves. The lab masks the plugin (a host outside the lab keeps it).
mkdir -p /etc/kernel/install.d
ln -sf /dev/null /etc/kernel/install.d/50-depmod.install
# systemd-boot installs itself on the mounted ESP and writes an entry for each kernel with kernel-install.
apt_install {second}
apt-get purge -y -q grub-pc grub-pc-bin grub2-common grub-common initramfs-tools initramfs-tools-core >/dev/null
kernel=$(uname -r)
entry=/boot/efi/loader/entries/debian-$kernel.conf
fail() {{ echo "conversion check failed: $*"; ls -R /boot/efi; exit 1; }}
[ -s "$entry" ] || fail "no entry $entry"
grep -q '^options.* intel_iommu=off' "$entry" || fail "$entry lacks the image's intel_iommu=off: $(cat "$entry")"
initrd=/boot/efi$(sed -n 's/^initrd[[:space:]]*//p' "$entry" | head -n1)
cmp -s /boot/initrd.img-$kernel "$initrd" || fail "the ESP's initrd $initrd is not /boot's dracut image"
lsinitrd /boot/initrd.img-$kernel >/dev/null 2>&1 || fail "/boot/initrd.img-$kernel is not a dracut image"
cd /
rm -rf {guest_dir}
sync
echo "=== converted: $(bootctl --no-pager list 2>/dev/null | grep -c 'type: Boot Loader Specification') BLS entries"
""".format(guest_dir=GUEST_DIR, dracut_conf=DRACUT_CONF, first=first, second=second)


def convert(vm, port, ssh_cmd, timeout=1800):
    """Convert the guest on `port` (a cold BIOS boot of the base image with an empty ESP disk): copy the debs in,
    run the conversion, power it off. Raises LabError with the guest's output when a step fails."""
    debs = guest_debs()
    tar = subprocess.Popen(["tar", "-C", GUEST_DEBS, "-c"] + [os.path.basename(p) for p in debs],  # pylint: disable=consider-using-with
                           stdout=subprocess.PIPE)
    try:
        copy = subprocess.run(ssh_cmd(port, "mkdir -p %s && tar -C %s -x" % (GUEST_DIR, GUEST_DIR)), stdin=tar.stdout,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, check=False)
    finally:
        tar.stdout.close()
        tar.wait(timeout=60)
    if copy.returncode != 0 or tar.returncode != 0:
        raise LabError("%s: copying the boot path's packages in failed: %s" % (vm.name, copy.stdout.strip()[-500:]))
    proc = subprocess.run(ssh_cmd(port, "bash -s"), input=conversion_script(debs), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)
    log_path = os.path.join(vm.dir, "uefi-conversion.log")
    with open(log_path, "w", encoding="utf-8") as handle:
        handle.write(proc.stdout)
    if proc.returncode != 0:
        raise LabError("%s: the conversion to systemd-boot and dracut failed (rc=%d; the whole output is in %s):\n%s"
                       % (vm.name, proc.returncode, log_path, "\n".join(proc.stdout.strip().splitlines()[-25:])))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("=== converted")]
    log("%s: %s" % (vm.name, lines[-1][4:] if lines else "converted"))
    subprocess.run(ssh_cmd(port, "systemctl poweroff"), timeout=120, check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
