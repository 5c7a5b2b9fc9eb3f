# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings

from ansible_collections.gpuops.sandbox.plugins.module_utils import _host
from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import (
    assert_ends_cleanly,
    assert_fails_with,
    call_main,
    raising,
)

OPTIONS = ["addresses", "vendors", "classes", "include_all"]


def run_main(monkeypatch, root, args):
    return call_main(monkeypatch, gpu_facts, root, args)


run = run_main


def test_defaults_select_nvidia_gpus_and_change_nothing(monkeypatch, host):
    before = host.snapshot()
    kind, result = run(monkeypatch, host.root, {})
    assert host.snapshot() == before
    assert kind == "exit"
    assert result["changed"] is False
    facts = result["ansible_facts"]
    assert sorted(facts) == ["gpu_facts_gpus", "gpu_facts_host", "gpu_facts_iommu", "gpu_facts_mdev_parents", "gpu_facts_pci_ids"]
    assert [gpu["address"] for gpu in facts["gpu_facts_gpus"]] == [
        st.A10, st.A100, *st.A100_VFS, st.L40S, *st.L40S_VFS]
    assert facts["gpu_facts_pci_ids"] == "/usr/share/misc/pci.ids"
    assert facts["gpu_facts_iommu"]["enabled"] is True
    assert [parent["name"] for parent in facts["gpu_facts_mdev_parents"]] == list(st.A100_VFS)
    a10 = facts["gpu_facts_gpus"][0]
    assert a10["device_name"] == "GA102GL [A10]"
    assert a10["driver"] == "nvidia"
    assert a10["iommu_group"] == 12
    assert [(m["address"], m["driver"]) for m in a10["iommu_group_members"]] == [
        (st.A10, "nvidia"), (st.A10_AUDIO, "snd_hda_intel")]
    assert a10["viable"] is False
    assert a10["sandbox_resource_name"] == "nvidia.com/GA102GL_A10"
    vf = facts["gpu_facts_gpus"][2]
    assert vf["physfn"] == st.A100
    assert vf["mdev_types"][0]["name"] == "NVIDIA A100-4C"
    assert facts["gpu_facts_gpus"][5]["vgpu"]["creatable_types"][0] == {"id": 1155, "name": "NVIDIA L40S-1B"}


def test_driver_override_is_null_when_unset(monkeypatch, host):
    kind, result = run(monkeypatch, host.root, {"vendors": ["10de:2236"]})
    assert kind == "exit"
    a10 = result["ansible_facts"]["gpu_facts_gpus"][0]
    assert a10["driver_override"] is None
    assert [(m["address"], m["driver_override"]) for m in a10["iommu_group_members"]] == [(st.A10, None), (st.A10_AUDIO, None)]
    # An empty attribute (the kernel shows "(null)" or, on some versions, nothing) is unset too.
    host.write(host.functions[st.A10] + "/driver_override", "\n")
    _kind, result = run(monkeypatch, host.root, {"vendors": ["10de:2236"]})
    assert result["ansible_facts"]["gpu_facts_gpus"][0]["driver_override"] is None


def test_driver_override_of_a_stranded_gpu_and_sibling(tmp_path, monkeypatch):
    """After a switch away from vm-passthrough: both functions with driver_override=vfio-pci and no driver."""
    tree = st.SysfsTree(tmp_path)
    tree.add_function(st.A10_PORT, "8086", "347a", "060400", driver="pcieport", iommu_group=11)
    tree.add_function(st.A10, "10de", "2236", "030200", parent=st.A10_PORT, iommu_group=12, driver_override="vfio-pci")
    tree.add_function(st.A10_AUDIO, "10de", "1aef", "040300", parent=st.A10_PORT, iommu_group=12,
                      driver_override="vfio-pci")
    tree.set_iommu()
    before = tree.snapshot()
    kind, result = run(monkeypatch, tree.root, {})
    assert kind == "exit" and tree.snapshot() == before
    a10 = result["ansible_facts"]["gpu_facts_gpus"][0]
    assert (a10["address"], a10["driver"], a10["driver_override"]) == (st.A10, None, "vfio-pci")
    assert [(m["address"], m["driver"], m["driver_override"]) for m in a10["iommu_group_members"]] == [
        (st.A10, None, "vfio-pci"), (st.A10_AUDIO, None, "vfio-pci")]


