# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""vfio_probe on fake hosts with a fake VFIO kernel (tests/unit/fakes/vfio_kernel.py).

The real kernel's answers are the lab's part (tests/integration/targets/vfio_probe); here each answer the
kernel can give is played once, and the probe must report it as the right problem, close every descriptor and
never open a device that a process holds.
"""

from __future__ import annotations

import errno

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _vfio_probe as vp
from ansible_collections.gpuops.sandbox.plugins.modules import vfio_probe
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import (
    assert_ends_cleanly,
    call_main,
)
from ansible_collections.gpuops.sandbox.tests.unit.fakes.vfio_kernel import FakeVfioKernel

UUID = "4b20d080-1b54-4048-85b3-a6a62d165c01"
LEGACY_CALLS = [vp.VFIO_GET_API_VERSION, vp.VFIO_CHECK_EXTENSION, vp.VFIO_GROUP_GET_STATUS,
                vp.VFIO_GROUP_SET_CONTAINER, vp.VFIO_SET_IOMMU, vp.VFIO_GROUP_GET_DEVICE_FD, vp.VFIO_DEVICE_GET_INFO]


@pytest.fixture
def host(tmp_path):
    """The fake GPU host with the A10 and its audio function on vfio-pci (group 12), no process holding them."""
    tree = st.build_gpu_host(tmp_path)
    st.remove_process(tree, 3456)
    tree.bind(st.A10, "vfio-pci")
    tree.bind(st.A10_AUDIO, "vfio-pci")
    tree.write("/proc/interrupts", "  24:  0  IR-PCI-MSI 65536-edge  vfio-msi\n   1:  9  IR-IO-APIC  1-edge  i8042\n")
    return tree


@pytest.fixture
def kernel():
    # Group 12: the A10 and its audio; group 42: the L40S VF carrying vGPU type 1161.
    return FakeVfioKernel(groups={12: {"devices": [st.A10, st.A10_AUDIO]}, 42: {"devices": [st.L40S_VFS[1]]}})


def run(monkeypatch, tree, kernel, args):
    monkeypatch.setattr(vfio_probe, "Kernel", lambda root: kernel)
    return call_main(monkeypatch, vfio_probe, tree.root, args)


def ioctls(kernel):
    return [call[2] for call in kernel.calls if call[0] == "ioctl"]


def by_name(result):
    return {dev["name"]: dev for dev in result["devices"]}


def test_the_vmm_calls_succeed_on_a_bound_gpu_and_a_vgpu(monkeypatch, host, kernel):
    before = host.snapshot()
    kind, result = run(monkeypatch, host, kernel, {})
    assert host.snapshot() == before
    assert kind == "exit" and result["changed"] is False
    assert result["all_ok"] is True
    devices = by_name(result)
    assert sorted(devices) == [st.A10, st.L40S_VFS[1]]
    assert devices[st.A10]["type"] == "pci" and devices[st.A10]["group"] == 12
    assert devices[st.L40S_VFS[1]]["type"] == "vgpu" and devices[st.L40S_VFS[1]]["vgpu_type"] == 1161
    assert devices[st.L40S_VFS[1]]["parent"] == st.L40S
    assert devices[st.A10]["legacy"] == {"ok": True, "flags": 3, "regions": 9, "irqs": 5, "pci": True,
                                         "reset": True}
    # The calls a VMM makes, in its order, for each device; nothing left open.
    assert ioctls(kernel) == LEGACY_CALLS * 2
    assert kernel.open_fds() == {}
    # The selected functions on nvidia are listed as not handed to VMs.
    not_probed = {s["address"]: s for s in result["not_probed"]}
    assert not_probed[st.A100]["driver"] == "nvidia" and st.A10 not in not_probed
    # Ansible reads a result's `skipped` as "the task was skipped" (and then ignores failed_when).
    assert "skipped" not in result
    assert result["backends"] == {"legacy": True, "iommufd": False, "dra_setting": "LegacyOnly"}
    assert result["interrupts"] == {"remapping": True, "allow_unsafe_interrupts": None}


def test_a_held_group_is_never_opened_and_its_holder_named(monkeypatch, host, kernel):
    host.add_process(3456, "qemu-kvm", {20: "/dev/vfio/vfio", 21: "/dev/vfio/12"})
    host.write("/proc/3456/cmdline", "/usr/bin/qemu-system-x86_64\0-name\0guest=vm1\0")
    kind, result = run(monkeypatch, host, kernel, {})
    assert kind == "fail"
    assert ("0000:65:00.0 (pci): 0000:65:00.0 is in use: pid 3456 (/usr/bin/qemu-system-x86_64 -name "
            "guest=vm1) holds /dev/vfio/12; it was not opened") in result["msg"]
    assert ("open", "/dev/vfio/12") not in kernel.calls
    dev = by_name(result)[st.A10]
    assert dev["problem_kind"] == "busy" and dev["holders"][0]["pid"] == 3456
    # The busy device does not decide which backends work; the vGPU still proves the legacy path.
    assert result["backends"]["legacy"] is True


def test_a_holder_the_scan_cannot_see_still_makes_it_busy(monkeypatch, host, kernel):
    kernel.busy.add(12)   # e.g. a VMM in another PID namespace
    kind, result = run(monkeypatch, host, kernel, {"fail_on_problem": False})
    assert kind == "exit" and result["all_ok"] is False
    dev = by_name(result)[st.A10]
    assert dev["problem_kind"] == "busy"
    assert "opening /dev/vfio/12 failed" in dev["problem"] and "EBUSY" in dev["problem"]
    assert kernel.open_fds() == {}


def test_a_group_the_kernel_calls_not_viable_names_the_member_on_a_host_driver(monkeypatch, host, kernel):
    host.bind(st.A10_AUDIO, "snd_hda_intel")
    kernel.groups[12]["viable"] = False
    kind, result = run(monkeypatch, host, kernel, {"addresses": [st.A10]})
    assert kind == "fail"
    dev = by_name(result)[st.A10]
    assert dev["problem_kind"] == "not-viable"
    assert dev["problem"] == "IOMMU group 12 is not viable: 0000:65:00.1 is on snd_hda_intel"
    assert vp.VFIO_GROUP_SET_CONTAINER not in ioctls(kernel)
    assert kernel.open_fds() == {}


def test_no_interrupt_remapping_is_reported_and_unsafe_interrupts_never_set(monkeypatch, host, kernel):
    kernel.interrupt_remapping = False
    host.write("/proc/interrupts", "  24:  0  PCI-MSI 65536-edge  nvme0q0\n")
    host.write(vp.UNSAFE_INTERRUPTS, "N\n")
    before = host.snapshot()
    kind, result = run(monkeypatch, host, kernel, {"addresses": [st.A10]})
    assert host.snapshot() == before
    assert kind == "fail"
    dev = by_name(result)[st.A10]
    assert dev["problem_kind"] == "interrupt-remapping" and dev["legacy"]["step"] == "VFIO_SET_IOMMU"
    assert "allow_unsafe_interrupts is off" in dev["problem"] and "never done here" in dev["problem"]
    assert result["interrupts"] == {"remapping": False, "allow_unsafe_interrupts": False}
    assert kernel.open_fds() == {}


def test_unsafe_interrupts_allowed_is_a_warning(monkeypatch, host, kernel):
    host.write(vp.UNSAFE_INTERRUPTS, "Y\n")
    kind, result = run(monkeypatch, host, kernel, {})
    assert kind == "exit"
    assert result["interrupts"]["allow_unsafe_interrupts"] is True
    assert "allow_unsafe_interrupts is on" in result["warnings_list"][0]


def test_iommufd_path_when_the_kernel_and_the_device_have_it(monkeypatch, host, kernel):
    host.mkdir(host.functions[st.A10] + "/vfio-dev/vfio0")
    kernel.iommufd = True
    kernel.cdevs["/dev/vfio/devices/vfio0"] = st.A10
    kind, result = run(monkeypatch, host, kernel, {"addresses": [st.A10]})
    assert kind == "exit"
    dev = by_name(result)[st.A10]
    assert dev["cdevs"] == ["/dev/vfio/devices/vfio0"]
    assert dev["legacy"]["ok"] and dev["iommufd"]["ok"]
    assert result["backends"] == {"legacy": True, "iommufd": True, "dra_setting": "PreferIommuFD"}
    assert ioctls(kernel)[len(LEGACY_CALLS):] == [vp.IOMMU_IOAS_ALLOC, vp.VFIO_DEVICE_BIND_IOMMUFD,
                                                  vp.VFIO_DEVICE_ATTACH_IOMMUFD_PT, vp.VFIO_DEVICE_GET_INFO]
    assert kernel.open_fds() == {}


def test_a_vmm_holding_only_the_cdev_makes_the_device_busy(monkeypatch, host, kernel):
    host.mkdir(host.functions[st.A10] + "/vfio-dev/vfio0")
    host.add_process(4567, "qemu-kvm", {30: "/dev/iommu", 31: "/dev/vfio/devices/vfio0"})
    kind, result = run(monkeypatch, host, kernel, {"addresses": [st.A10], "fail_on_problem": False})
    assert kind == "exit"
    dev = by_name(result)[st.A10]
    assert dev["problem_kind"] == "busy" and "holds /dev/vfio/devices/vfio0" in dev["problem"]
    assert kernel.calls == []


def test_iommufd_unavailable_is_not_a_failure_when_legacy_works(monkeypatch, host, kernel):
    kind, result = run(monkeypatch, host, kernel, {"addresses": [st.A10]})
    assert kind == "exit"
    dev = by_name(result)[st.A10]
    assert dev["ok"] and dev["iommufd"]["kind"] == "unavailable"
    assert "no /dev/iommu" in dev["iommufd"]["reason"]


@pytest.mark.parametrize("request_, code, problem_kind, step", [
    (vp.VFIO_GROUP_GET_DEVICE_FD, errno.ENODEV, "no-device", "VFIO_GROUP_GET_DEVICE_FD"),
    (vp.VFIO_GROUP_GET_DEVICE_FD, errno.EBUSY, "busy", "VFIO_GROUP_GET_DEVICE_FD"),
    (vp.VFIO_DEVICE_GET_INFO, errno.EIO, "error", "VFIO_DEVICE_GET_INFO"),
    (vp.VFIO_GROUP_SET_CONTAINER, errno.EBUSY, "busy", "VFIO_GROUP_SET_CONTAINER"),
    ("open:/dev/vfio/vfio", errno.EACCES, "error", "open container"),
])
def test_each_failing_call_is_named_and_everything_closed(monkeypatch, host, kernel, request_, code, problem_kind,
                                                          step):
    kernel.errors[request_] = code
    kind, result = run(monkeypatch, host, kernel, {"addresses": [st.A10]})
    assert_ends_cleanly(kind, result)
    assert kind == "fail"
    dev = by_name(result)[st.A10]
    assert (dev["problem_kind"], dev["legacy"]["step"]) == (problem_kind, step)
    assert errno.errorcode[code] in dev["problem"]
    assert kernel.open_fds() == {}


def test_container_missing_and_no_type1v2(monkeypatch, host, kernel):
    kernel.container_missing = True
    _kind, result = run(monkeypatch, host, kernel, {"addresses": [st.A10], "fail_on_problem": False})
    assert by_name(result)[st.A10]["problem_kind"] == "no-vfio"
    kernel.container_missing = False
    kernel.type1v2 = False
    _kind, result = run(monkeypatch, host, kernel, {"addresses": [st.A10], "fail_on_problem": False})
    assert by_name(result)[st.A10]["problem_kind"] == "no-type1v2"
    assert result["backends"] == {"legacy": False, "iommufd": False, "dra_setting": None}


def test_mdevs_of_a_non_pci_parent_only_with_mdevs_all(monkeypatch, tmp_path):
    tree = st.build_lab_host(tmp_path)
    dev_dir = tree.mkdir("/sys/devices/virtual/mtty/mtty/" + UUID)
    tree.link(dev_dir + "/mdev_type", "/sys/devices/virtual/mtty/mtty/mdev_supported_types/mtty-2")
    tree.link("/sys/bus/mdev/devices/" + UUID, dev_dir)
    tree.mkdir("/sys/kernel/iommu_groups/9/devices")
    tree.link(dev_dir + "/iommu_group", "/sys/kernel/iommu_groups/9")
    kernel = FakeVfioKernel(groups={9: {"devices": [UUID]}})
    kind, result = run(monkeypatch, tree, kernel, {"vendors": ["1234:11e8"], "classes": []})
    assert kind == "exit" and result["devices"] == []
    kind, result = run(monkeypatch, tree, kernel, {"vendors": ["1234:11e8"], "classes": [], "mdevs": "all"})
    assert kind == "exit"
    [dev] = result["devices"]
    assert (dev["name"], dev["type"], dev["parent"], dev["mdev_type"], dev["group"]) == \
        (UUID, "mdev", "mtty", "mtty-2", 9)
    assert dev["ok"] is True
    assert vp.VFIO_GROUP_GET_DEVICE_FD in ioctls(kernel)


def test_require_devices_when_nothing_is_handed_to_vms(monkeypatch, tmp_path):
    tree = st.build_gpu_host(tmp_path)
    kernel = FakeVfioKernel()
    kind, result = run(monkeypatch, tree, kernel, {"addresses": [st.A100], "require_devices": True})
    assert kind == "fail"
    assert result["msg"].startswith("no device is handed to VMs: none of the selected functions (0000:b1:00.0)")
    kind, result = run(monkeypatch, tree, kernel, {"addresses": [st.A100]})
    assert kind == "exit" and result["devices"] == [] and result["all_ok"] is True


def test_check_mode_probes_the_same_and_changes_nothing(monkeypatch, host, kernel):
    before = host.snapshot()
    kind, result = run(monkeypatch, host, kernel, {"_ansible_check_mode": True})
    assert kind == "exit" and result["changed"] is False and result["all_ok"] is True
    assert host.snapshot() == before


def test_bad_selector_is_a_message(monkeypatch, host, kernel):
    kind, result = run(monkeypatch, host, kernel, {"addresses": ["0000:zz:00.0"]})
    assert_ends_cleanly(kind, result)
    assert kind == "fail" and "0000:zz:00.0" in result["msg"]
    assert kernel.calls == []


def test_a_device_without_a_group_is_no_iommu():
    kernel = FakeVfioKernel()
    report = vp.probe_device(kernel, {"name": "0000:01:00.0", "type": "pci", "group": None, "cdevs": []})
    assert report["problem_kind"] == "no-iommu" and "has no IOMMU group" in report["problem"]
    assert kernel.calls == []
