# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Module tests for vfio_bind on fake hosts shaped like real ones, with a simulated kernel (VfioKernel)."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest
from ansible.release import __version__ as ANSIBLE_VERSION
from ansible.module_utils import basic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ansible_collections.gpuops.sandbox.plugins.module_utils import _persist, _sysfs, _vfio
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import TIMEOUTS_OUT_OF_BOUNDS
from ansible_collections.gpuops.sandbox.tests.unit.fakes.vfio_bind_host import RELEASE, make_host, run

# The ansible-core running the tests (make test-cores runs them on each claimed one).
CORE = tuple(int(part) for part in ANSIBLE_VERSION.split(".")[:2])

A10_RULE = "/etc/udev/rules.d/61-gpuops-vfio-0000:65:00.0.rules"
AUDIO_RULE = "/etc/udev/rules.d/61-gpuops-vfio-0000:65:00.1.rules"
A10_RECORD = "/var/lib/gpuops/vfio_bind/0000:65:00.0.json"
AUDIO_RECORD = "/var/lib/gpuops/vfio_bind/0000:65:00.1.json"
LAB_EDU = "0000:01:00.0"
LAB_EDU_GROUPED = "0000:00:03.0"
LAB_HDA = "0000:00:03.1"
LAB_VGA = "0000:00:01.0"
LAB_ARGS = {"vendors": ["1234:11e8"], "classes": ["00ff00"]}


@pytest.fixture(autouse=True)
def fast_clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(_sysfs, "_monotonic", lambda: now[0])
    monkeypatch.setattr(_sysfs, "_sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))


@pytest.fixture
def host(tmp_path, monkeypatch):
    return make_host(monkeypatch, st.build_vfio_gpu_host(tmp_path, RELEASE))


@pytest.fixture
def busy_host(tmp_path, monkeypatch):
    return make_host(monkeypatch, st.build_vfio_gpu_host(tmp_path, RELEASE, holders=True))


@pytest.fixture
def lab(tmp_path, monkeypatch):
    return make_host(monkeypatch, st.build_vfio_lab_host(tmp_path, RELEASE))


def run_unchanged(monkeypatch, host_pair, args, check):
    """Run the module and check neither the tree nor the kernel saw a write (only dry-run modprobes)."""
    tree, kernel = host_pair
    before = tree.snapshot()
    outcome = run(monkeypatch, host_pair, args, check=check)
    assert tree.snapshot() == before and kernel.writes == []
    assert [argv for argv, _env in kernel.commands if "--dry-run" not in argv] == []
    return outcome


def assert_refused(monkeypatch, host_pair, args, msg):
    """The module fails with exactly ``msg``, in check mode and out of it, and neither the tree nor the kernel saw a
    write."""
    for check in (True, False):
        kind, result = run_unchanged(monkeypatch, host_pair, args, check=check)
        assert kind == "fail", result
        assert result["msg"] == msg


def drivers(kernel, *addresses):
    return [kernel.driver(a) for a in addresses]


# ---------------------------------------------------------------------------------------------
# The normal sequence
# ---------------------------------------------------------------------------------------------

def test_check_run_check_run_then_absent(monkeypatch, host):
    tree, kernel = host
    args = {"include_group": True, "addresses": [st.A10], "persistent": True}
    before = tree.snapshot()
    kind, result = run(monkeypatch, host, args, check=True, diff=True)
    assert kind == "exit" and result["changed"] is True
    assert tree.snapshot() == before and kernel.writes == []
    assert [(d["address"], d["role"], d["before"], d["after"], d["changed"]) for d in result["devices"]] == [
        (st.A10, "selected", "nvidia", "vfio-pci", True), (st.A10_AUDIO, "group", "snd_hda_intel", "vfio-pci", True)]
    assert result["diff"][0] == {
        "before_header": "drivers", "after_header": "drivers",
        "before": "0000:65:00.0: nvidia\n0000:65:00.1: snd_hda_intel\n",
        "after": "0000:65:00.0: vfio-pci\n0000:65:00.1: vfio-pci\n"}
    assert [d["after_header"] for d in result["diff"][1:]] == [A10_RECORD, A10_RULE, AUDIO_RECORD, AUDIO_RULE]
    assert result["diff"][2]["before"] == "" and 'KERNEL=="0000:65:00.0"' in result["diff"][2]["after"]
    assert result["persistent_files"] == [A10_RULE, AUDIO_RULE]
    assert result["reboot_required"] is False

    kind, result = run(monkeypatch, host, args)
    assert kind == "exit" and result["changed"] is True
    assert drivers(kernel, st.A10, st.A10_AUDIO) == ["vfio-pci", "vfio-pci"]
    assert [(d["before"], d["after"]) for d in result["devices"]] == [("nvidia", "vfio-pci"),
                                                                      ("snd_hda_intel", "vfio-pci")]
    assert os.path.exists(tree.path("/dev/vfio/12"))
    assert result["files_changed"] == [A10_RECORD, A10_RULE, AUDIO_RECORD, AUDIO_RULE]
    for path in result["files_changed"]:
        assert stat.S_IMODE(os.stat(tree.path(path)).st_mode) == 0o644
    assert json.loads(tree.read(A10_RECORD))["driver"] == "nvidia"
    assert json.loads(tree.read(AUDIO_RECORD))["driver"] == "snd_hda_intel"
    assert [name for name in os.listdir(tree.path("/etc/udev/rules.d")) if name.startswith(".")] == []

    kernel.writes.clear()
    after_first = tree.snapshot()
    for check in (True, False):
        kind, result = run(monkeypatch, host, args, check=check)
        assert kind == "exit" and result["changed"] is False
        assert [d["changed"] for d in result["devices"]] == [False, False]
    assert kernel.writes == [] and tree.snapshot() == after_first

    absent = {"state": "absent", "addresses": [st.A10], "include_group": True}
    kind, result = run(monkeypatch, host, absent, check=True)
    assert kind == "exit" and result["changed"] is True and kernel.writes == []
    assert [(d["before"], d["after"]) for d in result["devices"]] == [("vfio-pci", "nvidia"),
                                                                      ("vfio-pci", "snd_hda_intel")]
    kind, result = run(monkeypatch, host, absent)
    assert kind == "exit" and result["changed"] is True
    assert drivers(kernel, st.A10, st.A10_AUDIO) == ["nvidia", "snd_hda_intel"]
    assert [kernel.override(a) for a in (st.A10, st.A10_AUDIO)] == [None, None]
    assert result["persistent_files"] == [] and result["record_files"] == []
    for path in (A10_RULE, AUDIO_RULE, A10_RECORD, AUDIO_RECORD):
        assert not os.path.exists(tree.path(path))
    assert not os.path.exists(tree.path("/dev/vfio/12"))
    kernel.writes.clear()
    kind, result = run(monkeypatch, host, absent)
    assert kind == "exit" and result["changed"] is False and kernel.writes == []


def test_defaults_select_the_nvidia_gpus(monkeypatch, host):
    _tree, _kernel = host
    kind, result = run(monkeypatch, host, {"include_group": True}, check=True)
    # The A100 PF has VFs and the L40S VFs use the vendor vGPU interface: refused, all at once.
    assert kind == "fail"
    assert "0000:b1:00.0 is an SR-IOV physical function with 2 VFs enabled" in result["msg"]
    assert "0000:cb:00.4 offers NVIDIA vendor-specific vGPU types" in result["msg"]


def test_not_persistent_leaves_rules_alone_and_absent_without_record_probes(monkeypatch, host):
    tree, kernel = host
    kind, result = run(monkeypatch, host, {"addresses": [st.A10, st.A10_AUDIO],
                                           "allowed_drivers": ["nvidia", "snd_hda_intel"]})
    assert kind == "exit" and result["changed"] and result["persistent_files"] == []
    assert result["record_files"] == [A10_RECORD, AUDIO_RECORD]
    os.unlink(tree.path(AUDIO_RECORD))
    kind, result = run(monkeypatch, host, {"addresses": [st.A10_AUDIO], "state": "absent"})
    assert kind == "exit" and result["changed"]
    assert ("/sys/bus/pci/drivers_probe", st.A10_AUDIO) in kernel.writes
    assert kernel.driver(st.A10_AUDIO) == "snd_hda_intel"


def test_absent_after_reboot_removes_stale_files_only(monkeypatch, host):
    tree, kernel = host
    run(monkeypatch, host, {"addresses": [st.A10], "include_group": True, "persistent": True})
    # A reboot without the rules taking effect: both functions are back on their host drivers.
    for address, driver in ((st.A10, "nvidia"), (st.A10_AUDIO, "snd_hda_intel")):
        kernel.do_unbind(address, "vfio-pci", "x", "x")
        kernel.write(tree.path("/sys/bus/pci/devices/%s/driver_override" % address), "\n")
        kernel.do_bind(address, driver, "x", "x")
    kernel.writes.clear()
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "include_group": True, "state": "absent"})
    assert kind == "exit" and result["changed"] is True
    assert kernel.writes == []
    assert result["files_changed"] == [A10_RECORD, A10_RULE, AUDIO_RECORD, AUDIO_RULE]


