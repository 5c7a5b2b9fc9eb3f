# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""host_plan and plan_table: a GPU node's plan from the facts gpu_facts reads on fake host trees (the lab's layout,
the model GPU host, the H200's driver), before and after what the preparation writes."""

from __future__ import annotations

import json
import os

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.gpu_selectors import gpu_selectors
from ansible_collections.gpuops.sandbox.plugins.filter.host_plan import FilterModule, host_plan
from ansible_collections.gpuops.sandbox.plugins.filter.plan_table import plan_table
from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call_main

KERNEL = "6.1.0-18-amd64"
LAB_SELECTORS = {"vendors": ["1234:11e8"], "classes": ["00ff00"]}
LAB_SETTINGS = {"vendor_ids": ["1234"], "device_ids": ["11e8"], "class_ids": ["00ff00"]}
LAB_GPUS = ["0000:00:03.0", "0000:01:00.0"]
DEBIAN = 'ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n'


def installed(tree, version=KERNEL, initramfs=True):
    tree.mkdir("/lib/modules/%s/kernel" % version)
    tree.write("/boot/vmlinuz-" + version, "kernel")
    if initramfs:
        tree.write("/boot/initrd.img-" + version, "image")


def lab_host(tmp_path, iommu=False):
    """The lab's q35 layout as the pristine image boots it: Debian 12, one kernel, the IOMMU off."""
    tree = st.build_lab_host(tmp_path, iommu=iommu)
    tree.write("/etc/os-release", DEBIAN)
    tree.write("/proc/sys/kernel/osrelease", KERNEL + "\n")
    tree.set_cpuinfo(st.CPUINFO_INTEL)
    installed(tree)
    return tree


def facts(monkeypatch, tree, selectors=None):
    kind, result = call_main(monkeypatch, gpu_facts, tree.root, selectors or LAB_SELECTORS)
    assert kind == "exit", result
    return result["ansible_facts"]


def plan_of(monkeypatch, tree, workload_type, selectors=None, **settings):
    found = facts(monkeypatch, tree, selectors)
    given = dict(LAB_SETTINGS if selectors is None else {}, workload_type=workload_type, **settings)
    return host_plan(found["gpu_facts_gpus"], found["gpu_facts_iommu"], found["gpu_facts_host"], given,
                     mdev_parents=found["gpu_facts_mdev_parents"])


def details(plan):
    return [change["detail"] for change in plan["changes"]]


def prepare_as_passthrough(tree):
    """What a vm-passthrough preparation leaves on the lab host, once rebooted: the module files, the kernel
    arguments booted with and recorded, the GPUs and their groups on vfio-pci."""
    tree.write("/etc/modprobe.d/gpuops-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n")
    tree.write("/etc/modprobe.d/gpuops-vfio.conf", "softdep nvidia pre: vfio-pci\n")
    tree.write("/etc/modules-load.d/gpuops-vfio.conf", "vfio\nvfio_iommu_type1\nvfio_pci\n")
    tree.write("/var/lib/gpuops/kernel_cmdline.json", json.dumps({
        "intel_iommu": {"original": [], "set": ["intel_iommu=on"]}, "iommu": {"original": [], "set": ["iommu=pt"]}}))
    # The image is rebuilt after the files (newer than them).
    tree.write("/boot/initrd.img-" + KERNEL, "image with vfio")
    for address in ("0000:00:03.0", "0000:00:03.1", "0000:01:00.0"):
        tree.bind(address, "vfio-pci")


