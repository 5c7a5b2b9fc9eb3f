# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _iommu
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st


def test_parse_cmdline_keeps_order_repeats_and_quotes():
    text = 'BOOT_IMAGE=/vmlinuz root=UUID=ab-cd ro quiet dyndbg="file x.c +p" iommu=pt iommu=off -- init=1'
    assert _iommu.parse_cmdline(text) == [
        ("BOOT_IMAGE", "/vmlinuz"), ("root", "UUID=ab-cd"), ("ro", None), ("quiet", None),
        ("dyndbg", "file x.c +p"), ("iommu", "pt"), ("iommu", "off"),
    ]
    assert _iommu.parse_cmdline("") == []
    assert _iommu.parse_cmdline('  a=""  ') == [("a", "")]


def test_parse_cmdline_keeps_the_quotes_the_kernel_keeps():
    # Only a value's (or token's) opening quote and the closing one at its end go, as in the kernel's next_arg.
    assert _iommu.parse_cmdline('vfio-pci.ids="10de:2236" dyndbg=a"b c"d') == [
        ("vfio-pci.ids", "10de:2236"), ("dyndbg", 'a"b c"d')]


def test_cmdline_flags():
    text = ("ro intel_iommu=off intel-iommu=on iommu=pt iommu.passthrough=1 amd_iommu vfio_pci.ids=10de:2236 "
            "vfio-pci.ids=10de:1aef,1234:11e8 unrelated=1")
    assert _iommu.cmdline_flags(text) == {
        "intel_iommu": "on", "iommu": "pt", "iommu.passthrough": "1", "amd_iommu": "",
        "vfio-pci.ids": ["10de:2236", "10de:1aef", "1234:11e8"],
    }
    assert _iommu.cmdline_flags("ro quiet") == {}


@pytest.mark.parametrize("cpuinfo, expected", [
    (st.CPUINFO_INTEL, {"vendor_id": "GenuineIntel", "vendor": "intel", "virt_flag": "vmx",
                        "model_name": "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"}),
    (st.CPUINFO_AMD, {"vendor_id": "AuthenticAMD", "vendor": "amd", "virt_flag": "svm",
                      "model_name": "AMD EPYC 7543 32-Core Processor"}),
    (st.CPUINFO_NO_VIRT, {"vendor_id": "GenuineIntel", "vendor": "intel", "virt_flag": None,
                          "model_name": "QEMU Virtual CPU version 2.5+"}),
    ("", {"vendor_id": None, "vendor": None, "virt_flag": None, "model_name": None}),
])
def test_cpu_info(tmp_path, cpuinfo, expected):
    tree = st.SysfsTree(tmp_path)
    tree.set_cpuinfo(cpuinfo)
    assert _iommu.cpu_info(tree.root) == expected


def test_state_iommu_on(tmp_path):
    tree = st.build_gpu_host(tmp_path)
    before = tree.snapshot()
    state = _iommu.iommu_state(tree.root)
    assert tree.snapshot() == before
    assert state == {
        "enabled": True,
        "group_count": 12,
        "firmware_tables": ["DMAR"],
        "firmware_table": "DMAR",
        "iommu_units": ["dmar0", "dmar1"],
        "iommufd": True,
        "cmdline": "BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/sda1 ro intel_iommu=on iommu=pt",
        "cmdline_flags": {"intel_iommu": "on", "iommu": "pt"},
        "cpu_vendor": "intel",
        "cpu_vendor_id": "GenuineIntel",
        "cpu_model": "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz",
        "cpu_virt_flag": "vmx",
        "cpu_virtualization": True,
        "platform_vendor": "intel",
        "problems": [],
    }


def test_state_iommu_off_on_intel_with_off_flag(tmp_path):
    tree = st.build_gpu_host(tmp_path, iommu=False, cmdline="ro intel_iommu=off")
    state = _iommu.iommu_state(tree.root)
    assert state["enabled"] is False
    assert state["group_count"] == 0
    assert state["iommu_units"] == []
    assert state["iommufd"] is False
    assert state["problems"] == [{
        "item": "iommu_groups",
        "reason": "/sys/kernel/iommu_groups is empty: the kernel has not enabled the IOMMU",
        "fix": "remove intel_iommu=off from the kernel command line, add intel_iommu=on iommu=pt to the kernel "
               "command line and reboot",
    }]