def test_variant_driver_is_loaded_and_used(monkeypatch, tmp_path):
    tree = st.build_vfio_gpu_host(tmp_path, RELEASE)
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT
                         + "alias vfio_pci:v000010DEd00002236sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci\n")
    pair = make_host(monkeypatch, tree, modules=("vfio_pci", "nvgrace_gpu_vfio_pci"))
    kernel = pair[1]
    kind, result = run(monkeypatch, pair, {"addresses": [st.A10], "include_group": True}, check=True)
    assert kind == "exit" and result["loaded_modules"] == ["nvgrace_gpu_vfio_pci"]
    assert [argv for argv, _env in kernel.commands] == [["/usr/sbin/modprobe", "--dry-run", "nvgrace_gpu_vfio_pci"]]
    assert not os.path.isdir(tree.path("/sys/bus/pci/drivers/nvgrace_gpu_vfio_pci"))
    kind, result = run(monkeypatch, pair, {"addresses": [st.A10], "include_group": True})
    assert kind == "exit", result
    assert kernel.commands[-1] == (["/usr/sbin/modprobe", "nvgrace_gpu_vfio_pci"], {"LC_ALL": "C"})
    assert kernel.full_commands[-1] == ["/usr/sbin/timeout", "--kill-after=10", "60", "/usr/sbin/modprobe",
                                        "nvgrace_gpu_vfio_pci"]
    assert drivers(kernel, st.A10, st.A10_AUDIO) == ["nvgrace_gpu_vfio_pci", "vfio-pci"]


def test_lab_sequence_like_the_integration_target(monkeypatch, lab):
    tree, kernel = lab
    lone = {"addresses": [LAB_EDU]}
    kind, result = run(monkeypatch, lab, lone, check=True)
    assert kind == "exit" and result["changed"] and result["loaded_modules"] == ["vfio_pci"]
    assert not os.path.isdir(tree.path("/sys/bus/pci/drivers/vfio-pci"))
    kind, result = run(monkeypatch, lab, lone)
    assert kind == "exit" and result["changed"] and kernel.driver(LAB_EDU) == "vfio-pci"
    assert os.path.exists(tree.path("/dev/vfio/5"))
    for check in (True, False):
        kind, result = run(monkeypatch, lab, lone, check=check)
        assert kind == "exit" and not result["changed"]
    # Selecting both edu functions by vendor and class: the grouped one has the HDA beside it.
    kind, result = run(monkeypatch, lab, LAB_ARGS)
    assert kind == "fail" and result["msg"] == (
        "refusing to change anything: IOMMU group 3 of 0000:00:03.0 is not viable for passthrough: 0000:00:03.1 is "
        "bound to snd_hda_intel; set include_group=true to bind the other functions of the group too")
    kind, result = run(monkeypatch, lab, dict(LAB_ARGS, include_group=True))
    assert kind == "exit" and result["changed"]
    assert drivers(kernel, LAB_EDU, LAB_EDU_GROUPED, LAB_HDA) == ["vfio-pci"] * 3
    # A process holds the group open: absent refuses, naming it.
    tree.add_process(4242, "python3", {3: "/dev/vfio/3"})
    absent = dict(LAB_ARGS, state="absent", include_group=True)
    before = tree.snapshot()
    kernel.writes.clear()
    kind, result = run(monkeypatch, lab, absent)
    assert kind == "fail" and result["msg"] == (
        "refusing to change anything: 0000:00:03.0 is in use (driver vfio-pci): pid 4242 (python3) holds /dev/vfio/3; "
        "stop these processes first (this module never stops or kills anything); 0000:00:03.1 is in use (driver "
        "vfio-pci): pid 4242 (python3) holds /dev/vfio/3; stop these processes first (this module never stops or "
        "kills anything)")
    assert tree.snapshot() == before and kernel.writes == []
    st.remove_process(tree, 4242)
    kind, result = run(monkeypatch, lab, absent)
    assert kind == "exit" and result["changed"]
    assert drivers(kernel, LAB_EDU, LAB_EDU_GROUPED, LAB_HDA) == [None, None, "snd_hda_intel"]
    kind, result = run(monkeypatch, lab, absent)
    assert kind == "exit" and not result["changed"]


# ---------------------------------------------------------------------------------------------
# Refusals (RELIABILITY cases 1, 2, 7-11): exact message, nothing written
# ---------------------------------------------------------------------------------------------

def test_bad_address(monkeypatch, host):
    assert_refused(monkeypatch, host, {"addresses": ["0000:65:00.9"]},
                   "PCI address '0000:65:00.9' is not valid; expected DDDD:BB:SS.F (hex domain, bus, slot, "
                   "function 0-7), e.g. 0000:65:00.0")


def test_missing_address(monkeypatch, host):
    assert_refused(monkeypatch, host, {"addresses": ["0000:99:00.0"]},
                   "PCI device 0000:99:00.0 does not exist on this host (no /sys/bus/pci/devices/0000:99:00.0)")


def test_nothing_matches(monkeypatch, host):
    assert_refused(monkeypatch, host, {"vendors": ["abcd"]},
                   "no PCI function matches vendors abcd and classes 030000, 030200; nothing to bind")


def test_vfio_pci_module_missing(monkeypatch, lab):
    _tree, kernel = lab
    kernel.modules.clear()
    msg_tail = ("failed (rc=1): modprobe: FATAL: Module vfio_pci not found in directory /lib/modules/%s; nothing was "
                "changed" % RELEASE)
    tree = lab[0]
    before = tree.snapshot()
    kind, result = run(monkeypatch, lab, {"addresses": [LAB_EDU]}, check=True)
    assert kind == "fail" and result["msg"] == (
        "kernel module vfio_pci (driver vfio-pci) cannot be loaded: /usr/sbin/modprobe --dry-run vfio_pci " + msg_tail)
    kind, result = run(monkeypatch, lab, {"addresses": [LAB_EDU]})
    assert kind == "fail" and result["msg"] == (
        "kernel module vfio_pci (driver vfio-pci) cannot be loaded: /usr/sbin/modprobe vfio_pci " + msg_tail)
    assert tree.snapshot() == before and kernel.writes == []
    assert kernel.commands[-1] == (["/usr/sbin/modprobe", "vfio_pci"], {"LC_ALL": "C"})


def test_modprobe_that_hangs_is_told_as_out_of_time(monkeypatch, lab):
    tree, kernel = lab
    kernel.hang.add("vfio_pci")
    before = tree.snapshot()
    kind, result = run(monkeypatch, lab, {"addresses": [LAB_EDU]})
    assert kind == "fail" and result["msg"] == (
        "kernel module vfio_pci (driver vfio-pci) cannot be loaded: /usr/sbin/modprobe vfio_pci failed (rc=-9): "
        "/usr/sbin/modprobe did not finish within 60 seconds (the module's limit for modprobe); nothing was changed")
    assert tree.snapshot() == before and kernel.writes == []


def test_holders_of_nvidia_device(monkeypatch, busy_host):
    assert_refused(monkeypatch, busy_host, {"addresses": [st.A10], "include_group": True},
                   "refusing to change anything: 0000:65:00.0 is in use (driver nvidia): pid 1234 (nvidia-persiste) "
                   "holds /dev/nvidia0, pid 2345 (nv-hostengine) holds /dev/nvidia0; stop these processes first (this "
                   "module never stops or kills anything)")


