# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""labreboot: a host's reboot follower, which starts the host again when its guest reboots.

Each host's QEMU runs with -action reboot=shutdown, so a guest's restart ends it; the follower (`gpulab
follow-reboots HOST`, started with the host by Vm.launch) waits on the host's event monitor and then starts a
new QEMU on the same port: a cold start.
"""

from __future__ import annotations

import os
import time

from labconfig import BOOT_TIMEOUT, STATE, LabError, locked, log
from labhost import choose_accel
from labimage import image_manifest
from labnet import ANSWER_TIMEOUT, NoAnswer, console_size, ssh_key, wait_ssh


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
        port = vm.meta().get("ssh_port")
        log("%s: the guest rebooted; started again (ssh port %s)" % (vm.name, port))
    answered_or_restarted(vm, port, meta.get("accel") or choose_accel())
    return reason


def answered_or_restarted(vm, port, accel, timeout=None):
    """After the restart: wait until SSH answers, as `gpulab start` does. A guest that booted and does not answer
    is started once more, cold, on the same port, with what it says on its rescue port in the log: seen 2026-12-01
    on lab-container after a preparation's reboot, systemd-networkd's DHCP client failed with "Device or resource
    busy" while udev renamed eth0 beside it, so the host had no address and the play's reboot task waited its
    1800 s out. A QEMU that ends meanwhile (another reboot, a stop) is left to its own follower or to the lab.
    True when SSH answered (after the one restart or not)."""
    if not port:
        return False
    try:
        wait_ssh(vm, port, timeout or BOOT_TIMEOUT, answer_timeout=ANSWER_TIMEOUT)
        return True
    except NoAnswer as exc:
        console_from = restart_cold(vm, exc, image_manifest(), accel, ssh_key()[1], port=port)
    except LabError as exc:
        log("%s: not waiting for SSH after the restart: %s" % (vm.name, str(exc).splitlines()[0]))
        return False
    if console_from is None:
        return False  # another command started the host again meanwhile
    try:
        wait_ssh(vm, port, timeout or BOOT_TIMEOUT, answer_timeout=ANSWER_TIMEOUT, console_from=console_from)
        log("%s: ssh up after the restart" % vm.name)
        return True
    except LabError as exc:
        log("%s: after a cold restart too: %s" % (vm.name, str(exc).splitlines()[0]))
        return False


def restart_cold(vm, exc, manifest, accel, pub, port=None):
    """A guest that booted and does not answer SSH (`exc`, a NoAnswer): what it says on its rescue port is logged and
    kept, then it is started once more, cold, on the same port (`gpulab start` and the reboot follower both do
    this). With `port`, nothing is done when the host's port is another by then (another command started it).
    The console's size before the start (where wait_ssh reads on from), or None when nothing was done."""
    report = vm.rescue_report()
    log("%s; what the guest says on its rescue port (kept in %s):\n%s\n%s: restarting it once (a cold start, "
        "same port)" % (exc, vm.rescue_log, "\n".join("  " + line for line in report.splitlines()[:60]), vm.name))
    with locked(os.path.join(STATE, "lab.lock")):
        if port is not None and vm.meta().get("ssh_port") != port:
            return None
        vm.kill()
        console_from = console_size(vm)
        vm.launch(manifest, accel, pub, rebooting=True)  # every device on its command line: nothing to finish
    return console_from
