# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""labimage: the lab's base image: its checks against the cache manifest, and its build.

The image is a Debian 12 disk, debootstrapped, with the kernel's mtty sample driver built for its kernel and
the lab's configuration written into its root file system; one boot under QEMU installs grub on the disk with
the image's own tools. A manifest beside the image records the recipe, the size and a checksum of its head:
a missing, corrupt or outdated image is built again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time

from labcommon import Progress, utc_now
from labconfig import (BOOT_TIMEOUT, CACHE, DISK_SIZE, FINALISE_MARKER, IMAGE_CMDLINE, LAB, LAB_DIR, PACKAGES,
                       PART_OFFSET, RECIPE_VERSION, SUITE, LabError, image_path, locked, log, manifest_path,
                       need_tools, read_text, run, tail_text)
from labhost import choose_accel, qemu_base_cmd


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


# A distribution kernel package of the image's series: linux-image-<release>-<abi>-amd64.
KERNEL_PACKAGE_RE = re.compile(r"^linux-image-(\d+\.\d+\.\d+)-(\d+)-amd64$")


def pick_kernel_package(names, image_kernel):
    """Of the package names `names`, the kernel package another kernel ABI of the image's series than
    `image_kernel` (say 6.1.0-50-amd64) comes in: the highest ABI above the image's (a distribution's kernel
    update), else the highest below it; None when there is no other."""
    match = KERNEL_PACKAGE_RE.match("linux-image-" + image_kernel)
    if not match:
        raise LabError("the image's kernel %r is not a Debian kernel release of the form 6.1.0-50-amd64" % image_kernel)
    series, abi = match.group(1), int(match.group(2))
    others = sorted(int(m.group(2)) for m in map(KERNEL_PACKAGE_RE.match, names)
                    if m and m.group(1) == series and int(m.group(2)) != abi)
    above = [n for n in others if n > abi]
    pick = (above or others or [None])[-1]
    return None if pick is None else "linux-image-%s-%d-amd64" % (series, pick)


