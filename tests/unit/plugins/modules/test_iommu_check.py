# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from ansible_collections.gpuops.sandbox.plugins.modules import iommu_check
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import (
    assert_ends_cleanly,
    assert_fails_with,
    call_main,
    raising,
)

OPTIONS = ["addresses", "vendors", "classes", "include_all", "require_cpu_virtualization", "require_iommu",
           "require_iommufd", "require_viable"]

A10_GPU_REASON = ("0000:65:00.0 (10de:2236, class 030200) in IOMMU group 12 is bound to nvidia, not vfio-pci; "
                  "bind it to vfio-pci (or unbind it) so the group is viable")
A10_AUDIO_REASON = ("0000:65:00.1 (10de:1aef, class 040300) in IOMMU group 12 is bound to snd_hda_intel, not "
                    "vfio-pci; bind it to vfio-pci (or unbind it) so the group is viable")
VIABLE_FIX = ("fix: bind every listed function of the group (the GPU and its sibling functions such as HDMI "
              "audio) to vfio-pci, or unbind it")


@pytest.fixture
def host_off(tmp_path):
    return st.build_gpu_host(tmp_path, iommu=False, cmdline="BOOT_IMAGE=/vmlinuz ro intel_iommu=off")


def run_main(monkeypatch, root, args):
    return call_main(monkeypatch, iommu_check, root, args)


run = run_main


def test_report_on_gpu_host(monkeypatch, host):
    before = host.snapshot()
    kind, result = run(monkeypatch, host.root, {"vendors": ["10de:2236"]})
    assert host.snapshot() == before
    assert kind == "exit"
    assert result.get("changed", False) is False
    assert result["iommu_enabled"] is True
    assert result["firmware_table"] == "DMAR"
    assert result["cpu_virtualization"] is True
    assert result["iommufd"] is True
    assert result["cmdline_flags"] == {"intel_iommu": "on", "iommu": "pt"}
    assert result["iommu"]["iommu_units"] == ["dmar0", "dmar1"]
    assert result["unmet"] == []
    assert result["all_viable"] is False
    [dev] = result["devices"]
    assert dev["address"] == st.A10
    assert dev["iommu_group"] == 12
    assert [(m["address"], m["driver"]) for m in dev["members"]] == [(st.A10, "nvidia"),
                                                                     (st.A10_AUDIO, "snd_hda_intel")]
    assert dev["viable"] is False
    assert [b["reason"] for b in dev["blockers"]] == [A10_GPU_REASON, A10_AUDIO_REASON]


def test_require_viable_names_the_sibling(monkeypatch, host):
    host.bind(st.A10, "vfio-pci")
    before = host.snapshot()
    kind, result = run(monkeypatch, host.root, {"addresses": [st.A10], "require_viable": True})
    assert host.snapshot() == before
    assert kind == "fail"
    assert result["msg"] == ("passthrough viability is required but IOMMU group 12 of 0000:65:00.0 is not "
                             "viable: %s; %s" % (A10_AUDIO_REASON, VIABLE_FIX))
    assert result["unmet"] == ["require_viable"]
    assert result["devices"][0]["blockers"][0]["address"] == st.A10_AUDIO


def test_require_viable_passes_when_group_on_vfio(monkeypatch, host):
    host.bind(st.A10, "vfio-pci")
    host.bind(st.A10_AUDIO, "vfio-pci")
    kind, result = run(monkeypatch, host.root, {"vendors": ["10de:2236"], "require_viable": True,
                                                "require_iommu": True, "require_iommufd": True,
                                                "require_cpu_virtualization": True})
    assert kind == "exit"
    assert result["all_viable"] is True
    assert result["devices"][0]["viable"] is True


def test_require_viable_with_nothing_selected(monkeypatch, host):
    kind, result = run(monkeypatch, host.root, {"vendors": ["ffff"], "require_viable": True})
    assert (kind, result["msg"]) == ("fail", "passthrough viability is required but no PCI function matched the "
                                             "selection; check the addresses, vendors and classes options")


def test_iommu_off_reported_as_data(monkeypatch, host_off):
    kind, result = run(monkeypatch, host_off.root, {})
    assert kind == "exit"
    assert result["iommu_enabled"] is False
    assert result["iommufd"] is False
    assert result["cmdline_flags"] == {"intel_iommu": "off"}
    assert [p["item"] for p in result["iommu"]["problems"]] == ["iommu_groups"]
    assert all(dev["iommu_group"] is None and dev["viable"] is False for dev in result["devices"])


