# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _holders, _mdev, _pci
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import SysfsError
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st


@pytest.fixture
def host(tmp_path):
    return st.build_gpu_host(tmp_path)


@pytest.fixture
def root(host):
    return host.root


# --- input validation -------------------------------------------------------------------------

@pytest.mark.parametrize("address, message", [
    ("0000:65:00.8", "PCI address '0000:65:00.8' is not valid; expected DDDD:BB:SS.F (hex domain, bus, slot, "
                     "function 0-7), e.g. 0000:65:00.0"),
    ("../../etc", "PCI address '../../etc' is not valid; expected DDDD:BB:SS.F (hex domain, bus, slot, "
                  "function 0-7), e.g. 0000:65:00.0"),
    ("0000:99:00.0", "PCI device 0000:99:00.0 does not exist on this host (no /sys/bus/pci/devices/0000:99:00.0)"),
])
def test_bad_addresses_fail_with_exact_message_and_change_nothing(host, address, message):
    before = host.snapshot()
    with pytest.raises(SysfsError) as info:
        _pci.select_functions(host.root, addresses=[address])
    assert info.value.msg == message
    with pytest.raises(SysfsError) as info:
        _pci.describe_function(address, host.root)
    assert info.value.msg == message
    assert host.snapshot() == before


def test_address_resolving_outside_sys_devices_is_refused(host, tmp_path):
    host.mkdir("/tmp/evil/0000:66:00.0")
    host.write("/tmp/evil/0000:66:00.0/vendor", "0x10de\n")
    host.link("/sys/bus/pci/devices/0000:66:00.0", "/tmp/evil/0000:66:00.0")
    before = host.snapshot()
    with pytest.raises(SysfsError) as info:
        _pci.select_functions(host.root, addresses=["66:00.0"])
    assert info.value.msg == "PCI device 0000:66:00.0 resolves outside /sys/devices; refusing to use it"
    with pytest.raises(SysfsError) as info:
        _pci.select_functions(host.root)
    assert info.value.msg == "PCI device 0000:66:00.0 resolves outside /sys/devices; refusing to use it"
    assert host.snapshot() == before


@pytest.mark.parametrize("vendors, message", [
    (["nvidia"], "vendor selector 'nvidia' is not valid; expected VVVV or VVVV:DDDD in hex, e.g. 10de or 10de:2236"),
    (["10de:22"], "vendor selector '10de:22' is not valid; expected VVVV or VVVV:DDDD in hex, e.g. 10de or "
                  "10de:2236"),
    ([7], "vendor selector 7 is not valid; expected VVVV or VVVV:DDDD in hex, e.g. 10de or 10de:2236"),
])
def test_bad_vendor_selector(root, vendors, message):
    with pytest.raises(_pci.SelectorError) as info:
        _pci.select_functions(root, vendors=vendors)
    assert info.value.msg == message


@pytest.mark.parametrize("classes", [["3"], ["03020"], ["0302000"], ["vga"]])
def test_bad_class_selector(root, classes):
    with pytest.raises(_pci.SelectorError) as info:
        _pci.select_functions(root, classes=classes)
    assert info.value.msg == (
        "class selector %r is not valid; expected 2, 4 or 6 hex digits (class, class+subclass or "
        "class+subclass+prog-if), e.g. 03, 0302 or 030200" % classes[0])


# --- selection --------------------------------------------------------------------------------

def test_default_selection_is_nvidia_display_functions(root):
    assert _pci.select_functions(root) == [st.A10, st.A100, *st.A100_VFS, st.L40S, *st.L40S_VFS]


