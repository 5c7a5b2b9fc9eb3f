"""A prepared dra node: IOMMU on through grub with iommu=pt, nouveau kept off, the GPUs left on their own driver
(the DRA driver binds one to vfio-pci only while a VM's claim holds it), and nothing of the other types' stacks."""

import importlib.util
import os


# The vm_passthrough scenario's reading of the host's GPUs and their group companions, and its command-line
# check: a dra node boots with the same IOMMU arguments.
_SPEC = importlib.util.spec_from_file_location(
    "passthrough_node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "vm_passthrough",
                                     "tests", "test_passthrough_node.py"))
_PASSTHROUGH = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_PASSTHROUGH)
found, handed = _PASSTHROUGH.found, _PASSTHROUGH.handed
test_running_cmdline = _PASSTHROUGH.test_running_cmdline


def test_the_late_drop_in_wins_over_the_distributions(host):
    """The scenario's prepare step moved the image's intel_iommu=off into a grub.d drop-in of the distribution's: it
    is still there, and the command line the host booted with after its preparation has intel_iommu=on (the
    collection's drop-in sorts last)."""
    dropin = host.file("/etc/default/grub.d/50-distro-iommu.cfg")
    assert dropin.exists and "intel_iommu=off" in dropin.content_string
    args = host.file("/proc/cmdline").content_string.split()
    assert "intel_iommu=on" in args and "intel_iommu=off" not in args, args


def test_no_vfio_pci_claims_on_the_command_line(host):
    assert not [a for a in host.file("/proc/cmdline").content_string.split() if a.startswith("vfio-pci.ids=")]


def test_iommu_groups_for_the_gpus(found, handed):
    assert [a for a in handed if found[a]["group"] == "-"] == []


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


def test_gpus_left_to_their_driver(host, found, handed):
    assert [a for a in handed if found[a]["driver"] == "vfio-pci" or found[a]["override"] != "(null)"] == []
    for address in handed:
        assert not host.file("/etc/udev/rules.d/61-gpuops-vfio-%s.rules" % address).exists, address


def test_nothing_of_the_other_stacks(host):
    for path in ("/etc/modprobe.d/gpuops-vfio.conf", "/etc/modules-load.d/gpuops-vfio.conf",
                 "/etc/gpuops/mdev-devices.conf", "/etc/gpuops/sriov-vfs.conf"):
        assert not host.file(path).exists, path
    assert host.check_output("ls /sys/bus/mdev/devices 2>/dev/null || true") == ""


def test_no_preparation_left_pending(host):
    assert host.check_output("ls /var/lib/gpuops/pending 2>/dev/null || true") == ""