def test_holders_of_vfio_group_on_absent(monkeypatch, busy_host):
    tree, kernel = busy_host
    for address in (st.A10, st.A10_AUDIO):
        kernel.do_unbind(address, kernel.driver(address), "x", "x")
        kernel.do_bind(address, "vfio-pci", "x", "x")
    kernel.writes.clear()
    assert_refused(monkeypatch, busy_host, {"addresses": [st.A10], "state": "absent"},
                   "refusing to change anything: 0000:65:00.0 is in use (driver vfio-pci): pid 3456 (qemu-kvm) holds "
                   "/dev/vfio/12; stop these processes first (this module never stops or kills anything)")


def test_unviable_group_without_include_group(monkeypatch, host):
    assert_refused(monkeypatch, host, {"addresses": [st.A10]},
                   "refusing to change anything: IOMMU group 12 of 0000:65:00.0 is not viable for passthrough: "
                   "0000:65:00.1 is bound to snd_hda_intel; set include_group=true to bind the other functions of the "
                   "group too")


def test_boot_vga_protected_unless_forced(monkeypatch, host):
    tree, kernel = host
    tree.write(tree.functions[st.A10] + "/boot_vga", "1\n")
    args = {"addresses": [st.A10], "include_group": True}
    assert_refused(monkeypatch, host, args,
                   "refusing to change anything: 0000:65:00.0 is the boot VGA device (the console the firmware set "
                   "up); set force_boot_vga=true to bind it anyway")
    kind, result = run(monkeypatch, host, dict(args, force_boot_vga=True))
    assert kind == "exit" and result["changed"] and kernel.driver(st.A10) == "vfio-pci"


def test_unexpected_current_driver(monkeypatch, host):
    tree, kernel = host
    args = {"addresses": [st.BMC_VGA], "force_boot_vga": True}
    assert_refused(monkeypatch, host, args,
                   "refusing to change anything: 0000:02:00.0 is bound to ast, which is not in allowed_drivers "
                   "(nvidia, nouveau, vfio-pci, none); add ast to allowed_drivers to bind it anyway")
    assert_refused(monkeypatch, host, {"addresses": [st.BMC_VGA]},
                   "refusing to change anything: 0000:02:00.0 is the boot VGA device (the console the firmware set "
                   "up); set force_boot_vga=true to bind it anyway; 0000:02:00.0 is bound to ast, which is not in "
                   "allowed_drivers (nvidia, nouveau, vfio-pci, none); add ast to allowed_drivers to bind it "
                   "anyway")
    kind, result = run(monkeypatch, host, dict(args, allowed_drivers=["ast"]))
    assert kind == "exit" and kernel.driver(st.BMC_VGA) == "vfio-pci"
    assert tree.read(tree.functions[st.BMC_VGA] + "/driver_override") == "vfio-pci"


def test_pf_with_vfs(monkeypatch, busy_host):
    assert_refused(monkeypatch, busy_host, {"addresses": [st.A100]},
                   "refusing to change anything: 0000:b1:00.0 is an SR-IOV physical function with 2 VFs enabled; a PF "
                   "with VFs cannot be passed through: disable them first (sriov_numvfs=0, e.g. "
                   "gpuops.sandbox.sriov_vfs with state=absent)")


def test_lab_boot_vga_and_nvme_pf(monkeypatch, lab):
    assert_refused(monkeypatch, lab, {"addresses": ["0000:02:00.0"]},
                   "refusing to change anything: 0000:02:00.0 is bound to nvme, which is not in allowed_drivers "
                   "(nvidia, nouveau, vfio-pci, none); add nvme to allowed_drivers to bind it anyway")
    assert_refused(monkeypatch, lab, {"addresses": [LAB_VGA]},
                   "refusing to change anything: 0000:00:01.0 is the boot VGA device (the console the firmware set "
                   "up); set force_boot_vga=true to bind it anyway; 0000:00:01.0 is bound to bochs-drm, which is not "
                   "in allowed_drivers (nvidia, nouveau, vfio-pci, none); add bochs-drm to allowed_drivers "
                   "to bind it anyway")


@pytest.mark.parametrize("args, msg", [
    ({"addresses": [st.A10], "timeout": -1}, "timeout must be 0 or a positive number of seconds, got -1"),
    ({"addresses": [st.A10], "driver": "nvidia"},
     "driver 'nvidia' is not a vfio driver; use auto, vfio-pci or a variant driver whose name ends in _vfio_pci "
     "(e.g. nvgrace_gpu_vfio_pci)"),
    ({"addresses": [st.A10], "allowed_drivers": ["nvidia", "$(reboot)"]},
     "allowed_drivers entry '$(reboot)' is not a driver name (letters, digits, '_', '-', '.'; e.g. nvidia, or none "
     "for a function without a driver)"),
    ({"addresses": [st.A10], "vendors": ["10de"]}, "parameters are mutually exclusive: addresses|vendors"),
    ({"state": "bound"}, "value of state must be one of: present, absent, got: bound"),
    ({"addresses": []}, "addresses must list at least one PCI address (omit it to select by vendors and classes)"),
])
def test_argument_errors(monkeypatch, host, args, msg):
    assert_refused(monkeypatch, host, args, msg)


# ---------------------------------------------------------------------------------------------
# Predicting before the IOMMU is on: the functions of the GPU's slot stand in for its group
# ---------------------------------------------------------------------------------------------

SLOT_NO_GROUP = ("refusing to change anything: 0000:01:00.0 has no IOMMU group: the IOMMU is off, so vfio-pci could "
                 "not give it to a VM; enable VT-d/AMD-Vi in the firmware, and on Intel boot with intel_iommu=on (see "
                 "gpuops.sandbox.iommu_check)")
SLOT_USB_REFUSED = (
    "refusing to change anything: 0000:01:00.2 (8086:2934, class 0c0300) is in the PCI slot of 0000:01:00.0, so it "
    "will most likely share its IOMMU group once the IOMMU is on and go to vfio-pci with it, but it is bound to "
    "uhci_hcd, which is not in allowed_drivers or allowed_group_drivers (nvidia, nouveau, vfio-pci, none, "
    "snd_hda_intel, xhci_hcd, nvidia-gpu, ucsi_ccg); add uhci_hcd to allowed_group_drivers to give the function to "
    "vfio-pci with 0000:01:00.0, or unbind or disable the function (e.g. in the firmware setup)")


@pytest.fixture
def slot_host(tmp_path, monkeypatch):
    return make_host(monkeypatch, st.build_vfio_slot_host(tmp_path, RELEASE))


def test_slot_prediction_refuses_a_sibling_on_a_driver_not_allowed(monkeypatch, slot_host):
    """The defect: with the IOMMU off nothing was checked, and the USB function refused only after the reboot."""
    args = {"include_group": True, "persistent": True, "assume_slot_groups": True}
    kind, result = run_unchanged(monkeypatch, slot_host, args, check=True)
    assert kind == "fail" and result["msg"] == SLOT_USB_REFUSED


def test_slot_prediction_plans_the_whole_slot_with_the_driver_allowed(monkeypatch, slot_host):
    args = {"include_group": True, "persistent": True, "assume_slot_groups": True,
            "allowed_group_drivers": list(_vfio.DEFAULT_ALLOWED_GROUP_DRIVERS) + ["uhci_hcd"]}
    kind, result = run_unchanged(monkeypatch, slot_host, args, check=True)
    assert kind == "exit" and result["changed"] is True, result
    assert [(d["address"], d["role"], d["iommu_group"], d["before"], d["after"], d["changed"])
            for d in result["devices"]] == [
        (st.SLOT_GPU, "selected", None, "nvidia", "vfio-pci", True),
        (st.SLOT_AUDIO, "group", None, "snd_hda_intel", "vfio-pci", True),
        (st.SLOT_USB, "group", None, "uhci_hcd", "vfio-pci", True)]
    assert result["persistent_files"] == ["/etc/udev/rules.d/61-gpuops-vfio-%s.rules" % a
                                          for a in (st.SLOT_GPU, st.SLOT_AUDIO, st.SLOT_USB)]


def test_slot_prediction_without_include_group_names_the_unviable_slot(monkeypatch, slot_host):
    kind, result = run_unchanged(monkeypatch, slot_host, {"assume_slot_groups": True}, check=True)
    assert kind == "fail" and result["msg"] == (
        "refusing to change anything: the PCI slot of 0000:01:00.0, whose functions will most likely share its IOMMU "
        "group once the IOMMU is on, would not be viable for passthrough: 0000:01:00.1 is bound to snd_hda_intel, "
        "0000:01:00.2 is bound to uhci_hcd; set include_group=true to bind the other functions of the slot too")


