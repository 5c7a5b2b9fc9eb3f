#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: guest_attach_probe
short_description: Start a real guest with the given GPUs, functions and mediated devices passed through, and show what it sees
version_added: 1.0.0
description:
  - Starts one QEMU guest with each given PCI function (C(-device vfio-pci,host=<address>)) and mediated device
    (C(-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/<uuid>)) passed through, and reports, per device, what the
    guest saw at the place QEMU put it (guest address, vendor and device ids, class). This proves what
    M(gpuops.sandbox.vfio_probe) infers from the VFIO calls, that a VM can start with the device.
  - The guest is a q35 machine with nothing else (C(-nodefaults -display none)); each device goes to its own slot
    of the guest's root bus from C(00:08.0) on, in the order given (O(devices), then O(mdevs)).
  - QEMU runs once, as a command of the module (C(timeout --kill-after=10 <timeout> qemu-system-x86_64 ...)), and
    the module waits for it to exit.
  - With O(mode=paused), QEMU starts with C(-S), so no guest code runs, and with QMP on its standard input and
    output (C(-qmp stdio)). Its standard input is the three QMP commands C(qmp_capabilities), C(query-pci) and
    C(quit). QEMU answers them, in order, once it has realized the devices (opened the VFIO group, mapped the
    guest's memory for DMA, read the configuration space); the answer to C(query-pci) is the guest's PCI bus.
    Then QEMU exits.
  - With O(mode=boot), the guest boots a kernel and an initramfs. The defaults are the host's running kernel,
    C(/boot/vmlinuz-<release>), and a small initramfs, made in a private temporary directory from the host's
    static C(busybox), whose C(/init) mounts sysfs, prints one line per PCI function on the serial console and
    powers the guest off; QEMU then exits (C(-no-reboot)). The serial console is QEMU's standard output, which
    the module reads for those lines. Each line is C(GPUOPS-PCI <address> <vendor> <device> <class> [tty ports]),
    between C(GPUOPS-GUEST-BEGIN) and C(GPUOPS-GUEST-END). The tty ports are those of a serial function, such as
    the ports of the kernel's C(mtty) sample. An O(initrd) of your own must print the same lines and power off.
  - Before anything starts, each device is checked on the host. A PCI function must exist, be bound to a VFIO
    driver (C(vfio-pci) or a vendor C(*_vfio_pci) driver) and have an IOMMU group. A mediated device must exist
    and have an IOMMU group. A device whose VFIO nodes (C(/dev/vfio/<group>), C(/dev/vfio/devices/vfioN)) a process
    holds is busy; its holders are named by process id and command line. A device that fails these checks is
    never handed to QEMU.
  - When QEMU refuses a device (an IOMMU group that is not viable, a device it cannot reset, too little lockable
    memory, ...) its own error text is reported for that device.
  - Changes nothing persistent on the host. A QEMU still running at O(timeout) (one that hangs, or whose guest
    does not power off) is stopped by C(timeout) (coreutils) with SIGTERM, and SIGKILL 10 seconds later; nothing
    else stops it, so if the module's own process dies first, QEMU runs on until it exits or reaches O(timeout).
    The temporary directory is removed. Opening a device makes its VFIO driver enable and reset it, as each VM
    start does.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  devices:
    description:
      - PCI addresses (C(DDDD:BB:SS.F), or C(BB:SS.F) in domain 0000) of the functions to pass through. Each must be
        bound to a VFIO driver; every function of an IOMMU group must be on a VFIO driver (or have no driver) for
        QEMU to take any of them.
      - At least one device is needed in O(devices) or O(mdevs); 16 at most in all.
    type: list
    elements: str
    default: []
  mdevs:
    description:
      - UUIDs of mediated devices (C(/sys/bus/mdev/devices/<uuid>)) to pass through.
    type: list
    elements: str
    default: []
  mode:
    description:
      - V(paused) starts the guest paused and asks QEMU over QMP what its PCI bus holds (seconds, no guest code
        runs).
      - V(boot) boots a kernel and an initramfs and reads what the guest's kernel enumerated from its serial
        console (under software emulation this takes minutes).
    type: str
    choices: [paused, boot]
    default: paused
  qemu:
    description:
      - The QEMU binary, a path or a command name looked up on C(PATH).
      - By default the first of C(qemu-system-x86_64) on C(PATH) and C(/usr/libexec/qemu-kvm) (RHEL).
    type: str
  accel:
    description:
      - The accelerator. V(auto) uses V(kvm) when C(/dev/kvm) opens and creates a VM, else V(tcg) (software
        emulation). V(kvm) fails when KVM is not usable; nothing is started then.
    type: str
    choices: [auto, kvm, tcg]
    default: auto
  memory_mb:
    description:
      - The guest's memory in MiB, 32 to 65536. VFIO pins all of it on the host while QEMU runs.
      - Defaults to 64 with O(mode=paused) and 256 with O(mode=boot).
    type: int
  timeout:
    description:
      - Seconds, 1 to 3600, that QEMU may run, from its start until it has answered and quit (paused) or the guest
        has powered off (boot). A QEMU still running then is stopped (see the description). Each device the guest
        had not reported by then is reported with C(problem_kind=timeout); when the guest had already reported
        its devices, they are reported as seen and the module warns that QEMU did not exit.
    type: int
    default: 300
  kernel:
    description:
      - With O(mode=boot), the guest's kernel image on the host (an absolute path). Defaults to the running
        kernel's C(/boot/vmlinuz-<release>).
    type: str
  initrd:
    description:
      - With O(mode=boot), the guest's initramfs on the host (an absolute path). By default one is made in a
        private temporary directory from the host's static C(busybox) (Debian and Ubuntu package
        C(busybox-static)).
    type: str
  fail_on_problem:
    description:
      - Fail when a device was refused before the start or the guest did not see it, naming each device and why.
        A refused device then stops the run before QEMU starts.
      - With V(false), QEMU starts with the devices that passed the checks, the report is returned and RV(all_ok)
        tells.
    type: bool
    default: true