def test_selection_by_vendor_device_and_class(root):
    assert _pci.select_functions(root, vendors=["10de:2236"]) == [st.A10]
    assert _pci.select_functions(root, vendors=["0x10DE:0x1AEF"], classes=["04"]) == [st.A10_AUDIO]
    assert _pci.select_functions(root, vendors=["10de"], classes=[]) == [
        st.A10, st.A10_AUDIO, st.A100, *st.A100_VFS, st.L40S, *st.L40S_VFS]
    assert _pci.select_functions(root, vendors=[], classes=["0300"]) == [st.BMC_VGA]
    assert _pci.select_functions(root, vendors=[], classes=["0604"]) == [
        "0000:00:1c.0", st.BMC_BRIDGE, st.A10_PORT, "0000:b0:00.0", "0000:ca:00.0"]


def test_selection_by_address_normalises_and_dedupes(root):
    assert _pci.select_functions(root, addresses=["65:00.1", "0000:65:00.0", "0000:65:00.1"],
                                 vendors=["1234"]) == [st.A10, st.A10_AUDIO]


def test_include_all(root):
    assert _pci.select_functions(root, include_all=True) == _pci.list_functions(root)
    assert len(_pci.list_functions(root)) == 14


def test_empty_host(tmp_path):
    assert _pci.list_functions(str(tmp_path)) == []
    assert _pci.select_functions(str(tmp_path)) == []
    assert _pci.iommu_groups(str(tmp_path)) == []
    assert _pci.mdev_parents(str(tmp_path)) == []


# --- identity, groups, viability ----------------------------------------------------------------

def test_identity_of_a10(root):
    assert _pci.read_identity("0000:65:00.0", root) == {
        "address": st.A10, "vendor": "10de", "device": "2236", "subsystem_vendor": "10de",
        "subsystem_device": "1482", "class": "030200", "driver": "nvidia", "is_bridge": False,
    }


def test_a10_group_holds_audio_function_and_is_not_viable(host, root):
    before = host.snapshot()
    result = _pci.device_viability(st.A10, root)
    assert result["group"] == 12
    assert [(m["address"], m["driver"], m["class"]) for m in result["members"]] == [
        (st.A10, "nvidia", "030200"), (st.A10_AUDIO, "snd_hda_intel", "040300")]
    assert result["viable"] is False
    assert [b["reason"] for b in result["blockers"]] == [
        "0000:65:00.0 (10de:2236, class 030200) in IOMMU group 12 is bound to nvidia, not vfio-pci; bind it "
        "to vfio-pci (or unbind it) so the group is viable",
        "0000:65:00.1 (10de:1aef, class 040300) in IOMMU group 12 is bound to snd_hda_intel, not vfio-pci; "
        "bind it to vfio-pci (or unbind it) so the group is viable",
    ]
    assert host.snapshot() == before


def test_group_viable_once_gpu_on_vfio_and_audio_driverless(host, root):
    host.bind(st.A10, "vfio-pci")
    assert _pci.group_viability(12, root)["blockers"][0]["address"] == st.A10_AUDIO
    os.unlink(host.path(host.functions[st.A10_AUDIO] + "/driver"))
    result = _pci.group_viability(12, root)
    assert result["viable"] is True
    assert result["blockers"] == []


def test_bridges_are_exempt(host, root):
    result = _pci.device_viability(st.BMC_VGA, root)
    assert [m["address"] for m in result["members"]] == [st.BMC_BRIDGE, st.BMC_VGA]
    assert [m["is_bridge"] for m in result["members"]] == [True, False]
    assert [b["address"] for b in result["blockers"]] == [st.BMC_VGA]
    host.bind(st.BMC_VGA, "vfio-pci")
    assert _pci.device_viability(st.BMC_VGA, root)["viable"] is True


@pytest.mark.parametrize("driver, allowed", [
    (None, True), ("vfio-pci", True), ("nvgrace_gpu_vfio_pci", True), ("pci-stub", True),
    ("nvidia", False), ("nouveau", False), ("snd_hda_intel", False), ("pcieport", False),
])
def test_driver_allows_vfio(driver, allowed):
    assert _pci.driver_allows_vfio(driver) is allowed


