# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""host_checks: the checks of host_verify, each passing and failing, and the role that runs them, for real."""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import sys

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.host_checks import GPUS_CHECK, FilterModule, host_checks
from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
from ansible_collections.gpuops.sandbox.tests.unit.playbook import ansible_playbook
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st

GPU = "0000:65:00.0"
AUDIO = "0000:65:00.1"
GPU_B = "0000:b1:00.0"
VM_CMDLINE = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro intel_iommu=on iommu=pt"
PLAIN_CMDLINE = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro"
RULES = ["/etc/udev/rules.d/61-gpuops-vfio-0000:65:00.0.rules", "/etc/udev/rules.d/61-gpuops-vfio-0000:65:00.1.rules"]
MODULES = ["/etc/modprobe.d/gpuops-vfio.conf", "/etc/modules-load.d/gpuops-vfio.conf"]
UUID_A = "5f2a2b8e-3c2b-5a8f-9b55-3b8e0c1d2e3f"
UUID_B = "0b5c3d1e-1111-4222-8333-944455556666"


def member(address, driver, override=None, pci=True):
    return {"address": address, "driver": driver, "driver_override": override, "pci": pci, "is_bridge": False}


def gpu(address=GPU, driver="nvidia", override=None, viable=None, members=None):
    """A gpu_facts_gpus entry; by default in a group with its audio function (both on the host drivers)."""
    if members is None:
        members = [member(address, driver, override), member(AUDIO, "snd_hda_intel")]
    if viable is None:
        viable = all(m["driver"] in (None, "vfio-pci") for m in members)
    return {"address": address, "driver": driver, "driver_override": override, "viable": viable,
            "iommu_group_members": members}


def iommu(cmdline=VM_CMDLINE, enabled=True, groups=42):
    flags = {}
    for word in cmdline.split():
        key, sep, value = word.partition("=")
        if sep and key in ("intel_iommu", "amd_iommu", "iommu"):
            flags[key] = value
    return {"enabled": enabled, "group_count": groups, "cmdline": cmdline, "cmdline_flags": flags}


def host(vfio_rules=(), vfio_modules=(), mdev_definitions=(), sriov_definitions=(), mdevs=(), sriov=None):
    return {"managed_files": {"kernel_cmdline": [], "nouveau": [], "vfio_rules": list(vfio_rules),
                              "vfio_modules": list(vfio_modules), "mdev_definitions": list(mdev_definitions),
                              "sriov_definitions": list(sriov_definitions)},
            "mdev_devices": [{"uuid": u, "parent": GPU_B, "type_id": "nvidia-692"} for u in mdevs],
            "sriov": sriov or {}}


# Each workload type's host as the preparation leaves it, and its settings.
PASSTHROUGH = dict(gpus=[gpu(driver="vfio-pci", members=[member(GPU, "vfio-pci"), member(AUDIO, "vfio-pci")])],
                   iommu=iommu(), host=host(vfio_rules=RULES, vfio_modules=MODULES), workload_type="vm-passthrough",
                   expected={"vfio": [GPU, AUDIO], "mdev_uuids": [], "sriov": {}, "restored": {}})
CONTAINER = dict(gpus=[gpu()], iommu=iommu(PLAIN_CMDLINE, enabled=False, groups=0), host=host(), workload_type="container",
                 expected={"vfio": [], "mdev_uuids": [], "sriov": {}, "restored": {GPU: "nvidia", AUDIO: "snd_hda_intel"}})
VGPU = dict(gpus=[gpu(GPU_B, members=[member(GPU_B, "nvidia")])], iommu=iommu(),
            host=host(mdev_definitions=["/etc/gpuops/mdev-devices.conf"], sriov_definitions=["/etc/gpuops/sriov-vfs.conf"],
                      mdevs=[UUID_A, UUID_B], sriov={GPU_B: {"numvfs": 2, "totalvfs": 20}}),
            workload_type="vm-vgpu", expected={"vfio": [], "mdev_uuids": [UUID_A, UUID_B], "sriov": {GPU_B: 2}, "restored": {}})
DRA = dict(gpus=[gpu()], iommu=iommu(), host=host(), workload_type="dra",
           expected={"vfio": [], "mdev_uuids": [], "sriov": {}, "restored": {}})
HOSTS = {"vm-passthrough": PASSTHROUGH, "container": CONTAINER, "vm-vgpu": VGPU, "dra": DRA}


def run(base, **changes):
    """The checks of ``base`` (one of HOSTS) with ``changes`` to its facts and settings, by name."""
    args = copy.deepcopy(base)
    args.update(changes)
    checks = host_checks(args.pop("gpus"), args.pop("iommu"), args.pop("host"), **args)
    names = [c["check"] for c in checks]
    assert len(names) == len(set(names)), names
    assert all(sorted(c) == ["check", "detail", "ok"] and isinstance(c["ok"], bool) for c in checks)
    return dict((c["check"], c) for c in checks)


def failed(checks):
    return sorted(name for name, check in checks.items() if not check["ok"])


@pytest.mark.parametrize("workload_type", sorted(HOSTS))
@pytest.mark.parametrize("stage", ["after-reboot", "final"])
def test_a_prepared_host_passes_every_check(workload_type, stage):
    checks = run(HOSTS[workload_type], stage=stage)
    assert failed(checks) == []


def test_the_checks_of_each_type():
    generated = "initramfs and boot loader generated"
    assert list(run(PASSTHROUGH)) == [GPUS_CHECK, "kernel command line", "IOMMU groups", generated,
                                      "no vGPU devices or VF records left", "GPUs on vfio-pci", "vfio boot settings"]
    assert list(run(CONTAINER)) == [GPUS_CHECK, "no IOMMU arguments of a VM node", generated, "no vfio-pci binding left",
                                    "no vfio driver_override left", "0000:65:00.0 back on nvidia",
                                    "0000:65:00.1 back on snd_hda_intel", "no vGPU devices or VF records left"]
    assert list(run(VGPU)) == [GPUS_CHECK, "kernel command line", "IOMMU groups", generated, "no vfio-pci binding left",
                               "no vfio driver_override left", "vGPU devices", "SR-IOV VFs of 0000:b1:00.0"]
    assert list(run(DRA)) == [GPUS_CHECK, "kernel command line", "IOMMU groups", generated, "no vfio-pci binding left",
                              "no vGPU devices or VF records left"]
    assert list(run(PASSTHROUGH, stage="after-reboot")) == [
        GPUS_CHECK, "kernel command line", "IOMMU groups", generated, "no vGPU devices or VF records left",
        "0000:65:00.0 back on vfio-pci after the reboot"]


@pytest.mark.parametrize("workload_type", sorted(HOSTS))
@pytest.mark.parametrize("stage", ["final", "after-reboot"])
def test_a_run_cut_short_while_generating_fails_every_type(workload_type, stage):
    host = HOSTS[workload_type]
    record = "/var/lib/gpuops/pending/initramfs.json"
    managed = dict(host["host"]["managed_files"], pending=[record])
    checks = run(dict(host, host=dict(host["host"], managed_files=managed)), stage=stage)
    assert failed(checks) == ["initramfs and boot loader generated"]
    assert record in checks["initramfs and boot loader generated"]["detail"]
    assert "run the preparation again" in checks["initramfs and boot loader generated"]["detail"]


