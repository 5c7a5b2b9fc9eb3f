"""A prepared vm-passthrough node: IOMMU on through the host's boot loader (grub, or each systemd-boot entry on a
gpulab_boot: uefi host), vfio early in every image a boot loads, GPUs and their group on vfio-pci.

The GPUs are what the lab inventory's selectors pick on the host, and their companions the other endpoints of
their IOMMU groups (shared/lab_functions.py), so the checks hold on a host of any layout."""

import importlib.util
import os

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "lab_functions", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                  "lab_functions.py"))
lab_functions = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lab_functions)


@pytest.fixture(scope="module")
def found(host):
    """Every PCI function of the host (one read for the whole module)."""
    return lab_functions.functions(host)


@pytest.fixture(scope="module")
def handed(found):
    """The GPUs and their group companions: what a VM takes."""
    gpus = lab_functions.gpus(found)
    assert len(gpus) >= 2, found
    return gpus + lab_functions.companions(found)


def test_running_cmdline(host):
    args = host.file("/proc/cmdline").content_string.split()
    assert "intel_iommu=on" in args and "iommu=pt" in args
    assert "intel_iommu=off" not in args


def test_iommu_groups(host):
    assert len(host.check_output("ls /sys/kernel/iommu_groups").split()) > 3


def test_gpus_have_their_group_companions(found, handed):
    # Each lab layout puts an audio function (and on some a USB controller) in a GPU's slot.
    assert [a for a in handed if found[a]["class"].startswith("0x0403")], handed


def test_on_vfio_pci_with_group_node(host, found, handed):
    assert {a: found[a]["driver"] for a in handed} == {a: "vfio-pci" for a in handed}
    for address in handed:
        assert host.file("/dev/vfio/%s" % found[address]["group"]).exists, address


def test_binding_persists_through_udev(host, handed):
    for address in handed:
        rule = host.file("/etc/udev/rules.d/61-gpuops-vfio-%s.rules" % address)
        assert rule.exists and "vfio-pci" in rule.content_string, address


def test_vfio_modules_early_and_softdeps(host):
    load = host.file("/etc/modules-load.d/gpuops-vfio.conf").content_string.split()
    assert {"vfio", "vfio_iommu_type1", "vfio_pci"} <= set(load)
    softdeps = host.file("/etc/modprobe.d/gpuops-vfio.conf").content_string.splitlines()
    assert "softdep nvidia pre: vfio-pci" in softdeps
    assert "softdep nouveau pre: vfio-pci" in softdeps
    kernel = host.check_output("uname -r")
    images = lab_functions.booted_images(host, kernel)
    assert len(images) == (2 if lab_functions.boot_path(host) == "systemd-boot" else 1), images
    for image in images:
        listing = lab_functions.initramfs_files(host, image)
        assert [p for p in listing if p.endswith("/vfio-pci.ko")], image
        assert "etc/modprobe.d/gpuops-vfio.conf" in listing, image


def test_every_boot_entry_has_the_arguments(host):
    """On systemd-boot each entry carries its own arguments: every entry on the ESP, and /etc/kernel/cmdline that
    kernel-install writes the entries of kernels installed later from, turn the IOMMU on. (On grub one
    configuration serves every entry: the running command line above.)"""
    if lab_functions.boot_path(host) != "systemd-boot":
        pytest.skip("a grub host")
    found = lab_functions.entries(host)
    assert found
    found["/etc/kernel/cmdline"] = host.file("/etc/kernel/cmdline").content_string.split()
    for name, options in found.items():
        assert "intel_iommu=on" in options and "iommu=pt" in options, (name, options)
        assert "intel_iommu=off" not in options, (name, options)


def test_the_boot_entry_that_booted_is_the_running_kernels(host):
    """systemd-boot booted the running kernel's entry, with that entry's arguments (systemd-boot adds initrd=)."""
    if lab_functions.boot_path(host) != "systemd-boot":
        pytest.skip("a grub host")
    kernel = host.check_output("uname -r")
    mine = [options for name, options in lab_functions.entries(host).items() if kernel in name]
    assert len(mine) == 1, lab_functions.entries(host)
    assert lab_functions.comparable(host.file("/proc/cmdline").content_string) == lab_functions.comparable(
        " ".join(mine[0]))


def test_boot_vga_left_alone(found):
    assert found["0000:00:01.0"]["driver"] != "vfio-pci"


def test_no_vgpu_leftovers(host):
    assert not host.file("/etc/gpuops/mdev-devices.conf").exists
    assert host.check_output("ls /sys/bus/mdev/devices 2>/dev/null || true") == ""


def test_the_boot_loader_backend_is_chosen_without_being_told(host):
    """kernel_cmdline's backend: auto picks kernel_cmdline_file on the systemd-boot host (kernel-install, no
    grub-mkconfig) and grub on the others; asked again for what the preparation set, it changes nothing (check mode)."""
    result = host.ansible("gpuops.sandbox.kernel_cmdline", "arguments=intel_iommu=on,iommu=pt", check=True)
    expected = "kernel_cmdline_file" if lab_functions.boot_path(host) == "systemd-boot" else "grub"
    assert result.get("backend") == expected, result
    assert result.get("changed") is False, result