def test_without_slot_prediction_a_function_without_group_is_refused_as_before(monkeypatch, slot_host):
    for args in ({"include_group": True}, {"include_group": True, "assume_slot_groups": False}):
        assert_refused(monkeypatch, slot_host, args, SLOT_NO_GROUP)


@pytest.mark.parametrize("args, check, msg", [
    ({"include_group": True, "assume_slot_groups": True}, False,
     "assume_slot_groups=true only predicts the binding of a host whose IOMMU is not on yet; use it in check mode "
     "(check_mode: true), and bind without it once the IOMMU is on; nothing was changed"),
    ({"include_group": True, "assume_slot_groups": True, "state": "absent"}, True,
     "assume_slot_groups=true applies to state=present only; nothing was changed"),
])
def test_slot_prediction_is_refused_outside_check_mode(monkeypatch, slot_host, args, check, msg):
    kind, result = run_unchanged(monkeypatch, slot_host, args, check=check)
    assert kind == "fail" and result["msg"] == msg
    assert slot_host[1].commands == []


def test_slot_prediction_changes_nothing_once_the_iommu_is_on(monkeypatch, host):
    """With IOMMU groups the real group decides: the A10's audio is planned, nothing of its slot is guessed."""
    args = {"addresses": [st.A10], "include_group": True}
    _kind, plain = run(monkeypatch, host, args, check=True)
    kind, predicted = run(monkeypatch, host, dict(args, assume_slot_groups=True), check=True)
    assert kind == "exit" and predicted == plain


# ---------------------------------------------------------------------------------------------
# Failures while changing (RELIABILITY cases 15, 16, 18, 19)
# ---------------------------------------------------------------------------------------------

def test_bind_failure_rolls_back_all_functions(monkeypatch, host):
    tree, kernel = host
    before = tree.snapshot()
    real_bind = kernel.do_bind

    def refuse_audio(address, driver, rel, value):
        if address == st.A10_AUDIO and driver == "vfio-pci":
            raise kernel._error(rel, value, errno.ENODEV)
        return real_bind(address, driver, rel, value)

    kernel.do_bind = refuse_audio
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "include_group": True, "persistent": True})
    assert kind == "fail"
    assert result["msg"] == (
        "binding 0000:65:00.1 to vfio-pci failed: writing '0000:65:00.1' to /sys/bus/pci/drivers/vfio-pci/bind failed: "
        "No such device; rolled back: 0000:65:00.1 back on snd_hda_intel; 0000:65:00.0 back on nvidia")
    assert result["rollback"] == ["0000:65:00.1 back on snd_hda_intel", "0000:65:00.0 back on nvidia"]
    assert drivers(kernel, st.A10, st.A10_AUDIO) == ["nvidia", "snd_hda_intel"]
    # Sysfs is back as it was (driver_override "(null)" again) and no record or rule was written.
    assert tree.snapshot().keys() == before.keys()
    assert not os.path.exists(tree.path("/etc/udev")) and not os.path.exists(tree.path("/var/lib/gpuops"))
    assert kernel.writes[-2:] == [("/sys/bus/pci/devices/0000:65:00.0/driver_override", ""),
                                  ("/sys/bus/pci/drivers/nvidia/bind", st.A10)]


def test_file_write_failure_rolls_back_the_live_change(monkeypatch, host):
    tree, kernel = host
    real = _persist.write_text

    def failing(module, root, path, content, **kwargs):
        if path == AUDIO_RULE:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(module, root, path, content, **kwargs)

    monkeypatch.setattr(_persist, "write_text", failing)
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "include_group": True, "persistent": True})
    assert kind == "fail"
    assert result["msg"] == (
        "writing %s failed: [Errno 28] No space left on device (after the drivers were changed); rolled back: "
        "0000:65:00.1 back on snd_hda_intel; 0000:65:00.0 back on nvidia" % AUDIO_RULE)
    assert drivers(kernel, st.A10, st.A10_AUDIO) == ["nvidia", "snd_hda_intel"]
    for path in (A10_RECORD, A10_RULE, AUDIO_RECORD, AUDIO_RULE):
        assert not os.path.exists(tree.path(path))


def test_restore_failure_rolls_back_to_vfio(monkeypatch, host):
    tree, kernel = host
    run(monkeypatch, host, {"addresses": [st.A10], "include_group": True})
    kernel.refuse["/sys/bus/pci/drivers/snd_hda_intel/bind"] = errno.EIO
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "include_group": True, "state": "absent"})
    assert kind == "fail"
    assert result["msg"] == (
        "restoring 0000:65:00.1 failed: writing '0000:65:00.1' to /sys/bus/pci/drivers/snd_hda_intel/bind failed: "
        "Input/output error; rolled back: 0000:65:00.1 back on vfio-pci; 0000:65:00.0 back on vfio-pci")
    assert drivers(kernel, st.A10, st.A10_AUDIO) == ["vfio-pci", "vfio-pci"]
    assert os.path.exists(tree.path(A10_RECORD)) and os.path.exists(tree.path(AUDIO_RECORD))


def test_missing_vfio_group_node_is_a_failure(monkeypatch, host):
    _tree, kernel = host
    real = kernel._sync_vfio_node
    kernel._sync_vfio_node = lambda group: None
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "include_group": True, "timeout": 1})
    assert kind == "fail"
    assert result["msg"] == (
        "binding 0000:65:00.0 to vfio-pci failed: 0000:65:00.0 is bound to vfio-pci but /dev/vfio/12 did not appear; "
        "rolled back: 0000:65:00.0 back on nvidia")
    kernel._sync_vfio_node = real
    assert kernel.driver(st.A10) == "nvidia"


# ---------------------------------------------------------------------------------------------
# Bounds checked before any change; a failed final file write is rolled back like any other failure
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("timeout, msg", TIMEOUTS_OUT_OF_BOUNDS)
def test_timeout_out_of_bounds_is_refused_before_any_change(monkeypatch, host, timeout, msg):
    assert_refused(monkeypatch, host, {"addresses": [st.A10], "include_group": True, "timeout": timeout}, msg)


@pytest.mark.parametrize("timeout", ["1e400", 10 ** 400, "1" + "0" * 400])
def test_timeout_too_large_for_a_float_is_refused_before_any_change(monkeypatch, host, timeout):
    # It used to raise OverflowError in the wait after the first bind: GPUs left on vfio-pci, no rollback.
    tree, kernel = host
    before = tree.snapshot()
    for check in (True, False):
        kind, result = run(monkeypatch, host, {"addresses": [st.A10], "include_group": True, "timeout": timeout},
                           check=check)
        assert kind == "fail", result
        # ansible-core 2.17 and 2.18 refuse the string "1e400" in their own argument check (type int), before the
        # module's, with a message of theirs naming the option; 2.19 converts it and the module's own bound refuses it.
        if timeout == "1e400" and CORE < (2, 19):
            assert result["msg"] == ("argument 'timeout' is of type <class 'str'> and we were unable to convert to "
                                     "int: <class 'str'> cannot be converted to an int"), result["msg"]
        else:
            assert result["msg"] == ("timeout must be 0 to 3600 seconds, got a number of 401 digits; nothing was "
                                     "changed"), result["msg"]
    assert tree.snapshot() == before and kernel.writes == []
    assert [argv for argv, _env in kernel.commands if "--dry-run" not in argv] == []


def files_and_links(tree):
    """Files (without mtimes) and links of the tree: directories made on the way may stay."""
    return {path: entry[:2] for path, entry in tree.snapshot().items() if entry[0] != "dir"}


def test_failed_final_write_rolls_back_drivers_and_files(monkeypatch, host):
    # ansible-core 2.19's atomic_move raises a bare Exception (a file name too long, say); only OSError was
    # caught, so the GPUs stayed on vfio-pci with half their records written.
    tree, kernel = host
    before = files_and_links(tree)
    st.failing_atomic_move(monkeypatch, AUDIO_RULE)
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "include_group": True, "persistent": True})
    assert kind == "fail", result
    assert result["msg"] == (
        "writing %s failed: Could not replace '61-gpuops-vfio-0000:65:00.1.rules' (File name too long) (after the "
        "drivers were changed); rolled back: 0000:65:00.1 back on snd_hda_intel; 0000:65:00.0 back on nvidia"
        % AUDIO_RULE)
    assert result["rollback"] == ["0000:65:00.1 back on snd_hda_intel", "0000:65:00.0 back on nvidia"]
    assert drivers(kernel, st.A10, st.A10_AUDIO) == ["nvidia", "snd_hda_intel"]
    for path in (A10_RECORD, A10_RULE, AUDIO_RECORD, AUDIO_RULE):
        assert not os.path.exists(tree.path(path))
    assert files_and_links(tree) == before