def test_the_filter_is_registered():
    assert FilterModule().filters() == {"host_checks": host_checks}


# ---------------------------------------------------------------------------------------------
# GPUs matching the selectors
# ---------------------------------------------------------------------------------------------

SELECTORS = {"vendors": ["10de"], "devices": ["2236", "20b5"], "classes": ["030000", "030200"]}
NAMED = "the GPU selectors (vendors 10de, devices 2236,20b5, classes 030000,030200)"


@pytest.mark.parametrize("workload_type", sorted(HOSTS))
@pytest.mark.parametrize("stage", ["after-reboot", "final"])
@pytest.mark.parametrize("pending", [False, True])
def test_no_gpu_fails_every_type_naming_the_selectors(workload_type, stage, pending):
    """No GPU hides a wrong selector or a dead GPU: the host is not ready, and the detail says what to do."""
    checks = run(HOSTS[workload_type], gpus=[], selectors=SELECTORS, stage=stage, reboot_pending=pending)
    assert GPUS_CHECK in failed(checks)
    detail = checks[GPUS_CHECK]["detail"]
    assert detail.startswith("no GPU found: no PCI function of this %s node matches %s. " % (workload_type, NAMED)), detail
    for remedy in ("gpuops_gpu_vendor_ids", "gpuops_gpu_device_ids", "gpuops_gpu_class_ids", "gpuops_gpus_optional: true"):
        assert remedy in detail


def test_no_gpu_is_ready_when_the_inventory_allows_it():
    container = dict(CONTAINER, gpus=[], expected={})
    assert failed(run(container, selectors=SELECTORS)) == [GPUS_CHECK]
    checks = run(container, selectors=SELECTORS, gpus_optional=True)
    assert failed(checks) == []
    assert checks[GPUS_CHECK] == {"check": GPUS_CHECK, "ok": True, "detail": "no GPU found: no PCI function matches %s; "
                                  "allowed by the inventory (gpuops_gpus_optional)" % NAMED}
    assert run(container, gpus_optional="yes")[GPUS_CHECK]["ok"] is True  # a boolean as the inventory may write it
    # The VM types still need their GPUs for their own checks.
    assert failed(run(PASSTHROUGH, gpus=[], gpus_optional=True)) == ["GPUs on vfio-pci"]


def test_gpus_found_pass_whatever_the_flag():
    for optional in (False, True):
        assert run(PASSTHROUGH, selectors=SELECTORS, gpus_optional=optional)[GPUS_CHECK] == {
            "check": GPUS_CHECK, "ok": True, "detail": "1 GPU matches " + NAMED}
    two = [gpu(), gpu(GPU_B, members=[member(GPU_B, "nvidia")])]
    assert run(CONTAINER, gpus=two, selectors={"vendors": ["10de"], "devices": []})[GPUS_CHECK]["detail"] == (
        "2 GPUs match the GPU selectors (vendors 10de)")
    assert run(CONTAINER)[GPUS_CHECK]["detail"] == "1 GPU matches the GPU selectors"  # none given


# ---------------------------------------------------------------------------------------------
# Kernel command line and IOMMU
# ---------------------------------------------------------------------------------------------

def test_kernel_command_line():
    check = run(PASSTHROUGH)["kernel command line"]
    assert check == {"check": "kernel command line", "ok": True, "detail": "/proc/cmdline should have intel_iommu=on iommu=pt: " + VM_CMDLINE}
    check = run(PASSTHROUGH, iommu=iommu("BOOT_IMAGE=/vmlinuz intel_iommu=on"))["kernel command line"]
    assert check == {"check": "kernel command line", "ok": False,
                     "detail": "/proc/cmdline should have intel_iommu=on iommu=pt: BOOT_IMAGE=/vmlinuz intel_iommu=on"}
    assert run(PASSTHROUGH, iommu=iommu("BOOT_IMAGE=/vmlinuz iommu=pt"))["kernel command line"]["ok"] is False
    # Without iommu_pt, intel_iommu=on alone.
    check = run(VGPU, iommu=iommu("BOOT_IMAGE=/vmlinuz intel_iommu=on"), iommu_pt=False)["kernel command line"]
    assert check == {"check": "kernel command line", "ok": True,
                     "detail": "/proc/cmdline should have intel_iommu=on: BOOT_IMAGE=/vmlinuz intel_iommu=on"}


def test_kernel_command_line_of_an_amd_host_wants_no_amd_iommu_on():
    """The kernel has no amd_iommu=on (AMD-Vi is on with the firmware's IVRS table): host_prepare writes iommu=pt alone."""
    check = run(DRA, iommu=iommu("BOOT_IMAGE=/vmlinuz iommu=pt"), cpu_vendor="amd")["kernel command line"]
    assert check == {"check": "kernel command line", "ok": True, "detail": "/proc/cmdline should have iommu=pt: BOOT_IMAGE=/vmlinuz iommu=pt"}
    assert run(DRA, iommu=iommu("BOOT_IMAGE=/vmlinuz"), cpu_vendor="amd")["kernel command line"]["ok"] is False
    check = run(DRA, iommu=iommu("BOOT_IMAGE=/vmlinuz"), cpu_vendor="amd", iommu_pt=False)["kernel command line"]
    assert check["ok"] is True and check["detail"].startswith("/proc/cmdline needs no IOMMU argument")


def test_iommu_groups():
    assert run(VGPU)["IOMMU groups"] == {"check": "IOMMU groups", "ok": True, "detail": "42 IOMMU groups"}
    assert run(VGPU, iommu=iommu(enabled=False, groups=0))["IOMMU groups"] == {
        "check": "IOMMU groups", "ok": False, "detail": "0 IOMMU groups"}


def test_boot_settings_are_not_checked_with_a_reboot_pending():
    broken = iommu(PLAIN_CMDLINE, enabled=False, groups=0)
    assert failed(run(VGPU, iommu=broken)) == ["IOMMU groups", "kernel command line"]
    checks = run(VGPU, iommu=broken, reboot_pending=True)
    assert "kernel command line" not in checks and "IOMMU groups" not in checks
    checks = run(CONTAINER, iommu=iommu(VM_CMDLINE), reboot_pending="yes")
    assert "no IOMMU arguments of a VM node" not in checks


@pytest.mark.parametrize("cmdline, ok", [
    (PLAIN_CMDLINE, True), (PLAIN_CMDLINE + " intel_iommu=on", False), (PLAIN_CMDLINE + " iommu=pt", False),
    (PLAIN_CMDLINE + " intel_iommu=off", True),
])
def test_no_iommu_arguments_of_a_vm_node(cmdline, ok):
    check = run(CONTAINER, iommu=iommu(cmdline))["no IOMMU arguments of a VM node"]
    assert check == {"check": "no IOMMU arguments of a VM node", "ok": ok,
                     "detail": "/proc/cmdline should not have intel_iommu=on or iommu=pt: " + cmdline}
    assert "no IOMMU arguments of a VM node" not in run(DRA, iommu=iommu(cmdline))


@pytest.mark.parametrize("cmdline, ok", [
    (PLAIN_CMDLINE, True), (PLAIN_CMDLINE + " iommu=pt", False), (PLAIN_CMDLINE + " iommu.passthrough=1", True),
])
def test_a_host_of_unknown_cpu_vendor_has_no_vendor_argument(cmdline, ok):
    """preflight's unknown (neither Intel nor AMD, e.g. an Arm container node): only iommu=pt is looked for."""
    checks = run(CONTAINER, iommu=iommu(cmdline), cpu_vendor="unknown")
    assert checks["no IOMMU arguments of a VM node"] == {
        "check": "no IOMMU arguments of a VM node", "ok": ok, "detail": "/proc/cmdline should not have iommu=pt: " + cmdline}


