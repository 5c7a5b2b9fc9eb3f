# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Unit tests for _vfio on fake host trees, with a small simulated kernel for the sysfs writes.

``VfioKernel`` is in fakes/vfio_bind_host.py.
"""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _sysfs, _vfio
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.vfio_bind_host import RELEASE, VfioKernel


def snapshot_without(tree, *prefixes):
    return {k: v for k, v in tree.snapshot().items() if not k.startswith(prefixes)}


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(_sysfs, "_monotonic", lambda: now[0])
    monkeypatch.setattr(_sysfs, "_sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    return now


@pytest.fixture
def gpu_host(tmp_path, monkeypatch, clock):
    tree = st.build_vfio_gpu_host(tmp_path, RELEASE)
    kernel = VfioKernel(tree)
    monkeypatch.setattr(_vfio, "write_attr", kernel.write)
    return tree, kernel


# ---------------------------------------------------------------------------------------------
# Variant drivers
# ---------------------------------------------------------------------------------------------

def test_parse_vfio_aliases_keeps_only_vfio_pci_lines():
    assert _vfio.parse_vfio_aliases(st.VFIO_ALIASES_TEXT) == [
        ("v*d*sv*sd*bc*sc*i*", "vfio_pci"),
        ("v000010DEd00002342sv*sd*bc*sc*i*", "nvgrace_gpu_vfio_pci"),
        ("v000015B3d0000101Esv*sd*bc*sc*i*", "mlx5_vfio_pci"),
    ]


def test_match_variant_prefers_the_most_specific_alias():
    aliases = _vfio.parse_vfio_aliases(st.VFIO_ALIASES_TEXT)
    grace = "pci:v000010DEd00002342sv000010DEsd000016EBbc03sc02i00"
    a10 = "pci:v000010DEd00002236sv000010DEsd00001482bc03sc02i00"
    assert _vfio.match_variant(grace, aliases) == "nvgrace_gpu_vfio_pci"
    assert _vfio.match_variant(a10, aliases) == "vfio-pci"
    assert _vfio.match_variant(a10, aliases[1:]) is None
    assert _vfio.match_variant("", aliases) is None
    assert _vfio.match_variant("acpi:PNP0A08", aliases) is None


def test_target_driver_reads_modalias_and_modules_alias(gpu_host):
    tree, _kernel = gpu_host
    assert st.modalias_of(tree, st.A10) == "pci:v000010DEd00002236sv000010DEsd00001482bc03sc02i00"
    assert _vfio.target_driver(st.A10, "auto", tree.root, RELEASE) == "vfio-pci"
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT
                         + "alias vfio_pci:v000010DEd00002236sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci\n")
    assert _vfio.target_driver(st.A10, "auto", tree.root, RELEASE) == "nvgrace_gpu_vfio_pci"
    assert _vfio.target_driver(st.A10, "vfio-pci", tree.root, RELEASE) == "vfio-pci"
    # No modules.alias for the running kernel: plain vfio-pci.
    assert _vfio.target_driver(st.A10, "auto", tree.root, "0.0.0-none") == "vfio-pci"


# ---------------------------------------------------------------------------------------------
# Holders
# ---------------------------------------------------------------------------------------------

def test_nvidia_nodes_from_the_minor_or_every_node(gpu_host):
    tree, _kernel = gpu_host
    assert _vfio.nvidia_device_nodes(st.A10, tree.root) == ["/dev/nvidia0"]
    assert _vfio.nvidia_device_nodes(st.A100, tree.root) == ["/dev/nvidia1"]
    tree.write("/dev/nvidia10", "")
    # The L40S has no information file: every GPU node counts.
    assert _vfio.nvidia_device_nodes(st.L40S, tree.root) == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia10"]


def test_holders_problem_names_the_full_command_line(tmp_path):
    """A holder is named by its whole command line (which VM, which tool), not only its 15-character comm."""
    tree = st.build_vfio_gpu_host(tmp_path, RELEASE, holders=True)
    with open(tree.path("/proc/2345/cmdline"), "wb") as handle:
        handle.write(b"/usr/bin/nv-hostengine\0-n\0--service-account\0nvidia-dcgm\0")
    state = _vfio.device_state(st.A10, tree.root)
    assert _vfio.holders_problem(state, tree.root) == (
        "0000:65:00.0 is in use (driver nvidia): pid 1234 (nvidia-persiste) holds /dev/nvidia0, "
        "pid 2345 (/usr/bin/nv-hostengine -n --service-account nvidia-dcgm) holds /dev/nvidia0; stop these "
        "processes first (this module never stops or kills anything)")


def test_nvidia_nodes_default_when_dev_is_empty(tmp_path):
    tree = st.build_gpu_host(tmp_path)
    assert _vfio.nvidia_device_nodes(st.A10, tree.root) == ["/dev/nvidia0"]


def test_holders_problem_lists_pid_comm_and_device(tmp_path):
    tree = st.build_vfio_gpu_host(tmp_path, RELEASE, holders=True)
    state = _vfio.device_state(st.A10, tree.root)
    assert _vfio.holders_problem(state, tree.root) == (
        "0000:65:00.0 is in use (driver nvidia): pid 1234 (nvidia-persiste) holds /dev/nvidia0, "
        "pid 2345 (nv-hostengine) holds /dev/nvidia0; stop these processes first (this module never stops "
        "or kills anything)")
    audio = _vfio.device_state(st.A10_AUDIO, tree.root)
    assert _vfio.holder_paths(audio, tree.root) == []


def test_holder_paths_of_vfio_and_drm_functions(gpu_host):
    tree, _kernel = gpu_host
    tree.bind(st.A10, "vfio-pci")
    tree.mkdir(tree.functions[st.A10] + "/vfio-dev/vfio3")
    state = _vfio.device_state(st.A10, tree.root)
    assert _vfio.holder_paths(state, tree.root) == ["/dev/vfio/12", "/dev/vfio/devices/vfio3"]
    tree.mkdir(tree.functions[st.BMC_VGA] + "/drm/card0")
    tree.mkdir(tree.functions[st.BMC_VGA] + "/drm/renderD128")
    tree.mkdir(tree.functions[st.BMC_VGA] + "/drm/ttm")
    bmc = _vfio.device_state(st.BMC_VGA, tree.root)
    assert _vfio.holder_paths(bmc, tree.root) == ["/dev/dri/card0", "/dev/dri/renderD128"]


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

def test_udev_rule_text(gpu_host):
    tree, _kernel = gpu_host
    state = _vfio.device_state(st.A10, tree.root)
    assert _vfio.udev_rule_path(st.A10) == "/etc/udev/rules.d/61-gpuops-vfio-0000:65:00.0.rules"
    text = _vfio.udev_rule_text(state, "vfio-pci")
    lines = text.splitlines()
    assert lines[0].startswith("# Managed by gpuops.sandbox.vfio_bind")
    assert lines[2] == (
        'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="0000:65:00.0", ATTR{driver_override}="vfio-pci", '
        'RUN+="/sbin/modprobe -q vfio_pci", RUN+="/bin/sh -c \'cd /sys/bus/pci/devices/0000:65:00.0 && '
        'if [ -e driver ] && [ ! driver -ef /sys/bus/pci/drivers/vfio-pci ]; then echo 0000:65:00.0 > '
        'driver/unbind; fi; echo 0000:65:00.0 > /sys/bus/pci/drivers_probe\'"')
    assert len(lines) == 3
    with pytest.raises(_vfio.VfioError):
        _vfio.udev_rule_text(state, "vfio pci; rm -rf /")


def test_records_round_trip_and_reject_junk(gpu_host):
    tree, _kernel = gpu_host
    state = _vfio.device_state(st.A10, tree.root)
    tree.write(_vfio.record_path(st.A10), _vfio.record_text(state, "vfio-pci"))
    bound = {"driver": "nvidia", "driver_override": None, "origin": "bind", "host_modules": []}
    assert _vfio.read_record(st.A10, tree.root) == bound
    # An inferred record (a host claim had bound the function): its modules are kept, a junk module list is not.
    claims = [{"kind": "cmdline"}]
    tree.write(_vfio.record_path(st.A10), _vfio.inferred_record_text(state, "vfio-pci", claims, tree.root, RELEASE))
    assert _vfio.read_record(st.A10, tree.root) == {"driver": "nvidia", "driver_override": None,
                                                    "origin": "modules.alias", "host_modules": ["nvidia"]}
    tree.write(_vfio.record_path(st.A10), '{"address": "0000:65:00.0", "driver": null, "origin": "modules.alias", '
                                          '"host_modules": ["../x"]}')
    assert _vfio.read_record(st.A10, tree.root)["host_modules"] == []
    for junk in ("not json", "[]", '{"address": "0000:65:00.1", "driver": "nvidia"}',
                 '{"address": "0000:65:00.0", "driver": "../../x y"}', "[" * 100000 + "]" * 100000):
        tree.write(_vfio.record_path(st.A10), junk)
        assert _vfio.read_record(st.A10, tree.root) is None
    tree.write(_vfio.record_path(st.A10), '{"address": "0000:65:00.0", "driver": null}')
    assert _vfio.read_record(st.A10, tree.root) == {"driver": None, "driver_override": None, "origin": "bind",
                                                    "host_modules": []}
    assert _vfio.read_record(st.A10_AUDIO, tree.root) is None


def test_check_driver_names():
    assert _vfio.check_driver_names(["nvidia", "none", "i2c-nvidia_gpu.1"], "allowed_drivers")
    with pytest.raises(_vfio.VfioError, match="allowed_drivers entry 'a b' is not a driver name"):
        _vfio.check_driver_names(["a b"], "allowed_drivers")
    with pytest.raises(_vfio.VfioError, match="is not a driver name"):
        _vfio.check_driver_names([""], "allowed_group_drivers")


# ---------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------

def test_plan_bind_with_group(gpu_host):
    tree, kernel = gpu_host
    before = tree.snapshot()
    plan = _vfio.plan_bind([st.A10], tree.root, include_group=True, release=RELEASE)
    assert [(s["address"], s["role"], s["before"], s["target"]) for s in plan["steps"]] == [
        (st.A10, "selected", "nvidia", "vfio-pci"), (st.A10_AUDIO, "group", "snd_hda_intel", "vfio-pci")]
    assert tree.snapshot() == before and kernel.writes == []
    assert _vfio.drivers_to_load(plan, tree.root) == []


def test_plan_bind_refuses_unviable_group(gpu_host):
    tree, _kernel = gpu_host
    with pytest.raises(_vfio.VfioError) as info:
        _vfio.plan_bind([st.A10], tree.root, release=RELEASE)
    assert info.value.msg == (
        "refusing to change anything: IOMMU group 12 of 0000:65:00.0 is not viable for passthrough: "
        "0000:65:00.1 is bound to snd_hda_intel; set include_group=true to bind the other functions of the "
        "group too")


def test_plan_bind_refuses_group_sibling_on_unknown_driver(gpu_host):
    tree, _kernel = gpu_host
    with pytest.raises(_vfio.VfioError) as info:
        _vfio.plan_bind([st.A10], tree.root, include_group=True, allowed_group_drivers=[], release=RELEASE)
    assert info.value.msg == (
        "refusing to change anything: 0000:65:00.1 is bound to snd_hda_intel, which is not in allowed_drivers "
        "or allowed_group_drivers (nvidia, nouveau, vfio-pci, none); add snd_hda_intel to "
        "allowed_drivers or allowed_group_drivers to bind it anyway")


def test_plan_bind_refuses_non_pci_group_member(gpu_host):
    tree, _kernel = gpu_host
    tree.mkdir("/sys/devices/platform/idma64.0")
    tree.link("/sys/kernel/iommu_groups/12/devices/idma64.0", "/sys/devices/platform/idma64.0")
    tree.add_driver("idma64")
    tree.link("/sys/devices/platform/idma64.0/driver", "/sys/bus/pci/drivers/idma64")
    expected = "idma64.0 in IOMMU group 12 is not a PCI function and is bound to idma64"
    with pytest.raises(_vfio.VfioError, match=expected):
        _vfio.plan_bind([st.A10], tree.root, include_group=True, release=RELEASE)


def test_plan_bind_skips_functions_already_bound(gpu_host):
    tree, _kernel = gpu_host
    tree.bind(st.A10, "vfio-pci")
    tree.bind(st.A10_AUDIO, "vfio-pci")
    plan = _vfio.plan_bind([st.A10], tree.root, include_group=True, release=RELEASE)
    assert plan["steps"] == [] and [d["action"] for d in plan["devices"]] == ["none", "none"]


def test_plan_bind_refuses_function_without_group(tmp_path, clock):
    tree = st.build_gpu_host(tmp_path, iommu=False)
    with pytest.raises(_vfio.VfioError) as info:
        _vfio.plan_bind([st.A10], tree.root, release=RELEASE)
    assert info.value.msg == (
        "refusing to change anything: 0000:65:00.0 has no IOMMU group: the IOMMU is off, so vfio-pci could not "
        "give it to a VM; enable VT-d/AMD-Vi in the firmware, and on Intel boot with intel_iommu=on (see "
        "gpuops.sandbox.iommu_check)")


def test_slot_siblings_are_the_other_functions_of_the_slot_without_vfs(tmp_path):
    tree = st.build_gpu_host(tmp_path, iommu=False)
    assert [m["address"] for m in _vfio.slot_siblings(st.A10, tree.root)] == [st.A10_AUDIO]
    assert [(m["driver"], m["pci"]) for m in _vfio.slot_siblings("65:00.1", tree.root)] == [("nvidia", True)]
    # The A100's VFs (0000:b1:00.4 and .5) share its bus and device number but are not grouped by slot.
    assert _vfio.slot_siblings(st.A100, tree.root) == []
    assert _vfio.slot_siblings(st.BMC_VGA, tree.root) == []


def test_plan_bind_assumes_slot_groups_only_while_the_iommu_is_off(tmp_path, clock):
    tree = st.build_vfio_slot_host(tmp_path, RELEASE)
    plan = _vfio.plan_bind([st.SLOT_GPU], tree.root, include_group=True, assume_slot_groups=True, release=RELEASE,
                           allowed_group_drivers=["snd_hda_intel", "uhci_hcd"])
    assert [(s["address"], s["role"], s["before"], s["target"]) for s in plan["steps"]] == [
        (st.SLOT_GPU, "selected", "nvidia", "vfio-pci"), (st.SLOT_AUDIO, "group", "snd_hda_intel", "vfio-pci"),
        (st.SLOT_USB, "group", "uhci_hcd", "vfio-pci")]
    # A sibling without a driver goes along; one on pci-stub is left where it is, as in a real group.
    tree.add_function("0000:01:00.3", "10de", "1ad7", "0c8000", parent=st.SLOT_PORT)
    tree.add_function("0000:01:00.4", "10de", "1ad8", "0c8000", parent=st.SLOT_PORT, driver="pci-stub")
    plan = _vfio.plan_bind([st.SLOT_GPU], tree.root, include_group=True, assume_slot_groups=True, release=RELEASE,
                           allowed_group_drivers=["snd_hda_intel", "uhci_hcd"])
    assert [s["address"] for s in plan["devices"]] == [st.SLOT_GPU, st.SLOT_AUDIO, st.SLOT_USB, "0000:01:00.3"]
    # Once the host has IOMMU groups, a function without one is refused again, option or not.
    tree.set_group(st.SLOT_NIC, 7)
    with pytest.raises(_vfio.VfioError, match="0000:01:00.0 has no IOMMU group: the IOMMU is off"):
        _vfio.plan_bind([st.SLOT_GPU], tree.root, include_group=True, assume_slot_groups=True, release=RELEASE,
                        allowed_group_drivers=["snd_hda_intel", "uhci_hcd"])


def test_plan_bind_refuses_bridge_and_vendor_vgpu_vf(gpu_host):
    tree, _kernel = gpu_host
    with pytest.raises(_vfio.VfioError) as info:
        _vfio.plan_bind([st.A10_PORT, st.L40S_VFS[0]], tree.root, release=RELEASE)
    assert info.value.msg == (
        "refusing to change anything: 0000:64:00.0 is a PCI bridge (class 060400); bridges are never bound to a "
        "vfio driver; 0000:cb:00.4 offers NVIDIA vendor-specific vGPU types (nvidia/creatable_vgpu_types); its "
        "vGPUs are created with gpuops.sandbox.mdev_create, never by binding it to vfio-pci")


def test_plan_unbind_uses_record_and_group(gpu_host):
    tree, _kernel = gpu_host
    tree.write(_vfio.record_path(st.A10), _vfio.record_text(_vfio.device_state(st.A10, tree.root), "vfio-pci"))
    tree.bind(st.A10, "vfio-pci")
    tree.bind(st.A10_AUDIO, "vfio-pci")
    plan = _vfio.plan_unbind([st.A10], tree.root, include_group=True)
    assert [(s["address"], s["restore_to"], s["probe"]) for s in plan["steps"]] == [
        (st.A10, "nvidia", False), (st.A10_AUDIO, None, True)]


# ---------------------------------------------------------------------------------------------
# Applying and rolling back
# ---------------------------------------------------------------------------------------------

def test_apply_binds_and_restores(gpu_host):
    tree, kernel = gpu_host
    plan = _vfio.plan_bind([st.A10], tree.root, include_group=True, release=RELEASE)
    _vfio.apply_steps(plan["steps"], tree.root, timeout=1)
    assert kernel.driver(st.A10) == "vfio-pci" and kernel.driver(st.A10_AUDIO) == "vfio-pci"
    assert kernel.override(st.A10) == "vfio-pci"
    assert os.path.exists(tree.path("/dev/vfio/12"))
    assert kernel.writes[:3] == [
        ("/sys/bus/pci/drivers/nvidia/unbind", st.A10),
        ("/sys/bus/pci/devices/0000:65:00.0/driver_override", "vfio-pci"),
        ("/sys/bus/pci/drivers/vfio-pci/bind", st.A10),
    ]
    for step in plan["steps"]:
        tree.write(_vfio.record_path(step["address"]), _vfio.record_text(step["state"], "vfio-pci"))
    back = _vfio.plan_unbind([st.A10], tree.root, include_group=True)
    _vfio.apply_steps(back["steps"], tree.root, timeout=1)
    assert kernel.driver(st.A10) == "nvidia" and kernel.driver(st.A10_AUDIO) == "snd_hda_intel"
    assert kernel.override(st.A10) is None and kernel.override(st.A10_AUDIO) is None
    assert not os.path.exists(tree.path("/dev/vfio/12"))


def test_bind_failure_rolls_back_every_function_in_reverse(gpu_host):
    tree, kernel = gpu_host
    before = snapshot_without(tree)
    kernel.refuse["/sys/bus/pci/drivers/vfio-pci/bind"] = errno.EINVAL
    plan = _vfio.plan_bind([st.A10], tree.root, include_group=True, release=RELEASE)
    with pytest.raises(_vfio.VfioError) as info:
        _vfio.apply_steps(plan["steps"], tree.root, timeout=1)
    assert info.value.msg == (
        "binding 0000:65:00.0 to vfio-pci failed: writing '0000:65:00.0' to /sys/bus/pci/drivers/vfio-pci/bind "
        "failed: Invalid argument; rolled back: 0000:65:00.0 back on nvidia")
    assert kernel.driver(st.A10) == "nvidia" and kernel.override(st.A10) is None


def test_second_function_failure_rolls_back_both_and_continues_past_errors(gpu_host):
    tree, kernel = gpu_host
    plan = _vfio.plan_bind([st.A10], tree.root, include_group=True, release=RELEASE)
    # The audio function refuses vfio-pci's bind; putting the A10 back on nvidia fails too.
    real_bind = kernel.do_bind

    def picky_bind(address, driver, rel, value):
        if address == st.A10_AUDIO and driver == "vfio-pci":
            raise kernel._error(rel, value, errno.ENODEV)
        if address == st.A10 and driver == "nvidia":
            raise kernel._error(rel, value, errno.EIO)
        return real_bind(address, driver, rel, value)

    kernel.do_bind = picky_bind
    with pytest.raises(_vfio.VfioError) as info:
        _vfio.apply_steps(plan["steps"], tree.root, timeout=1)
    assert info.value.msg == (
        "binding 0000:65:00.1 to vfio-pci failed: writing '0000:65:00.1' to /sys/bus/pci/drivers/vfio-pci/bind "
        "failed: No such device; rolled back: 0000:65:00.1 back on snd_hda_intel; 0000:65:00.0 NOT restored: "
        "writing '0000:65:00.0' to /sys/bus/pci/drivers/nvidia/bind failed: Input/output error")
    assert info.value.rollback == [
        "0000:65:00.1 back on snd_hda_intel",
        "0000:65:00.0 NOT restored: writing '0000:65:00.0' to /sys/bus/pci/drivers/nvidia/bind failed: "
        "Input/output error"]
    assert kernel.driver(st.A10_AUDIO) == "snd_hda_intel"
    assert kernel.override(st.A10) is None and kernel.override(st.A10_AUDIO) is None


def test_verification_failure_is_reported(gpu_host, clock):
    tree, kernel = gpu_host
    plan = _vfio.plan_bind([st.A10], tree.root, include_group=True, release=RELEASE)
    # The kernel accepts the bind but the function stays unbound (a probe failure).
    kernel.do_bind = lambda address, driver, rel, value: None
    with pytest.raises(_vfio.VfioError) as info:
        _vfio.apply_steps(plan["steps"], tree.root, timeout=2)
    assert info.value.msg.startswith("binding 0000:65:00.0 to vfio-pci failed: 0000:65:00.0 is bound to none "
                                     "after the change, not vfio-pci; rolled back: 0000:65:00.0 NOT restored")
    assert clock[0] >= 2


def test_restore_without_record_probes(gpu_host):
    tree, kernel = gpu_host
    kernel.do_unbind(st.A10_AUDIO, "snd_hda_intel", "x", "x")
    kernel.write(tree.path("/sys/bus/pci/devices/%s/driver_override" % st.A10_AUDIO), "vfio-pci")
    kernel.do_bind(st.A10_AUDIO, "vfio-pci", "x", "x")
    plan = _vfio.plan_unbind([st.A10_AUDIO], tree.root)
    kernel.writes.clear()
    _vfio.apply_steps(plan["steps"], tree.root, timeout=1)
    assert kernel.writes == [
        ("/sys/bus/pci/drivers/vfio-pci/unbind", st.A10_AUDIO),
        ("/sys/bus/pci/devices/0000:65:00.1/driver_override", ""),
        ("/sys/bus/pci/drivers_probe", st.A10_AUDIO),
    ]
    assert kernel.driver(st.A10_AUDIO) == "snd_hda_intel"


# ---------------------------------------------------------------------------------------------
# Waiting is bounded whatever the timeout; errors carry their result keys
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("timeout", [10 ** 400, 10 ** 30, float("inf"), float("nan"), -5, None, "junk"])
def test_wait_until_never_raises_and_is_bounded(bounded_clock, timeout):
    # 10**400 used to raise OverflowError (int too large to convert to float) after the first bind, and
    # inf waited for ever.
    now = bounded_clock
    calls = []
    assert _vfio.wait_until(lambda: calls.append(1), timeout) is None
    assert now[0] <= _sysfs.MAX_WAIT + _sysfs.POLL_INTERVAL
    assert _vfio.wait_until(lambda: "done", timeout) == "done"


def test_vfio_error_reports_rollback_as_a_result_key():
    assert _vfio.VfioError("failed", rollback=["0000:65:00.0 back on nvidia"]).extra == {
        "rollback": ["0000:65:00.0 back on nvidia"]}
    assert _vfio.VfioError("refused").extra == {}


@pytest.mark.parametrize("bad", ["nvidia\n", "vfio-pci\n", "a" * 65, "nvidia drm", ""])
def test_driver_names_are_matched_in_full(bad):
    with pytest.raises(_vfio.VfioError, match="is not a driver name"):
        _vfio.check_driver_names([bad], "allowed_drivers")


def test_apply_rolls_back_on_any_exception(gpu_host, monkeypatch):
    tree, kernel = gpu_host
    plan = _vfio.plan_bind([st.A10, st.A10_AUDIO], root=tree.root, include_group=True,
                           allowed_drivers=["nvidia", "snd_hda_intel"])
    real = _vfio.bind_one

    def broken(step, root="/", timeout=10):
        if step["address"] == st.A10_AUDIO:
            raise ValueError("a bug")
        return real(step, root, timeout)

    monkeypatch.setattr(_vfio, "bind_one", broken)
    with pytest.raises(_vfio.VfioError) as info:
        _vfio.apply_steps(plan["steps"], root=tree.root)
    assert info.value.msg == ("binding 0000:65:00.1 to vfio-pci failed: ValueError: a bug; rolled back: "
                              "0000:65:00.1 back on snd_hda_intel; 0000:65:00.0 back on nvidia")
    assert [kernel.driver(a) for a in (st.A10, st.A10_AUDIO)] == ["nvidia", "snd_hda_intel"]


# ---------------------------------------------------------------------------------------------
# The host driver of a function without a record
# ---------------------------------------------------------------------------------------------

XHCI = "0000:00:14.0"


def test_host_modules_leave_out_vfio_and_stub():
    aliases = _vfio.parse_pci_aliases(st.VFIO_ALIASES_TEXT + "alias pci:v*d*sv*sd*bc03sc*i* pci_stub\n"
                                      "alias pci:v000010DEd*sv*sd*bc*sc*i* mlx5_vfio_pci\n"
                                      "alias pci:v000010DEd*sv*sd*bc03sc*i* nouveau\n")
    assert aliases[0] == ("v000010DEd*sv*sd*bc03sc*i*", "nvidia")
    a10 = "pci:v000010DEd00002236sv000010DEsd00001482bc03sc02i00"
    assert _vfio.host_modules(a10, aliases) == ["nvidia", "nouveau"]
    assert _vfio.host_modules("", aliases) == [] and _vfio.host_modules("acpi:PNP0A08", aliases) == []


@pytest.mark.parametrize("alias_file", ["modules.alias", "modules.builtin.alias"])
def test_host_driver_maps_the_module_to_its_pci_driver(gpu_host, alias_file):
    """Module xhci_pci registers driver xhci_hcd: only the driver's module link says so."""
    tree, _kernel = gpu_host
    tree.add_function(XHCI, "8086", "a36d", "0c0330", driver="xhci_hcd", iommu_group=2)
    st.add_modaliases(tree)
    tree.write("/lib/modules/%s/%s" % (RELEASE, alias_file), "alias pci:v*d*sv*sd*bc0Csc03i30* xhci_pci\n")
    assert _vfio.host_driver(XHCI, tree.root, RELEASE) == (None, ["xhci_pci"], [])
    st.add_driver_module(tree, "xhci_hcd", "xhci_pci")
    st.add_driver_module(tree, "nvidia")
    assert _vfio.host_driver(XHCI, tree.root, RELEASE) == ("xhci_hcd", ["xhci_pci"], ["xhci_hcd"])
    assert _vfio.pci_drivers_by_module(tree.root) == {"nvidia": ["nvidia"], "xhci_pci": ["xhci_hcd"]}