def test_failed_final_write_on_absent_puts_the_functions_back_on_vfio(monkeypatch, host):
    tree, kernel = host
    args = {"addresses": [st.A10], "include_group": True, "persistent": True}
    run(monkeypatch, host, args)
    before = files_and_links(tree)
    # Removing a file cannot fail through atomic_move; make the first removal fail instead.
    real_unlink = os.unlink

    def unlink(path, *a, **kw):
        if path.endswith(os.path.basename(AUDIO_RECORD)):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_unlink(path, *a, **kw)

    monkeypatch.setattr(os, "unlink", unlink)
    kind, result = run(monkeypatch, host, dict(args, state="absent"))
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert kind == "fail", result
    assert result["msg"].startswith("writing %s failed: [Errno 13] Permission denied" % AUDIO_RECORD)
    assert result["msg"].endswith("(after the drivers were changed); rolled back: 0000:65:00.1 back on vfio-pci; "
                                  "0000:65:00.0 back on vfio-pci")
    assert drivers(kernel, st.A10, st.A10_AUDIO) == ["vfio-pci", "vfio-pci"]
    assert files_and_links(tree) == before


# ---------------------------------------------------------------------------------------------
# Fuzzing: whatever the arguments, a clean exit_json or fail_json
# ---------------------------------------------------------------------------------------------

_SAMPLES = [st.A10, st.A10_AUDIO, "65:00.0", "10de", "10de:2236", "0302", "none", "vfio-pci", "nvidia", "auto",
            "vfio-pci\n", "nvidia\\", "\u0661\u0662", "0000:65:00.0" * 30]
_text = hs.one_of(hs.text(max_size=20), hs.sampled_from(_SAMPLES))
_value = hs.one_of(hs.none(), hs.booleans(), hs.integers(-5, 50), _text, hs.lists(_text, max_size=3),
                   hs.dictionaries(hs.text(max_size=5), hs.integers(), max_size=2),
                   hs.sampled_from(st.HOSTILE_VALUES), hs.lists(hs.sampled_from(st.HOSTILE_VALUES), max_size=2))
_args = hs.dictionaries(hs.sampled_from(["state", "addresses", "vendors", "classes", "driver", "include_group",
                                         "allowed_drivers", "allowed_group_drivers", "force_boot_vga", "persistent",
                                         "timeout", "assume_slot_groups", "bogus"]), _value, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=_args, check=hs.booleans())
def test_fuzz_arguments_end_cleanly(monkeypatch, tmp_path_factory, args, check):
    tree = st.build_vfio_gpu_host(tmp_path_factory.mktemp("fuzz"), RELEASE)
    pair = make_host(monkeypatch, tree)
    kind, result = run(monkeypatch, pair, args, check=check)
    assert kind in ("exit", "fail")
    if kind == "fail":
        assert isinstance(result["msg"], str) and result["msg"]
        assert "Traceback" not in result["msg"]
    else:
        assert isinstance(result["changed"], bool) and result["reboot_required"] is False


# --- claims made by hand outside this module (vfio-pci.ids, modprobe.d, driverctl) -------------

CLAIM_CASES = [
    ("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vda1 vfio-pci.ids=1234:11e8,10de:2236 quiet\n",
     "vfio-pci.ids=1234:11e8 on the kernel command line (/proc/cmdline; put there by the boot configuration, "
     "e.g. /etc/default/grub)"),
    ("/proc/cmdline", "root=/dev/vda1 vfio_pci.ids=1234:11e8:ffffffff:ffffffff:00ff00:ffff00\n",
     "vfio-pci.ids=1234:11e8:ffffffff:ffffffff:00ff00:ffff00 on the kernel command line (/proc/cmdline; put there "
     "by the boot configuration, e.g. /etc/default/grub)"),
    ("/etc/modprobe.d/vfio.conf", "# passthrough\noptions vfio-pci disable_vga=1 ids=10de:2236,1234:11e8\n",
     "options vfio-pci ids=1234:11e8 in /etc/modprobe.d/vfio.conf"),
    ("/etc/driverctl.d/pci-0000:00:03.0", "vfio-pci\n",
     "a driverctl override to vfio-pci (/etc/driverctl.d/pci-0000:00:03.0)"),
]


@pytest.mark.parametrize("path, text, claim", CLAIM_CASES)
def test_absent_refuses_a_function_claimed_for_vfio_by_hand(monkeypatch, lab, path, text, claim):
    """A hand-made claim would re-bind the function to vfio-pci at once: refuse, naming the file, change nothing."""
    tree, kernel = lab
    grouped = {"addresses": [LAB_EDU_GROUPED], "include_group": True}
    kind, result = run(monkeypatch, lab, grouped)
    assert kind == "exit" and result["changed"]
    tree.write(path, text)
    before = tree.snapshot()
    kernel.writes.clear()
    kind, result = run(monkeypatch, lab, dict(grouped, state="absent"), check=True)
    assert kind == "fail" and claim in result["msg"] and "0000:00:03.0 (1234:11e8) is claimed for vfio-pci" in result["msg"]
    assert "0000:00:03.1" not in result["msg"]   # the HDA sibling (8086:2668) is not claimed
    kind, result = run(monkeypatch, lab, dict(grouped, state="absent"))
    assert kind == "fail" and claim in result["msg"] and result["msg"].startswith("refusing to change anything: ")
    assert tree.snapshot() == before and kernel.writes == []


@pytest.mark.parametrize("text", [
    "root=/dev/vda1 vfio-pci.ids=10de:2236\n",                              # another device
    "root=/dev/vda1 vfio-pci.ids=1234:11e8:1af4:1100\n",                  # another subsystem
    "root=/dev/vda1 vfio-pci.ids=1234:11e8:ffffffff:ffffffff:030000:ffffff\n",  # another class
    "root=/dev/vda1 vfio-pci.ids=zzzz:11e8,1234\n",                         # not parsed by the driver either
])
def test_absent_ignores_claims_of_other_devices(monkeypatch, lab, text):
    tree, kernel = lab
    grouped = {"addresses": [LAB_EDU_GROUPED], "include_group": True}
    assert run(monkeypatch, lab, grouped)[0] == "exit"
    tree.write("/proc/cmdline", text)
    kind, result = run(monkeypatch, lab, dict(grouped, state="absent"))
    assert kind == "exit" and result["changed"], result
    assert drivers(kernel, LAB_EDU_GROUPED, LAB_HDA) == [None, "snd_hda_intel"]


# --- without a record: the one loaded host driver bound explicitly, not left to drivers_probe ---------------

def on_vfio_by_hand(kernel, *addresses):
    """Put ``addresses`` on vfio-pci as a hand-made setup does: no record, no driver_override."""
    for address in addresses:
        kernel.do_unbind(address, kernel.driver(address), "x", "x")
        kernel.do_bind(address, "vfio-pci", "x", "x")
    kernel.writes.clear()


def probes(kernel):
    return [value for path, value in kernel.writes if path == "/sys/bus/pci/drivers_probe"]


def test_without_record_the_one_loaded_host_driver_is_bound_explicitly(monkeypatch, host):
    tree, kernel = host
    st.add_driver_module(tree, "nvidia")
    on_vfio_by_hand(kernel, st.A10)
    args = {"addresses": [st.A10], "state": "absent"}
    kind, result = run(monkeypatch, host, args, check=True)
    assert kind == "exit" and result["devices"][0]["after"] == "nvidia" and result["cmdline_claims"] == []
    kind, result = run(monkeypatch, host, args)
    assert kind == "exit" and result["changed"] is True, result
    assert kernel.writes[-1] == ("/sys/bus/pci/drivers/nvidia/bind", st.A10) and probes(kernel) == []
    assert kernel.driver(st.A10) == "nvidia"