def test_driver_override_of_a_sibling_on_its_host_driver(monkeypatch, host):
    host.write(host.functions[st.A10_AUDIO] + "/driver_override", "snd_hda_intel\n")
    _kind, result = run(monkeypatch, host.root, {})
    gpus = result["ansible_facts"]["gpu_facts_gpus"]
    assert gpus[0]["driver_override"] is None
    assert [(m["driver"], m["driver_override"]) for m in gpus[0]["iommu_group_members"]] == [
        ("nvidia", None), ("snd_hda_intel", "snd_hda_intel")]
    # Every GPU and every group member has the key.
    assert all("driver_override" in g and all("driver_override" in m for m in g["iommu_group_members"]) for g in gpus)


def test_driver_override_without_the_attribute_and_of_a_non_pci_member(monkeypatch, host):
    """An old kernel without driver_override, and a platform device in the group (no PCI attributes at all)."""
    os.unlink(host.path(host.functions[st.A10] + "/driver_override"))
    host.mkdir("/sys/devices/platform/dummy.0")
    host.link("/sys/kernel/iommu_groups/12/devices/dummy.0", "/sys/devices/platform/dummy.0")
    _kind, result = run(monkeypatch, host.root, {"vendors": ["10de:2236"]})
    a10 = result["ansible_facts"]["gpu_facts_gpus"][0]
    assert a10["driver_override"] is None
    assert [(m["address"], m["pci"], m["driver_override"]) for m in a10["iommu_group_members"]] == [
        (st.A10, True, None), (st.A10_AUDIO, True, None), ("dummy.0", False, None)]


def test_no_group_members_with_the_iommu_off(tmp_path, monkeypatch):
    tree = st.build_gpu_host(tmp_path, iommu=False)
    tree.write(tree.functions[st.A10] + "/driver_override", "vfio-pci\n")
    _kind, result = run(monkeypatch, tree.root, {"vendors": ["10de:2236"]})
    a10 = result["ansible_facts"]["gpu_facts_gpus"][0]
    assert (a10["driver_override"], a10["iommu_group"], a10["iommu_group_members"]) == ("vfio-pci", None, [])


def test_check_mode_gives_the_same_facts(monkeypatch, host):
    _kind, normal = run(monkeypatch, host.root, {})
    kind, checked = run(monkeypatch, host.root, {"_ansible_check_mode": True})
    assert kind == "exit"
    assert checked == normal


def test_selection_by_address(monkeypatch, host):
    kind, result = run(monkeypatch, host.root, {"addresses": ["65:00.1"]})
    assert kind == "exit"
    gpus = result["ansible_facts"]["gpu_facts_gpus"]
    assert [gpu["address"] for gpu in gpus] == [st.A10_AUDIO]
    assert gpus[0]["sandbox_resource_name"] == "nvidia.com/GA102_HIGH_DEFINITION_AUDIO_CONTROLLER"


def test_selection_by_vendor_and_class(monkeypatch, host):
    _kind, result = run(monkeypatch, host.root, {"vendors": ["1a03"], "classes": ["0300"]})
    gpus = result["ansible_facts"]["gpu_facts_gpus"]
    assert [(gpu["address"], gpu["boot_vga"]) for gpu in gpus] == [(st.BMC_VGA, True)]


def test_include_all(monkeypatch, host):
    _kind, result = run(monkeypatch, host.root, {"include_all": True})
    assert len(result["ansible_facts"]["gpu_facts_gpus"]) == 14


def test_no_match_is_an_empty_list(monkeypatch, host):
    kind, result = run(monkeypatch, host.root, {"vendors": ["ffff"]})
    assert kind == "exit"
    assert result["ansible_facts"]["gpu_facts_gpus"] == []