def test_host_driver_is_none_with_two_loaded_or_a_vfio_one(gpu_host):
    tree, _kernel = gpu_host
    st.add_driver_module(tree, "nvidia")
    st.add_driver_module(tree, "vfio-pci")
    assert _vfio.host_driver(st.A10, tree.root, RELEASE) == ("nvidia", ["nvidia"], ["nvidia"])
    st.add_driver_module(tree, "nouveau")
    st.add_modules_alias(tree, RELEASE, st.VFIO_ALIASES_TEXT + "alias pci:v000010DEd*sv*sd*bc03sc*i* nouveau\n")
    assert _vfio.host_driver(st.A10, tree.root, RELEASE) == (None, ["nvidia", "nouveau"], ["nouveau", "nvidia"])


# ---------------------------------------------------------------------------------------------
# Removing the claims made by hand (remove_claims)
# ---------------------------------------------------------------------------------------------

A10_STATE = {"vendor": "10de", "device": "2236", "subsystem_vendor": "10de", "subsystem_device": "1482",
             "class": "030200"}


@pytest.mark.parametrize("text, wanted", [
    ("options vfio-pci ids=10de:2236\n", ""),
    ("options vfio-pci ids=10de:2236 # A10\nblacklist nouveau\n", "blacklist nouveau\n"),
    ("options vfio-pci ids=10de:2236,10de:1aef disable_vga=1\n", "options vfio-pci ids=10de:1aef disable_vga=1\n"),
    ("options vfio_pci  disable_vga=1 ids=10de:2236\n", "options vfio_pci disable_vga=1\n"),
    ("options vfio-pci ids=10de:2236:10de:1482 # A10 only\n", ""),
    ("options vfio-pci ids=10de:2236:10de:1482 \\\n  disable_idle_d3=1\nsoftdep nvidia pre: vfio-pci\n",
     "options vfio-pci disable_idle_d3=1\nsoftdep nvidia pre: vfio-pci\n"),
    ("options vfio-pci ids=1234:11e8,10de:1aef\n", None),                 # another device: unchanged
    ("options vfio-pci ids=10de:2236:10de:0000\n", None),                  # another subsystem
    ("# options vfio-pci ids=10de:2236\n", None),                          # a comment
    ("options nvidia ids=10de:2236\n", None),                              # another module
    ("install vfio-pci /bin/true ids=10de:2236\n", None),
])
def test_strip_modprobe_ids(text, wanted):
    assert _vfio.strip_modprobe_ids(text, [A10_STATE]) == (text if wanted is None else wanted)