@pytest.mark.parametrize("base", [PASSTHROUGH, VGPU, DRA], ids=["vm-passthrough", "vm-vgpu", "dra"])
def test_a_node_needing_the_iommu_of_unknown_cpu_vendor_is_not_ready(base):
    """The preflight role refuses such a node; one prepared anyway fails the kernel command line check."""
    check = run(base, cpu_vendor="unknown")["kernel command line"]
    assert check == {"check": "kernel command line", "ok": False, "detail": "the CPU vendor is neither Intel nor AMD, "
                     "so this collection cannot turn the IOMMU on: " + VM_CMDLINE}


# ---------------------------------------------------------------------------------------------
# Nothing of another workload type left
# ---------------------------------------------------------------------------------------------

def test_no_vfio_pci_binding_left():
    assert run(CONTAINER)["no vfio-pci binding left"] == {
        "check": "no vfio-pci binding left", "ok": True, "detail": "GPU drivers {'0000:65:00.0': 'nvidia'}; vfio files []"}
    check = run(CONTAINER, gpus=[gpu(driver="vfio-pci")])["no vfio-pci binding left"]
    assert check == {"check": "no vfio-pci binding left", "ok": False,
                     "detail": "GPU drivers {'0000:65:00.0': 'vfio-pci'}; vfio files []"}
    check = run(VGPU, host=dict(VGPU["host"], managed_files=dict(VGPU["host"]["managed_files"], vfio_rules=RULES[:1],
                                                                 vfio_modules=MODULES[:1])))["no vfio-pci binding left"]
    assert check == {"check": "no vfio-pci binding left", "ok": False,
                     "detail": "GPU drivers {'0000:b1:00.0': 'nvidia'}; vfio files ['%s', '%s']" % (RULES[0], MODULES[0])}
    # A vfio-pci variant driver is a vfio binding too.
    assert run(VGPU, gpus=[gpu(driver="nvgrace_gpu_vfio_pci")])["no vfio-pci binding left"]["ok"] is False
    assert "no vfio-pci binding left" not in run(PASSTHROUGH)


def test_no_vgpu_devices_or_vf_records_left():
    assert run(CONTAINER)["no vGPU devices or VF records left"] == {
        "check": "no vGPU devices or VF records left", "ok": True, "detail": "mdev definitions [], SR-IOV records []"}
    check = run(CONTAINER, host=host(mdev_definitions=["/etc/gpuops/mdev-devices.conf"]))["no vGPU devices or VF records left"]
    assert check == {"check": "no vGPU devices or VF records left", "ok": False,
                     "detail": "mdev definitions ['/etc/gpuops/mdev-devices.conf'], SR-IOV records []"}
    check = run(PASSTHROUGH, host=dict(PASSTHROUGH["host"], managed_files=dict(
        PASSTHROUGH["host"]["managed_files"], sriov_definitions=["/etc/gpuops/sriov-vfs.conf"])))
    assert check["no vGPU devices or VF records left"]["ok"] is False
    assert "no vGPU devices or VF records left" not in run(VGPU)


# ---------------------------------------------------------------------------------------------
# vm-passthrough
# ---------------------------------------------------------------------------------------------

def test_gpus_on_vfio_pci():
    assert run(PASSTHROUGH)["GPUs on vfio-pci"] == {
        "check": "GPUs on vfio-pci", "ok": True, "detail": "GPU drivers {'0000:65:00.0': 'vfio-pci'}; groups viable: [True]"}
    check = run(PASSTHROUGH, gpus=[gpu(driver="nvidia", members=[member(GPU, "nvidia"), member(AUDIO, "vfio-pci")])])
    assert check["GPUs on vfio-pci"] == {"check": "GPUs on vfio-pci", "ok": False,
                                         "detail": "GPU drivers {'0000:65:00.0': 'nvidia'}; groups viable: [False]"}
    # On vfio-pci but the audio function still on its host driver: the group is not viable.
    unviable = [gpu(driver="vfio-pci", members=[member(GPU, "vfio-pci"), member(AUDIO, "snd_hda_intel")])]
    assert run(PASSTHROUGH, gpus=unviable)["GPUs on vfio-pci"]["ok"] is False
    # No GPU at all is not ready either.
    assert run(PASSTHROUGH, gpus=[])["GPUs on vfio-pci"] == {"check": "GPUs on vfio-pci", "ok": False,
                                                             "detail": "GPU drivers {}; groups viable: []"}
    # vfio_bind's driver=auto may pick a vfio-pci variant driver.
    variant = [gpu(driver="nvgrace_gpu_vfio_pci", viable=True)]
    assert run(PASSTHROUGH, gpus=variant)["GPUs on vfio-pci"]["ok"] is True


def test_gpus_on_vfio_pci_only_when_the_host_binds_them_at_the_final_stage():
    assert "GPUs on vfio-pci" not in run(PASSTHROUGH, vfio_binding="operator")
    assert "vfio boot settings" not in run(PASSTHROUGH, vfio_binding="operator")
    assert "GPUs on vfio-pci" not in run(PASSTHROUGH, stage="after-reboot")
    assert "GPUs on vfio-pci" not in run(PASSTHROUGH, reboot_pending=True)


def test_vfio_boot_settings():
    assert run(PASSTHROUGH)["vfio boot settings"] == {
        "check": "vfio boot settings", "ok": True, "detail": "vfio files %s" % (MODULES + RULES)}
    check = run(PASSTHROUGH, host=host(vfio_rules=RULES))["vfio boot settings"]
    assert check == {"check": "vfio boot settings", "ok": False, "detail": "vfio files %s" % RULES}
    # One rule for each GPU at least.
    two = [gpu(driver="vfio-pci"), gpu(GPU_B, driver="vfio-pci", members=[member(GPU_B, "vfio-pci")])]
    assert run(PASSTHROUGH, gpus=two, host=host(vfio_rules=RULES[:1], vfio_modules=MODULES))["vfio boot settings"]["ok"] is False
    assert run(PASSTHROUGH, gpus=two)["vfio boot settings"]["ok"] is True


def test_back_on_vfio_pci_after_the_reboot():
    name = "0000:65:00.0 back on vfio-pci after the reboot"
    checks = run(PASSTHROUGH, stage="after-reboot")
    assert checks[name] == {"check": name, "ok": True, "detail": "0000:65:00.0 is on vfio-pci"}
    # The audio function is in expected.vfio but is no GPU: the GPU's group viability covers it.
    assert "0000:65:00.1 back on vfio-pci after the reboot" not in checks
    checks = run(PASSTHROUGH, stage="after-reboot", gpus=[gpu(driver=None)])
    assert checks[name] == {"check": name, "ok": False, "detail": "0000:65:00.0 is on no driver"}
    checks = run(PASSTHROUGH, stage="after-reboot", gpus=[gpu(driver="nouveau")])
    assert checks[name] == {"check": name, "ok": False, "detail": "0000:65:00.0 is on nouveau"}
    assert name not in run(PASSTHROUGH)