def test_a_pristine_lab_host_plans_the_boot_settings_one_reboot_and_the_binding_after_it(monkeypatch, tmp_path):
    plan = plan_of(monkeypatch, lab_host(tmp_path), "vm-passthrough")
    assert plan["refusals"] == []
    assert [g["address"] for g in plan["gpus"]] == LAB_GPUS
    assert plan["reboot"] == {"required": True, "reasons": [
        "nouveau settings changed", "vfio boot settings changed", "kernel command line changed"]}
    assert details(plan) == [
        "blacklist nouveau (/etc/modprobe.d/gpuops-nouveau.conf)",
        "load vfio, vfio_iommu_type1, vfio_pci at boot, in the initramfs, before nvidia, nouveau (gpuops-vfio)",
        "rebuild the initramfs of the running kernel %s" % KERNEL,
        "add intel_iommu=on iommu=pt to the kernel command line",
        # No groups yet: the GPUs and nothing else (their slot companions show once the IOMMU is on).
        "bind 0000:00:03.0, 0000:01:00.0 to vfio-pci after the reboot turns the IOMMU on",
    ]
    assert plan["deferred"] == ["vfio-pci binding (the IOMMU is not on yet)"]
    assert plan["calls"]["vfio_bind"] == {
        "vendors": ["1234:11e8"], "classes": ["00ff00"], "include_group": True, "persistent": True,
        "allowed_group_drivers": ["snd_hda_intel", "xhci_hcd", "nvidia-gpu", "ucsi_ccg"]}
    assert plan["calls"]["nouveau"]["rebuild"] == "never"  # the vfio set rebuilds once for both
    assert plan["calls"]["cmdline"] == {"arguments": ["intel_iommu=on", "iommu=pt"]}
    assert plan["expected"]["kernel_arguments"] == ["intel_iommu=on", "iommu=pt"]
    assert plan["empty"] is False


def test_the_prepared_lab_host_has_an_empty_plan(monkeypatch, tmp_path):
    tree = lab_host(tmp_path, iommu=True)
    prepare_as_passthrough(tree)
    plan = plan_of(monkeypatch, tree, "vm-passthrough")
    assert plan["changes"] == [] and plan["refusals"] == [], plan
    assert plan["reboot"] == {"required": False, "reasons": []}
    assert plan["empty"] is True
    # The calls are still named (the preparation runs them to find drift), and what the host must show.
    assert plan["calls"]["vfio_bind"]["persistent"] is True
    assert plan["expected"]["vfio"] == ["0000:00:03.0", "0000:00:03.1", "0000:01:00.0"]


@pytest.mark.parametrize("drift, detail", [
    # A function that fell off vfio-pci is bound back.
    (lambda tree: tree.bind("0000:00:03.1", "snd_hda_intel"), "bind 0000:00:03.1 to vfio-pci"),
    # A stale image of another kernel is rebuilt.
    (lambda tree: installed(tree, "6.1.0-50-amd64", initramfs=False),
     "rebuild the initramfs of the installed kernel 6.1.0-50-amd64"),
], ids=["function-off-vfio-pci", "stale-image-of-another-kernel"])
def test_drift_of_a_prepared_passthrough_host_is_planned_back_without_a_reboot(monkeypatch, tmp_path, drift, detail):
    tree = lab_host(tmp_path, iommu=True)
    prepare_as_passthrough(tree)
    drift(tree)
    plan = plan_of(monkeypatch, tree, "vm-passthrough")
    assert details(plan) == [detail]
    assert plan["reboot"]["required"] is False


def test_arguments_written_but_not_booted_yet_are_a_pending_reboot_not_a_change_of_the_files(monkeypatch, tmp_path):
    tree = lab_host(tmp_path, iommu=False)
    prepare_as_passthrough(tree)
    tree.write("/usr/sbin/grub-mkconfig", "#!/bin/sh\n")
    tree.write("/boot/grub/grub.cfg", "menuentry 'Debian GNU/Linux' {\n\tlinux /boot/vmlinuz-%s root=/dev/vda1 ro "
               "intel_iommu=on iommu=pt\n}\n" % KERNEL)
    plan = plan_of(monkeypatch, tree, "vm-passthrough")
    assert "boot with intel_iommu=on iommu=pt, already in the boot entries" in details(plan)
    assert plan["reboot"]["reasons"] == ["kernel command line changed"]


def test_switching_a_prepared_passthrough_host_to_container_gives_everything_back(monkeypatch, tmp_path):
    tree = lab_host(tmp_path, iommu=True)
    prepare_as_passthrough(tree)
    tree.write("/etc/udev/rules.d/61-gpuops-vfio-0000:00:03.0.rules", 'ACTION=="add"\n')
    plan = plan_of(monkeypatch, tree, "container")
    assert plan["refusals"] == []
    assert details(plan) == [
        "remove the vfio boot settings of an earlier workload type (/etc/modprobe.d/gpuops-vfio.conf, "
        "/etc/modules-load.d/gpuops-vfio.conf, /etc/udev/rules.d/61-gpuops-vfio-0000:00:03.0.rules)",
        "rebuild the initramfs of the running kernel %s" % KERNEL,
        "take intel_iommu=on iommu=pt off the kernel command line",
        "give 0000:00:03.0, 0000:00:03.1, 0000:01:00.0 back from vfio-pci to their host drivers",
    ]
    assert plan["reboot"]["reasons"] == ["vfio boot settings changed", "kernel command line changed"]
    assert plan["calls"]["vfio_release"] == {"vendors": ["1234:11e8"], "classes": ["00ff00"], "include_group": True,
                                             "state": "absent", "remove_claims": False}
    assert plan["calls"]["cmdline_remove"]["state"] == "absent"
    assert "vfio_bind" not in plan["calls"] and plan["calls"]["vfio_modules"] == {"name": "gpuops-vfio",
                                                                                  "state": "absent"}


