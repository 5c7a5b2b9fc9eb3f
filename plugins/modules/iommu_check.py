#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: iommu_check
short_description: Check that a host's IOMMU and the IOMMU groups of its GPUs are ready for passthrough
version_added: 1.0.0
description:
  - Reports, as data a play can branch on, the CPU virtualisation flag (C(vmx)/C(svm)), the IOMMU ACPI
    table of the firmware (C(DMAR) or C(IVRS)), whether the kernel enabled the IOMMU (IOMMU groups
    present), the IOMMU flags on the kernel command line, whether iommufd (C(/dev/iommu)) is available,
    and for each selected PCI function its IOMMU group, the group members with their drivers and
    whether the group is viable for passthrough, with the reasons when it is not.
  - A group is viable when every endpoint in it is bound to C(vfio-pci) (or a vfio-pci variant driver or
    C(pci-stub)) or has no driver; PCI bridges are exempt.
  - Optionally fails, saying which requirement is unmet and how to fix it.
  - Reads only; never changes anything.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  require_cpu_virtualization:
    description:
      - Fail unless the CPU shows hardware virtualisation (C(vmx) or C(svm) in C(/proc/cpuinfo)).
    type: bool
    default: false
  require_iommu:
    description:
      - Fail unless the IOMMU is enabled (C(/sys/kernel/iommu_groups) is not empty). The message says
        whether the firmware table is missing (BIOS/UEFI setting) or the kernel argument.
      - On Intel the advice is C(intel_iommu=on iommu=pt). On AMD the kernel enables AMD-Vi by default
        when the firmware provides the IVRS table (C(amd_iommu) has no C(on) value), so the advice is to
        enable the IOMMU in the BIOS/UEFI setup when the IVRS table is missing, to remove C(amd_iommu=off)
        or C(iommu=off) when present, and C(iommu=pt).
    type: bool
    default: false
  require_iommufd:
    description:
      - Fail unless C(/dev/iommu) exists.
    type: bool
    default: false
  require_viable:
    description:
      - Fail unless at least one function is selected and the IOMMU group of every selected function is
        viable; the message names each blocking function and its driver.
    type: bool
    default: false
notes:
  - O(addresses), O(include_all) and the O(vendors)/O(classes) selectors are mutually exclusive.
  - A flag on the kernel command line is reported but is not taken as proof; only IOMMU groups are.
extends_documentation_fragment:
  - gpuops.sandbox.pci_selectors
  - gpuops.sandbox.pci_selectors.include_all
  - gpuops.sandbox.attributes
attributes:
  diff_mode:
    support: none
seealso:
  - module: gpuops.sandbox.gpu_facts
"""

EXAMPLES = r"""
- name: Report the IOMMU state and the groups of the NVIDIA GPUs
  gpuops.sandbox.iommu_check:
  register: iommu

- name: Tell the operator what to change when the IOMMU is off
  ansible.builtin.debug:
    msg: "{{ iommu.iommu.problems | map(attribute='fix') | list }}"
  when: not iommu.iommu_enabled

- name: Stop unless the IOMMU is on and every GPU group can be passed through
  gpuops.sandbox.iommu_check:
    require_iommu: true
    require_viable: true

- name: Check two functions given by address
  gpuops.sandbox.iommu_check:
    addresses:
      - "0000:65:00.0"
      - "0000:65:00.1"
    require_viable: true
"""

RETURN = r"""
iommu_enabled:
  description: Whether the kernel enabled the IOMMU (C(/sys/kernel/iommu_groups) is not empty).
  returned: always
  type: bool
  sample: true
firmware_table:
  description: IOMMU ACPI table present, C(DMAR) (Intel VT-d) or C(IVRS) (AMD-Vi), or null.
  returned: always
  type: str
  sample: DMAR
cpu_virtualization:
  description: Whether the CPU shows hardware virtualisation (C(vmx) or C(svm)).
  returned: always
  type: bool
  sample: true
iommufd:
  description: Whether C(/dev/iommu) (iommufd) exists.
  returned: always
  type: bool
  sample: true
cmdline_flags:
  description: IOMMU-related kernel command line flags in force (C(intel_iommu), C(amd_iommu), C(iommu),
    C(iommu.passthrough) as strings, the last occurrence winning; C(vfio-pci.ids) as a list).
  returned: always
  type: dict
  sample:
    intel_iommu: "on"
    iommu: pt
    vfio-pci.ids: ["10de:2236", "10de:1aef"]