# ---------------------------------------------------------------------------------------------
# vm-vgpu
# ---------------------------------------------------------------------------------------------

def test_vgpu_devices():
    assert run(VGPU)["vGPU devices"] == {"check": "vGPU devices", "ok": True, "detail": "missing [] of 2 expected; 2 live"}
    check = run(VGPU, host=dict(VGPU["host"], mdev_devices=[{"uuid": UUID_A}]))["vGPU devices"]
    assert check == {"check": "vGPU devices", "ok": False, "detail": "missing ['%s'] of 2 expected; 1 live" % UUID_B}
    # None expected and none live: the final readiness wants at least one; after the reboot it is enough that none is missing.
    empty = dict(VGPU["expected"], mdev_uuids=[])
    none_live = dict(VGPU["host"], mdev_devices=[])
    assert run(VGPU, expected=empty, host=none_live)["vGPU devices"] == {
        "check": "vGPU devices", "ok": False, "detail": "missing [] of 0 expected; 0 live"}
    assert run(VGPU, expected=empty, host=none_live, stage="after-reboot")["vGPU devices"]["ok"] is True
    assert "vGPU devices" not in run(VGPU, vgpu_devices="operator")


def test_missing_vgpu_devices_are_listed_in_the_order_expected():
    uuids = ["u%d" % n for n in range(9, 0, -1)]
    check = run(VGPU, expected=dict(VGPU["expected"], mdev_uuids=uuids))["vGPU devices"]
    assert check["detail"] == "missing %s of 9 expected; 2 live" % uuids


def test_sriov_vfs():
    name = "SR-IOV VFs of 0000:b1:00.0"
    assert run(VGPU)[name] == {"check": name, "ok": True, "detail": "0000:b1:00.0 has 2 VFs, 2 wanted"}
    assert run(VGPU, expected=dict(VGPU["expected"], sriov={GPU_B: "2"}))[name]["ok"] is True
    assert run(VGPU, expected=dict(VGPU["expected"], sriov={GPU_B: 4}))[name] == {
        "check": name, "ok": False, "detail": "0000:b1:00.0 has 2 VFs, 4 wanted"}
    assert run(VGPU, host=dict(VGPU["host"], sriov={}))[name] == {
        "check": name, "ok": False, "detail": "0000:b1:00.0 has 0 VFs, 2 wanted"}
    assert name not in run(VGPU, vgpu_devices="operator")


# ---------------------------------------------------------------------------------------------
# Functions given back from vfio-pci (issue 17)
# ---------------------------------------------------------------------------------------------

STRANDED = "0000:65:00.1 has driver_override=vfio-pci and no driver: it will not come back to its host driver until the override is cleared"


def test_a_stranded_function_fails():
    """After a switch away from vm-passthrough: the GPU back on nvidia, its audio function with driver_override=vfio-pci
    and no driver. No GPU is on vfio-pci, yet the host is not ready."""
    gpus = [gpu(members=[member(GPU, "nvidia"), member(AUDIO, None, "vfio-pci")])]
    checks = run(CONTAINER, gpus=gpus, iommu=iommu(PLAIN_CMDLINE), expected={"restored": {GPU: "nvidia"}})
    assert checks["no vfio-pci binding left"]["ok"] is True
    assert checks["no vfio driver_override left"] == {"check": "no vfio driver_override left", "ok": False, "detail": STRANDED}
    assert failed(checks) == ["no vfio driver_override left"]


@pytest.mark.parametrize("workload_type", ["container", "vm-vgpu"])
def test_a_stranded_gpu_and_sibling_fail_on_every_type_but_vm_passthrough_and_dra(workload_type):
    gpus = [gpu(driver=None, override="vfio-pci", members=[member(GPU, None, "vfio-pci"), member(AUDIO, None, "vfio-pci")])]
    check = run(HOSTS[workload_type], gpus=gpus)["no vfio driver_override left"]
    assert check["ok"] is False
    assert check["detail"] == STRANDED.replace(AUDIO, GPU) + "; " + STRANDED
    assert "no vfio driver_override left" not in run(PASSTHROUGH, gpus=gpus)


def test_a_dra_node_may_have_gpus_on_vfio_for_claims_but_not_this_collections_files():
    """The DRA driver binds a GPU to vfio-pci (driver_override included) while a VM's claim holds it: on a dra
    node only this collection's vfio files fail the check; what the driver did is not a leftover."""
    gpus = [gpu(driver="vfio-pci", override="vfio-pci", members=[member(GPU, "vfio-pci", "vfio-pci"), member(AUDIO, "vfio-pci")])]
    checks = run(DRA, gpus=gpus)
    assert checks["no vfio-pci binding left"]["ok"] is True
    assert "no vfio driver_override left" not in checks
    assert run(CONTAINER, gpus=gpus)["no vfio-pci binding left"]["ok"] is False
    left = run(DRA, gpus=gpus, host=host(vfio_rules=["/etc/udev/rules.d/61-gpuops-vfio-0000:65:00.0.rules"]))
    assert left["no vfio-pci binding left"]["ok"] is False


def dra_result(*blockers, **extra):
    return dict({"changed": False, "ok": not blockers, "blockers": list(blockers), "tolerated": [],
                 "stopped": [], "warnings_list": []}, **extra)


PERSISTENCED = {"kind": "nvidia-persistenced", "pid": 1234, "unit": "nvidia-persistenced.service",
                "paths": ["/dev/nvidia0", "/dev/nvidiactl"], "remedy": "stop it", "stoppable": True}
EXPORTER = {"kind": "dcgm-exporter", "pid": 3456, "unit": None, "paths": ["/run/nvidia/driver/dev/nvidia0"],
            "remedy": "label", "stoppable": False}


def dra_checks(result):
    return [c for c in host_checks([gpu()], iommu(), host(), "dra", dra_blockers=result)
            if c["check"] == "nothing holds the GPUs' device nodes"]


def test_a_dra_node_with_nothing_holding_its_gpus_passes():
    assert dra_checks(dra_result()) == [{"check": "nothing holds the GPUs' device nodes", "ok": True,
                                         "detail": "no process holds a /dev/nvidia* node that the DRA driver needs free"}]


def test_a_dra_node_with_blockers_fails_naming_them():
    [check] = dra_checks(dra_result(PERSISTENCED, EXPORTER))
    assert check["ok"] is False
    assert check["detail"] == ("nvidia-persistenced pid 1234 (nvidia-persistenced.service) holds /dev/nvidia0, "
                               "/dev/nvidiactl; dcgm-exporter pid 3456 holds /run/nvidia/driver/dev/nvidia0 "
                               "(see the dra_blockers remedies)")


def test_a_failed_dra_blockers_run_fails_the_check():
    [check] = dra_checks({"failed": True, "msg": "cannot scan the processes"})
    assert check["ok"] is False and "cannot scan the processes" in check["detail"]


@pytest.mark.parametrize("result", [None, {}, {"skipped": True, "changed": False}])
def test_no_dra_blockers_result_adds_no_check(result):
    assert dra_checks(result) == []


@pytest.mark.parametrize("workload_type", ["container", "vm-passthrough", "vm-vgpu"])
def test_the_dra_check_is_only_for_dra_nodes(workload_type):
    checks = host_checks([gpu()], iommu(), host(), workload_type, dra_blockers=dra_result(PERSISTENCED))
    assert "nothing holds the GPUs' device nodes" not in [c["check"] for c in checks]