def test_non_pci_group_member_is_an_endpoint(host, root):
    host.mkdir("/sys/devices/platform/idma0")
    host.link("/sys/devices/platform/idma0/driver", "/sys/bus/platform/drivers/idma")
    host.mkdir("/sys/bus/platform/drivers/idma")
    host.link("/sys/kernel/iommu_groups/12/devices/idma0", "/sys/devices/platform/idma0")
    members = _pci.iommu_group_members(12, root)
    assert members[-1] == {"address": "idma0", "vendor": None, "device": None, "subsystem_vendor": None,
                           "subsystem_device": None, "class": None, "is_bridge": False, "pci": False,
                           "driver": "idma"}
    assert _pci.group_viability(12, root)["blockers"][-1]["reason"] == (
        "idma0 in IOMMU group 12 is bound to idma, not vfio-pci; bind it to vfio-pci (or unbind it) so the "
        "group is viable")


def test_missing_group(root):
    with pytest.raises(SysfsError) as info:
        _pci.iommu_group_members(999, root)
    assert info.value.msg == "IOMMU group 999 does not exist (no /sys/kernel/iommu_groups/999/devices)"


def test_iommu_off_means_no_group_and_not_viable(tmp_path):
    tree = st.build_gpu_host(tmp_path, iommu=False)
    assert _pci.iommu_groups(tree.root) == []
    assert _pci.iommu_group_of(st.A10, tree.root) is None
    result = _pci.device_viability(st.A10, tree.root)
    assert result["viable"] is False
    assert result["blockers"][0]["reason"] == (
        "0000:65:00.0 has no IOMMU group: the IOMMU is not enabled (enable VT-d/AMD-Vi in the firmware; on Intel "
        "also boot with intel_iommu=on, AMD-Vi is on by default)")
    assert "amd_iommu=on" not in result["blockers"][0]["reason"]


def test_bad_group_link(host, root):
    host.link(host.functions[st.A10] + "/iommu_group", "/sys/kernel/iommu_groups/abc")
    with pytest.raises(SysfsError) as info:
        _pci.iommu_group_of(st.A10, root)
    assert info.value.msg == "iommu_group of 0000:65:00.0 points at 'abc', not a group number"


# --- SR-IOV, mdev, vGPU ------------------------------------------------------------------------

def test_sriov_pf_and_vf(root):
    assert _pci.sriov_info(st.A100, root) == {
        "totalvfs": 20, "numvfs": 2, "physfn": None, "virtfns": list(st.A100_VFS)}
    assert _pci.sriov_info(st.A100_VFS[1], root) == {
        "totalvfs": None, "numvfs": None, "physfn": st.A100, "virtfns": []}
    assert _pci.sriov_info(st.A10, root) == {"totalvfs": None, "numvfs": None, "physfn": None, "virtfns": []}


def test_mdev_types_on_a100_vf(root):
    assert _pci.mdev_types(st.A100_VFS[0], root) == [
        {"id": "nvidia-692", "name": "NVIDIA A100-4C", "available_instances": 1, "device_api": "vfio-pci",
         "description": "num_heads=1, frl_config=60, framebuffer=4096M",
         "resource_name": "nvidia.com/NVIDIA_A100-4C"},
        {"id": "nvidia-700", "name": "NVIDIA A100-80C", "available_instances": 0, "device_api": "vfio-pci",
         "description": None, "resource_name": "nvidia.com/NVIDIA_A100-80C"},
    ]
    assert _pci.mdev_types(st.A100, root) == []


def test_mdev_parents(root):
    parents = _pci.mdev_parents(root)
    assert [(p["name"], p["address"]) for p in parents] == [(vf, vf) for vf in st.A100_VFS]
    assert parents[0]["sysfs_path"] == "/sys/devices/pci0000:b0/0000:b0:00.0/0000:b1:00.4"