def test_a_container_node_never_prepared_as_a_vm_node_keeps_its_command_line(monkeypatch, tmp_path):
    tree = lab_host(tmp_path, iommu=True)  # intel_iommu=on iommu=pt set by hand, no record of this collection's
    plan = plan_of(monkeypatch, tree, "container")
    assert "cmdline_remove" not in plan["calls"]
    assert details(plan) == ["blacklist nouveau (/etc/modprobe.d/gpuops-nouveau.conf)",
                             "rebuild the initramfs of the running kernel %s" % KERNEL]
    assert plan["calls"]["nouveau"]["rebuild"] == "changed"


def test_a_dra_node_leaves_the_binding_to_the_dra_driver_and_names_the_holder_check(monkeypatch, tmp_path):
    tree = lab_host(tmp_path, iommu=True)
    tree.bind("0000:00:03.0", "vfio-pci")  # a VM's claim prepared by the DRA driver
    plan = plan_of(monkeypatch, tree, "dra", dra_stop_blockers=["dcgm"])
    assert not [d for d in details(plan) if "vfio-pci" in d]
    assert plan["calls"]["dra_blockers"] == {"stop": ["dcgm"], "dra_driver_version": ""}
    assert plan["calls"]["cmdline"] == {"arguments": ["intel_iommu=on", "iommu=pt"]}


def test_an_amd_host_gets_no_vendor_argument(monkeypatch, tmp_path):
    tree = lab_host(tmp_path, iommu=True)
    tree.set_cpuinfo(st.CPUINFO_AMD)
    os.unlink(tree.path("/sys/firmware/acpi/tables/DMAR"))
    tree.set_iommu(table="IVRS", units=("ivhd0",))
    plan = plan_of(monkeypatch, tree, "vm-vgpu", vgpu_devices="operator")
    assert plan["cpu_vendor"] == "amd"
    assert plan["calls"]["cmdline"] == {"arguments": ["iommu=pt"]}


def test_the_firmware_without_an_iommu_refuses_a_vm_node(monkeypatch, tmp_path):
    tree = lab_host(tmp_path)
    os.unlink(tree.path("/sys/firmware/acpi/tables/DMAR"))
    plan = plan_of(monkeypatch, tree, "vm-passthrough")
    assert [(r["check"], r["fix"]) for r in plan["refusals"]] == [
        ("IOMMU in the firmware", "turn on VT-d in the firmware setup, or make the host a container node")]
    assert plan["empty"] is False
    # A container node does not need it.
    assert plan_of(monkeypatch, tree, "container")["refusals"] == []


def test_an_unsupported_os_and_no_gpus_are_refused_with_their_fixes(monkeypatch, tmp_path):
    tree = lab_host(tmp_path)
    tree.write("/etc/os-release", 'ID=fedora\nVERSION_ID="41"\nPRETTY_NAME="Fedora Linux 41"\n')
    plan = plan_of(monkeypatch, tree, "vm-passthrough", selectors={"vendors": ["10de"], "classes": ["030200"]},
                   supported_os={"debian": ["12"], "rhel": ["8", "9"]})
    assert [r["check"] for r in plan["refusals"]] == ["operating system", "GPUs"]
    assert plan["refusals"][0]["problem"] == "Fedora Linux 41 (ID=fedora, VERSION_ID=41) is not supported"
    assert plan["refusals"][0]["fix"] == "use one of: debian 12, rhel 8/9"
    assert "vendors 10de, classes 030000,030200" in plan["refusals"][1]["problem"]
    assert plan_of(monkeypatch, tree, "vm-passthrough", selectors={"vendors": ["10de"], "classes": ["030200"]},
                   require_gpus=False)["refusals"] == []