@pytest.mark.parametrize("result", [{"blockers": "pid 1"}, {"blockers": [1]}, ["not", "a", "dict"]])
def test_a_malformed_dra_blockers_result_is_an_error(result):
    with pytest.raises(AnsibleFilterError, match="dra_blockers"):
        host_checks([gpu()], iommu(), host(), "dra", dra_blockers=result)


def test_a_vfio_override_on_a_bound_function_fails_too():
    gpus = [gpu(members=[member(GPU, "nvidia"), member(AUDIO, "snd_hda_intel", "vfio-pci"),
                         member("0000:65:00.2", "vfio-pci", "mlx5_vfio_pci")])]
    check = run(CONTAINER, gpus=gpus)["no vfio driver_override left"]
    assert check == {"check": "no vfio driver_override left", "ok": False, "detail":
                     "0000:65:00.1 has driver_override=vfio-pci while on snd_hda_intel: it will go to vfio-pci at its next probe "
                     "until the override is cleared; 0000:65:00.2 has driver_override=mlx5_vfio_pci and is on vfio-pci: it will "
                     "not go back to its host driver until the override is cleared"}


@pytest.mark.parametrize("override", [None, "", "(null)", "nvidia"])
def test_no_vfio_override(override):
    gpus = [gpu(members=[member(GPU, "nvidia", override), member(AUDIO, "snd_hda_intel")])]
    check = run(CONTAINER, gpus=gpus)["no vfio driver_override left"]
    assert check == {"check": "no vfio driver_override left", "ok": True,
                     "detail": "no GPU or function of a GPU's IOMMU group has a vfio driver_override"}


def test_restored_functions_back_on_their_drivers():
    checks = run(CONTAINER)
    assert checks["0000:65:00.0 back on nvidia"] == {"check": "0000:65:00.0 back on nvidia", "ok": True,
                                                     "detail": "0000:65:00.0 is on nvidia, no driver_override"}
    assert checks["0000:65:00.1 back on snd_hda_intel"] == {
        "check": "0000:65:00.1 back on snd_hda_intel", "ok": True, "detail": "0000:65:00.1 is on snd_hda_intel, no driver_override"}


def test_a_restored_sibling_on_no_driver_fails():
    gpus = [gpu(members=[member(GPU, "nvidia"), member(AUDIO, None, "vfio-pci")])]
    checks = run(CONTAINER, gpus=gpus)
    assert checks["0000:65:00.1 back on snd_hda_intel"] == {
        "check": "0000:65:00.1 back on snd_hda_intel", "ok": False,
        "detail": "0000:65:00.1 is on no driver, driver_override=vfio-pci; snd_hda_intel wanted, with no driver_override"}
    assert failed(checks) == ["0000:65:00.1 back on snd_hda_intel", "no vfio driver_override left"]
    # Without an override it still has no driver.
    gpus = [gpu(members=[member(GPU, "nvidia"), member(AUDIO, None)])]
    check = run(CONTAINER, gpus=gpus)["0000:65:00.1 back on snd_hda_intel"]
    assert check["ok"] is False
    assert check["detail"] == "0000:65:00.1 is on no driver, no driver_override; snd_hda_intel wanted, with no driver_override"


def test_a_restored_function_on_the_wrong_driver_fails():
    gpus = [gpu(driver="nouveau", members=[member(GPU, "nouveau"), member(AUDIO, "snd_hda_intel")])]
    check = run(CONTAINER, gpus=gpus)["0000:65:00.0 back on nvidia"]
    assert check == {"check": "0000:65:00.0 back on nvidia", "ok": False,
                     "detail": "0000:65:00.0 is on nouveau, no driver_override; nvidia wanted, with no driver_override"}
    # Still on vfio-pci: the binding check fails as well.
    gpus = [gpu(driver="vfio-pci", members=[member(GPU, "vfio-pci"), member(AUDIO, "snd_hda_intel")])]
    checks = run(VGPU, gpus=gpus, expected=dict(VGPU["expected"], restored={GPU: "nvidia"}))
    assert failed(checks) == ["0000:65:00.0 back on nvidia", "no vfio-pci binding left"]


def test_a_restored_function_on_its_driver_but_with_an_override_fails():
    gpus = [gpu(members=[member(GPU, "nvidia"), member(AUDIO, "snd_hda_intel", "snd_hda_intel")])]
    check = run(CONTAINER, gpus=gpus)["0000:65:00.1 back on snd_hda_intel"]
    assert check["ok"] is False
    assert check["detail"] == ("0000:65:00.1 is on snd_hda_intel, driver_override=snd_hda_intel; snd_hda_intel wanted, "
                               "with no driver_override")


def test_a_function_restored_to_no_driver():
    restored = {"restored": {GPU: "nvidia", AUDIO: None}}
    gpus = [gpu(members=[member(GPU, "nvidia"), member(AUDIO, None)])]
    assert run(CONTAINER, gpus=gpus, expected=restored)["0000:65:00.1 back on no driver"] == {
        "check": "0000:65:00.1 back on no driver", "ok": True, "detail": "0000:65:00.1 is on no driver, no driver_override"}
    check = run(CONTAINER, expected=restored)["0000:65:00.1 back on no driver"]
    assert check["ok"] is False and check["detail"].endswith("; no driver wanted, with no driver_override")


def test_a_missing_restored_function_fails():
    """Neither a GPU nor in a GPU's IOMMU group (no groups with the IOMMU off), and nothing read about it."""
    gpus = [gpu(members=[])]
    checks = run(CONTAINER, gpus=gpus)
    assert checks["0000:65:00.1 back on snd_hda_intel"] == {
        "check": "0000:65:00.1 back on snd_hda_intel", "ok": False,
        "detail": "0000:65:00.1 is missing: no such PCI function on this host (snd_hda_intel expected)"}
    assert checks["0000:65:00.0 back on nvidia"]["ok"] is True


@pytest.mark.parametrize("stage", ["after-reboot", "final"])
@pytest.mark.parametrize("pending", [False, True])
def test_restored_functions_are_checked_at_every_stage(stage, pending):
    gpus = [gpu(members=[member(GPU, "nvidia"), member(AUDIO, None, "vfio-pci")])]
    checks = run(CONTAINER, gpus=gpus, stage=stage, reboot_pending=pending)
    assert checks["0000:65:00.1 back on snd_hda_intel"]["ok"] is False
    assert checks["no vfio driver_override left"]["ok"] is False


def test_restored_functions_are_not_checked_on_vm_passthrough():
    checks = run(PASSTHROUGH, expected=dict(PASSTHROUGH["expected"], restored={GPU: "nvidia"}))
    assert "0000:65:00.0 back on nvidia" not in checks and failed(checks) == []


def test_all_good_after_a_switch_to_container():
    """Both functions back on their host drivers, no override, no vfio file: every check passes."""
    checks = run(CONTAINER, stage="after-reboot")
    assert failed(checks) == []
    assert checks["no vfio driver_override left"]["ok"] is True


def slurped(address, uevent=None, override=None):
    """The results of ansible.builtin.slurp of a function's uevent and driver_override (None: the read failed)."""
    results = []
    for attribute, text in (("uevent", uevent), ("driver_override", override)):
        if text is None:
            results.append({"item": [address, attribute], "failed": True, "msg": "file not found: /sys/bus/pci/devices/x"})
        else:
            results.append({"item": [address, attribute], "content": base64.b64encode(text.encode()).decode(),
                            "encoding": "base64", "source": "/sys/bus/pci/devices/%s/%s" % (address, attribute)})
    return results