def kernel_package(image_kernel):
    """The .deb of another kernel of the image's series (see pick_kernel_package), for the lab's kernel-update
    test: {"package", "kernel", "deb"}. Downloaded once with apt-get into the cache; a cached one is used as it is,
    so a mirror that has moved on since does not change the test."""
    directory = os.path.join(CACHE, "kernels")
    os.makedirs(directory, exist_ok=True)
    cached = sorted(name for name in os.listdir(directory)
                    if name.endswith(".deb") and KERNEL_PACKAGE_RE.match(name.split("_")[0])
                    and name.split("_")[0] != "linux-image-" + image_kernel)
    if not cached:
        if not shutil.which("apt-get"):
            raise LabError("no kernel package is cached in %s and apt-get is missing to download one" % directory)
        proc = subprocess.run(["apt-cache", "pkgnames", "linux-image-"], timeout=300, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, check=False)
        package = pick_kernel_package(proc.stdout.split(), image_kernel)
        if package is None:
            raise LabError("the package lists name no kernel of the series of %s besides it (apt-cache pkgnames "
                           "linux-image-: %s); run apt-get update" % (image_kernel, proc.stderr.strip() or "none"))
        log("downloading %s (a kernel update for the lab's kernel-update test)" % package)
        proc = subprocess.run(["apt-get", "download", package], cwd=directory, timeout=1200,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
        if proc.returncode != 0:
            raise LabError("apt-get download %s failed: %s" % (package, proc.stderr.strip()))
        cached = sorted(name for name in os.listdir(directory) if name.startswith(package + "_"))
        if not cached:
            raise LabError("apt-get download %s left no .deb in %s" % (package, directory))
    name = cached[-1]
    package = name.split("_")[0]
    return {"package": package, "kernel": package[len("linux-image-"):], "deb": os.path.join(directory, name)}


def configure_rootfs(rootfs, kver, mtty_ko):
    """Write the lab's configuration into the debootstrapped tree."""
    write_file(rootfs, "/etc/hostname", "gpulab\n")
    write_file(rootfs, "/etc/hosts", "127.0.0.1 localhost\n127.0.1.1 gpulab\n")
    # No fsck of the root file system at boot (the last field 0): ext4's journal is replayed at mount all the same,
    # and systemd-fsck-root cost a boot about 3 s under emulation.
    write_file(rootfs, "/etc/fstab", "LABEL=gpulab-root / ext4 errors=remount-ro 0 0\n")
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
rm -f /etc/gpulab/finalise
sync
echo %s > /dev/ttyS0
systemctl poweroff
""" % FINALISE_MARKER, 0o755)
    # An initramfs with the modules this VM mounts its root with and no busybox (klibc's tools do): every later
    # rebuild (host preparation does them) and every boot is much quicker under emulation than with Debian's
    # MODULES=most (or dep, which walks sysfs for them on every rebuild). What the collection adds
    # (/usr/share/initramfs-tools/modules.d, /etc/modprobe.d) goes in as with any other setting. Built here in the
    # chroot, natively, not in the first boot under emulation (about 90 s of it), and that boot loads it too.
    conf = os.path.join(rootfs, "etc/initramfs-tools/initramfs.conf")
    with open(conf) as handle:
        text = handle.read()
    text = re.sub(r"(?m)^MODULES=.*$", "MODULES=list", text)
    text = re.sub(r"(?m)^BUSYBOX=.*$", "BUSYBOX=n", text)
    # gzip at its quickest: the image has no zstd (mkinitramfs fell back to gzip's default level with a warning).
    text = re.sub(r"(?m)^COMPRESS=.*$", "COMPRESS=gzip", text)
    text = re.sub(r"(?m)^#? *COMPRESSLEVEL=.*$", "", text) + "COMPRESSLEVEL=1\n"
    # Two of Debian's hooks add what a lab guest never uses at boot: fsck and its libraries (the root file system
    # is not checked, see /etc/fstab) and device-mapper's tools and rules (no LVM or dm devices). Each file a hook
    # adds costs the guest 0.5-2 s under emulation: the two were 22 s of an 81-s rebuild (2026-11-27). Diverted
    # out of the hooks directory through dpkg, so the packages stay whole.
    os.makedirs(os.path.join(rootfs, "usr/share/initramfs-tools/hooks-gpulab-off"), exist_ok=True)
    for hook in ("fsck", "dmsetup"):
        run(["chroot", rootfs, "dpkg-divert", "--local", "--rename", "--divert",
             "/usr/share/initramfs-tools/hooks-gpulab-off/%s" % hook, "--add",
             "/usr/share/initramfs-tools/hooks/%s" % hook], timeout=120)
    write_file(rootfs, "/etc/initramfs-tools/initramfs.conf", text)
    with open(os.path.join(rootfs, "etc/initramfs-tools/modules"), "a") as handle:
        handle.write("virtio_pci\nvirtio_blk\next4\n")
    # SSH into a lab guest: loopback only, the lab's key, root. Under emulation PAM's session modules (motd,
    # lastlog, limits...) and the post-quantum key exchange made a connection cost the guest about 8 s of CPU;
    # without them about 3 s (measured 2026-11-27). Every Ansible run on mitogen, every lab `ssh` and every
    # verifier connection pays it.
    write_file(rootfs, "/etc/ssh/sshd_config.d/gpulab.conf", """UsePAM no
PrintMotd no
PrintLastLog no
KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org
""")
    # The rescue port: when a host does not answer SSH, the lab asks on the second serial port (ttyS1, a socket
    # of the lab's: .lab/<host>/rescue.sock) and this answers with a fixed report of the services and the network
    # SSH needs. It reads requests only, runs no command it is sent, and waits in a blocked read when idle.
    # Two more fixed requests serve a host restored from a saved boot (lab/labstate.py), before SSH: `keys`
    # installs the key of the QEMU it now runs in (fw_cfg comes from the new QEMU's command line, the saved guest
    # holds the key of the lab that saved it), `clock SECONDS` sets the clock (the saved guest's clock stood still
    # since the save), SECONDS digits only.
    write_file(rootfs, "/usr/local/sbin/gpulab-rescue", """#!/bin/sh
exec 3<>/dev/ttyS1
stty -echo <&3 2>/dev/null || true
while IFS= read -r line <&3; do
  case "$line" in
    keys*)
      if /usr/local/sbin/gpulab-keys >/dev/null 2>&1; then echo "=== keys ok" >&3; else echo "=== keys failed" >&3; fi
      ;;
    'clock '*)
      secs=${line#clock }
      case "$secs" in
        ''|*[!0-9]*) echo "=== clock refused" >&3 ;;
        *) if date -u -s "@$secs" >/dev/null 2>&1; then echo "=== clock ok" >&3; else echo "=== clock failed" >&3; fi ;;
      esac
      ;;
    report*)
      {
        echo "=== gpulab-rescue: $(hostname) up $(cut -d' ' -f1 /proc/uptime)s, load $(cut -d' ' -f1-3 /proc/loadavg)"
        echo "--- systemctl list-jobs"; systemctl --no-pager list-jobs 2>&1 | head -20
        echo "--- systemctl status ssh systemd-networkd"
        systemctl --no-pager --lines=5 status ssh.service systemd-networkd.service 2>&1 | head -40
        echo "--- networkctl"; networkctl --no-pager 2>&1
        echo "--- ip addr"; ip addr 2>&1
        echo "--- listening TCP sockets"; ss -ltn 2>&1
        echo "--- journal (last 40 lines)"; journalctl --no-pager -n 40 2>&1
        echo "=== end"
      } >&3 2>&1
      ;;
  esac