iommu:
  description: Full IOMMU state.
  returned: always
  type: dict
  contains:
    enabled:
      description: Same as RV(iommu_enabled).
      type: bool
      sample: true
    group_count:
      description: Number of IOMMU groups.
      type: int
      sample: 42
    firmware_tables:
      description: Every IOMMU ACPI table present.
      type: list
      elements: str
      sample: [DMAR]
    firmware_table:
      description: Same as RV(firmware_table).
      type: str
      sample: DMAR
    iommu_units:
      description: Entries of C(/sys/class/iommu).
      type: list
      elements: str
      sample: [dmar0]
    iommufd:
      description: Same as RV(iommufd).
      type: bool
      sample: true
    cmdline:
      description: The kernel command line.
      type: str
      sample: BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt
    cmdline_flags:
      description: Same as RV(cmdline_flags).
      type: dict
      sample: {intel_iommu: "on"}
    cpu_vendor:
      description: C(intel), C(amd) or null.
      type: str
      sample: intel
    cpu_vendor_id:
      description: C(vendor_id) of C(/proc/cpuinfo).
      type: str
      sample: GenuineIntel
    cpu_model:
      description: C(model name) of C(/proc/cpuinfo).
      type: str
      sample: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz
    cpu_virt_flag:
      description: C(vmx), C(svm) or null.
      type: str
      sample: vmx
    cpu_virtualization:
      description: Same as RV(cpu_virtualization).
      type: bool
      sample: true
    platform_vendor:
      description: C(intel) or C(amd) from the firmware table, else from the CPU; null when unknown.
      type: str
      sample: intel
    problems:
      description: What stops the IOMMU being usable, each with C(item) (C(cpu_virtualization),
        C(firmware_table) or C(iommu_groups)), C(reason) and C(fix) (the firmware setting and/or kernel
        arguments to change, never C(amd_iommu=on), which the kernel does not have); empty when usable.
      type: list
      elements: dict
      sample:
        - item: iommu_groups
          reason: "/sys/kernel/iommu_groups is empty: the kernel has not enabled the IOMMU"
          fix: add intel_iommu=on iommu=pt to the kernel command line and reboot
devices:
  description: One entry per selected PCI function, sorted by address.
  returned: always
  type: list
  elements: dict
  contains:
    address:
      description: PCI address.
      type: str
      sample: "0000:65:00.0"
    vendor:
      description: Vendor ID.
      type: str
      sample: "10de"
    device:
      description: Device ID.
      type: str
      sample: "2236"
    class:
      description: PCI class code (6 hex digits).
      type: str
      sample: "030200"
    driver:
      description: Driver the function is bound to, or null.
      type: str
      sample: vfio-pci
    iommu_group:
      description: IOMMU group number, or null when the IOMMU is off.
      type: int
      sample: 12
    members:
      description: Every member of the group with C(address), C(vendor), C(device), C(class), C(driver),
        C(is_bridge), C(pci).
      type: list
      elements: dict
      sample:
        - address: "0000:65:00.0"
          vendor: "10de"
          device: "2236"
          subsystem_vendor: "10de"
          subsystem_device: "1482"
          class: "030200"
          driver: vfio-pci
          is_bridge: false
          pci: true
    viable:
      description: Whether the group can be passed through now.
      type: bool
      sample: true
    blockers:
      description: Members stopping the group being viable, with C(address), C(driver), C(class), C(reason).
      type: list
      elements: dict
      sample:
        - address: "0000:65:00.1"
          driver: snd_hda_intel
          class: "040300"
          reason: 0000:65:00.1 (10de:1aef, class 040300) in IOMMU group 12 is bound to snd_hda_intel, not
            vfio-pci; bind it to vfio-pci (or unbind it) so the group is viable
all_viable:
  description: Whether at least one function is selected and every selected function's group is viable.
  returned: always
  type: bool
  sample: false