def test_restored_functions_the_facts_do_not_show_are_read():
    """With the IOMMU off a GPU's IOMMU group is unknown: the role reads the audio function's uevent and driver_override."""
    gpus = [gpu(members=[])]
    uevent = "DRIVER=snd_hda_intel\nPCI_CLASS=40300\nPCI_ID=10DE:1AEF\nPCI_SLOT_NAME=0000:65:00.1\n"
    checks = run(CONTAINER, gpus=gpus, reads=slurped(AUDIO, uevent, "(null)\n"))
    assert failed(checks) == []
    assert checks["0000:65:00.1 back on snd_hda_intel"]["detail"] == "0000:65:00.1 is on snd_hda_intel, no driver_override"
    # Stranded: no DRIVER line, and the override.
    checks = run(CONTAINER, gpus=gpus, reads=slurped(AUDIO, "PCI_CLASS=40300\n", "vfio-pci\n"))
    assert failed(checks) == ["0000:65:00.1 back on snd_hda_intel", "no vfio driver_override left"]
    assert checks["no vfio driver_override left"]["detail"] == STRANDED
    # The read failed: no such function.
    checks = run(CONTAINER, gpus=gpus, reads=slurped(AUDIO))
    assert checks["0000:65:00.1 back on snd_hda_intel"]["detail"].startswith("0000:65:00.1 is missing")
    # Skipped results (the task skipped on vm-passthrough) are left out.
    assert failed(run(CONTAINER, reads=[{"item": [AUDIO, "uevent"], "skipped": True}])) == []


def test_gpu_facts_and_the_checks_together(tmp_path):
    """The facts gpu_facts gathers from a host whose A10 audio function was stranded, checked as a container node."""
    tree = st.build_gpu_host(tmp_path)
    tree.write(tree.functions[st.A10_AUDIO] + "/driver_override", "vfio-pci\n")
    os.unlink(tree.path(tree.functions[st.A10_AUDIO] + "/driver"))
    facts = gpu_facts.gather({"vendors": ["10de:2236"]}, root=tree.root)
    checks = dict((c["check"], c) for c in host_checks(
        facts["gpu_facts_gpus"], facts["gpu_facts_iommu"], facts["gpu_facts_host"], workload_type="container",
        expected={"restored": {st.A10: "nvidia", st.A10_AUDIO: "snd_hda_intel"}}, reboot_pending=True))
    assert failed(checks) == ["0000:65:00.1 back on snd_hda_intel", "no vfio driver_override left"]
    assert checks["no vfio driver_override left"]["detail"] == STRANDED


def test_expected_keys_default_to_empty():
    for expected in (None, {}, {"vfio": None, "mdev_uuids": None, "sriov": None, "restored": None}):
        assert failed(run(CONTAINER, expected=expected)) == []
    # A record of an earlier version, without restored.
    assert "0000:65:00.0 back on nvidia" not in run(CONTAINER, expected={"vfio": [], "mdev_uuids": [], "sriov": {}})


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"gpus": "0000:65:00.0"}, "expects the GPUs (gpu_facts_gpus of gpu_facts, a list of dicts)"),
    ({"gpus": [{"address": GPU}]}, "a GPU without address or driver"),
    ({"iommu": None}, "iommu (gpu_facts_iommu of gpu_facts) must be a dict"),
    ({"host": []}, "host (gpu_facts_host of gpu_facts) must be a dict"),
    ({"workload_type": "vm"}, "workload_type must be one of container, vm-passthrough, vm-vgpu, dra, got 'vm'"),
    ({"cpu_vendor": "arm"}, "cpu_vendor must be one of intel, amd, unknown, got 'arm'"),
    ({"cpu_vendor": None}, "cpu_vendor must be one of intel, amd, unknown, got None"),
    ({"stage": "before"}, "stage must be one of after-reboot, final, got 'before'"),
    ({"reboot_pending": "maybe"}, "reboot_pending must be a boolean, got 'maybe'"),
    ({"iommu_pt": None}, "iommu_pt must be a boolean, got None"),
    ({"vfio_binding": "both"}, "vfio_binding must be one of host, operator, got 'both'"),
    ({"vgpu_devices": 1}, "vgpu_devices must be one of host, operator, got 1"),
    ({"expected": ["restored"]}, "expected must be a dict"),
    ({"expected": {"restored": [AUDIO]}}, "expected.restored must be a dict"),
    ({"expected": {"vfio": GPU}}, "expected.vfio must be a list"),
    ({"expected": {"restored": {"65:00.9": "nvidia"}}}, "expected.restored: PCI address '65:00.9' is not valid"),
    ({"expected": {"restored": {AUDIO: 3}}}, "expected.restored[0000:65:00.1] must be a driver name or null, got 3"),
    ({"reads": {"results": []}}, "reads must be the results (a list of dicts) of ansible.builtin.slurp"),
    ({"reads": [{"item": AUDIO, "content": ""}]}, "reads: each result needs item [address, attribute]"),
    ({"reads": [{"item": [AUDIO, "uevent"], "content": "not base64!"}]}, "is not base64"),
    ({"gpus_optional": "maybe"}, "gpus_optional must be a boolean, got 'maybe'"),
    ({"selectors": ["10de"]}, "selectors must be a dict"),
    ({"selectors": {"vendors": "10de"}}, "selectors.vendors must be a list of IDs, got '10de'"),
])
def test_bad_input_is_an_error_naming_it(changes, message):
    with pytest.raises(AnsibleFilterError, match="^host_checks: ") as info:
        run(CONTAINER, **changes)
    assert message in str(info.value)


def test_bad_vf_count_is_an_error():
    with pytest.raises(AnsibleFilterError, match=r"expected.sriov\[0000:b1:00.0\] must be a VF count, got 'two'"):
        run(VGPU, expected=dict(VGPU["expected"], sriov={GPU_B: "two"}))


# ---------------------------------------------------------------------------------------------
# The role, for real
# ---------------------------------------------------------------------------------------------

ABSENT = "ffff:ff:1f.7"  # no host has PCI domain ffff: the role's read of it fails, and the check says it is missing


def role_play(tmp_path, hosts, fail, host_vars=None):
    """Run host_verify on local hosts, each with the facts of ``hosts`` set by set_fact and the inventory variables
    of ``host_vars`` (by host); return (rc, output, reports)."""
    inventory = {"gpu_nodes": {"hosts": dict(
        (name, dict({"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "fake": fake},
                    **(host_vars or {}).get(name, {})))
        for name, fake in hosts.items())}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "name": "host_verify", "hosts": "gpu_nodes", "gather_facts": False,
        "tasks": [
            {"name": "Set the facts gpu_facts would have gathered", "ansible.builtin.set_fact": {
                "gpu_facts_gpus": "{{ fake.gpus }}", "gpu_facts_iommu": "{{ fake.iommu }}", "gpu_facts_host": "{{ fake.host }}",
                "host_prepare_expected": "{{ fake.expected }}"}},
            {"name": "Verify", "ansible.builtin.include_role": {"name": "gpuops.sandbox.host_verify"},
             "vars": {"host_verify_refresh": False, "host_verify_fail": fail, "host_verify_workload_type": "{{ fake.workload_type }}"}},
            {"name": "Keep the report", "ansible.builtin.copy": {
                "content": "{{ host_verify_report | to_json }}", "dest": str(tmp_path) + "/{{ inventory_hostname }}.json",
                "mode": "0644"}},
        ]}]))
    rc, out = ansible_playbook("-i", tmp_path / "hosts.yml", tmp_path / "play.yml")
    reports = dict((name, json.loads((tmp_path / ("%s.json" % name)).read_text()))
                   for name in hosts if (tmp_path / ("%s.json" % name)).exists())
    return rc, out, reports