def test_mdev_parent_mtty(tmp_path):
    tree = st.build_lab_host(tmp_path)
    assert _pci.mdev_parents(tree.root) == [{
        "name": "mtty", "address": None, "sysfs_path": "/sys/devices/virtual/mtty/mtty",
        "types": [
            {"id": "mtty-1", "name": "Single port serial", "available_instances": 24, "device_api": "vfio-pci",
             "description": None, "resource_name": "nvidia.com/Single_port_serial"},
            {"id": "mtty-2", "name": "Dual port serial", "available_instances": 12, "device_api": "vfio-pci",
             "description": None, "resource_name": "nvidia.com/Dual_port_serial"},
        ],
    }]


def test_bad_available_instances_is_unknown_not_a_failure(host, root):
    """One reader for gpu_facts and mdev_create: a count that is not a number is reported as unknown (None)
    instead of failing every fact gathering on the host; mdev_create counts it as none available."""
    host.write(host.functions[st.A100_VFS[0]] + "/mdev_supported_types/nvidia-692/available_instances", "many\n")
    types = dict((t["id"], t) for t in _pci.mdev_types(st.A100_VFS[0], root))
    assert types["nvidia-692"]["available_instances"] is None
    assert types["nvidia-692"]["name"] == "NVIDIA A100-4C"


def test_vendor_specific_vgpu(root):
    assert _pci.vgpu_info(st.L40S_VFS[0], root) == {
        "creatable_types": [{"id": 1155, "name": "NVIDIA L40S-1B"}, {"id": 1156, "name": "NVIDIA L40S-2B"},
                            {"id": 1161, "name": "NVIDIA L40S-1Q"}],
        "current_type": 0,
    }
    assert _pci.vgpu_info(st.L40S_VFS[1], root) == {"creatable_types": [], "current_type": 1161}
    assert _pci.vgpu_info(st.L40S, root) is None
    assert _pci.vgpu_info(st.A100_VFS[0], root) is None


def test_numbers_in_sysfs_names_are_ascii_digits_only():
    # "\u00b2".isdigit() is True but int() refuses it: such a line is junk, not a crash.
    assert _pci.parse_creatable_vgpu_types("\u00b2 : NVIDIA L40S-1B\n\u0661 : x\n1155 : NVIDIA L40S-2B\n") == [
        {"id": 1155, "name": "NVIDIA L40S-2B"}]


@pytest.mark.parametrize("vendors, classes", [(["10de\n"], None), (None, ["0302\n"]), (["10de:2236\n"], ["03\n"])])
def test_selectors_are_stripped_then_matched_whole(root, vendors, classes):
    """Surrounding whitespace (a trailing newline included) is stripped; the rest must match as a whole."""
    assert _pci.select_functions(root=root, vendors=vendors, classes=classes) == _pci.select_functions(
        root=root, vendors=[v.strip() for v in vendors] if vendors else None,
        classes=[c.strip() for c in classes] if classes else None)


@pytest.mark.parametrize("bad", ["10de\n0", "10de\x00", "1\uff10de", "10de:22\u0663\u0666"])
def test_vendor_selector_with_inner_control_or_non_ascii_is_refused(bad):
    with pytest.raises(_pci.SelectorError) as info:
        _pci.parse_vendor_selectors([bad])
    assert repr(bad) in info.value.msg


def test_parse_creatable_vgpu_types_ignores_header_and_junk():
    text = "ID    : vGPU Name\n1155  : NVIDIA L40S-1B\n\ngarbage\nx : y\n 42:  Name: with colon \n"
    assert _pci.parse_creatable_vgpu_types(text) == [{"id": 1155, "name": "NVIDIA L40S-1B"},
                                                     {"id": 42, "name": "Name: with colon"}]


@pytest.mark.parametrize("line", ["0 : none", "1234567890 : too long", "00 : zero"])
def test_parse_creatable_vgpu_types_has_no_id_zero_or_huge_ids(line):
    """Id 0 is what current_vgpu_type holds with no vGPU, never a type; ids are at most 9 digits. gpu_facts and
    mdev_create read the file through this one parser and agree."""
    text = "ID : vGPU Name\n%s\n1155 : NVIDIA L40S-1B\n" % line
    assert _pci.parse_creatable_vgpu_types(text) == [{"id": 1155, "name": "NVIDIA L40S-1B"}]
    assert _mdev.parse_vgpu_types(text) == {1155: "NVIDIA L40S-1B"}


