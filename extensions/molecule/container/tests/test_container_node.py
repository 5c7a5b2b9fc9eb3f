"""A prepared container node: nouveau kept off (also in the initramfs), nothing of the VM stack."""

import json


def test_nouveau_blacklisted(host):
    conf = host.file("/etc/modprobe.d/gpuops-nouveau.conf")
    assert conf.exists and conf.user == "root" and conf.mode == 0o644
    lines = conf.content_string.splitlines()
    assert "blacklist nouveau" in lines
    assert "options nouveau modeset=0" in lines


def test_initramfs_carries_the_blacklist(host):
    kernel = host.check_output("uname -r")
    listing = host.check_output("lsinitramfs /boot/initrd.img-%s" % kernel)
    assert "etc/modprobe.d/gpuops-nouveau.conf" in listing.split()


def test_nouveau_not_loaded(host):
    assert not host.file("/sys/module/nouveau").exists


def test_nothing_of_the_vm_stack(host):
    for path in ("/etc/modprobe.d/gpuops-vfio.conf", "/etc/modules-load.d/gpuops-vfio.conf",
                 "/etc/gpuops/mdev-devices.conf", "/etc/gpuops/sriov-vfs.conf",
                 "/etc/default/grub.d/99-gpuops-sandbox.cfg"):
        assert not host.file(path).exists, path
    assert host.check_output("ls /etc/udev/rules.d") .find("gpuops-vfio") < 0
    assert host.check_output("ls /sys/bus/mdev/devices 2>/dev/null || true") == ""
    for gpu in ("0000:00:03.0", "0000:02:00.0"):
        driver = host.file("/sys/bus/pci/devices/%s/driver" % gpu)
        assert not driver.exists or not driver.linked_to.endswith("/vfio-pci")


def test_cmdline_has_no_vm_arguments(host):
    args = host.file("/proc/cmdline").content_string.split()
    assert "intel_iommu=on" not in args and "iommu=pt" not in args


def test_host_has_no_iommu(host):
    # This lab host stands for firmware with VT-d off: no DMAR table, no IOMMU groups.
    assert not host.file("/sys/firmware/acpi/tables/DMAR").exists
    assert json.loads(host.check_output("ls /sys/kernel/iommu_groups | wc -l")) == 0