def test_without_record_two_loaded_host_drivers_leave_it_to_the_probe(monkeypatch, host):
    tree, kernel = host
    st.add_driver_module(tree, "nvidia")
    st.add_driver_module(tree, "nouveau")
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT + "alias pci:v000010DEd*sv*sd*bc03sc*i* nouveau\n")
    on_vfio_by_hand(kernel, st.A10)
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "state": "absent"}, check=True)
    assert kind == "exit" and result["devices"][0]["after"] is None
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "state": "absent"})
    assert kind == "exit" and probes(kernel) == [st.A10] and kernel.driver(st.A10) == "nvidia"


# --- remove_claims: the host driver bound explicitly, the claims of modprobe.d and driverctl removed ---------

A10_CMDLINE = "BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/sda1 ro intel_iommu=on iommu=pt vfio-pci.ids=10de:2236,10de:1aef"
MODPROBE = "/etc/modprobe.d/vfio.conf"
A10_DRIVERCTL = "/etc/driverctl.d/pci-0000:65:00.0"
AUDIO_ALIAS = "alias pci:v*d*sv*sd*bc04sc03i* snd_hda_intel\n"


def test_remove_claims_binds_nvidia_explicitly_and_returns_the_cmdline_claim(monkeypatch, host):
    """No record, vfio-pci.ids on the command line: drivers_probe would give the A10 straight back to vfio-pci."""
    tree, kernel = host
    tree.set_cmdline(A10_CMDLINE)
    st.add_driver_module(tree, "nvidia")
    on_vfio_by_hand(kernel, st.A10, st.A10_AUDIO)
    args = {"addresses": [st.A10], "state": "absent", "remove_claims": True}
    before = tree.snapshot()
    kind, result = run(monkeypatch, host, args, check=True, diff=True)
    assert kind == "exit" and result["changed"] is True, result
    assert tree.snapshot() == before and kernel.writes == []
    assert [(d["address"], d["before"], d["after"]) for d in result["devices"]] == [(st.A10, "vfio-pci", "nvidia")]
    # The audio function is not given back: its entry stays on the command line.
    claims = [{"argument": "vfio-pci.ids=10de:2236,10de:1aef", "replace_with": "vfio-pci.ids=10de:1aef"}]
    assert result["cmdline_claims"] == claims
    assert result["files_changed"] == [] and result["initramfs_rebuild_required"] is False
    assert result["reboot_required"] is False

    kind, result = run(monkeypatch, host, args)
    assert kind == "exit" and result["changed"] is True, result
    assert kernel.writes == [("/sys/bus/pci/drivers/vfio-pci/unbind", st.A10),
                             ("/sys/bus/pci/devices/0000:65:00.0/driver_override", ""),
                             ("/sys/bus/pci/drivers/nvidia/bind", st.A10)]
    assert probes(kernel) == []
    assert kernel.driver(st.A10) == "nvidia" and result["devices"][0]["after"] == "nvidia"
    assert result["cmdline_claims"] == claims

    # With the group, and the audio's driver known too: the whole argument goes. The A10, already back, still
    # counts (a run whose kernel_cmdline step failed gets the argument again).
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT + AUDIO_ALIAS)
    st.add_driver_module(tree, "snd_hda_intel")
    kernel.writes.clear()
    kind, result = run(monkeypatch, host, dict(args, include_group=True))
    assert kind == "exit" and result["changed"] is True, result
    assert [(d["address"], d["changed"], d["after"]) for d in result["devices"]] == [
        (st.A10, False, "nvidia"), (st.A10_AUDIO, True, "snd_hda_intel")]
    assert result["cmdline_claims"] == [{"argument": "vfio-pci.ids=10de:2236,10de:1aef", "replace_with": None}]
    assert kernel.writes[-1] == ("/sys/bus/pci/drivers/snd_hda_intel/bind", st.A10_AUDIO) and probes(kernel) == []


def test_remove_claims_takes_only_the_matching_id_out_of_modprobe_d(monkeypatch, host):
    tree, kernel = host
    args = {"addresses": [st.A10], "include_group": True}
    assert run(monkeypatch, host, args)[0] == "exit"
    text = ("# passthrough\noptions vfio-pci ids=10de:2236,8086:1234 disable_vga=1  # by hand\n"
            "softdep nvidia pre: vfio-pci\n")
    tree.write(MODPROBE, text)
    tree.write("/etc/modprobe.d/only-a10.conf", "options vfio_pci ids=10de:2236\n")
    absent = dict(args, state="absent", remove_claims=True)
    before = tree.snapshot()
    kernel.writes.clear()
    kind, result = run(monkeypatch, host, absent, check=True, diff=True)
    assert kind == "exit" and result["changed"] is True, result
    assert tree.snapshot() == before and kernel.writes == []
    new = ("# passthrough\noptions vfio-pci ids=8086:1234 disable_vga=1 # by hand\n"
           "softdep nvidia pre: vfio-pci\n")
    assert result["files_changed"] == [A10_RECORD, AUDIO_RECORD, "/etc/modprobe.d/only-a10.conf", MODPROBE]
    diffs = {d["after_header"]: d for d in result["diff"][1:]}
    assert diffs[MODPROBE]["before"] == text and diffs[MODPROBE]["after"] == new
    assert diffs["/etc/modprobe.d/only-a10.conf"]["after"] == ""
    assert result["initramfs_rebuild_required"] is True and result["cmdline_claims"] == []

    kind, result = run(monkeypatch, host, absent)
    assert kind == "exit" and result["changed"] is True, result
    assert tree.read(MODPROBE) + "\n" == new
    assert not os.path.exists(tree.path("/etc/modprobe.d/only-a10.conf"))
    assert drivers(kernel, st.A10, st.A10_AUDIO) == ["nvidia", "snd_hda_intel"]
    assert result["initramfs_rebuild_required"] is True
    kind, result = run(monkeypatch, host, absent)
    assert kind == "exit" and result["changed"] is False and result["initramfs_rebuild_required"] is False


def test_remove_claims_deletes_the_driverctl_override(monkeypatch, host):
    tree, kernel = host
    st.add_driver_module(tree, "nvidia")
    on_vfio_by_hand(kernel, st.A10)
    kernel.write(tree.path("/sys/bus/pci/devices/%s/driver_override" % st.A10), "vfio-pci")
    tree.write(A10_DRIVERCTL, "vfio-pci\n")
    kernel.writes.clear()
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "state": "absent", "remove_claims": True})
    assert kind == "exit" and result["changed"] is True, result
    assert result["files_changed"] == [A10_DRIVERCTL] and not os.path.exists(tree.path(A10_DRIVERCTL))
    assert result["initramfs_rebuild_required"] is False and result["cmdline_claims"] == []
    assert kernel.driver(st.A10) == "nvidia" and kernel.override(st.A10) is None and probes(kernel) == []


def test_without_remove_claims_the_refusal_names_the_file_and_the_option(monkeypatch, host):
    tree, kernel = host
    st.add_driver_module(tree, "nvidia")
    on_vfio_by_hand(kernel, st.A10)
    tree.write(MODPROBE, "options vfio-pci ids=10de:2236\n")
    for args in ({"addresses": [st.A10], "state": "absent"},
                 {"addresses": [st.A10], "state": "absent", "remove_claims": False}):
        assert_refused(monkeypatch, host, args, (
            "refusing to change anything: 0000:65:00.0 (10de:2236) is claimed for vfio-pci by options vfio-pci "
            "ids=10de:2236 in /etc/modprobe.d/vfio.conf; it would go back to vfio-pci as soon as it is released. Remove "
            "that claim first (kernel arguments: the kernel_cmdline module with state=absent, then a reboot; modprobe.d: "
            "delete the line and rebuild the initramfs; driverctl: driverctl unset-override 0000:65:00.0), or set "
            "remove_claims=true to have this module remove the modprobe.d and driverctl claims, bind the host driver "
            "explicitly and return the kernel arguments to take off (cmdline_claims)"))