def test_bad_current_vgpu_type(host, root):
    host.write(host.functions[st.L40S_VFS[0]] + "/nvidia/current_vgpu_type", "none\n")
    with pytest.raises(SysfsError) as info:
        _pci.vgpu_info(st.L40S_VFS[0], root)
    assert "current_vgpu_type holds 'none', not a vGPU type ID" in info.value.msg


# --- describe ------------------------------------------------------------------------------------

def test_describe_function_a10(host, root):
    before = host.snapshot()
    info = _pci.describe_function(st.A10, root, _pci.load_pci_ids_db(root))
    assert host.snapshot() == before
    assert info["device_name"] == "GA102GL [A10]"
    assert info["vendor_name"] == "NVIDIA Corporation"
    assert info["subsystem_name"] == "GA102GL [A10]"
    assert info["class_name"] == "3D controller"
    assert info["sysfs_path"] == "/sys/devices/pci0000:64/0000:64:00.0/0000:65:00.0"
    assert info["numa_node"] == 0
    assert info["boot_vga"] is False
    assert info["iommu_group"] == 12
    assert [m["address"] for m in info["iommu_group_members"]] == [st.A10, st.A10_AUDIO]
    assert info["viable"] is False
    assert info["is_vf"] is False
    assert info["sandbox_resource_name"] == "nvidia.com/GA102GL_A10"
    assert info["vgpu"] is None


def test_describe_bmc_vga(root):
    info = _pci.describe_function(st.BMC_VGA, root, _pci.load_pci_ids_db(root))
    assert info["boot_vga"] is True
    assert info["numa_node"] == -1
    assert info["device_name"] == "ASPEED Graphics Family"
    assert info["class_name"] == "VGA controller"
    assert info["sandbox_resource_name"] is None


def test_describe_without_pci_ids(root):
    info = _pci.describe_function(st.A10, root)
    assert info["device_name"] is None
    assert info["vendor_name"] is None
    # The sandbox device plugin names GPUs from its own pci.ids: the host having none changes nothing.
    assert info["sandbox_resource_name"] == "nvidia.com/GA102GL_A10"


# --- pci.ids ---------------------------------------------------------------------------------------

def test_load_pci_ids_search_order(tmp_path):
    tree = st.SysfsTree(tmp_path)
    assert _pci.load_pci_ids(tree.root) == (None, None)
    tree.write("/usr/share/pci.ids", "1234  Third\n")
    assert _pci.load_pci_ids(tree.root) == ("/usr/share/pci.ids", "1234  Third\n")
    tree.write("/usr/share/hwdata/pci.ids", "1234  Second\n")
    assert _pci.load_pci_ids(tree.root)[0] == "/usr/share/hwdata/pci.ids"
    tree.write("/usr/share/misc/pci.ids", "1234  First\n")
    assert _pci.load_pci_ids(tree.root)[0] == "/usr/share/misc/pci.ids"


def test_pci_ids_names_are_vendor_scoped():
    db = _pci.parse_pci_ids(st.PCI_IDS_TEXT)
    assert _pci.pci_names(db, "10de", "20b5")["device_name"] == "GA100 [A100 PCIe 80GB]"
    assert _pci.pci_names(db, "1013", "20b5")["device_name"] == "Made-up device with an NVIDIA-looking ID"
    assert _pci.pci_names(db, "10de", "26b9")["device_name"] == "AD102GL [L40S]"
    assert _pci.pci_names(db, "10df", "1ae5")["vendor_name"] == "Emulex Corporation"
    assert _pci.pci_names(db, "10de", "1ae5")["device_name"] is None
    assert _pci.pci_names(db, "ffff", "0000") == {
        "vendor_name": None, "device_name": None, "subsystem_name": None, "class_name": None}
    assert _pci.pci_names(db, "10de", "20b5", "10de", "1533")["subsystem_name"] == "A100 PCIe 80GB"
    assert _pci.pci_names(db, "10de", "2236", pci_class="040300")["class_name"] == "Audio device"
    assert _pci.pci_names(db, "10de", "2236", pci_class="0c0330")["class_name"] is None
    assert _pci.pci_names(db, "1a03", "1150", pci_class="060400")["class_name"] == "Normal decode"
    assert _pci.pci_names(None, "10de", "2236")["vendor_name"] is None