unmet:
  description: The requirements (C(require_*) options) that are not met; empty when the module succeeds.
  returned: always
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError, create_module, run_module
from ansible_collections.gpuops.sandbox.plugins.module_utils._pci import (
    SELECTION_ARGUMENT_SPEC,
    SELECTION_MUTUALLY_EXCLUSIVE,
    device_viability,
    read_identity,
    select_from_params,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._iommu import iommu_state

# Host root for everything this module reads. Only unit tests point it elsewhere.
ROOT = "/"


def build_module():
    """Create the AnsibleModule; the argument spec does the validation it can."""
    return create_module(
        AnsibleModule,
        argument_spec=dict(
            **SELECTION_ARGUMENT_SPEC,
            require_cpu_virtualization=dict(type="bool", default=False),
            require_iommu=dict(type="bool", default=False),
            require_iommufd=dict(type="bool", default=False),
            require_viable=dict(type="bool", default=False),
        ),
        mutually_exclusive=SELECTION_MUTUALLY_EXCLUSIVE,
        supports_check_mode=True,
    )


def check(params, root="/"):
    """Return ``(result, failures)``: the report and one message per unmet requirement."""
    state = iommu_state(root)
    selected = select_from_params(params, root)
    devices = []
    for address in selected:
        ident = read_identity(address, root)
        viability = device_viability(address, root)
        devices.append({
            "address": ident["address"],
            "vendor": ident["vendor"],
            "device": ident["device"],
            "class": ident["class"],
            "driver": ident["driver"],
            "iommu_group": viability["group"],
            "members": viability["members"],
            "viable": viability["viable"],
            "blockers": viability["blockers"],
        })
    result = {
        "iommu_enabled": state["enabled"],
        "firmware_table": state["firmware_table"],
        "cpu_virtualization": state["cpu_virtualization"],
        "iommufd": state["iommufd"],
        "cmdline_flags": state["cmdline_flags"],
        "iommu": state,
        "devices": devices,
        "all_viable": bool(devices) and all(dev["viable"] for dev in devices),
    }
    problems = {problem["item"]: problem for problem in state["problems"]}
    failures = []
    unmet = []
    if params.get("require_cpu_virtualization") and "cpu_virtualization" in problems:
        unmet.append("require_cpu_virtualization")
        problem = problems["cpu_virtualization"]
        failures.append("CPU virtualisation is required but %s; fix: %s" % (problem["reason"], problem["fix"]))
    if params.get("require_iommu") and not state["enabled"]:
        unmet.append("require_iommu")
        failures.append(_iommu_off_message(state, problems))
    if params.get("require_iommufd") and not state["iommufd"]:
        unmet.append("require_iommufd")
        failures.append("iommufd is required but /dev/iommu does not exist; fix: use a kernel with "
                        "CONFIG_IOMMUFD (6.2 or later) and load the iommufd module")
    if params.get("require_viable"):
        message = _viability_message(state, problems, devices)
        if message:
            unmet.append("require_viable")
            failures.append(message)
    result["unmet"] = unmet
    return result, failures


def _iommu_off_message(state, problems):
    parts = ["the IOMMU is required but not enabled: /sys/kernel/iommu_groups is empty"]
    if "firmware_table" in problems:
        parts.append("no DMAR/IVRS ACPI table was found, so first enable VT-d (Intel) or AMD-Vi/IOMMU "
                     "(AMD) in the BIOS/UEFI setup")
    else:
        parts.append("the firmware describes an IOMMU (%s table)" % state["firmware_table"])
    parts.append("fix: %s" % problems["iommu_groups"]["fix"])
    return "; ".join(parts)


def _viability_message(state, problems, devices):
    if not devices:
        return ("passthrough viability is required but no PCI function matched the selection; check the "
                "addresses, vendors and classes options")
    if not state["enabled"]:
        return ("passthrough viability is required but the IOMMU is not enabled, so no device has an "
                "IOMMU group (%s); fix: %s" % (", ".join(dev["address"] for dev in devices),
                                               problems["iommu_groups"]["fix"]))
    reasons = []
    for dev in devices:
        if dev["viable"]:
            continue
        if dev["iommu_group"] is None:
            reasons.append("%s has no IOMMU group" % dev["address"])
            continue
        reasons.append("IOMMU group %s of %s is not viable: %s" % (
            dev["iommu_group"], dev["address"], "; ".join(blocker["reason"] for blocker in dev["blockers"])))
    if not reasons:
        return None
    return ("passthrough viability is required but %s; fix: bind every listed function of the group "
            "(the GPU and its sibling functions such as HDMI audio) to vfio-pci, or unbind it"
            % " | ".join(reasons))


def report(module, root="/"):
    """The module's body: return the report, or raise GpuopsError naming the unmet requirements.

    The failure carries the whole report as result keys, so a play can still read it.
    """
    try:
        result, failures = check(module.params, root=root)
    except (OSError, ValueError) as exc:
        raise GpuopsError("cannot check the IOMMU state: %s" % exc) from exc
    if failures:
        raise GpuopsError(". ".join(failures), **result)
    result["changed"] = False
    return result


def main():
    run_module(build_module, report, root=ROOT)


if __name__ == "__main__":
    main()
