#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vfio_probe
short_description: Prove that a VMM can take each GPU, vGPU and mediated device handed to VMs
version_added: 1.0.0
description:
  - For every device that the host hands to VMs, makes the kernel calls a VMM (QEMU under libvirt or
    KubeVirt's virt-launcher) makes to take it, and undoes them at once, so C(ready) is shown rather than
    inferred from sysfs.
  - The devices are the selected PCI functions bound to a VFIO driver (passthrough), the NVIDIA vendor-specific
    vGPUs (a VF with a non-zero C(nvidia/current_vgpu_type)) among the selected functions and their VFs, and
    the mediated devices whose parent is one of them (see O(mdevs)).
  - The legacy path opens C(/dev/vfio/vfio), checks the API version and the Type1v2 extension, opens
    C(/dev/vfio/<group>), reads the group status (viable), sets the container and the Type1v2 IOMMU, gets the
    device by name and reads its region and interrupt counts.
  - The iommufd path, where the kernel has C(/dev/iommu) and the device a C(/dev/vfio/devices/vfioN) node
    (kernel 6.6 or later), allocates an IOAS, binds the device and attaches it, then reads the same device
    information. RV(backends) says which paths worked, and the DRA driver's setting that follows
    (C(PreferIommuFD) or C(LegacyOnly)).
  - Reports whether interrupts are remapped and whether C(vfio_iommu_type1.allow_unsafe_interrupts) is on;
    that parameter is never set.
  - A device whose VFIO nodes a process holds open is never opened; it is reported busy with the holders'
    process ids and command lines.
  - Changes nothing on the host. Opening a free device makes its VFIO driver enable and reset it, as each VM
    start does; every descriptor is closed before the next device.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  mdevs:
    description:
      - Which mediated devices to probe.
      - C(selected) probes those whose parent is a selected function or one of its VFs; C(all) probes every
        mediated device of the host (parents that are not PCI functions, such as the kernel's C(mtty) sample,
        included); C(none) probes none.
    type: str
    choices: [selected, all, none]
    default: selected
  fail_on_problem:
    description:
      - Fail when a probed device fails, naming each device and why. With V(false) the report is returned and
        RV(all_ok) tells.
    type: bool
    default: true
  require_devices:
    description:
      - Fail when no device at all is handed to VMs (nothing to probe).
    type: bool
    default: false
notes:
  - O(addresses), O(include_all) and the O(vendors)/O(classes) selectors are mutually exclusive.
  - Needs root (the VFIO nodes are root's).
  - A device busy because a VM uses it counts as a problem only for RV(all_ok); RV(devices) says which.
extends_documentation_fragment:
  - gpuops.sandbox.pci_selectors
  - gpuops.sandbox.pci_selectors.include_all
  - gpuops.sandbox.attributes
attributes:
  diff_mode:
    support: none
seealso:
  - module: gpuops.sandbox.iommu_check
  - module: gpuops.sandbox.vfio_bind
  - module: gpuops.sandbox.mdev_create
"""

EXAMPLES = r"""
- name: Prove that the GPUs bound to vfio-pci can be taken by a VMM
  gpuops.sandbox.vfio_probe:

- name: Probe every mediated device, report without failing
  gpuops.sandbox.vfio_probe:
    mdevs: all
    fail_on_problem: false
  register: probe

- name: Show the DRA driver's VFIO backend setting that works here
  ansible.builtin.debug:
    msg: "{{ probe.backends.dra_setting }}"
"""

RETURN = r"""
devices:
  description: One report per probed device, sorted by name.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: PCI address, or the UUID of a mediated device.
      type: str
      sample: "0000:65:00.0"
    type:
      description: C(pci) (a function on a VFIO driver), C(vgpu) (a vendor-specific vGPU VF) or C(mdev).
      type: str
      sample: pci
    parent:
      description: The parent of a mediated device or the PF of a VF; null otherwise.
      type: str
      sample: null
    group:
      description: IOMMU group number, or null.
      type: int
      sample: 12
    cdevs:
      description: The device's iommufd character devices.
      type: list
      elements: str
      sample: []
    ok:
      description: Whether at least one VFIO path took the device.
      type: bool
      sample: true
    problem_kind:
      description: >-
        Null when ok, else one of C(busy), C(no-iommu), C(no-vfio), C(no-type1v2), C(no-group-node),
        C(not-viable), C(interrupt-remapping), C(no-device), C(api), C(error).
      type: str
      sample: null
    problem:
      description: Why the device cannot be taken, naming holders, group members or the failed call; null when ok.
      type: str
      sample: null
    holders:
      description: Processes holding the device's VFIO nodes, each with C(pid), C(comm), C(cmdline), C(device).
      type: list
      elements: dict
      sample: []
    legacy:
      description: >-
        The legacy path's result, C(ok) with C(regions), C(irqs), C(flags), C(pci), C(reset) on success, or
        C(kind), C(step) and C(reason).
      type: dict
      sample: {ok: true, regions: 9, irqs: 5, flags: 3, pci: true, reset: true}
    iommufd:
      description: The iommufd path's result, shaped as RV(devices[].legacy); C(kind) is C(unavailable) when
        the kernel or the device has no such path.
      type: dict
      sample: {ok: false, kind: unavailable, step: open /dev/iommu, reason: "no /dev/iommu"}
not_probed:
  description:
    - Selected functions not handed to VMs themselves, with C(address), C(driver) and C(reason).
    - Not named C(skipped), which Ansible reads as the task having been skipped.
  returned: always
  type: list
  elements: dict
  sample: [{address: "0000:65:00.0", driver: nvidia, reason: "on nvidia, not a VFIO driver"}]
backends:
  description: >-
    C(legacy) and C(iommufd), true when that path took every probed device that is not busy, and
    C(dra_setting), C(PreferIommuFD), C(LegacyOnly) or null.
  returned: always
  type: dict
  sample: {legacy: true, iommufd: false, dra_setting: LegacyOnly}
interrupts:
  description: >-
    C(remapping) (interrupt remapping on, from C(/proc/interrupts); null when unreadable) and
    C(allow_unsafe_interrupts) (the vfio_iommu_type1 parameter; null when the module is not loaded).
  returned: always
  type: dict
  sample: {remapping: true, allow_unsafe_interrupts: false}
warnings_list:
  description: Conditions that weaken isolation without stopping the probe (unsafe interrupts allowed).
  returned: always
  type: list
  elements: str
  sample: []
all_ok:
  description: Whether every probed device passed.
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError, create_module, run_module
from ansible_collections.gpuops.sandbox.plugins.module_utils._pci import (
    SELECTION_ARGUMENT_SPEC,
    SELECTION_MUTUALLY_EXCLUSIVE,
    read_identity,
    select_from_params,
    sriov_info,
    vgpu_info,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import SysfsError, host_path, pci_device_dir
from ansible_collections.gpuops.sandbox.plugins.module_utils._mdev import MDEV_DEVICES, list_mdev_devices
from ansible_collections.gpuops.sandbox.plugins.module_utils._vfio import is_vfio_driver
from ansible_collections.gpuops.sandbox.plugins.module_utils._vfio_probe import (
    Kernel,
    backends,
    device_target,
    interrupt_remapping,
    probe_device,
)

# Host root for everything this module reads. Only unit tests point it elsewhere.
ROOT = "/"


def build_module():
    return create_module(
        AnsibleModule,
        argument_spec=dict(
            **SELECTION_ARGUMENT_SPEC,
            mdevs=dict(type="str", choices=["selected", "all", "none"], default="selected"),
            fail_on_problem=dict(type="bool", default=True),
            require_devices=dict(type="bool", default=False),
        ),
        mutually_exclusive=SELECTION_MUTUALLY_EXCLUSIVE,
        supports_check_mode=True,
    )


def find_targets(params, root="/"):
    """``(targets, not_probed)``: the devices handed to VMs among the selection, and the selected functions that
    are not handed to VMs themselves."""
    targets = {}
    not_probed = []
    functions = []
    for address in select_from_params(params, root):
        if address not in functions:
            functions.append(address)
        for vf in sriov_info(address, root)["virtfns"]:
            if vf not in functions:
                functions.append(vf)
    selected = set(select_from_params(params, root))
    for address in functions:
        ident = read_identity(address, root)
        devdir = pci_device_dir(address, root)
        physfn = sriov_info(address, root)["physfn"]
        vgpu = vgpu_info(address, root)
        if is_vfio_driver(ident["driver"]):
            targets[address] = device_target(address, "pci", devdir, {"driver": ident["driver"], "parent": physfn})
        elif vgpu is not None and vgpu["current_type"]:
            targets[address] = device_target(address, "vgpu", devdir, {"driver": ident["driver"], "parent": physfn,
                                                                       "vgpu_type": vgpu["current_type"]})
        elif address in selected:
            not_probed.append({"address": address, "driver": ident["driver"],
                               "reason": "on %s, not a VFIO driver" % (ident["driver"] or "no driver")})
    if params.get("mdevs") != "none":
        for uuid, mdev in sorted(list_mdev_devices(root).items()):
            if params.get("mdevs") == "all" or mdev["parent"] in functions:
                targets[uuid] = device_target(uuid, "mdev", host_path(root, "%s/%s" % (MDEV_DEVICES, uuid)),
                                              {"driver": None, "parent": mdev["parent"], "mdev_type": mdev["type_id"]})
    return [targets[name] for name in sorted(targets)], not_probed


def probe(module, root="/", kernel=None):
    """The module's body."""
    params = module.params
    kernel = kernel or Kernel(root)
    try:
        targets, not_probed = find_targets(params, root)
    except (SysfsError, OSError) as exc:
        raise GpuopsError("cannot list the devices to probe: %s" % exc) from exc
    reports = [probe_device(kernel, target, root) for target in targets]
    interrupts = interrupt_remapping(root)
    warnings = []
    if interrupts["allow_unsafe_interrupts"]:
        warnings.append("vfio_iommu_type1.allow_unsafe_interrupts is on: a VM's device can forge interrupts "
                        "(it is meant for platforms without interrupt remapping); this module never sets it")
    result = {
        "changed": False,
        "devices": reports,
        "not_probed": not_probed,
        "backends": backends(reports),
        "interrupts": interrupts,
        "warnings_list": warnings,
        "all_ok": all(r["ok"] for r in reports),
    }
    for warning in warnings:
        module.warn(warning)
    extra = dict((k, v) for k, v in result.items() if k != "changed")
    if params.get("require_devices") and not reports:
        raise GpuopsError("no device is handed to VMs: none of the selected functions (%s) is on a VFIO driver or "
                          "carries a vGPU, and no mediated device matched mdevs=%s"
                          % (", ".join(s["address"] for s in not_probed) or "none selected", params.get("mdevs")), **extra)
    failures = ["%s (%s): %s" % (r["name"], r["type"], r["problem"]) for r in reports if not r["ok"]]
    if failures and params.get("fail_on_problem"):
        raise GpuopsError("a VMM could not take %d device(s): %s" % (len(failures), "; ".join(failures)), **extra)
    return result


def main():
    run_module(build_module, probe, root=ROOT)


if __name__ == "__main__":
    main()