def test_state_amd_without_firmware_table_or_virt(tmp_path):
    tree = st.SysfsTree(tmp_path)
    tree.set_cpuinfo(st.CPUINFO_AMD.replace(" svm", ""))
    tree.set_cmdline("ro")
    state = _iommu.iommu_state(tree.root)
    assert state["platform_vendor"] == "amd"
    assert [p["item"] for p in state["problems"]] == ["cpu_virtualization", "firmware_table", "iommu_groups"]
    assert state["problems"][0]["fix"] == ("enable Intel VT-x or AMD-V (SVM) in the BIOS/UEFI setup (for a VM, "
                                           "expose the host CPU features to it)")
    assert state["problems"][1]["fix"] == "enable VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the BIOS/UEFI setup"
    assert state["problems"][2]["fix"] == (
        "enable the IOMMU in the BIOS/UEFI setup (named IOMMU or AMD-Vi, often next to SVM Mode) so that the firmware "
        "provides the IVRS ACPI table; add iommu=pt to the kernel command line and reboot (the kernel enables AMD-Vi "
        "by itself when the firmware provides the IVRS table; there is no amd_iommu=on)")


def test_firmware_table_decides_vendor(tmp_path):
    tree = st.SysfsTree(tmp_path)
    tree.set_iommu(table="IVRS", units=(), iommufd=False)
    assert _iommu.iommu_state(tree.root)["platform_vendor"] == "amd"


def test_unknown_vendor_fix():
    assert _iommu.kernel_argument_fix(None, {"iommu": "off"}) == (
        "remove iommu=off from the kernel command line, add iommu=pt to the kernel command line, plus intel_iommu=on "
        "on Intel, and reboot (on AMD the kernel enables AMD-Vi by itself when the firmware provides the IVRS table; "
        "there is no amd_iommu=on)")


@pytest.mark.parametrize("vendor, expected", [("intel", ["intel_iommu=on", "iommu=pt"]), ("amd", ["iommu=pt"]),
                                              (None, ["iommu=pt"])])
def test_kernel_args_to_add_never_propose_amd_iommu_on(vendor, expected):
    """amd_iommu has no 'on' value (off, force_isolation, fullflush, pgtbl_v1, ...): AMD-Vi is on by default."""
    assert _iommu.kernel_args_to_add(vendor) == expected


@pytest.mark.parametrize("flags", [{}, {"amd_iommu": "off"}, {"iommu": "off"}, {"amd_iommu": "on"}, {"intel_iommu": "off"}])
@pytest.mark.parametrize("vendor", ["amd", None, "intel"])
@pytest.mark.parametrize("tables", [None, [], ["IVRS"], ["DMAR"]])
def test_fix_never_tells_to_add_amd_iommu_on(vendor, flags, tables):
    fix = _iommu.kernel_argument_fix(vendor, flags, tables)
    assert "add amd_iommu=on" not in fix and "amd_iommu=on iommu=pt" not in fix and "or amd_iommu=on" not in fix
    assert "iommu=pt" in fix and fix.endswith(("reboot", ")"))


def test_amd_fix_depends_on_the_ivrs_table_and_the_command_line():
    firmware = _iommu.kernel_argument_fix("amd", {}, [])
    assert firmware.startswith("enable the IOMMU in the BIOS/UEFI setup (named IOMMU or AMD-Vi, often next to SVM Mode)")
    kernel = _iommu.kernel_argument_fix("amd", {}, ["IVRS"])
    assert kernel.startswith("the firmware provides the IVRS table, so check that the kernel is built with "
                             "CONFIG_AMD_IOMMU")
    removal = _iommu.kernel_argument_fix("amd", {"amd_iommu": "off", "iommu": "pt"}, ["IVRS"])
    assert removal.startswith("remove amd_iommu=off from the kernel command line, add iommu=pt to the kernel command "
                              "line and reboot")
    both = _iommu.kernel_argument_fix("amd", {"iommu": "off"}, [])
    assert both.startswith("enable the IOMMU in the BIOS/UEFI setup") and "; remove iommu=off from" in both


def test_state_amd_with_ivrs_but_no_groups(tmp_path):
    tree = st.SysfsTree(tmp_path)
    tree.set_cpuinfo(st.CPUINFO_AMD)
    tree.set_cmdline("ro amd_iommu=off")
    tree.set_iommu(table="IVRS", units=(), iommufd=False)
    state = _iommu.iommu_state(tree.root)
    assert [p["item"] for p in state["problems"]] == ["iommu_groups"]
    assert state["problems"][0]["fix"] == (
        "remove amd_iommu=off from the kernel command line, add iommu=pt to the kernel command line and reboot (the "
        "kernel enables AMD-Vi by itself when the firmware provides the IVRS table; there is no amd_iommu=on)")


def test_empty_root_reports_everything_missing(tmp_path):
    state = _iommu.iommu_state(str(tmp_path))
    assert state["enabled"] is False
    assert state["cmdline"] == ""
    assert state["firmware_table"] is None
    assert state["cpu_vendor"] is None