def fake(base, **changes):
    facts = copy.deepcopy(base)
    facts.update(changes)
    return facts


def test_the_role_reports_the_checks_and_fails_a_stranded_host(tmp_path):
    stranded = [gpu(members=[member(GPU, "nvidia"), member(AUDIO, None, "vfio-pci")])]
    hosts = {
        "clean": fake(CONTAINER),
        "stranded": fake(CONTAINER, gpus=stranded),
        "missing": fake(CONTAINER, expected={"vfio": [], "mdev_uuids": [], "sriov": {}, "restored": {GPU: "nvidia", ABSENT: "snd_hda_intel"}}),
        "passthrough": fake(PASSTHROUGH),
    }
    rc, out, reports = role_play(tmp_path, hosts, fail=False)
    assert rc == 0, out[-5000:]
    assert sorted(reports) == sorted(hosts), out[-5000:]
    clean = reports["clean"]
    assert sorted(clean) == ["checks", "device_plugin_config", "driver", "driver_version", "gpus", "host", "iommu_groups",
                             "mdevs", "mig_config", "ready", "reboot_pending", "stage", "vfio_probe", "workload_type"]
    # The fake facts carry no nvidia_driver and the inventory no sharing: nothing to say.
    assert (clean["driver"], clean["mig_config"], clean["device_plugin_config"]) == (None, None, None)
    assert (clean["host"], clean["workload_type"], clean["stage"], clean["ready"], clean["reboot_pending"]) == (
        "clean", "container", "final", True, False)
    assert clean["gpus"] == ["0000:65:00.0=nvidia"]
    assert clean["checks"] == host_checks(CONTAINER["gpus"], CONTAINER["iommu"], CONTAINER["host"], "container",
                                          expected=CONTAINER["expected"], selectors=DEFAULT_SELECTORS)
    assert reports["stranded"]["ready"] is False
    assert failed(dict((c["check"], c) for c in reports["stranded"]["checks"])) == [
        "0000:65:00.1 back on snd_hda_intel", "no vfio driver_override left"]
    missing = dict((c["check"], c) for c in reports["missing"]["checks"])
    assert reports["missing"]["ready"] is False
    assert missing["ffff:ff:1f.7 back on snd_hda_intel"] == {
        "check": "ffff:ff:1f.7 back on snd_hda_intel", "ok": False,
        "detail": "ffff:ff:1f.7 is missing: no such PCI function on this host (snd_hda_intel expected)"}
    assert reports["passthrough"]["ready"] is True
    assert [c["check"] for c in reports["passthrough"]["checks"]] == list(run(PASSTHROUGH))

    # host_verify_fail: the stranded host fails, naming what is wrong; the clean one does not.
    (tmp_path / "fail").mkdir()
    rc, out, reports = role_play(tmp_path / "fail", {"clean": fake(CONTAINER), "stranded": fake(CONTAINER, gpus=stranded)}, fail=True)
    assert rc != 0
    assert "stranded (container, final) is not as prepared: " + STRANDED + "; " in out, out[-5000:]
    assert sorted(reports) == ["clean"]


DEFAULT_SELECTORS = {"vendors": ["10de"], "devices": [], "classes": ["030000", "030200"]}


def test_the_role_fails_a_node_without_a_gpu_unless_its_inventory_allows_it(tmp_path):
    none = fake(CONTAINER, gpus=[], expected={})
    hosts = {"empty": none, "allowed": none, "dra-empty": fake(DRA, gpus=[])}
    host_vars = {"allowed": {"gpuops_gpus_optional": True},
                 "dra-empty": {"gpuops_gpu_vendor_ids": ["1234"], "gpuops_gpu_device_ids": ["11e8"],
                               "gpuops_gpu_class_ids": ["00ff00"]}}
    rc, out, reports = role_play(tmp_path, hosts, fail=False, host_vars=host_vars)
    assert rc == 0, out[-5000:]
    assert reports["empty"]["ready"] is False and reports["empty"]["gpus"] == []
    assert reports["allowed"]["ready"] is True
    assert reports["dra-empty"]["ready"] is False
    detail = dict((c["check"], c) for c in reports["dra-empty"]["checks"])[GPUS_CHECK]["detail"]
    assert "this dra node matches the GPU selectors (vendors 1234, devices 11e8, classes 00ff00)" in detail, detail

    # host_verify_fail: the message names the node, its type and the selectors, and what to do.
    (tmp_path / "fail").mkdir()
    rc, out, reports = role_play(tmp_path / "fail", hosts, fail=True, host_vars=host_vars)
    assert rc != 0
    assert sorted(reports) == ["allowed"], out[-5000:]
    flat = " ".join(out.split())
    assert ("empty (container, final) is not as prepared: no GPU found: no PCI function of this container node matches "
            "the GPU selectors (vendors 10de, classes 030000,030200).") in flat, out[-5000:]
    assert "or set gpuops_gpus_optional: true if the node may have no GPU" in flat


# --------------------------------------------------------------------------- other installed kernels

def kernel(version, running=False, problems=()):
    return {"version": version, "running": running, "initramfs": "/boot/initrd.img-" + version,
            "initramfs_stale": bool(problems), "entries": [], "problems": list(problems)}


@pytest.mark.parametrize("workload_type", sorted(HOSTS))
@pytest.mark.parametrize("stage", ["after-reboot", "final"])
def test_another_kernel_with_problems_fails_naming_kernel_and_problem(workload_type, stage):
    base = HOSTS[workload_type]
    stale = "initramfs /boot/initrd.img-6.1.0-20-amd64 is older than /etc/modprobe.d/gpuops-nouveau.conf"
    entry = "boot entry /boot/grub/grub.cfg entry 'Debian GNU/Linux' lacks iommu=pt"
    kernels = [kernel("6.1.0-18-amd64", running=True), kernel("6.1.0-20-amd64", problems=[stale, entry])]
    checks = run(dict(base, host=dict(base["host"], kernels=kernels)), stage=stage)
    assert failed(checks) == ["other installed kernels"]
    assert checks["other installed kernels"]["detail"] == (
        "6.1.0-20-amd64: %s; %s; run the preparation again to repair them" % (stale, entry))


def test_the_running_kernels_problems_are_left_to_the_other_checks():
    kernels = [kernel("6.1.0-18-amd64", running=True, problems=["has no initramfs (/boot/initrd.img-6.1.0-18-amd64)"]),
               kernel("6.1.0-20-amd64")]
    checks = run(dict(CONTAINER, host=dict(CONTAINER["host"], kernels=kernels)))
    assert failed(checks) == []
    assert checks["other installed kernels"]["detail"] == "6.1.0-20-amd64 boot with the collection's settings"