def test_claim_changes_lists_files_and_cmdline_arguments(gpu_host):
    tree, _kernel = gpu_host
    tree.set_cmdline("root=/dev/sda1 vfio_pci.ids=10de:2236,8086:1234 quiet vfio-pci.ids=10de:1aef")
    tree.write("/etc/modprobe.d/a.conf", "options vfio-pci ids=10de:2236\n")
    tree.write("/etc/modprobe.d/b.conf", "options vfio-pci ids=10de:2236,10de:1aef\n")
    tree.write("/usr/lib/modprobe.d/b.conf", "options vfio-pci ids=10de:2236\n")   # hidden by /etc's b.conf
    tree.write("/etc/driverctl.d/pci-0000:65:00.0", "vfio-pci\n")
    tree.write("/etc/driverctl.d/pci-0000:65:00.1", "snd_hda_intel\n")   # not a claim for vfio
    states = [_vfio.device_state(st.A10, tree.root), _vfio.device_state(st.A10_AUDIO, tree.root)]
    files, cmdline = _vfio.claim_changes(states[:1], tree.root)
    assert files == [("/etc/modprobe.d/a.conf", "options vfio-pci ids=10de:2236\n", None),
                     ("/etc/modprobe.d/b.conf", "options vfio-pci ids=10de:2236,10de:1aef\n",
                      "options vfio-pci ids=10de:1aef\n"),
                     ("/etc/driverctl.d/pci-0000:65:00.0", "vfio-pci\n", None)]
    assert cmdline == [{"argument": "vfio_pci.ids=10de:2236,8086:1234", "replace_with": "vfio_pci.ids=8086:1234"}]
    _files, cmdline = _vfio.claim_changes(states, tree.root)
    assert cmdline == [{"argument": "vfio_pci.ids=10de:2236,8086:1234", "replace_with": "vfio_pci.ids=8086:1234"},
                       {"argument": "vfio-pci.ids=10de:1aef", "replace_with": None}]
    assert [c["kind"] for c in _vfio.find_claims(states[0], tree.root)] == ["cmdline", "modprobe", "modprobe",
                                                                            "driverctl"]
