"""The lab's device layouts (lab/layout.py): the default keeps today's devices, other shapes give the QEMU
arguments and the guest addresses that follow, bad layouts are refused with the bad value named."""

import importlib.util
import os

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_SPEC = importlib.util.spec_from_file_location("layout_under_test", os.path.join(TOP, "lab", "layout.py"))
layout = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(layout)

# What every lab host carried before layouts were data (the QEMU devices, in the same places).
TODAY = [
    "-vga", "std",
    "-device", "edu,addr=03.0,multifunction=on",
    "-device", "ich9-intel-hda,addr=03.1",
    "-device", "pcie-root-port,id=rp1,chassis=1,addr=04.0",
    "-device", "nvme-subsys,id=subsys0",
    "-device", "nvme,bus=rp1,addr=00.0,serial=s1,subsys=subsys0,sriov_max_vfs=4,sriov_vq_flexible=8,"
               "sriov_vi_flexible=4,max_ioqpairs=12",
    "-device", "pcie-root-port,id=rp2,chassis=2,addr=05.0",
    "-device", "edu,bus=rp2,addr=00.0",
]

SHAPED = [
    {"slot": "03", "functions": ["gpu", "audio", "usb"]},
    {"slot": "0x08", "behind": "switch", "functions": ["gpu"]},
    {"slot": 9, "behind": "root-port", "functions": ["gpu", "serial"]},
]


def test_the_default_is_todays_layout():
    assert layout.qemu_args(None, "s1") == TODAY
    assert layout.guest_addresses(None) == {
        "gpu": ["0000:00:03.0", "0000:02:00.0"], "audio": ["0000:00:03.1"], "usb": [], "serial": [],
        "sriov": ["0000:01:00.0"]}


def test_a_switch_and_a_three_function_slot():
    args = layout.qemu_args(SHAPED, "s1")
    assert args[:8] == ["-vga", "std", "-device", "edu,addr=03.0,multifunction=on", "-device",
                        "ich9-intel-hda,addr=03.1", "-device", "qemu-xhci,addr=03.2"]
    text = " ".join(args)
    assert ("pcie-root-port,id=rp1,chassis=1,addr=08.0 -device x3130-upstream,id=up2,bus=rp1 "
            "-device xio3130-downstream,id=dn2,bus=up2,chassis=2,slot=0 -device edu,bus=dn2,addr=00.0") in text
    assert ("pcie-root-port,id=rp3,chassis=3,addr=09.0 -device edu,bus=rp3,addr=00.0,multifunction=on "
            "-device pci-serial,bus=rp3,addr=00.1") in text
    assert "nvme" not in text
    # Bus 1: the switch's upstream port, 2: its downstream port, 3: the GPU behind it; 4: the root port in 09.
    assert layout.guest_addresses(SHAPED) == {
        "gpu": ["0000:00:03.0", "0000:03:00.0", "0000:04:00.0"], "audio": ["0000:00:03.1"],
        "usb": ["0000:00:03.2"], "serial": ["0000:04:00.1"], "sriov": []}


def test_slots_are_taken_in_slot_order_whatever_the_list_order():
    assert layout.guest_addresses(list(reversed(SHAPED))) == layout.guest_addresses(SHAPED)


@pytest.mark.parametrize("bad,message", [
    ([], r"lab-x: gpulab_layout must be a non-empty list of slots, got \[\]"),
    ("03", r"must be a non-empty list of slots, got '03'"),
    ([["gpu"]], r"gpulab_layout\[0\] must be a mapping with slot, behind and functions, got \['gpu'\]"),
    ([{"functions": ["gpu"]}], r"gpulab_layout\[0\] has no slot"),
    ([{"slot": "01", "functions": ["gpu"]}], r"slot 01 is the lab's own \(the boot VGA device\); free slots"),
    ([{"slot": "07", "functions": ["gpu"]}], r"slot 07 is the lab's own \(the lab's network card\)"),
    ([{"slot": "zz", "functions": ["gpu"]}], r"slot 'zz' is not a PCI slot number \(two hex digits, 02 to 1e\)"),
    ([{"slot": True, "functions": ["gpu"]}], r"slot True is not a PCI slot number"),
    ([{"slot": "1f", "functions": ["gpu"]}], r"slot 1f is the lab's own \(the chipset\)"),
    ([{"slot": "20", "functions": ["gpu"]}], r"slot '20' is out of range"),
    ([{"slot": "03", "functions": ["gpu"]}, {"slot": 3, "functions": ["gpu"]}],
     r"gpulab_layout\[1\]: slot 03 is already used by gpulab_layout\[0\]"),
    ([{"slot": "03", "behind": "bridge", "functions": ["gpu"]}],
     r"behind='bridge'; accepted: bus, root-port, switch"),
    ([{"slot": "03", "functions": []}], r"functions must be a list of 1 to 8 kinds, got \[\]"),
    ([{"slot": "03", "functions": ["gpu"] * 9}], r"functions must be a list of 1 to 8 kinds"),
    ([{"slot": "03", "functions": ["gpu", "tpu"]}],
     r"function kind 'tpu'; accepted: gpu, audio, usb, serial, sriov"),
    ([{"slot": "03", "function": ["gpu"]}], r"unknown key\(s\) function; accepted: slot, behind, functions"),
    ([{"slot": "03", "functions": ["sriov"]}, {"slot": "04", "functions": ["sriov"]}],
     r"lab-x: 2 sriov functions; the lab has one SR-IOV stand-in per host"),
])
def test_bad_layouts_are_refused_naming_the_value(bad, message):
    with pytest.raises(layout.LayoutError, match=message):
        layout.qemu_args(bad, "s1", host="lab-x")