notes:
  - Needs root (the VFIO nodes are root's and VFIO pins the guest's memory), and C(timeout) (coreutils) on
    C(PATH).
  - Check mode runs the same probe, as M(gpuops.sandbox.vfio_probe) does; it changes nothing persistent on the
    host in either mode.
  - Under software emulation (no usable KVM, for example in a VM without nested virtualisation) O(mode=paused)
    still takes seconds; O(mode=boot) may take many minutes.
extends_documentation_fragment:
  - gpuops.sandbox.attributes
attributes:
  check_mode:
    details: Check mode starts the guest as well; the probe changes nothing persistent on the host.
  diff_mode:
    support: none
seealso:
  - module: gpuops.sandbox.vfio_probe
  - module: gpuops.sandbox.vfio_bind
  - module: gpuops.sandbox.mdev_create
"""

EXAMPLES = r"""
- name: Show that a paused guest gets the GPU and its audio function
  gpuops.sandbox.guest_attach_probe:
    devices: ["0000:65:00.0", "0000:65:00.1"]

- name: Boot a guest with a vGPU (mediated device) and report without failing
  gpuops.sandbox.guest_attach_probe:
    mdevs: ["4b20d080-1b54-4048-85b3-a6a62d165c01"]
    mode: boot
    timeout: 900
    fail_on_problem: false
  register: guest

- name: Show what the guest saw
  ansible.builtin.debug:
    msg: "{{ guest.devices | map(attribute='guest') | list }}"