def test_require_iommu_when_off(monkeypatch, host_off):
    before = host_off.snapshot()
    kind, result = run(monkeypatch, host_off.root, {"require_iommu": True})
    assert host_off.snapshot() == before
    assert kind == "fail"
    assert result["msg"] == (
        "the IOMMU is required but not enabled: /sys/kernel/iommu_groups is empty; the firmware describes an "
        "IOMMU (DMAR table); fix: remove intel_iommu=off from the kernel command line, add intel_iommu=on "
        "iommu=pt to the kernel command line and reboot")
    assert result["unmet"] == ["require_iommu"]
    assert result["iommu_enabled"] is False


def test_require_iommu_without_firmware_table(monkeypatch, tmp_path):
    tree = st.build_gpu_host(tmp_path, iommu=False, cpuinfo=st.CPUINFO_AMD, cmdline="ro")
    st.os.unlink(tree.path("/sys/firmware/acpi/tables/DMAR"))
    kind, result = run(monkeypatch, tree.root, {"require_iommu": True, "require_viable": True})
    assert kind == "fail"
    fix = ("enable the IOMMU in the BIOS/UEFI setup (named IOMMU or AMD-Vi, often next to SVM Mode) so that the "
           "firmware provides the IVRS ACPI table; add iommu=pt to the kernel command line and reboot (the kernel "
           "enables AMD-Vi by itself when the firmware provides the IVRS table; there is no amd_iommu=on)")
    assert result["msg"] == (
        "the IOMMU is required but not enabled: /sys/kernel/iommu_groups is empty; no DMAR/IVRS ACPI table was "
        "found, so first enable VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the BIOS/UEFI setup; fix: %s. passthrough "
        "viability is required but the IOMMU is not enabled, so no device has an IOMMU group (0000:65:00.0, "
        "0000:b1:00.0, 0000:b1:00.4, 0000:b1:00.5, 0000:cb:00.0, 0000:cb:00.4, 0000:cb:00.5); fix: %s" % (fix, fix))
    assert result["unmet"] == ["require_iommu", "require_viable"]
    assert "amd_iommu=on " not in result["msg"] and "add amd_iommu" not in result["msg"]


@pytest.mark.parametrize("cmdline, fix", [
    ("ro", "the firmware provides the IVRS table, so check that the kernel is built with CONFIG_AMD_IOMMU and look for "
           "AMD-Vi errors in dmesg; add iommu=pt to the kernel command line and reboot (the kernel enables AMD-Vi by "
           "itself when the firmware provides the IVRS table; there is no amd_iommu=on)"),
    ("ro amd_iommu=off", "remove amd_iommu=off from the kernel command line, add iommu=pt to the kernel command line "
                         "and reboot (the kernel enables AMD-Vi by itself when the firmware provides the IVRS table; "
                         "there is no amd_iommu=on)"),
])
def test_amd_host_with_ivrs_is_never_told_amd_iommu_on(monkeypatch, tmp_path, cmdline, fix):
    """amd_iommu has no 'on' value: AMD-Vi is on by default when the firmware has the IVRS table."""
    tree = st.build_gpu_host(tmp_path, iommu=False, cpuinfo=st.CPUINFO_AMD, cmdline=cmdline)
    st.os.unlink(tree.path("/sys/firmware/acpi/tables/DMAR"))
    tree.set_iommu(table="IVRS", units=(), iommufd=False)
    kind, result = run(monkeypatch, tree.root, {"require_iommu": True})
    assert kind == "fail"
    assert result["firmware_table"] == "IVRS"
    assert result["iommu"]["platform_vendor"] == "amd"
    assert result["msg"] == ("the IOMMU is required but not enabled: /sys/kernel/iommu_groups is empty; the firmware "
                             "describes an IOMMU (IVRS table); fix: %s" % fix)
    assert [p["fix"] for p in result["iommu"]["problems"]] == [fix]