def test_a_host_with_one_kernel_passes():
    checks = run(dict(CONTAINER, host=dict(CONTAINER["host"], kernels=[kernel("6.1.0-18-amd64", running=True)])))
    assert checks["other installed kernels"] == {"check": "other installed kernels", "ok": True,
                                                 "detail": "no other kernel is installed"}


def test_facts_without_kernels_add_no_check():
    assert "other installed kernels" not in run(CONTAINER)


@pytest.mark.parametrize("value", ["6.1.0", [1], {"version": "x"}])
def test_kernels_of_the_wrong_type_are_named(value):
    with pytest.raises(AnsibleFilterError, match="host.kernels must be a list of dicts"):
        run(dict(CONTAINER, host=dict(CONTAINER["host"], kernels=value)))


# The host's plan (the host_plan filter, as the preflight role works it out before any change) is what host_verify
# checks the prepared host against.
def pristine_plan(workload_type="vm-passthrough", vendor="intel", **settings):
    """The plan of the PASSTHROUGH host before its preparation: its GPU and audio function on their host drivers."""
    from ansible_collections.gpuops.sandbox.plugins.filter.host_plan import host_plan

    facts = dict(iommu(PLAIN_CMDLINE, enabled=True), platform_vendor=vendor, firmware_tables=["DMAR"])
    return host_plan([gpu()], facts, host(), dict(settings, workload_type=workload_type))


def test_a_prepared_host_is_what_its_plan_said():
    plan = pristine_plan()
    assert plan["expected"]["vfio"] == [GPU, AUDIO] and plan["reboot"]["required"] is True, plan
    checks = run(PASSTHROUGH, plan=plan)
    assert failed(checks) == []
    assert checks["functions on vfio-pci as planned"]["detail"] == "%s, %s on vfio-pci, as the host's plan said" % (GPU, AUDIO)
    assert checks["kernel command line"]["detail"] == (
        "/proc/cmdline should have intel_iommu=on iommu=pt (the host's plan): " + VM_CMDLINE)


def test_a_function_of_the_plan_left_off_vfio_pci_fails():
    """The GPU reached vfio-pci but the audio function of its group, which the plan binds too, did not (or is gone)."""
    plan = pristine_plan()
    half = [gpu(driver="vfio-pci", viable=True, members=[member(GPU, "vfio-pci"), member(AUDIO, "snd_hda_intel")])]
    check = run(PASSTHROUGH, gpus=half, plan=plan)["functions on vfio-pci as planned"]
    assert check == {"check": "functions on vfio-pci as planned", "ok": False,
                     "detail": "%s is on snd_hda_intel (the host's plan binds %s, %s)" % (AUDIO, GPU, AUDIO)}
    alone = [gpu(driver="vfio-pci", members=[member(GPU, "vfio-pci")])]
    assert run(PASSTHROUGH, gpus=alone, plan=plan)["functions on vfio-pci as planned"]["detail"].startswith(
        "%s is missing" % AUDIO)
    # Not checked where the operator binds the GPUs, before the final stage or with a reboot pending.
    for changes in ({"vfio_binding": "operator"}, {"stage": "after-reboot"}, {"reboot_pending": True}):
        assert "functions on vfio-pci as planned" not in run(PASSTHROUGH, gpus=half, plan=plan, **changes)


def test_the_kernel_arguments_are_the_plans():
    """The plan's arguments, not those the cpu_vendor and iommu_pt given to host_checks would imply."""
    cmdline = "BOOT_IMAGE=/vmlinuz intel_iommu=on"
    without_pt = pristine_plan(iommu_pt=False)
    assert without_pt["expected"]["kernel_arguments"] == ["intel_iommu=on"]
    assert run(PASSTHROUGH, iommu=iommu(cmdline), plan=without_pt)["kernel command line"]["ok"] is True
    assert run(PASSTHROUGH, iommu=iommu(cmdline))["kernel command line"]["ok"] is False
    # An AMD host's plan adds iommu=pt alone; with it turned off, no argument at all.
    amd = pristine_plan(vendor="amd", iommu_pt=False)
    check = run(PASSTHROUGH, iommu=iommu("BOOT_IMAGE=/vmlinuz"), cpu_vendor="amd", plan=amd)["kernel command line"]
    assert check["ok"] is True and check["detail"].startswith("/proc/cmdline needs no IOMMU argument"), check


def test_the_vfs_of_the_plan_are_checked():
    plan = {"workload_type": "vm-vgpu", "expected": {"kernel_arguments": ["intel_iommu=on", "iommu=pt"],
                                                     "vfio": [], "sriov": {GPU_B: 4}}}
    check = run(VGPU, expected=dict(VGPU["expected"], sriov={}), plan=plan)["SR-IOV VFs of %s" % GPU_B]
    assert check == {"check": "SR-IOV VFs of %s" % GPU_B, "ok": False, "detail": "%s has 2 VFs, 4 wanted" % GPU_B}
    assert run(VGPU, plan=dict(plan, expected=dict(plan["expected"], sriov={GPU_B: 2})))["SR-IOV VFs of %s" % GPU_B]["ok"]


@pytest.mark.parametrize("plan,message", [
    ({"workload_type": "container", "expected": {}},
     "plan is the plan of a container node, but the host is checked as a vm-passthrough node"),
    ({"workload_type": "vm-passthrough"}, "plan.expected must be"),
    ({"workload_type": "vm-passthrough", "expected": {"vfio": GPU}}, "plan.expected.vfio must be a list of strings"),
    ({"workload_type": "vm-passthrough", "expected": {"vfio": ["65:00.0x"]}}, "plan.expected.vfio"),
    ({"workload_type": "vm-passthrough", "expected": {"sriov": []}}, "plan.expected.sriov must be a dict"),
    ("all", "plan must be"),
])
def test_a_plan_of_the_wrong_kind_is_named(plan, message):
    with pytest.raises(AnsibleFilterError, match=re.escape(message)):
        run(PASSTHROUGH, plan=plan)


def test_the_role_checks_the_host_against_the_preflight_roles_plan(tmp_path):
    """host_verify takes the plan the preflight role worked out (preflight_plan) by default."""
    plan = pristine_plan()
    half = [gpu(driver="vfio-pci", viable=True, members=[member(GPU, "vfio-pci"), member(AUDIO, "snd_hda_intel")])]
    hosts = {"as-planned": fake(PASSTHROUGH), "half": fake(PASSTHROUGH, gpus=half), "no-plan": fake(PASSTHROUGH, gpus=half)}
    host_vars = {"as-planned": {"preflight_plan": plan}, "half": {"preflight_plan": plan}}
    rc, out, reports = role_play(tmp_path, hosts, fail=False, host_vars=host_vars)
    assert rc == 0, out[-5000:]
    checks = {name: dict((c["check"], c) for c in report["checks"]) for name, report in reports.items()}
    assert reports["as-planned"]["ready"] is True, reports["as-planned"]
    assert checks["as-planned"]["functions on vfio-pci as planned"]["ok"] is True
    assert reports["half"]["ready"] is False
    assert failed(checks["half"]) == ["functions on vfio-pci as planned"], checks["half"]
    # Without a plan the same host passes: only the plan says the audio function goes to vfio-pci too.
    assert "functions on vfio-pci as planned" not in checks["no-plan"] and reports["no-plan"]["ready"] is True