# The real H200 host of FACTS.md: Ubuntu 24.04, driver 580.159.04 installed from the distribution (DKMS), the GPU on it.
def h200_facts(monkeypatch, tmp_path):
    tree = st.build_gpu_host(tmp_path)
    tree.write("/etc/os-release", 'ID=ubuntu\nVERSION_ID="24.04"\nPRETTY_NAME="Ubuntu 24.04.2 LTS"\n')
    tree.write("/proc/sys/kernel/osrelease", "6.8.0-60-generic\n")
    tree.write("/sys/module/nvidia/version", "580.159.04\n")
    tree.write("/lib/modules/6.8.0-60-generic/modules.dep", "updates/dkms/nvidia.ko.zst:\n")
    return tree


NVIDIA = {"vendors": ["10de"], "classes": ["030200"]}


def test_a_host_driver_refuses_the_operators_binding_not_the_collections(monkeypatch, tmp_path):
    tree = h200_facts(monkeypatch, tmp_path)
    plan = plan_of(monkeypatch, tree, "vm-passthrough", selectors=NVIDIA, vfio_binding="operator")
    assert [r["check"] for r in plan["refusals"]] == ["host driver"]
    problem = plan["refusals"][0]["problem"]
    assert problem.startswith("the GPUs 0000:65:00.0, %s, " % st.A100), problem
    assert problem.endswith(" are held by the NVIDIA driver installed on the host (updates/dkms/nvidia.ko.zst, version "
                            "580.159.04), which the GPU Operator's vfio-manager leaves alone, so they would never "
                            "reach VMs"), problem
    assert plan["refusals"][0]["fix"] == ("remove the host's NVIDIA driver packages, or let the collection bind the "
                                          "GPUs (gpuops_vfio_binding: host)")
    # vfio_bind takes the GPUs off the host driver itself.
    assert plan_of(monkeypatch, tree, "vm-passthrough", selectors=NVIDIA, vfio_binding="host")["refusals"] == []


def test_a_host_driver_refuses_the_operators_vgpu_devices_and_leaves_a_container_node_alone(monkeypatch, tmp_path):
    tree = h200_facts(monkeypatch, tmp_path)
    plan = plan_of(monkeypatch, tree, "vm-vgpu", selectors=NVIDIA, vgpu_devices="operator")
    assert [r["check"] for r in plan["refusals"]] == ["host driver"]
    assert plan["refusals"][0]["problem"].endswith("beside which the GPU Operator's vGPU Manager cannot load")
    assert plan["refusals"][0]["fix"] == "remove the host's NVIDIA driver packages"
    assert plan_of(monkeypatch, tree, "container", selectors=NVIDIA)["refusals"] == []


def test_gpus_off_the_host_driver_or_on_the_operators_own_are_not_refused(monkeypatch, tmp_path):
    found = facts(monkeypatch, h200_facts(monkeypatch, tmp_path), NVIDIA)
    settings = {"workload_type": "vm-passthrough", "vfio_binding": "operator"}
    on_vfio = [dict(gpu, driver="vfio-pci") for gpu in found["gpu_facts_gpus"]]
    assert host_plan(on_vfio, found["gpu_facts_iommu"], found["gpu_facts_host"], settings)["refusals"] == []
    operators = dict(found["gpu_facts_host"], nvidia_driver=dict(found["gpu_facts_host"]["nvidia_driver"],
                                                                 source="operator"))
    assert host_plan(found["gpu_facts_gpus"], found["gpu_facts_iommu"], operators, settings)["refusals"] == []


def test_debians_packaged_driver_is_named_by_its_renamed_file(monkeypatch, tmp_path):
    """Debian 12's nvidia-kernel-dkms (updates/dkms/nvidia-current.ko, loaded as nvidia), as gpu_facts reads it."""
    from ansible_collections.gpuops.sandbox.tests.unit.fakes import nvidia_packages as nv

    tree = st.build_gpu_host(tmp_path)
    nv.install_debian_dkms(tree, "nvidia-current")
    plan = plan_of(monkeypatch, tree, "vm-passthrough", selectors={"vendors": ["10de"]}, vfio_binding="operator")
    assert [r["check"] for r in plan["refusals"]] == ["host driver"], plan["refusals"]
    assert ("held by the NVIDIA driver installed on the host (updates/dkms/nvidia-current.ko, version %s)"
            % nv.DEBIAN_VERSION) in plan["refusals"][0]["problem"]