@pytest.mark.parametrize("args, message", [
    ({"addresses": ["0000:65:00.9"]},
     "PCI address '0000:65:00.9' is not valid; expected DDDD:BB:SS.F (hex domain, bus, slot, function 0-7), "
     "e.g. 0000:65:00.0"),
    ({"addresses": ["0000:99:00.0"]},
     "PCI device 0000:99:00.0 does not exist on this host (no /sys/bus/pci/devices/0000:99:00.0)"),
    ({"vendors": ["nvidia"]},
     "vendor selector 'nvidia' is not valid; expected VVVV or VVVV:DDDD in hex, e.g. 10de or 10de:2236"),
    ({"classes": ["vga"]},
     "class selector 'vga' is not valid; expected 2, 4 or 6 hex digits (class, class+subclass or "
     "class+subclass+prog-if), e.g. 03, 0302 or 030200"),
])
def test_bad_input_fails_with_message_and_changes_nothing(monkeypatch, host, args, message):
    before = host.snapshot()
    kind, result = run(monkeypatch, host.root, args)
    assert (kind, result["msg"]) == ("fail", message)
    assert host.snapshot() == before


def test_address_outside_sys_devices(monkeypatch, host):
    host.mkdir("/tmp/evil/0000:66:00.0")
    host.link("/sys/bus/pci/devices/0000:66:00.0", "/tmp/evil/0000:66:00.0")
    kind, result = run(monkeypatch, host.root, {"addresses": ["0000:66:00.0"]})
    assert (kind, result["msg"]) == ("fail", "PCI device 0000:66:00.0 resolves outside /sys/devices; "
                                             "refusing to use it")


def test_unreadable_attribute_is_a_clean_failure(monkeypatch, host):
    host.write(host.functions[st.A10] + "/numa_node", "zero\n")
    kind, result = run(monkeypatch, host.root, {"addresses": [st.A10]})
    assert kind == "fail"
    assert result["msg"].endswith("/numa_node holds 'zero', not an integer")


def test_os_error_is_a_clean_failure(monkeypatch, host):
    monkeypatch.setattr(gpu_facts, "mdev_parents", raising(OSError(5, "Input/output error")))
    kind, result = run(monkeypatch, host.root, {})
    assert (kind, result["msg"]) == ("fail", "cannot gather GPU facts: [Errno 5] Input/output error")


def test_a_bug_is_a_message_not_a_traceback(monkeypatch, host):
    monkeypatch.setattr(gpu_facts, "host_summary", raising(TypeError("'NoneType' object is not subscriptable")))
    kind, result = run(monkeypatch, host.root, {})
    assert kind == "fail" and result["changed"] is False
    assert result["msg"].endswith(" failed unexpectedly (TypeError: 'NoneType' object is not subscriptable); "
                                  "please report this")


def test_main_runs(monkeypatch, host):
    kind, result = run_main(monkeypatch, host.root, {"vendors": ["10de:2236"]})
    assert kind == "exit"
    assert [gpu["address"] for gpu in result["ansible_facts"]["gpu_facts_gpus"]] == [st.A10]


@pytest.mark.parametrize("args, fragments", [
    ({"bogus": 1}, ["Unsupported parameters", "bogus", "addresses, classes, include_all, module_files, vendors"]),
    ({"addresses": [st.A10], "vendors": ["10de"]}, ["parameters are mutually exclusive: addresses|vendors"]),
    ({"include_all": True, "classes": ["03"]}, ["parameters are mutually exclusive: include_all|classes"]),
    ({"include_all": "perhaps"}, ["include_all", "perhaps", "bool"]),
    ({"vendors": {"a": 1}}, ["vendors", "list"]),
])
def test_main_argument_errors(monkeypatch, host, args, fragments):
    assert_fails_with(*run_main(monkeypatch, host.root, args), fragments)


_ARGS, _TYPED_ARGS = st.selector_fuzz_args(
    OPTIONS, ["10de", "10de:2236", "1a03:2000", st.A10, "65:00.1", "0000:99:00.0", "030200", "0302", "03", "", "yes", "no"],
    max_size=4)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=_ARGS)
def test_fuzz_every_input_ends_in_exit_or_fail(monkeypatch, fuzz_root, args):
    kind, result = run_main(monkeypatch, fuzz_root, args)
    assert_ends_cleanly(kind, result)
    if kind == "exit":
        assert result["changed"] is False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=_TYPED_ARGS)
