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

from labconfig import STATE, locked, log
from labhost import choose_accel
from labimage import image_manifest
from labnet import ssh_key


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