def test_remove_claims_leaves_a_cmdline_claim_without_a_host_driver_on_no_driver_until_the_boot(monkeypatch, host):
    """No host driver to bind now (nvidia's module is not loaded): the probe would give the A10 straight back to
    vfio-pci while vfio-pci.ids is on the running command line, so it is taken off vfio-pci, not probed, and the
    claim is returned for the boot change; at that boot the kernel chooses among what modules.alias gives."""
    tree, kernel = host
    tree.set_cmdline(A10_CMDLINE)
    tree.write(MODPROBE, "options vfio-pci ids=10de:2236\n")
    on_vfio_by_hand(kernel, st.A10)
    args = {"addresses": [st.A10], "state": "absent", "remove_claims": True}
    before = tree.snapshot()
    kind, result = run(monkeypatch, host, args, check=True)
    assert kind == "exit" and result["changed"] is True, result
    assert tree.snapshot() == before and kernel.writes == []
    assert [(d["address"], d["before"], d["after"], d["until_boot"]) for d in result["devices"]] == [
        (st.A10, "vfio-pci", None, ["nvidia"])]
    assert result["cmdline_claims"] == [{"argument": "vfio-pci.ids=10de:2236,10de:1aef",
                                         "replace_with": "vfio-pci.ids=10de:1aef"}]

    kind, result = run(monkeypatch, host, args)
    assert kind == "exit" and result["changed"] is True, result
    assert kernel.writes == [("/sys/bus/pci/drivers/vfio-pci/unbind", st.A10),
                             ("/sys/bus/pci/devices/0000:65:00.0/driver_override", "")]
    assert probes(kernel) == [] and kernel.driver(st.A10) is None
    assert [(d["after"], d["until_boot"]) for d in result["devices"]] == [(None, ["nvidia"])]
    assert result["initramfs_rebuild_required"] is True and not os.path.exists(tree.path(MODPROBE))
    # Again: nothing left to do for the function, and the claim is still named until the boot without it.
    kernel.writes.clear()
    kind, result = run(monkeypatch, host, args)
    assert kind == "exit" and result["changed"] is False and kernel.writes == [], result
    assert result["cmdline_claims"][0]["argument"] == "vfio-pci.ids=10de:2236,10de:1aef"


def test_remove_claims_with_two_loaded_host_drivers_leaves_the_choice_to_the_boot(monkeypatch, host):
    tree, kernel = host
    tree.set_cmdline(A10_CMDLINE)
    on_vfio_by_hand(kernel, st.A10)
    st.add_driver_module(tree, "nvidia")
    st.add_driver_module(tree, "nouveau")
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT + "alias pci:v000010DEd*sv*sd*bc03sc*i* nouveau\n")
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "state": "absent", "remove_claims": True})
    assert kind == "exit" and result["changed"] is True, result
    assert [(d["after"], d["until_boot"]) for d in result["devices"]] == [(None, ["nvidia", "nouveau"])]
    assert probes(kernel) == [] and kernel.driver(st.A10) is None


def test_remove_claims_of_a_device_no_host_driver_supports(monkeypatch, host):
    """A function modules.alias names no host driver for (the lab's stand-ins): no driver now and after the boot."""
    tree, kernel = host
    tree.set_cmdline(A10_CMDLINE)
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT.replace("alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia\n", ""))
    on_vfio_by_hand(kernel, st.A10)
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "state": "absent", "remove_claims": True})
    assert kind == "exit" and result["changed"] is True, result
    assert [(d["after"], d["until_boot"]) for d in result["devices"]] == [(None, [])]
    assert kernel.driver(st.A10) is None and probes(kernel) == []


def test_remove_claims_failure_in_the_middle_rolls_back_the_files_and_the_drivers(monkeypatch, host):
    tree, kernel = host
    st.add_driver_module(tree, "nvidia")
    on_vfio_by_hand(kernel, st.A10)
    tree.write(MODPROBE, "options vfio-pci ids=10de:2236,10de:1aef disable_vga=1\n")
    tree.write(A10_DRIVERCTL, "vfio-pci\n")
    args = {"addresses": [st.A10], "state": "absent", "remove_claims": True}
    before = files_and_links(tree)
    # The modprobe.d file is written first; removing the driverctl override then fails.
    real_unlink = os.unlink

    def unlink(path, *a, **kw):
        if path == tree.path(A10_DRIVERCTL):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_unlink(path, *a, **kw)

    monkeypatch.setattr(os, "unlink", unlink)
    kind, result = run(monkeypatch, host, args)
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert kind == "fail", result
    assert result["msg"].startswith("writing %s failed: [Errno 13] Permission denied" % A10_DRIVERCTL)
    assert result["msg"].endswith("(after the drivers were changed); rolled back: 0000:65:00.0 back on vfio-pci")
    assert tree.read(MODPROBE) == "options vfio-pci ids=10de:2236,10de:1aef disable_vga=1"
    assert kernel.driver(st.A10) == "vfio-pci" and files_and_links(tree) == before

    # A failure of the live change touches no file at all.
    kernel.refuse["/sys/bus/pci/drivers/nvidia/bind"] = errno.EIO
    kind, result = run(monkeypatch, host, args)
    assert kind == "fail" and result["msg"].startswith("restoring 0000:65:00.0 failed: ")
    assert result["rollback"] == ["0000:65:00.0 back on vfio-pci"]
    assert kernel.driver(st.A10) == "vfio-pci" and files_and_links(tree) == before


def test_remove_claims_is_ignored_with_state_present(monkeypatch, host):
    tree, _kernel = host
    tree.write(MODPROBE, "options vfio-pci ids=10de:2236\n")
    args = {"addresses": [st.A10], "include_group": True}
    _kind, plain = run(monkeypatch, host, args, check=True)
    kind, result = run(monkeypatch, host, dict(args, remove_claims=True), check=True)
    assert kind == "exit" and result == plain and result["cmdline_claims"] == []


def test_preparation_names_the_hosts_own_claims_and_leaves_them(monkeypatch, host):
    """A host prepared by hand before: the A10 on vfio-pci through vfio-pci.ids and modprobe.d. Binding it (the
    vm-passthrough preparation) says so, with what giving it back later takes, and leaves both claims as written."""
    tree, kernel = host
    warned = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: warned.append(text))
    tree.set_cmdline(A10_CMDLINE)
    tree.write(MODPROBE, "options vfio-pci ids=10de:2236\n")
    on_vfio_by_hand(kernel, st.A10)
    args = {"addresses": [st.A10], "persistent": True, "include_group": True}
    cmdline = "vfio-pci.ids=%s on the kernel command line (/proc/cmdline; put there by the boot configuration, " \
              "e.g. /etc/default/grub)"
    for check in (True, False):
        warned.clear()
        kind, result = run(monkeypatch, host, args, check=check)
        assert kind == "exit", result
        assert result["host_claims"] == [
            {"address": st.A10, "claims": [cmdline % "10de:2236", "options vfio-pci ids=10de:2236 in /etc/modprobe.d/vfio.conf"]},
            {"address": st.A10_AUDIO, "claims": [cmdline % "10de:1aef"]}]
        assert len(warned) == 1 and "0000:65:00.0 by vfio-pci.ids=10de:2236" in warned[0]
        assert "remove_claims=true" in warned[0]
    # A caller's own words for the way back (a role names its playbook's input) end the warning instead.
    for check in (True, False):
        warned.clear()
        kind, result = run(monkeypatch, host, dict(args, host_claims_advice="set gpuops_x=true "), check=check)
        assert kind == "exit" and len(warned) == 1, result
        assert warned[0].endswith("To give them back to their host drivers later, set gpuops_x=true"), warned[0]
        assert "remove_claims" not in warned[0]
    assert tree.read(MODPROBE) == "options vfio-pci ids=10de:2236" and kernel.driver(st.A10) == "vfio-pci"
    # Nothing claimed: nothing named, no warning.
    tree.set_cmdline("BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/sda1 ro intel_iommu=on iommu=pt")
    os.unlink(tree.path(MODPROBE))
    warned.clear()
    kind, result = run(monkeypatch, host, args, check=True)
    assert kind == "exit" and result["host_claims"] == [] and warned == [], result


def read_json(tree, path):
    return json.loads(tree.read(path))