def test_fuzz_typed_arguments_never_raise_and_change_nothing(monkeypatch, fuzz_root, args):
    kind, result = run_main(monkeypatch, fuzz_root, args)
    assert_ends_cleanly(kind, result)
    if kind == "exit":
        assert isinstance(result["ansible_facts"]["gpu_facts_gpus"], list)


def _write(root, path, text):
    full = root / path.lstrip("/")
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text)
    return full


def test_fingerprint_follows_the_boot_settings_and_nothing_else(tmp_path):
    root = tmp_path
    _write(root, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vda1 intel_iommu=on iommu=pt\n")
    _write(root, "/etc/modprobe.d/gpuops-nouveau.conf", "blacklist nouveau\n")
    _write(root, "/boot/initrd.img-6.1.0", "x" * 10)
    _write(root, "/proc/modules", "vfio_pci 16384 0 - Live 0x0\next4 1 0 - Live 0x0\n")
    first = _host.boot_fingerprint(str(root), "6.1.0")
    assert first == _host.boot_fingerprint(str(root), "6.1.0")
    # Files a preparation does not depend on leave it alone.
    _write(root, "/etc/hostname", "node-1\n")
    _write(root, "/etc/udev/rules.d/70-other.rules", "# not ours\n")
    _write(root, "/boot/initrd.img-5.10.0", "old kernel")
    _write(root, "/proc/modules", "vfio_pci 16384 0 - Live 0x0\next4 1 0 - Live 0x0\nxfs 1 0 - Live 0x0\n")
    assert _host.boot_fingerprint(str(root), "6.1.0") == first
    # Each of these changes it: a setting edited, a file added or removed, a rebuilt initramfs, a GPU module
    # loaded, another kernel, another command line.
    changes = [
        lambda: _write(root, "/etc/modprobe.d/gpuops-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n"),
        lambda: _write(root, "/etc/modprobe.d/local.conf", "options vfio-pci ids=10de:2236\n"),
        (root / "etc/modprobe.d/local.conf").unlink,
        lambda: _write(root, "/etc/udev/rules.d/61-gpuops-vfio-0000:65:00.0.rules", "ACTION==\"add\"\n"),
        lambda: _write(root, "/boot/initrd.img-6.1.0", "y" * 11),
        lambda: _write(root, "/proc/modules", "vfio_pci 16384 0 - Live 0x0\nnouveau 1 0 - Live 0x0\n"),
        lambda: _write(root, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vda1\n"),
        lambda: _write(root, "/etc/default/grub.d/99-gpuops-sandbox.cfg", "GRUB_CMDLINE_LINUX=\"$GRUB_CMDLINE_LINUX\"\n"),
    ]
    history = [first]
    for change in changes:
        change()
        history.append(_host.boot_fingerprint(str(root), "6.1.0"))
        assert history[-1] != history[-2]
    # Removing the file added before gives back the fingerprint from before it was added.
    assert history[3] == history[1]
    assert len(set(history)) == len(history) - 1
    assert _host.boot_fingerprint(str(root), "6.2.0") not in history


def test_prepared_record_is_read_when_valid(monkeypatch, host):
    kind, result = run(monkeypatch, host.root, {})
    assert kind == "exit" and result["ansible_facts"]["gpu_facts_host"]["prepared"] is None
    assert len(result["ansible_facts"]["gpu_facts_host"]["fingerprint"]) == 64
    record = _write(pathlib.Path(host.root), _host.PREPARED_RECORD, '{"inputs": "a", "fingerprint": "b", "runtime": "c", "expected": {}}')
    kind, result = run(monkeypatch, host.root, {})
    expected = {"inputs": "a", "fingerprint": "b", "runtime": "c", "expected": {}}
    assert result["ansible_facts"]["gpu_facts_host"]["prepared"] == expected
    for broken in ("{not json", "[1, 2]", ""):
        record.write_text(broken)
        kind, result = run(monkeypatch, host.root, {})
        assert kind == "exit" and result["ansible_facts"]["gpu_facts_host"]["prepared"] is None
