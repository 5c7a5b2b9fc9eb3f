"""Verify a lab host after the smoke converge: real reboot, IOMMU on, stand-in devices grouped."""

import pytest


def group_of(host, address):
    return host.check_output("readlink -f /sys/bus/pci/devices/%s/iommu_group" % address).rsplit("/", 1)[-1]


def test_booted_without_intel_iommu_off(host):
    cmdline = host.file("/proc/cmdline").content_string.split()
    assert "intel_iommu=off" not in cmdline
    assert "intel_iommu=on" in cmdline


def test_iommu_groups_present(host):
    groups = host.check_output("ls /sys/kernel/iommu_groups").split()
    assert len(groups) > 3


def test_gpu_and_audio_share_a_group(host):
    assert group_of(host, "0000:00:03.0") == group_of(host, "0000:00:03.1")


def test_second_gpu_is_alone_in_its_group(host):
    gpu2 = host.check_output("grep -l 0x11e8 /sys/bus/pci/devices/0000:0[1-9]:00.0/device").split()
    assert len(gpu2) == 1
    address = gpu2[0].split("/")[-2]
    members = host.check_output("ls /sys/bus/pci/devices/%s/iommu_group/devices" % address).split()
    assert members == [address]


def test_boot_vga_and_mdev_parent(host):
    assert host.file("/sys/bus/pci/devices/0000:00:01.0/boot_vga").content_string.strip() == "1"
    assert host.file("/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-1/name").exists


@pytest.mark.parametrize("attr,value", [("sriov_totalvfs", "4")])
def test_sriov_function(host, attr, value):
    found = host.check_output("cat /sys/bus/pci/devices/*/%s" % attr).split()
    assert value in found
