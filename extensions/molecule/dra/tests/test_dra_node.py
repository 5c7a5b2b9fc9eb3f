"""A prepared dra node: IOMMU on through grub with iommu=pt, nouveau kept off, the GPUs left on their own driver
(the DRA driver binds one to vfio-pci only while a VM's claim holds it), and nothing of the other types' stacks."""

import pytest

GPUS = ["0000:00:03.0", "0000:02:00.0"]
SIBLING = "0000:00:03.1"   # the HDA function in the first GPU's IOMMU group


def driver_of(host, address):
    link = host.file("/sys/bus/pci/devices/%s/driver" % address)
    return link.linked_to.rsplit("/", 1)[-1] if link.exists else None


def test_running_cmdline(host):
    args = host.file("/proc/cmdline").content_string.split()
    assert "intel_iommu=on" in args and "iommu=pt" in args
    assert "intel_iommu=off" not in args
    assert not [a for a in args if a.startswith("vfio-pci.ids=")]


def test_iommu_groups_for_the_gpus(host):
    for address in GPUS:
        link = host.file("/sys/bus/pci/devices/%s/iommu_group" % address)
        assert link.exists, address


def test_nouveau_blacklisted_in_the_initramfs(host):
    conf = host.file("/etc/modprobe.d/gpuops-nouveau.conf").content_string.splitlines()
    assert "blacklist nouveau" in conf and "options nouveau modeset=0" in conf
    kernel = host.check_output("uname -r")
    listing = host.check_output("lsinitramfs /boot/initrd.img-%s" % kernel).split()
    assert "etc/modprobe.d/gpuops-nouveau.conf" in listing
    assert not host.file("/sys/module/nouveau").exists


def test_vfio_pci_is_there_for_the_dra_driver(host):
    # The kernel plugin loads vfio-pci when it prepares a VM's claim: the module must exist for this kernel.
    assert host.run("modinfo -F filename vfio-pci").rc == 0


@pytest.mark.parametrize("address", GPUS + [SIBLING])
def test_gpus_left_to_their_driver(host, address):
    assert driver_of(host, address) != "vfio-pci"
    override = host.file("/sys/bus/pci/devices/%s/driver_override" % address).content_string.strip()
    assert override in ("", "(null)")
    assert not host.file("/etc/udev/rules.d/61-gpuops-vfio-%s.rules" % address).exists


def test_nothing_of_the_other_stacks(host):
    for path in ("/etc/modprobe.d/gpuops-vfio.conf", "/etc/modules-load.d/gpuops-vfio.conf",
                 "/etc/gpuops/mdev-devices.conf", "/etc/gpuops/sriov-vfs.conf"):
        assert not host.file(path).exists, path
    assert host.check_output("ls /sys/bus/mdev/devices 2>/dev/null || true") == ""


def test_no_preparation_left_pending(host):
    assert host.check_output("ls /var/lib/gpuops/pending 2>/dev/null || true") == ""
