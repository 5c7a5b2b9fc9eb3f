#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather facts about the GPUs (and other PCI functions) of a host from sysfs
version_added: 1.0.0
description:
  - Reads C(/sys/bus/pci/devices) and returns, for each selected PCI function, its vendor, device,
    subsystem and class IDs, the names from the host's C(pci.ids), the driver it is bound to and its
    C(driver_override), its NUMA node, whether it is the boot VGA device, its IOMMU group with every member
    of the group (each with its driver and C(driver_override)), whether
    the group is viable for passthrough, SR-IOV state, legacy mdev types and NVIDIA vendor-specific
    vGPU types.
  - Also returns a summary of the IOMMU state, every mdev parent device of the host, and C(gpu_facts_host) -
    the operating system, the running kernel, the live mediated devices, SR-IOV VF counts of the selected
    functions, which of this collection's boot files are on the host (what host preparation and workload
    type switches look at), and every installed kernel with what its initramfs or boot entries lack of this
    collection's settings.
  - By default selects NVIDIA (vendor C(10de)) display functions of class C(030000) (VGA) and
    C(030200) (3D controller).
  - Reads only; never changes anything.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  module_files:
    description:
      - The names of the sets of module files the host preparation writes with M(gpuops.sandbox.kernel_modules)
        (the stems of C(/etc/modprobe.d/<name>.conf) and C(/etc/modules-load.d/<name>.conf)); C(gpu_facts_host)
        finds them by these names (C(managed_files), and the files the C(kernels) compare initramfs images with).
      - The roles pass the names they give kernel_modules (C(gpuops_module_files)). A name is letters, digits, C(.),
        C(_) and C(-), starting with a letter or digit, at most 64 characters; the two names differ.
    type: dict
    suboptions:
      nouveau:
        description: The set that keeps nouveau off the GPUs.
        type: str
        default: gpuops-nouveau
      vfio:
        description: The set that loads the vfio modules early on a vm-passthrough node.
        type: str
        default: gpuops-vfio
notes:
  - O(addresses), O(include_all) and the O(vendors)/O(classes) selectors are mutually exclusive.
  - The sandbox resource name is what the NVIDIA KubeVirt GPU device plugin would derive from this
    host's C(pci.ids); the plugin uses its own copy, so the names a node advertises in
    C(status.allocatable) are authoritative once the plugin runs.
extends_documentation_fragment:
  - gpuops.sandbox.pci_selectors
  - gpuops.sandbox.pci_selectors.include_all
  - gpuops.sandbox.attributes
  - gpuops.sandbox.attributes.facts
attributes:
  diff_mode:
    support: none
seealso:
  - module: gpuops.sandbox.iommu_check
"""

EXAMPLES = r"""
- name: Gather facts about the NVIDIA GPUs
  gpuops.sandbox.gpu_facts:

- name: List the IOMMU group members of every NVIDIA GPU
  ansible.builtin.debug:
    msg: "{{ item.address }}: {{ item.iommu_group_members | map(attribute='address') | list }}"
  loop: "{{ ansible_facts.gpu_facts_gpus }}"

- name: Gather facts about two functions given by address
  gpuops.sandbox.gpu_facts:
    addresses:
      - "0000:65:00.0"
      - "0000:65:00.1"

- name: Gather facts about every A10 (10de:2236), whatever its class
  gpuops.sandbox.gpu_facts:
    vendors:
      - "10de:2236"
    classes: []

- name: Gather facts about every PCI function
  gpuops.sandbox.gpu_facts:
    include_all: true

