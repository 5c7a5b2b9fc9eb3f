"""A prepared vm-passthrough node: IOMMU on through grub, vfio early, GPUs and their group on vfio-pci."""

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


def test_iommu_groups(host):
    assert len(host.check_output("ls /sys/kernel/iommu_groups").split()) > 3


@pytest.mark.parametrize("address", GPUS + [SIBLING])
def test_on_vfio_pci_with_group_node(host, address):
    assert driver_of(host, address) == "vfio-pci"
    group = host.file("/sys/bus/pci/devices/%s/iommu_group" % address).linked_to.rsplit("/", 1)[-1]
    assert host.file("/dev/vfio/%s" % group).exists


@pytest.mark.parametrize("address", GPUS + [SIBLING])
def test_binding_persists_through_udev(host, address):
    rule = host.file("/etc/udev/rules.d/61-gpuops-vfio-%s.rules" % address)
    assert rule.exists and "vfio-pci" in rule.content_string


def test_vfio_modules_early_and_softdeps(host):
    load = host.file("/etc/modules-load.d/gpuops-vfio.conf").content_string.split()
    assert {"vfio", "vfio_iommu_type1", "vfio_pci"} <= set(load)
    softdeps = host.file("/etc/modprobe.d/gpuops-vfio.conf").content_string.splitlines()
    assert "softdep nvidia pre: vfio-pci" in softdeps
    assert "softdep nouveau pre: vfio-pci" in softdeps
    kernel = host.check_output("uname -r")
    listing = host.check_output("lsinitramfs /boot/initrd.img-%s" % kernel)
    assert "vfio-pci.ko" in listing and "etc/modprobe.d/gpuops-vfio.conf" in listing


def test_boot_vga_left_alone(host):
    assert driver_of(host, "0000:00:01.0") != "vfio-pci"


def test_no_vgpu_leftovers(host):
    assert not host.file("/etc/gpuops/mdev-devices.conf").exists
    assert host.check_output("ls /sys/bus/mdev/devices 2>/dev/null || true") == ""


def container_leg(host):
    import json  # pylint: disable=import-outside-toplevel
    report = json.loads(host.file("/var/tmp/gpuops-switch-container.json").content_string)
    lines = {}
    for line in report.get("state", []):
        kind, _sep, rest = line.partition(" ")
        lines.setdefault(kind, []).append(rest)
    return report, lines


def test_container_leg_was_clean(host):
    report, _lines = container_leg(host)
    assert report["workload_type"] == "container" and report["ready"] is True
    names = [check["check"] for check in report["checks"] if check["ok"]]
    assert "no vfio-pci binding left" in names and "no IOMMU arguments of a VM node" in names


# What each function had on the pristine lab host: the edu stand-ins have no host driver, the HDA function
# of the first one's slot is on snd_hda_intel; nothing carries a driver_override.
PRISTINE = {"0000:00:03.0": "none", "0000:00:03.1": "snd_hda_intel", "0000:02:00.0": "none"}


@pytest.mark.parametrize("address", sorted(PRISTINE))
def test_container_leg_gave_every_function_back(host, address):
    """After the container leg's reboot every function is on the driver it had, with no driver_override
    (a vfio rule carried in the initramfs would leave the GPU and its audio function on no driver)."""
    _report, lines = container_leg(host)
    functions = dict((words[0], words[1:]) for words in (line.split() for line in lines["function"]))
    assert functions[address] == [PRISTINE[address], "(null)"], lines["function"]


def test_container_leg_no_vfio_override_anywhere(host):
    _report, lines = container_leg(host)
    assert [line for line in lines["function"] if "vfio" in line] == []


def test_container_leg_initramfs_matches_the_host(host):
    """The initramfs carries none of this collection's vfio files once they are gone from the host."""
    _report, lines = container_leg(host)
    on_host = set(line for line in lines.get("file", []))
    assert not [f for f in on_host if "gpuops-vfio" in f]
    carried = lines.get("initramfs", [])
    assert not [entry for entry in carried if "gpuops-vfio" in entry], carried


def test_container_leg_has_the_original_command_line(host):
    """passthrough -> container gives the distribution drop-in's intel_iommu=off back: the command line is the
    one the host booted with before its first preparation (recorded by the scenario's prepare step)."""
    _report, lines = container_leg(host)
    pristine = host.file("/var/tmp/gpuops-pristine-cmdline").content_string.strip()
    assert lines["cmdline"] == [pristine]
    assert "intel_iommu=off" in pristine.split()


def test_distribution_drop_in_left_alone(host):
    dropin = host.file("/etc/default/grub.d/50-distro-iommu.cfg")
    assert dropin.exists and "intel_iommu=off" in dropin.content_string