def test_preparation_records_the_driver_modules_alias_names_for_a_claimed_function(monkeypatch, host):
    """The hand-made claim had bound the A10 before the preparation: nothing saw its driver. The preparation records
    the one modules.alias names (nvidia, not loaded: its module's name), says so in the record, and leaves the audio
    function, which modules.alias names no driver for, with a record that names none."""
    tree, kernel = host
    tree.set_cmdline(A10_CMDLINE)
    on_vfio_by_hand(kernel, st.A10, st.A10_AUDIO)
    args = {"addresses": [st.A10], "persistent": True, "include_group": True}
    before = tree.snapshot()
    kind, result = run(monkeypatch, host, args, check=True)
    assert kind == "exit" and result["changed"] is True, result
    assert tree.snapshot() == before and result["record_files"] == [A10_RECORD, AUDIO_RECORD]
    kind, result = run(monkeypatch, host, args)
    assert kind == "exit" and result["changed"] is True and kernel.writes == [], result
    assert A10_RECORD in result["files_changed"] and AUDIO_RECORD in result["files_changed"]
    assert read_json(tree, A10_RECORD) == {
        "address": st.A10, "vendor": "10de", "device": "2236", "driver": "nvidia", "driver_override": None,
        "bound_to": "vfio-pci", "origin": "modules.alias", "host_modules": ["nvidia"], "claimed_by": ["cmdline"]}
    audio = read_json(tree, AUDIO_RECORD)
    assert (audio["driver"], audio["host_modules"], audio["origin"]) == (None, [], "modules.alias")
    # Again: the records stay as written, nothing changes.
    kind, result = run(monkeypatch, host, args)
    assert kind == "exit" and result["changed"] is False and result["files_changed"] == [], result
    # Two host modules for the A10: no driver recorded, both modules are.
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT + "alias pci:v000010DEd*sv*sd*bc03sc*i* nouveau\n")
    os.unlink(tree.path(A10_RECORD))
    kind, result = run(monkeypatch, host, args)
    assert kind == "exit" and result["files_changed"] == [A10_RECORD], result
    a10 = read_json(tree, A10_RECORD)
    assert (a10["driver"], a10["host_modules"]) == (None, ["nvidia", "nouveau"])


def test_preparation_records_nothing_for_an_unclaimed_function_already_on_vfio(monkeypatch, host):
    """On vfio-pci by someone's hand at run time, with no claim that outlives a boot: no inferred record (state=absent
    asks modules.alias at that time, as before)."""
    tree, kernel = host
    on_vfio_by_hand(kernel, st.A10, st.A10_AUDIO)
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "include_group": True})
    assert kind == "exit" and result["record_files"] == [] and result["changed"] is False, result
    assert not os.path.exists(tree.path(A10_RECORD))


def test_switch_binds_the_recorded_driver_when_loaded_and_waits_for_the_boot_when_not(monkeypatch, host):
    """The records of the preparation at the switch (remove_claims): nvidia loaded is bound explicitly (never the
    probe, which vfio-pci.ids would win); nouveau recorded but not loaded (blacklisted, as this collection does on
    GPU hosts) leaves the function on no driver until the boot without the claim. The records go either way."""
    tree, kernel = host
    tree.set_cmdline(A10_CMDLINE)
    on_vfio_by_hand(kernel, st.A10, st.A10_AUDIO)
    prepare = {"addresses": [st.A10], "persistent": True}
    kind, result = run(monkeypatch, host, prepare)
    assert kind == "exit" and read_json(tree, A10_RECORD)["driver"] == "nvidia", result
    switch = {"addresses": [st.A10], "state": "absent", "remove_claims": True}
    st.add_driver_module(tree, "nvidia")
    kernel.writes.clear()
    kind, result = run(monkeypatch, host, switch)
    assert kind == "exit" and result["changed"] is True, result
    assert kernel.writes[-1] == ("/sys/bus/pci/drivers/nvidia/bind", st.A10) and probes(kernel) == []
    assert kernel.driver(st.A10) == "nvidia" and not os.path.exists(tree.path(A10_RECORD))
    assert result["devices"][0]["until_boot"] is None

    # The same with nouveau recorded and not loaded (nvidia's alias gone from this kernel).
    on_vfio_by_hand(kernel, st.A10)
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT.replace("alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia\n",
                                                                     "alias pci:v000010DEd*sv*sd*bc03sc*i* nouveau\n"))
    kind, result = run(monkeypatch, host, prepare)
    assert kind == "exit" and read_json(tree, A10_RECORD)["driver"] == "nouveau", result
    kernel.writes.clear()
    kind, result = run(monkeypatch, host, switch, check=True)
    assert kind == "exit" and [(d["after"], d["until_boot"]) for d in result["devices"]] == [(None, ["nouveau"])]
    kind, result = run(monkeypatch, host, switch)
    assert kind == "exit" and [(d["after"], d["until_boot"]) for d in result["devices"]] == [(None, ["nouveau"])]
    assert probes(kernel) == [] and kernel.driver(st.A10) is None and not os.path.exists(tree.path(A10_RECORD))


def test_an_inferred_record_whose_modules_the_kernel_lost_still_names_them(monkeypatch, host):
    """A kernel update between the preparation and the switch dropped the alias: the record's modules are what
    the boot gets (until_boot), not an empty list."""
    tree, kernel = host
    tree.set_cmdline(A10_CMDLINE)
    nvidia_alias = "alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia\n"
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT.replace(nvidia_alias, nvidia_alias.replace("nvidia", "nouveau")))
    on_vfio_by_hand(kernel, st.A10, st.A10_AUDIO)
    kind, result = run(monkeypatch, host, {"addresses": [st.A10]})
    assert kind == "exit" and read_json(tree, A10_RECORD)["host_modules"] == ["nouveau"], result
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT.replace(nvidia_alias, ""))
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "state": "absent", "remove_claims": True})
    assert kind == "exit" and [(d["after"], d["until_boot"]) for d in result["devices"]] == [(None, ["nouveau"])]
    assert kernel.driver(st.A10) is None and not os.path.exists(tree.path(A10_RECORD))


# A network function the host uses, in the GPU's slot (the hostile lab VM's e1000 at function 3 of the GPU's slot) or
# its IOMMU group: the refusal says it is a live interface of the host, names it, and never advises allowing its
# driver, which would take the interface away.
E1000 = ("8086", "100e", "020000")


def add_host_nic(tree, address, interface, parent, iommu_group=None):
    tree.add_function(address, *E1000, parent=parent, driver="e1000", iommu_group=iommu_group)
    tree.mkdir("/sys/bus/pci/devices/%s/net/%s" % (address, interface))


def test_a_live_network_interface_in_the_gpus_slot_is_refused_as_such(monkeypatch, tmp_path):
    tree = st.build_vfio_slot_host(tmp_path, RELEASE)
    add_host_nic(tree, "0000:01:00.3", "enp1s0f3", st.SLOT_PORT)
    host = make_host(monkeypatch, tree)
    args = {"include_group": True, "persistent": True, "assume_slot_groups": True,
            "allowed_group_drivers": list(_vfio.DEFAULT_ALLOWED_GROUP_DRIVERS) + ["uhci_hcd"]}
    kind, result = run_unchanged(monkeypatch, host, args, check=True)
    assert kind == "fail", result
    assert result["msg"] == (
        "refusing to change anything: 0000:01:00.3 (8086:100e, class 020000) is a live network interface of the "
        "host, enp1s0f3 (driver e1000), in the PCI slot of 0000:01:00.0, so it will most likely share its IOMMU group "
        "once the IOMMU is on and go to vfio-pci with it: that would take enp1s0f3 away from the host, with every "
        "connection over it. Leave enp1s0f3 on e1000: give the VM a GPU whose slot (IOMMU group) holds no function "
        "the host needs, or move the host's network to another interface first and then disable this function (e.g. "
        "in the firmware setup)")
    assert "allowed_group_drivers" not in result["msg"] and "add e1000" not in result["msg"]


def test_a_live_network_interface_in_the_gpus_iommu_group_is_refused_as_such(monkeypatch, tmp_path):
    tree = st.build_vfio_gpu_host(tmp_path, RELEASE)
    add_host_nic(tree, "0000:65:00.2", "enp101s0f2", st.A10_PORT, iommu_group=12)
    host = make_host(monkeypatch, tree)
    kind, result = run_unchanged(monkeypatch, host, {"addresses": [st.A10], "include_group": True}, check=True)
    assert kind == "fail", result
    assert ("0000:65:00.2 (8086:100e, class 020000) is a live network interface of the host, enp101s0f2 (driver "
            "e1000), in the IOMMU group of 0000:65:00.0, so it goes to vfio-pci with it: that would take enp101s0f2 "
            "away from the host") in result["msg"], result["msg"]
    assert "allowed_drivers" not in result["msg"] and "add e1000" not in result["msg"]
    # The driver allowed by the user on purpose: the interface goes, as asked.
    args = {"addresses": [st.A10], "include_group": True, "allowed_group_drivers": ["e1000", "snd_hda_intel"]}
    kind, result = run_unchanged(monkeypatch, host, args, check=True)
    assert kind == "exit" and "0000:65:00.2" in [d["address"] for d in result["devices"]], result