- name: Gather facts about the NVIDIA GPUs of a host whose module files have names of their own
  gpuops.sandbox.gpu_facts:
    module_files:
      nouveau: acme-nouveau
      vfio: acme-vfio
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: complex
  contains:
    gpu_facts_gpus:
      description: One entry per selected PCI function, sorted by address.
      returned: success
      type: list
      elements: dict
      sample:
        - address: "0000:65:00.0"
          vendor: "10de"
          device: "2236"
          subsystem_vendor: "10de"
          subsystem_device: "1482"
          class: "030200"
          vendor_name: NVIDIA Corporation
          device_name: GA102GL [A10]
          subsystem_name: null
          class_name: 3D controller
          driver: nvidia
          driver_override: null
          mig_instances: 0
          is_bridge: false
          sysfs_path: /sys/devices/pci0000:64/0000:64:00.0/0000:65:00.0
          numa_node: 0
          boot_vga: false
          iommu_group: 12
          iommu_group_members:
            - address: "0000:65:00.0"
              vendor: "10de"
              device: "2236"
              subsystem_vendor: "10de"
              subsystem_device: "1482"
              class: "030200"
              driver: nvidia
              driver_override: null
              is_bridge: false
              pci: true
          viable: false
          blockers:
            - address: "0000:65:00.0"
              driver: nvidia
              class: "030200"
              reason: 0000:65:00.0 (10de:2236, class 030200) in IOMMU group 12 is bound to nvidia, not vfio-pci;
                bind it to vfio-pci (or unbind it) so the group is viable
          sriov_totalvfs: null
          sriov_numvfs: null
          physfn: null
          virtfns: []
          is_vf: false
          mdev_types: []
          vgpu: null
          sandbox_resource_name: nvidia.com/GA102GL_A10
      contains:
        address:
          description: PCI address, C(DDDD:BB:SS.F), lower case.
          type: str
          sample: "0000:65:00.0"
        vendor:
          description: Vendor ID, 4 lower-case hex digits.
          type: str
          sample: "10de"
        device:
          description: Device ID, 4 lower-case hex digits.
          type: str
          sample: "2236"
        subsystem_vendor:
          description: Subsystem vendor ID, or null when sysfs does not show one.
          type: str
          sample: "10de"
        subsystem_device:
          description: Subsystem device ID, or null when sysfs does not show one.
          type: str
          sample: "1482"
        class:
          description: PCI class code, 6 lower-case hex digits (class, subclass, programming interface).
          type: str
          sample: "030200"
        vendor_name:
          description: Vendor name from the host's pci.ids, or null.
          type: str
          sample: NVIDIA Corporation
        device_name:
          description: Device name from the host's pci.ids (looked up under its own vendor), or null.
          type: str
          sample: GA102GL [A10]
        subsystem_name:
          description: Subsystem name from the host's pci.ids, or null.
          type: str
          sample: null
        class_name:
          description: Most specific class name from the host's pci.ids, or null.
          type: str
          sample: 3D controller
        driver:
          description: Driver the function is bound to, or null when it has none.
          type: str
          sample: nvidia
        driver_override:
          description:
            - The function's C(driver_override) (the only driver the kernel will bind it to), or null when none is
              set. A function with C(driver_override=vfio-pci) and no driver stays without one until the override
              is cleared.
          type: str
        mig_instances:
          description:
            - How many MIG GPU instances exist on the GPU (the C(gi<N>) directories under
              C(/proc/driver/nvidia/capabilities/gpu<minor>/mig)), or null when the nvidia driver does not hold it.
              A GPU with instances is in MIG mode and cannot be handed to vfio-pci as it is.
          type: int
          sample: null
        is_bridge:
          description: Whether the function is a PCI bridge (class C(0604)).
          type: bool
          sample: false
        sysfs_path:
          description: Real sysfs directory of the function.
          type: str
          sample: /sys/devices/pci0000:64/0000:64:00.0/0000:65:00.0
        numa_node:
          description: NUMA node of the function (C(-1) when the platform does not say), or null.
          type: int
          sample: 0
        boot_vga:
          description: Whether the firmware used this function as the boot display.
          type: bool
          sample: false
        iommu_group:
          description: IOMMU group number, or null when the IOMMU is off.
          type: int
          sample: 12
        iommu_group_members:
          description: Every function in the IOMMU group (the function itself included) with its IDs, class,
            driver, C(driver_override) (null when none is set, and for a non-PCI member) and whether it is a bridge;
            C(pci) is false for a non-PCI member.
          type: list
          elements: dict
          sample: []
        viable:
          description: Whether the IOMMU group can be passed through now (every endpoint on vfio-pci or
            driverless; bridges exempt).
          type: bool
          sample: false
        blockers:
          description: What stops the group being viable, each with C(address), C(driver), C(class) and C(reason).
          type: list
          elements: dict
          sample: []
        sriov_totalvfs:
          description: Number of SR-IOV virtual functions the function supports, or null when it is not a PF.
          type: int
          sample: 20
        sriov_numvfs:
          description: Number of virtual functions currently enabled, or null when it is not a PF.
          type: int
          sample: 0
        physfn:
          description: Address of the physical function when this function is an SR-IOV VF, else null.
          type: str
          sample: null
        virtfns:
          description: Addresses of the enabled virtual functions, in VF index order.
          type: list
          elements: str
          sample: []
        is_vf:
          description: Whether the function is an SR-IOV virtual function.
          type: bool
          sample: false
        mdev_types:
          description: Legacy mediated device types the function offers, each with C(id), C(name),
            C(available_instances), C(device_api), C(description) and the sandbox device plugin
            C(resource_name).
          type: list
          elements: dict
          sample:
            - id: nvidia-692
              name: NVIDIA A100-4C
              available_instances: 1
              device_api: vfio-pci
              description: "num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=4096x2160, max_instance=10"
              resource_name: nvidia.com/NVIDIA_A100-4C
        vgpu:
          description: NVIDIA vendor-specific vGPU state (C(creatable_types) list of C(id)/C(name),
            C(current_type), 0 when none is created), or null when the function has no C(nvidia/) directory.
          type: dict
          sample:
            creatable_types:
              - id: 1155
                name: NVIDIA L40S-1B
            current_type: 0
        sandbox_resource_name:
          description: Resource name the NVIDIA sandbox device plugin would advertise for this device when
            bound to vfio-pci, from the pci.ids inside the plugin image the GPU Operator deploys (the collection's
            naming table), not the host's pci.ids, which names many GPUs otherwise; null for non-NVIDIA functions.
          type: str
          sample: nvidia.com/GA102GL_A10
    gpu_facts_iommu:
      description: Summary of the IOMMU state; the same keys as the output of M(gpuops.sandbox.iommu_check)'s
        C(iommu).
      returned: success
      type: dict
      sample:
        enabled: true
        group_count: 42
        firmware_tables: [DMAR]
        firmware_table: DMAR
        iommu_units: [dmar0, dmar1]
        iommufd: true
        cmdline: BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt
        cmdline_flags:
          intel_iommu: "on"
          iommu: pt
        cpu_vendor: intel
        cpu_vendor_id: GenuineIntel
        cpu_model: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz
        cpu_virt_flag: vmx
        cpu_virtualization: true
        platform_vendor: intel
        problems: []
    gpu_facts_mdev_parents:
      description: Every mdev parent in C(/sys/class/mdev_bus) with C(name), C(address) (null when not a PCI
        function), C(sysfs_path) and its C(types) (same keys as C(mdev_types)).
      returned: success
      type: list
      elements: dict
      sample:
        - name: mtty
          address: null
          sysfs_path: /sys/devices/virtual/mtty/mtty
          types:
            - id: mtty-1
              name: Single port serial
              available_instances: 24
              device_api: vfio-pci
              description: null
              resource_name: nvidia.com/Single_port_serial
    gpu_facts_pci_ids:
      description: Path of the pci.ids file the names come from, or null when the host has none.
      returned: success
      type: str
      sample: /usr/share/misc/pci.ids
    gpu_facts_host:
      description: The host around the GPUs.
      returned: success
      type: dict
      contains:
        os:
          description: From C(/etc/os-release) - C(id), C(id_like) (list), C(version_id), C(major), C(codename),
            C(pretty_name).
          type: dict
          sample: {"id": "debian", "id_like": [], "version_id": "12", "major": "12", "codename": "bookworm",
                   "pretty_name": "Debian GNU/Linux 12 (bookworm)"}
        kernel:
          description: The running kernel release.
          type: str
          sample: 6.1.0-50-amd64
        mdev_devices:
          description: Live mediated devices, each with C(uuid), C(parent) and C(type_id).
          type: list
          elements: dict
          sample: [{"uuid": "5f2a2b8e-3c2b-5a8f-9b55-3b8e0c1d2e3f", "parent": "mtty", "type_id": "mtty-1"}]
        managed_files:
          description:
            - This collection's boot files present on the host, by what they do - C(kernel_cmdline), C(nouveau),
              C(vfio_modules), C(vfio_rules), C(mdev_definitions), C(sriov_definitions); C(pending) lists the
              records of an initramfs or grub.cfg generation that a run cut short did not finish.
            - C(nouveau) and C(vfio_modules) are the files of the sets O(module_files) names.
          type: dict
          sample: {"nouveau": ["/etc/modprobe.d/gpuops-nouveau.conf"], "vfio_rules": []}
        sriov:
          description: C(numvfs) and C(totalvfs) of every SR-IOV capable function, by PCI address.
          type: dict
          sample: {"0000:01:00.0": {"numvfs": 4, "totalvfs": 4}}
        sriov_recorded:
          description: Physical functions whose VF count this collection sets again at boot.
          type: list
          elements: str
          sample: ["0000:01:00.0"]
        fingerprint:
          description:
            - SHA-256 over the boot settings a GPU node's preparation depends on - the running command line,
              kernel and GPU-related loaded modules, the content of the grub and kernel command line files,
              modprobe.d, modules-load.d, the initramfs configuration, this collection's udev rules,
              C(/etc/gpuops) and systemd units, the size and time of the running kernel's initramfs and
              of the boot loader configuration, and the installed kernels with their C(problems) (see C(kernels)).
              Any edit to one of them changes it.
          type: str
          sample: 9b1f0c3e5d2a4b6c8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d
        nvidia_driver:
          description:
            - Which NVIDIA driver serves the host. C(loaded) and C(version) from C(/sys/module/nvidia); C(host_module)
              the file of the nvidia module the running kernel's modules.dep lists (a driver installed on the host by
              the distribution, NVIDIA's installer or DKMS), or null. The file is known by the module's name, not its
              own, so it is C(nvidia.ko) (also C(.xz), C(.zst), C(.gz)), a file the modprobe configuration loads for C(nvidia)
              (C(install nvidia modprobe -i nvidia-current) or C(alias nvidia ...), as Debian's renamed
              C(nvidia-current.ko), C(nvidia-current-open.ko) and C(nvidia-tesla-535.ko) are loaded), or an
              uncompressed module whose C(.modinfo) says C(name=nvidia). C(source) is V(host) when there is such a file,
              V(operator) when the module is loaded without one and the GPU Operator's driver root
              C(/run/nvidia/driver) is there, V(other) when it is loaded from elsewhere, null with no NVIDIA driver.
          type: dict
          sample: {"loaded": true, "version": "580.159.04", "host_module": "updates/dkms/nvidia.ko.zst", "source": "host"}
        prepared:
          description:
            - What the host preparation recorded in C(/var/lib/gpuops/prepared.json) the last time it found the
              host ready, or null when there is no such record (or it cannot be read).
          type: dict
          sample: {"inputs": "5e1d...", "fingerprint": "9b1f...", "runtime": "0c7a...", "expected": {}}
        kernels:
          description:
            - Every installed kernel (a C(/lib/modules/<version>) directory with a C(/boot/vmlinuz-<version>)), by
              version, and what it lacks of this collection's boot settings - so a kernel the distribution installed
              after the preparation is seen before the host boots into it.
            - C(version); C(running) (the running kernel); C(initramfs), the path of its image
              (C(/boot/initrd.img-<version>) or C(/boot/initramfs-<version>.img)) or null; C(initramfs_stale), true
              when it has none or the image is older than one of this collection's files an initramfs carries
              (C(gpuops-*) and the files of the sets O(module_files) names in C(/etc/modprobe.d),
              C(/etc/modules-load.d), C(/usr/share/initramfs-tools/modules.d), C(/etc/dracut.conf.d)), by
              modification time (images are not unpacked); C(entries), its boot entries
              (the C(10_linux) entries of C(/boot/grub/grub.cfg) or C(/boot/grub2/grub.cfg) whose C(linux) line
              boots its C(vmlinuz), recovery entries left out, and the BLS entries of C(/boot/loader/entries)), each
              with C(file), C(title) and C(missing), the arguments kernel_cmdline recorded as its own
              (C(/var/lib/gpuops/kernel_cmdline.json)) that the entry lacks; C(problems), each of these in a
              sentence (empty when the kernel boots with the collection's settings).
            - A kernel removed while it is read is left out. Empty when C(/lib/modules) cannot be read.
          type: list
          elements: dict
          sample:
            - version: 6.1.0-50-amd64
              running: false
              initramfs: /boot/initrd.img-6.1.0-50-amd64
              initramfs_stale: true
              entries:
                - file: /boot/grub/grub.cfg
                  title: Debian GNU/Linux, with Linux 6.1.0-50-amd64
                  missing: [iommu=pt]
              problems:
                - initramfs /boot/initrd.img-6.1.0-50-amd64 is older than /etc/modprobe.d/gpuops-nouveau.conf
                - boot entry /boot/grub/grub.cfg entry 'Debian GNU/Linux, with Linux 6.1.0-50-amd64' lacks iommu=pt
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils import _modprobe
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError, create_module, run_module
from ansible_collections.gpuops.sandbox.plugins.module_utils._pci import (
    SELECTION_ARGUMENT_SPEC,
    SELECTION_MUTUALLY_EXCLUSIVE,
    describe_function,
    load_pci_ids_db,
    mdev_parents,
    select_from_params,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._host import host_summary
from ansible_collections.gpuops.sandbox.plugins.module_utils._iommu import iommu_state
from ansible_collections.gpuops.sandbox.plugins.module_utils._vfio import mig_instances, read_override

# Host root for everything this module reads. Only unit tests point it elsewhere.
ROOT = "/"


def build_module():
    """Create the AnsibleModule; the argument spec does the validation it can."""
    return create_module(
        AnsibleModule,
        argument_spec=dict(SELECTION_ARGUMENT_SPEC, module_files=dict(
            type="dict", apply_defaults=True,
            options=dict(nouveau=dict(type="str", default=_modprobe.DEFAULT_SETS["nouveau"]),
                         vfio=dict(type="str", default=_modprobe.DEFAULT_SETS["vfio"])))),
        mutually_exclusive=SELECTION_MUTUALLY_EXCLUSIVE,
        supports_check_mode=True,
    )


def gather(params, root="/"):
    """Return the facts dict for the given (validated) parameters; raises SysfsError/OSError/ValueError."""
    selected = select_from_params(params, root)
    db = load_pci_ids_db(root)
    gpus = [with_overrides(describe_function(address, root=root, pci_ids_db=db), root) for address in selected]
    parents = mdev_parents(root)
    return {
        "gpu_facts_gpus": gpus,
        "gpu_facts_iommu": iommu_state(root),
        "gpu_facts_mdev_parents": parents,
        "gpu_facts_pci_ids": db["path"],
        "gpu_facts_host": host_summary(root, params.get("module_files")),
    }


def with_overrides(info, root="/"):
    """Add ``driver_override`` (None when unset) to a function and to each PCI member of its IOMMU group, and the
    function's MIG GPU instances (``mig_instances``)."""
    info["driver_override"] = read_override(info["address"], root)
    info["mig_instances"] = mig_instances(info["address"], root)
    for member in info["iommu_group_members"]:
        member["driver_override"] = read_override(member["address"], root) if member["pci"] else None
    return info


def facts(module, root="/"):
    """The module's body: return the result with the facts, or raise GpuopsError naming the problem."""
    problem = _modprobe.sets_problem(module.params["module_files"])
    if problem:
        raise GpuopsError("module_files: %s" % problem)
    try:
        gathered = gather(module.params, root=root)
    except (OSError, ValueError) as exc:
        raise GpuopsError("cannot gather GPU facts: %s" % exc) from exc
    return {"changed": False, "ansible_facts": gathered}


def main():
    run_module(build_module, facts, root=ROOT)


if __name__ == "__main__":
    main()