def test_a_gpu_in_mig_mode_refuses_a_vm_node(monkeypatch, tmp_path):
    found = facts(monkeypatch, st.build_gpu_host(tmp_path), NVIDIA)

    def refusals(workload_type, instances):
        gpus = [dict(gpu, mig_instances=instances if gpu["address"] == st.A100 else 0)
                for gpu in found["gpu_facts_gpus"]]
        plan = host_plan(gpus, found["gpu_facts_iommu"], found["gpu_facts_host"],
                         {"workload_type": workload_type, "vgpu_devices": "operator"})
        return [(r["check"], r["problem"], r["fix"]) for r in plan["refusals"]]

    assert refusals("vm-passthrough", 2) == [
        ("MIG mode", "the GPUs %s have MIG GPU instances (MIG mode, from the host's time as a container node)" % st.A100,
         "keep the host a container node with gpuops_mig_config: all-disabled, run the cluster play and wait until "
         "its node's nvidia.com/mig.config.state is success; then switch it")]
    assert [r[0] for r in refusals("vm-vgpu", 7)] == ["MIG mode"] and [r[0] for r in refusals("dra", 1)] == ["MIG mode"]
    # No instances (MIG off, or a GPU not on nvidia: null), or a container node, which keeps MIG: nothing refused.
    assert refusals("vm-passthrough", 0) == [] and refusals("vm-passthrough", None) == []
    assert refusals("container", 7) == []


VGPU_CONFIG = {"version": "v1", "vgpu-configs": {"A100-4C": [{"devices": "all", "vgpu-devices": {"A100-4C": 1}}]}}


def test_a_vgpu_node_plans_its_vfs_and_devices_from_the_configuration(monkeypatch, tmp_path):
    tree = st.build_gpu_host(tmp_path)
    plan = plan_of(monkeypatch, tree, "vm-vgpu", selectors={"vendors": ["10de:20b5"], "classes": ["030200"]},
                   vgpu_device_config=VGPU_CONFIG, vgpu_config_name="A100-4C", mdev_parents=list(st.A100_VFS))
    assert plan["refusals"] == []
    assert [c["parents"] for c in plan["calls"]["mdev"]] == [[vf] for vf in st.A100_VFS]
    assert plan["calls"]["mdev"][0] == {"type": "nvidia-692", "count": 1, "persistent": True,
                                        "parents": [st.A100_VFS[0]]}
    assert plan["calls"]["sriov"] == [{"pf": st.A100, "count": 20, "persistent": True}]
    assert details(plan)[-3:] == [
        "set %s to 20 SR-IOV VFs (now 2)" % st.A100,
        "create 1 nvidia-692 device(s) on %s" % st.A100_VFS[0],
        "create 1 nvidia-692 device(s) on %s" % st.A100_VFS[1]]
    assert plan["expected"]["mdev"] == {"%s nvidia-692" % vf: 1 for vf in st.A100_VFS}
    assert plan["expected"]["sriov"] == {st.A100: 20}


def test_a_vgpu_configuration_that_does_not_resolve_is_a_refusal_not_an_error(monkeypatch, tmp_path):
    plan = plan_of(monkeypatch, st.build_gpu_host(tmp_path), "vm-vgpu",
                   selectors={"vendors": ["10de:20b5"], "classes": ["030200"]},
                   vgpu_device_config=VGPU_CONFIG, vgpu_config_name="A100-8C")
    assert [r["check"] for r in plan["refusals"]] == ["vGPU configuration"]
    assert "'A100-8C' is not defined; defined: A100-4C" in plan["refusals"][0]["problem"]


def test_leaving_vm_vgpu_removes_the_devices_and_vfs_recorded(monkeypatch, tmp_path):
    tree = lab_host(tmp_path, iommu=True)
    tree.write("/etc/gpuops/mdev-devices.conf", "x\n")
    tree.write("/etc/gpuops/sriov-vfs.conf", "0000:02:00.0 4\n")
    plan = plan_of(monkeypatch, tree, "container")
    assert details(plan)[-2:] == ["remove the vGPU devices of an earlier workload type (0 live) and their boot definitions",
                                  "turn the SR-IOV VFs of 0000:02:00.0 off"]
    assert plan["calls"]["mdev_remove"] == []
    assert plan["calls"]["sriov_remove"] == [{"pf": "0000:02:00.0", "state": "absent", "persistent": True}]
    assert plan["reboot"]["reasons"] == ["nouveau settings changed"]