def test_class_section_does_not_leak_into_vendors():
    db = _pci.parse_pci_ids("C 03  Display controller\n\t00  VGA compatible controller\n")
    assert db["vendors"] == {}
    assert db["classes"]["03"]["subclasses"]["00"]["name"] == "VGA compatible controller"


# --- sandbox device plugin resource names --------------------------------------------------------

@pytest.mark.parametrize("device_id, expected", [
    ("2236", "nvidia.com/GA102GL_A10"),
    ("0x2236", "nvidia.com/GA102GL_A10"),
    ("20B5", "nvidia.com/GA100_A100_PCIE_80GB"),
    ("26b9", "nvidia.com/AD102GL_L40S"),
    ("1aef", "nvidia.com/GA102_HIGH_DEFINITION_AUDIO_CONTROLLER"),
    ("ffff", "nvidia.com/ffff"),
    ("1ae5", "nvidia.com/1ae5"),
])
def test_sandbox_resource_name_vendor_scoped(device_id, expected):
    assert _pci.sandbox_resource_name(st.PCI_IDS_TEXT, device_id) == expected


@pytest.mark.parametrize("device_id, expected", [
    ("2236", "nvidia.com/GA102GL_A10"),
    # Older plugin images do not check the vendor: an earlier vendor's line wins.
    ("20b5", "nvidia.com/MADEUP_DEVICE_WITH_AN_NVIDIALOOKING_ID"),
    ("ffff", "nvidia.com/ffff"),
])
def test_sandbox_resource_name_unscoped(device_id, expected):
    assert _pci.sandbox_resource_name(st.PCI_IDS_TEXT, device_id, vendor_scoped=False) == expected


def test_sandbox_resource_name_unscoped_line_with_id_twice_stops_search():
    text = "1111  Vendor\n\t2236 2236  Twice\n10de  NVIDIA Corporation\n\t2236  GA102GL [A10]\n"
    assert _pci.sandbox_resource_name(text, "2236", vendor_scoped=False) == "nvidia.com/2236"
    assert _pci.sandbox_resource_name(text, "2236") == "nvidia.com/GA102GL_A10"


def test_sandbox_resource_name_scoped_stops_at_next_vendor_and_without_vendor():
    assert _pci.sandbox_resource_name("10de  NVIDIA\n\n\t2236  A10\n", "2236") == "nvidia.com/2236"
    assert _pci.sandbox_resource_name("1013  Cirrus\n\t2236  X\n", "2236") == "nvidia.com/2236"
    assert _pci.sandbox_resource_name("", "2236") == "nvidia.com/2236"
    assert _pci.sandbox_resource_name("10de  NVIDIA\n\t2236  GA102/GL. x  [A10]*\n", "2236") == (
        "nvidia.com/GA102_GL__X_A10")


@pytest.mark.parametrize("device_id", ["", "22", "22366", "zzzz", None])
def test_sandbox_resource_name_bad_id(device_id):
    with pytest.raises(_pci.SelectorError) as info:
        _pci.sandbox_resource_name(st.PCI_IDS_TEXT, device_id)
    assert info.value.msg == "device ID %r is not valid; expected 4 hex digits, e.g. 2236" % (device_id,)


