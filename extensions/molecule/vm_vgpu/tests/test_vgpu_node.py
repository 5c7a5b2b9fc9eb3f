"""A prepared vm-vgpu node: IOMMU on, VFs and vGPU (mdev) devices from the configuration, again at boot."""

NVME_PF = "0000:01:00.0"


def test_running_cmdline(host):
    args = host.file("/proc/cmdline").content_string.split()
    assert "intel_iommu=on" in args and "iommu=pt" in args


def test_mdev_devices_of_the_configuration(host):
    # lab-single-2: two mtty-1 devices on the mtty parent.
    uuids = host.check_output("ls /sys/bus/mdev/devices").split()
    assert len(uuids) == 2
    for uuid in uuids:
        link = host.file("/sys/bus/mdev/devices/%s/mdev_type" % uuid).linked_to
        assert link.endswith("/mtty-1")
    definitions = host.file("/etc/gpuops/mdev-devices.conf").content_string
    for uuid in uuids:
        assert uuid in definitions


def test_vfs_enabled_and_recorded(host):
    assert host.file("/sys/bus/pci/devices/%s/sriov_numvfs" % NVME_PF).content_string.strip() == "4"
    record = host.file("/etc/gpuops/sriov-vfs.conf").content_string.split("\n")
    assert any(line.split()[:2] == [NVME_PF, "4"] for line in record if line and not line.startswith("#"))


def test_restore_units_enabled_and_ran(host):
    for unit in ("gpuops-sriov-restore.service", "gpuops-mdev-restore.service"):
        service = host.service(unit)
        assert service.is_enabled, unit
    # The host rebooted after the devices were created: the units brought them back at boot.
    assert host.run("systemctl show -p ActiveState --value gpuops-mdev-restore.service").stdout.strip() == "active"
    assert host.run("systemctl show -p ActiveState --value gpuops-sriov-restore.service").stdout.strip() == "active"


def test_gpus_not_on_vfio(host):
    for gpu in ("0000:00:03.0", "0000:02:00.0"):
        link = host.file("/sys/bus/pci/devices/%s/driver" % gpu)
        assert not link.exists or not link.linked_to.endswith("/vfio-pci")
    assert not host.file("/etc/modprobe.d/gpuops-vfio.conf").exists