@pytest.mark.parametrize("settings,fragment", [
    ({"workload_type": "gpu"}, "workload type 'gpu' is not one of container, vm-passthrough, vm-vgpu, dra"),
    ({"workload_type": "container", "vfio_binding": "me"}, "vfio_binding 'me' is not one of host, operator"),
    ({"workload_type": "container", "vendor_ids": "10de"}, "gpuops_gpu_vendor_ids must be a list of strings"),
    ({"workload_type": "container", "iommu_pt": "maybe"}, "iommu_pt must be true or false, got 'maybe'"),
])
def test_bad_settings_name_the_value(settings, fragment):
    with pytest.raises(AnsibleFilterError, match="host_plan: ") as raised:
        host_plan([], {}, {}, settings)
    assert fragment in str(raised.value)


def test_gpu_selectors_pair_each_vendor_with_each_device():
    assert gpu_selectors(["10de"]) == ["10de"]
    assert gpu_selectors(["10de", "1234"], ["2236", "11e8"]) == ["10de:2236", "10de:11e8", "1234:2236", "1234:11e8"]
    with pytest.raises(AnsibleFilterError, match="gpuops_gpu_device_ids must be a list of strings"):
        gpu_selectors(["10de"], "2236")


def test_the_plan_table_reads_per_host_and_counts(monkeypatch, tmp_path):
    pristine = plan_of(monkeypatch, lab_host(tmp_path / "a"), "vm-passthrough")
    tree = lab_host(tmp_path / "b", iommu=True)
    prepare_as_passthrough(tree)
    prepared = plan_of(monkeypatch, tree, "vm-passthrough")
    nvidia = {"vendors": ["10de"], "classes": ["030200"]}
    refused = plan_of(monkeypatch, lab_host(tmp_path / "c"), "vm-passthrough", selectors=nvidia)
    lines = plan_table([pristine, prepared, refused], ["lab-passthrough", "lab-ready", "lab-refused", "gone"],
                       width=72, lines=True)
    assert max(len(line) for line in lines) <= 72
    assert lines[0].split() == ["HOST", "TYPE", "REBOOT"]
    rows = {line.split()[0]: index for index, line in enumerate(lines) if not line.startswith(" ")}
    assert lines[rows["lab-passthrough"]].split() == ["lab-passthrough", "vm-passthrough", "yes"]
    block = " ".join(" ".join(lines[rows["lab-passthrough"] + 1:rows["lab-ready"]]).split())
    assert block.startswith("- blacklist nouveau (/etc/modprobe.d/gpuops-nouveau.conf) - load vfio")
    assert block.endswith("- reboots: nouveau settings changed, vfio boot settings changed, kernel command line changed")
    assert lines[rows["lab-ready"]:rows["lab-ready"] + 2] == ["lab-ready        vm-passthrough  no", "  - nothing to change"]
    # A refused host is changed in nothing: its plan is the refusal.
    assert lines[rows["lab-refused"]].split() == ["lab-refused", "vm-passthrough", "-"]
    assert lines[rows["lab-refused"] + 1].startswith("  - REFUSED GPUs: no PCI function matches")
    assert lines[rows["lab-refused"] + 1:rows["gone"]][-1].startswith("    ")
    assert lines[rows["gone"]].split() == ["gone", "?", "?"]
    assert lines[rows["gone"] + 1] == "  - no plan: unreachable, managed elsewhere or failed before its facts"
    assert lines[-1] == "4 GPU nodes: 1 refused, 1 would reboot, 1 with nothing to change"
    elsewhere = {"host": "lab-h200", "managed": False, "workload_type": "container"}
    assert plan_table([elsewhere], ["lab-h200"], width=60, lines=True)[1:] == [
        "lab-h200  container  -", "  - host managed elsewhere: nothing planned for it here",
        "1 GPU node: 0 refused, 0 would reboot, 0 with nothing to", "change, 1 managed elsewhere"]
    assert plan_table([prepared], ["lab-ready"]) == "\n".join(plan_table([prepared], ["lab-ready"], lines=True))


def test_the_filters_are_registered():
    assert FilterModule().filters() == {"host_plan": host_plan}