def test_vgpu_resource_name():
    assert _pci.vgpu_resource_name("NVIDIA A10-12Q") == "nvidia.com/NVIDIA_A10-12Q"
    assert _pci.vgpu_resource_name("NVIDIA  A100-4C\n") == "nvidia.com/NVIDIA_A100-4C"
    assert _pci.vgpu_resource_name(b"NVIDIA A10-12Q \n") == "nvidia.com/NVIDIA_A10-12Q_"
    with pytest.raises(_pci.SelectorError) as info:
        _pci.vgpu_resource_name(None)
    assert info.value.msg == "an mdev type name must be text or bytes, not NoneType"


def test_sandbox_resource_name_default_is_the_plugin_table():
    # The plugin reads its own pci.ids, not the host's: None picks the deployed version's table.
    assert _pci.sandbox_resource_name(None, "2330") == "nvidia.com/GH100_H100_SXM5_80GB"
    assert _pci.sandbox_resource_name("10de  NVIDIA\n\t2330  GH100[H100 SXM5 80GB]\n", "2330") == (
        "nvidia.com/GH100H100_SXM5_80GB")


@pytest.mark.parametrize("raw, name, resource", [
    (b"NVIDIA A10-12Q \n", "NVIDIA A10-12Q", "nvidia.com/NVIDIA_A10-12Q_"),
    (b"NVIDIA\tA10-12Q\n", "NVIDIA\tA10-12Q", "nvidia.com/NVIDIA_A10-12Q"),
    (b"NVIDIA\x0bA10-12Q\x0b\n", "NVIDIA\x0bA10-12Q", "nvidia.com/NVIDIA\x0bA10-12Q\x0b"),
    (b"\tNVIDIA A10-12Q", "NVIDIA A10-12Q", "nvidia.com/_NVIDIA_A10-12Q"),
])
def test_mdev_type_resource_name_from_the_raw_name_file(host, root, raw, name, resource):
    """The plugin names an mdev type from the raw name file (only newlines trimmed), not the stripped name."""
    path = host.path(host.functions[st.A100_VFS[0]] + "/mdev_supported_types/nvidia-692/name")
    with open(path, "wb") as handle:
        handle.write(raw)
    mtype = _pci.mdev_types(st.A100_VFS[0], root)[0]
    assert (mtype["name"], mtype["resource_name"]) == (name, resource)


def test_mdev_type_without_name_file_has_no_resource_name(host, root):
    os.unlink(host.path(host.functions[st.A100_VFS[0]] + "/mdev_supported_types/nvidia-692/name"))
    mtype = _pci.mdev_types(st.A100_VFS[0], root)[0]
    assert (mtype["name"], mtype["resource_name"]) == (None, None)


# --- holders -----------------------------------------------------------------------------------

def test_find_holders(host, root):
    before = host.snapshot()
    assert _holders.find_holders(["/dev/nvidia0", "/dev/nvidia1", "/dev/vfio/12"], root) == [
        {"pid": 1234, "comm": "nvidia-persiste", "cmdline": None, "device": "/dev/nvidia0"},
        {"pid": 2345, "comm": "nv-hostengine", "cmdline": None, "device": "/dev/nvidia0"},
        {"pid": 2345, "comm": "nv-hostengine", "cmdline": None, "device": "/dev/nvidia1"},
        {"pid": 3456, "comm": "qemu-kvm", "cmdline": None, "device": "/dev/vfio/12"},
    ]
    assert _holders.find_holders(["/dev/nvidia7"], root) == []
    assert _holders.find_holders([], root) == []
    assert host.snapshot() == before


def test_vfio_nodes_and_holders_of_a_device(host, root):
    # The one list of the nodes a VMM opens for a device: its group's node and its iommufd character devices.
    devdir = host.path("/sys/bus/pci/devices/%s" % st.A10)
    assert _holders.vfio_nodes(devdir) == ["/dev/vfio/12"]
    host.mkdir("/sys/bus/pci/devices/%s/vfio-dev/vfio3" % st.A10)
    assert _holders.vfio_nodes(devdir) == ["/dev/vfio/12", "/dev/vfio/devices/vfio3"]
    assert _holders.vfio_holders(devdir, root) == [(3456, "qemu-kvm")]
    # A device outside any IOMMU group has no group node, and nothing holds its nodes.
    lone = host.path("/sys/bus/pci/devices/%s" % st.A10_PORT)
    if os.path.lexists(os.path.join(lone, "iommu_group")):
        os.unlink(os.path.join(lone, "iommu_group"))
    assert _holders.vfio_nodes(lone) == []
    assert _holders.vfio_holders(lone, root) == []