done
""", 0o755)
    write_file(rootfs, "/etc/systemd/system/gpulab-rescue.service", """[Unit]
Description=Answer the lab's report requests on the second serial port (when SSH does not)
DefaultDependencies=no
After=local-fs.target
Conflicts=shutdown.target
Before=shutdown.target
# A QEMU without the second port (the image's build boot) fails the open: three tries, then it stays off.
StartLimitIntervalSec=120
StartLimitBurst=3

[Service]
ExecStart=/usr/local/sbin/gpulab-rescue
Restart=on-failure
RestartSec=5

[Install]
WantedBy=sysinit.target
""")
    write_file(rootfs, "/etc/systemd/system/gpulab-finalise.service", """[Unit]
Description=Finish the gpulab image: install grub on the disk
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
    run(["chroot", rootfs, "update-initramfs", "-u", "-k", kver], timeout=600, progress="update-initramfs in the image")
    run(["systemctl", "--root", rootfs, "enable", "systemd-networkd", "gpulab-keys.service",
         "gpulab-finalise.service", "gpulab-rescue.service"], timeout=120)
    # Services a lab host does not need; under software emulation each costs seconds of boot. The modprobe@
    # services load modules nothing in the lab uses (loop, drm, fuse, configfs, dm_mod, efi_pstore): 14.5 s of a
    # guest's CPU at every boot, with the FUSE control mount (systemd's own accounting, 2026-11-27).
    run(["systemctl", "--root", rootfs, "mask", "systemd-networkd-wait-online.service",
         "apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "e2scrub_reap.service",
         "fstrim.timer", "getty-static.service", "getty@tty1.service", "systemd-binfmt.service",
         "proc-sys-fs-binfmt_misc.automount", "man-db.timer", "dpkg-db-backup.timer",
         "modprobe@loop.service", "modprobe@drm.service", "modprobe@fuse.service", "modprobe@configfs.service",
         "modprobe@dm_mod.service", "modprobe@efi_pstore.service", "sys-fs-fuse-connections.mount",
         "sys-kernel-config.mount"], timeout=120)
    # systemd runs its generators side by side at each boot and kills them all after a fixed 90 s (not a setting).
    # On a starved emulated guest the thirteen of Debian's systemd ran past it: the fstab generator was killed half
    # done, / stayed read-only and /boot/efi unmounted (seen on the UEFI host beside the tier's other work,
    # 2026-11-29). The lab keeps fstab's, the serial console's and the debug one (systemd.mask= on the command
    # line); the others make nothing here (no encrypted, verity or integrity volumes, no SysV-only scripts, no
    # rc.local, no hibernation, no offline updates, no boot counting, no discoverable partitions to mount).
    for name in GENERATORS_MASKED:
        link = os.path.join(rootfs, "etc/systemd/system-generators", name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink("/dev/null", link)
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        path = os.path.join(rootfs, sub)
        for name in os.listdir(path):
            full = os.path.join(path, name)
            if os.path.isfile(full) and name != "lock":
                os.unlink(full)


# The generators of Debian 12's systemd a lab host does without (see configure_rootfs).
GENERATORS_MASKED = (
    "systemd-bless-boot-generator", "systemd-cryptsetup-generator", "systemd-gpt-auto-generator",
    "systemd-hibernate-resume-generator", "systemd-integritysetup-generator", "systemd-rc-local-generator",
    "systemd-run-generator", "systemd-system-update-generator", "systemd-sysv-generator",
    "systemd-veritysetup-generator")


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