def test_require_cpu_virtualization_and_iommufd(monkeypatch, tmp_path):
    tree = st.build_lab_host(tmp_path, iommu=False)
    kind, result = run(monkeypatch, tree.root, {"require_cpu_virtualization": True, "require_iommufd": True})
    assert kind == "fail"
    assert result["msg"] == (
        "CPU virtualisation is required but the CPU shows no hardware virtualisation flag (vmx or svm) in "
        "/proc/cpuinfo; fix: enable Intel VT-x or AMD-V (SVM) in the BIOS/UEFI setup (for a VM, expose the host "
        "CPU features to it). iommufd is required but /dev/iommu does not exist; fix: use a kernel with "
        "CONFIG_IOMMUFD (6.2 or later) and load the iommufd module")
    assert result["unmet"] == ["require_cpu_virtualization", "require_iommufd"]


def test_lab_host_groups(monkeypatch, tmp_path):
    tree = st.build_lab_host(tmp_path)
    kind, result = run(monkeypatch, tree.root, {"vendors": ["1234:11e8"], "classes": ["00ff00"]})
    assert kind == "exit"
    assert [(d["address"], d["viable"]) for d in result["devices"]] == [("0000:00:03.0", False),
                                                                        ("0000:01:00.0", True)]
    assert [m["address"] for m in result["devices"][0]["members"]] == ["0000:00:03.0", "0000:00:03.1"]


@pytest.mark.parametrize("args, message", [
    ({"addresses": ["65:00"]},
     "PCI address '65:00' is not valid; expected DDDD:BB:SS.F (hex domain, bus, slot, function 0-7), "
     "e.g. 0000:65:00.0"),
    ({"addresses": ["0000:65:00.7"]},
     "PCI device 0000:65:00.7 does not exist on this host (no /sys/bus/pci/devices/0000:65:00.7)"),
    ({"vendors": ["10de:"]},
     "vendor selector '10de:' is not valid; expected VVVV or VVVV:DDDD in hex, e.g. 10de or 10de:2236"),
])
def test_bad_input(monkeypatch, host, args, message):
    before = host.snapshot()
    kind, result = run(monkeypatch, host.root, args)
    assert (kind, result["msg"]) == ("fail", message)
    assert host.snapshot() == before


def test_os_error_is_a_clean_failure(monkeypatch, host):
    monkeypatch.setattr(iommu_check, "iommu_state", raising(PermissionError(13, "Permission denied")))
    kind, result = run(monkeypatch, host.root, {})
    assert (kind, result["msg"]) == ("fail", "cannot check the IOMMU state: [Errno 13] Permission denied")


def test_a_bug_is_a_message_not_a_traceback(monkeypatch, host):
    monkeypatch.setattr(iommu_check, "device_viability", raising(KeyError("members")))
    kind, result = run(monkeypatch, host.root, {})
    assert kind == "fail" and result["changed"] is False
    assert "failed unexpectedly (KeyError: 'members'); please report this" in result["msg"]


def test_failure_keeps_the_report_as_result_keys(monkeypatch, host_off):
    kind, result = run(monkeypatch, host_off.root, {"require_iommu": True, "vendors": ["10de:2236"]})
    assert kind == "fail" and result["changed"] is False
    assert result["iommu"]["problems"][0]["item"] == "iommu_groups"
    assert [dev["address"] for dev in result["devices"]] == [st.A10]
    assert result["all_viable"] is False and result["iommu_enabled"] is False


def test_main_runs_in_check_mode(monkeypatch, host):
    kind, result = run_main(monkeypatch, host.root, {"_ansible_check_mode": True, "require_iommu": True})
    assert kind == "exit"
    assert result.get("changed", False) is False


@pytest.mark.parametrize("args, fragments", [
    ({"require_viable": "sometimes"}, ["require_viable", "sometimes", "bool"]),
    ({"addresses": [st.A10], "classes": ["03"]}, ["parameters are mutually exclusive: addresses|classes"]),
    ({"addresses": [st.A10], "include_all": True}, ["parameters are mutually exclusive: addresses|include_all"]),
    ({"fail_on_missing": True}, ["Unsupported parameters", "fail_on_missing"]),
])
def test_main_argument_errors(monkeypatch, host, args, fragments):
    assert_fails_with(*run_main(monkeypatch, host.root, args), fragments)


_ARGS, _TYPED_ARGS = st.selector_fuzz_args(OPTIONS, ["10de", "10de:2236", st.A10, st.A10_AUDIO, "bb:00.0", "030200", "true", "off", ""], max_size=5)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=_ARGS)
def test_fuzz_every_input_ends_in_exit_or_fail(monkeypatch, fuzz_root, args):
    kind, result = run_main(monkeypatch, fuzz_root, args)
    assert_ends_cleanly(kind, result)
    assert result.get("changed", False) is False