def test_find_holders_patterns(host, root):
    assert [(h["pid"], h["device"]) for h in _holders.find_holders([], root, patterns=["/dev/nvidia*"])] == [
        (1234, "/dev/nvidia0"), (1234, "/dev/nvidiactl"), (2345, "/dev/nvidia0"), (2345, "/dev/nvidia1")]
    # A pattern adds to the exact paths; a descriptor matching both is listed once.
    assert [(h["pid"], h["device"]) for h in _holders.find_holders(["/dev/nvidia0", "/dev/vfio/12"], root,
                                                                   patterns=["/dev/nvidia[1-9]"])] == [
        (1234, "/dev/nvidia0"), (2345, "/dev/nvidia0"), (2345, "/dev/nvidia1"), (3456, "/dev/vfio/12")]
    assert _holders.find_holders([], root, patterns=["/run/nvidia/driver/dev/nvidia*"]) == []
    with pytest.raises(_pci.SysfsError, match="device pattern 'nvidia\\*' is not valid"):
        _holders.find_holders([], root, patterns=["nvidia*"])


def test_find_holders_skips_processes_without_fd_dir_or_comm(host, root):
    host.write("/proc/77/comm", "zombie\n")
    host.mkdir("/proc/78/fd")
    host.raw_link("/proc/78/fd/1", "/dev/vfio/12")
    assert {"pid": 78, "comm": None, "cmdline": None, "device": "/dev/vfio/12"} in _holders.find_holders(["/dev/vfio/12"], root)


@pytest.mark.parametrize("raw, expected", [
    (b"/usr/bin/qemu-system-x86_64\0-name\0guest=vm1\0", "/usr/bin/qemu-system-x86_64 -name guest=vm1"),
    (b"sleep\x00\x00600\x00", "sleep 600"),
    (b"evil\nline\0\x1b[31m\0", "evil?line ?[31m"),
    (b"", None),
    (b"x" * 5000, "x" * 400 + "..."),
])
def test_find_holders_reads_the_full_command_line(host, root, raw, expected):
    with open(host.path("/proc/3456/cmdline"), "wb") as handle:
        handle.write(raw)
    assert _holders.find_holders(["/dev/vfio/12"], root) == [
        {"pid": 3456, "comm": "qemu-kvm", "cmdline": expected, "device": "/dev/vfio/12"}]


@pytest.mark.parametrize("path", ["dev/nvidia0", "", 3, None])
def test_find_holders_rejects_relative_paths(root, path):
    with pytest.raises(SysfsError) as info:
        _holders.find_holders([path], root)
    assert info.value.msg == ("device path %r is not valid; expected an absolute path such as /dev/nvidia0"
                              % (path,))


# --- lab-shaped host ---------------------------------------------------------------------------

def test_lab_host_selection_and_groups(tmp_path):
    tree = st.build_lab_host(tmp_path)
    selected = _pci.select_functions(tree.root, vendors=["1234:11e8"], classes=["00ff00"])
    assert selected == ["0000:00:03.0", "0000:01:00.0"]
    shared = _pci.device_viability("0000:00:03.0", tree.root)
    assert [m["address"] for m in shared["members"]] == ["0000:00:03.0", "0000:00:03.1"]
    assert [b["address"] for b in shared["blockers"]] == ["0000:00:03.1"]
    alone = _pci.device_viability("0000:01:00.0", tree.root)
    assert alone["viable"] is True
    assert _pci.sriov_info("0000:02:00.0", tree.root)["totalvfs"] == 4
