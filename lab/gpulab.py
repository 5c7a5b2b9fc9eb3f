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

Commands: image, start, stop, reset, status, ssh, info, inventory, kernel-package. Run with --help for details.

The parts live beside this script, which holds the commands: labconfig.py (settings, error, the inventory's
hosts), labhost.py (QEMU and the Vm class), labimage.py (the base image), labnet.py (SSH and the connection
inventory), labreboot.py (the reboot follower), labstate.py (the saved boots a pristine host starts from) and
labuefi.py (a host that boots the RHEL family's way: gpulab_boot: uefi, OVMF, systemd-boot, kernel-install, dracut).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time

# labcommon.py and gpulab's own modules lie beside this script: importable whether the script runs or is loaded
# from its path.
LAB_DIR = os.path.dirname(os.path.abspath(__file__))
if LAB_DIR not in sys.path:
    sys.path.insert(0, LAB_DIR)
from labcommon import Progress, add_command  # noqa: E402
# The modules themselves too, for whoever replaces one of their functions (the unit tests).
import labconfig  # noqa: E402
import labhost  # noqa: E402
import labimage  # noqa: E402
import labnet  # noqa: E402
import labreboot  # noqa: E402
import labuefi  # noqa: E402
from labconfig import (BOOT_TIMEOUT, CACHE, INVENTORY_CONNECTION, INVENTORY_DIR, INVENTORY_HOSTS, LAB,  # noqa: E402
                       PART_OFFSET, RECIPE_VERSION, SSH_USER, STATE, TOP, LabError, autostarts, image_path,
                       lab_host_settings, lab_hosts, locked, log, manifest_path, need_tools, select_hosts, tail_text)
from labhost import Vm, choose_accel, keep_priority, stand_in_devices  # noqa: E402
from labimage import ensure_image, image_manifest, image_problem, kernel_package  # noqa: E402
from labnet import (ANSWER_TIMEOUT, NoAnswer, close_master, ssh_cmd, ssh_key, wait_ssh,  # noqa: E402
                    write_inventory)
from labstate import SavedBootError  # noqa: E402
from labreboot import follow_reboots  # noqa: E402

# What this module offers besides its commands: the names the unit tests and other callers read from it.
__all__ = [
    "labconfig", "labhost", "labimage", "labnet", "labreboot",
    "BOOT_TIMEOUT", "CACHE", "INVENTORY_CONNECTION", "INVENTORY_DIR", "INVENTORY_HOSTS", "PART_OFFSET",
    "RECIPE_VERSION", "SSH_USER", "STATE", "TOP", "LabError", "autostarts", "image_path", "lab_host_settings",
    "lab_hosts", "manifest_path", "select_hosts",
    "Vm", "choose_accel", "keep_priority", "stand_in_devices",
    "ensure_image", "image_manifest", "image_problem",
    "ssh_cmd", "ssh_key", "wait_ssh", "write_inventory",
    "follow_reboots", "main",
]


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def cmd_image(args):
    need_tools("qemu-system-x86_64", "qemu-img")
    if args.verify:
        problem = image_problem()
        if problem:
            raise LabError("cached image is %s" % problem)
        if args.json:
            print(json.dumps({"image": image_path(), "manifest": manifest_path(), **image_manifest()}))
        else:
            log("cached image is valid (%s): %s" % (image_path(), json.dumps(image_manifest())))
        return
    started = time.time()
    manifest = ensure_image(rebuild=args.rebuild)
    log("image %s (kernel %s) ready in %.1fs" % (manifest["id"], manifest["kernel"], time.time() - started))


# A boot that came up short: the root file system left read-only or a file system of /etc/fstab not mounted (what a
# boot whose generators systemd killed at their 90-s limit looks like, lab/labimage.py). One line each.
BOOT_CHECK = ("findmnt -n -o OPTIONS / | grep -q '^ro' && echo 'the root file system is read-only'; "
              "for t in $(findmnt --fstab -n -o TARGET); do [ \"$t\" = / ] || mountpoint -q \"$t\" || "
              "echo \"$t of /etc/fstab is not mounted\"; done; true")


def boot_problem(port):
    """What is wrong with the boot answering on `port`, or None: a boot saved as its shape's boot is what every later
    pristine start of that shape is, so a boot that came up short is not saved."""
    try:
        proc = labconfig.run(ssh_cmd(port, BOOT_CHECK), timeout=300, check=False)
    except LabError as exc:
        return "its boot could not be checked: %s" % exc
    if proc.returncode != 0:
        return "its boot could not be checked (rc=%d): %s" % (proc.returncode, (proc.stderr or "").strip()[-200:])
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return ", ".join(lines) + " (systemd's generators ran past their limit?)" if lines else None


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
            t0 = time.time()
            port = vm.launch(manifest, accel, pub)
            plan = vm.pending
            log("%s: %s (%s, ssh on 127.0.0.1:%d)" % (
                name, "restored from its shape's saved boot in %.0fs" % (time.time() - t0)
                if plan is not None and plan.mode == "restore" else "booting", accel, port))
            booting.append((vm, port, t0))
    # SSH is awaited outside the lock, so other lab commands are not held up by a slow boot.
    errors = []

    def waiter(vm, port, t0):
        try:
            what = vm.name + (": booting" if t0 is not None else ": already running; waiting for SSH to answer")
            with Progress(LAB, what, status=lambda: tail_text(vm.serial, 1), say_done=False):
                if t0 is not None and vm.pending is not None and vm.pending.mode == "restore":
                    port = told_or_cold(vm, port)
                try:
                    wait_ssh(vm, port, args.timeout, answer_timeout=ANSWER_TIMEOUT)
                except NoAnswer as exc:
                    console_from = restart_once(vm, exc)
                    try:
                        wait_ssh(vm, port, args.timeout, answer_timeout=ANSWER_TIMEOUT, console_from=console_from)
                    except NoAnswer as again:
                        raise LabError("%s, after a cold restart too; what the guest says on its rescue port:\n%s"
                                       % (again, vm.rescue_report()))
            if t0 is not None:  # None: it was already running (maybe still booting for another command)
                vm.save_meta(boot_to_ssh=round(time.time() - t0, 1))
                log("%s: ssh up after %.0fs" % (vm.name, time.time() - t0))
                finish_pristine(vm, port)
        except LabError as exc:
            errors.append(str(exc))

    def told_or_cold(vm, port):
        """A host restored from a saved boot is given this lab's key and the time; one that does not take them is
        booted cold instead (its saved boot discarded). The port it answers on."""
        try:
            vm.tell_restored()
            return port
        except SavedBootError as exc:
            log("%s: %s; booting it cold instead" % (vm.name, exc))
            vm.pending.saved.discard(str(exc))
            with locked(os.path.join(STATE, "lab.lock")):
                vm.kill()
                vm.new_overlay(manifest)
                return vm.launch(manifest, accel, pub)

    def finish_pristine(vm, port):
        """What a pristine start does once the guest answers: save it as its shape's boot (a cold boot of a shape
        not saved yet), then hot-plug the SR-IOV stand-in held back for the save and wait until the guest's
        driver has it."""
        plan, vm.pending = vm.pending, None
        if vm.converting:
            convert(vm, port, plan)
        if plan is None:
            return
        if plan.mode == "save":
            problem = boot_problem(port)
            if problem:
                log("%s: not saved as the boot of its shape: %s; the next pristine start boots cold again"
                    % (vm.name, problem))
            else:
                vm.save_boot(plan, manifest, port, close_master)
        if plan.hotplug:
            started = time.time()
            address = vm.hotplug_sriov(plan)
            probe = ("for i in $(seq 600); do [ -e /sys/bus/pci/devices/{a}/driver ] && "
                     "[ -e /sys/bus/pci/devices/{a}/sriov_totalvfs ] && exit 0; sleep 1; done; exit 1").format(a=address)
            proc = labconfig.run(ssh_cmd(port, probe), timeout=900, check=False)
            if proc.returncode != 0:
                raise LabError("%s: the SR-IOV stand-in hot-plugged at %s did not appear with its driver in the "
                               "guest within 600s" % (vm.name, address))
            log("%s: SR-IOV stand-in hot-plugged at %s (%.0fs)" % (vm.name, address, time.time() - started))

    def convert(vm, port, plan):
        """A gpulab_boot: uefi host booted from the base image: converted (lab/labuefi.py), powered off and started
        again through OVMF on the same port, with the devices `plan` holds back. A conversion that fails leaves the
        host stopped, its overlay back to the pristine image, so the next start converts it again."""
        started = time.time()
        try:
            labuefi.convert(vm, port, ssh_cmd)
            close_master(port)
            deadline = time.time() + 300
            while vm.process_alive() and time.time() < deadline:
                time.sleep(1)
            if vm.process_alive():
                raise LabError("%s: did not power off within 300s after its conversion" % vm.name)
        except LabError:
            with locked(os.path.join(STATE, "lab.lock")):
                vm.kill()
                vm.new_overlay(manifest)
            raise
        vm.converting = False
        vm.save_meta(firmware="uefi")
        with locked(os.path.join(STATE, "lab.lock")):
            vm.kill()
            vm._launch(manifest, accel, pub, True, plan)  # pylint: disable=protected-access
        wait_ssh(vm, port, args.timeout, answer_timeout=ANSWER_TIMEOUT)
        vm.save_meta(boot_to_ssh=round(time.time() - started, 1))
        log("%s: converted to systemd-boot and dracut, and booted through OVMF, in %.0fs"
            % (vm.name, time.time() - started))

    def restart_once(vm, exc):
        """A guest that booted and does not answer: its report kept, then one cold start on the same port."""
        return labreboot.restart_cold(vm, exc, manifest, accel, pub)

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
            for path in (vm.disk, vm.meta_path) + vm.boot_files:
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


def cmd_kernel_package(_args):
    try:
        manifest = image_manifest()
    except (OSError, ValueError):
        manifest = {}
    if not manifest.get("kernel"):
        raise LabError("no lab image is built yet (its manifest names its kernel): run `gpulab image` first")
    # Its output is JSON that playbooks and tests parse: the log of a first call's download goes to stderr (on a fresh
    # machine "gpulab: downloading ..." on stdout failed the dra_switch scenario, 2026-11-29).
    labconfig.LAB.log_to = "stderr"
    print(json.dumps(kernel_package(manifest["kernel"])))


def cmd_inventory(_args):
    write_inventory(lab_hosts())
    log("wrote %s" % os.path.relpath(INVENTORY_CONNECTION, TOP))


def main(argv=None):
    parser, sub = LAB.parser(__doc__)
    p = add_command(sub, "image", cmd_image, "build the base image unless a valid one is cached")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when a valid image is cached")
    p.add_argument("--verify", action="store_true", help="only check the cached image")
    p.add_argument("--json", action="store_true", help="with --verify: the image's paths and manifest as JSON")
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
    add_command(sub, "kernel-package", cmd_kernel_package,
                "another kernel of the image's series as a .deb (cached), for the kernel-update test: JSON")
    add_command(sub, "inventory", cmd_inventory, "rewrite inventories/lab/zz-lab-connection.yml")
    add_command(sub, "follow-reboots", cmd_follow_reboots,
                "(started with each host) start the host again when its guest reboots").add_argument("host")
    return LAB.main(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