"""

RETURN = r"""
devices:
  description: One report per given device, in the order given (O(devices), then O(mdevs)).
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The PCI address or the UUID of the mediated device.
      type: str
      sample: "0000:65:00.0"
    type:
      description: C(pci) or C(mdev).
      type: str
      sample: pci
    driver:
      description: The host driver of a PCI function; null for a mediated device.
      type: str
      sample: vfio-pci
    parent:
      description: The parent of a mediated device; null for a PCI function.
      type: str
      sample: null
    mdev_type:
      description: The type of a mediated device; null for a PCI function.
      type: str
      sample: null
    group:
      description: The IOMMU group number, or null.
      type: int
      sample: 12
    cdevs:
      description: The device's iommufd character devices.
      type: list
      elements: str
      sample: []
    holders:
      description: Processes holding the device's VFIO nodes, each with C(pid), C(comm), C(cmdline), C(device).
      type: list
      elements: dict
      sample: []
    seen:
      description: Whether the guest has the device.
      type: bool
      sample: true
    guest:
      description: >-
        What the guest saw, or null. C(address) (in the guest), C(vendor_id), C(device_id), C(class) (4 hex digits,
        class and subclass), and with O(mode=boot) C(ttys), the serial ports the guest's kernel made of it.
      type: dict
      sample: {address: "0000:00:08.0", vendor_id: "10de", device_id: "2236", class: "0302"}
    problem_kind:
      description: >-
        Null when seen, else one of C(wrong-driver), C(no-iommu), C(busy) (refused before the start), C(qemu)
        (QEMU refused it or did not start), C(not-seen), C(timeout).
      type: str
      sample: null
    problem:
      description: Why the guest does not have the device (QEMU's own error text for C(qemu)); null when seen.
      type: str
      sample: null
guest_functions:
  description: Every PCI function the guest saw (its own bridges included), shaped as RV(devices[].guest).
  returned: always
  type: list
  elements: dict
  sample: [{address: "0000:00:00.0", vendor_id: "8086", device_id: "29c0", class: "0600"}]
mode:
  description: The mode used.
  returned: always
  type: str
  sample: paused
qemu:
  description: The QEMU binary used.
  returned: always
  type: str
  sample: /usr/bin/qemu-system-x86_64
accel:
  description: The accelerator used, C(kvm) or C(tcg).
  returned: always
  type: str
  sample: kvm
accel_reason:
  description: Why that accelerator.
  returned: always
  type: str
  sample: /dev/kvm creates VMs
memory_mb:
  description: The guest's memory in MiB.
  returned: always
  type: int
  sample: 64
started:
  description: Whether QEMU was started (false when the checks refused every device, or any with O(fail_on_problem)).
  returned: always
  type: bool
  sample: true
seconds:
  description: Wall time from QEMU's start until it had exited; 0 when it was not started.
  returned: always
  type: float
  sample: 1.4
qemu_command:
  description: QEMU's argument list; null when it was not started.
  returned: always
  type: list
  elements: str
  sample: [/usr/bin/qemu-system-x86_64, -name, gpuops-guest-probe, -nodefaults]
qemu_rc:
  description: >-
    QEMU's exit status, or null when it was not started. When QEMU was stopped at O(timeout), C(timeout)'s:
    124 when QEMU ended on SIGTERM, 137 or -9 when it needed SIGKILL.
  returned: always
  type: int
  sample: 0
qemu_end:
  description: >-
    How QEMU ended, or null: C(quit) (exited after its answers, paused mode), C(poweroff) (exited after the
    guest's device list, boot mode), C(exited) (by itself before the guest ran, or the guest stopped early),
    C(killed) (stopped at O(timeout), with or without the guest's answer or list).
  returned: always
  type: str
  sample: quit
qemu_error:
  description: QEMU's own output when it exited with an error (e.g. C(group 12 is not viable)), else null.
  returned: always
  type: str
  sample: null
qemu_output:
  description: >-
    What QEMU printed on its standard error (its last 4000 characters): its messages and warnings, and a line
    saying when it was stopped at O(timeout); null when it was not started.
  returned: always
  type: str
  sample: ""
console_tail:
  description: With O(mode=boot), the last 40 lines of the guest's serial console (QEMU's standard output); else null.
  returned: always
  type: str
  sample: null
all_ok:
  description: Whether the guest saw every given device.
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import create_module, run_module
from ansible_collections.gpuops.sandbox.plugins.module_utils._guest_probe import (
    ACCELS,
    DEFAULT_TIMEOUT,
    MODES,
    prove,
)

# Host root for everything this module reads, and the kernel release whose image boots by default. Only unit
# tests change them.
ROOT = "/"
RELEASE = None


def build_module():
    return create_module(
        AnsibleModule,
        argument_spec=dict(
            devices=dict(type="list", elements="str", default=[]),
            mdevs=dict(type="list", elements="str", default=[]),
            mode=dict(type="str", choices=list(MODES), default="paused"),
            qemu=dict(type="str"),
            accel=dict(type="str", choices=list(ACCELS), default="auto"),
            memory_mb=dict(type="int"),
            timeout=dict(type="int", default=DEFAULT_TIMEOUT),
            kernel=dict(type="str"),
            initrd=dict(type="str"),
            fail_on_problem=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )


def probe(module, root="/", release=None):
    """The module's body."""
    return prove(module, root, release)


def main():
    run_module(build_module, probe, root=ROOT, release=RELEASE)


if __name__ == "__main__":
    main()
