# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpu_facts' gpu_facts_host fact: os-release, kernel, managed boot files, mdev devices, SR-IOV counts."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ansible_collections.gpuops.sandbox.plugins.module_utils import _host
from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
from ansible_collections.gpuops.sandbox.tests.unit.fakes import nvidia_packages as nv
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call_main

DEBIAN = """\
PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
"""

ROCKY = """\
NAME="Rocky Linux"
VERSION="9.3 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.3"
PLATFORM_ID="platform:el9"
PRETTY_NAME="Rocky Linux 9.3 (Blue Onyx)"
"""

UBUNTU = """\
# A comment line
PRETTY_NAME='Ubuntu 22.04.4 LTS'
ID=ubuntu
ID_LIKE=debian
VERSION_ID="22.04"
VERSION_CODENAME=jammy
UBUNTU_CODENAME=jammy
"""

NONE_OS = {"id": None, "id_like": [], "version_id": None, "major": None, "codename": None, "pretty_name": None}
UUID_A = "5f2a2b8e-3c2b-5a8f-9b55-3b8e0c1d2e3f"
UUID_B = "0b5c3d1e-1111-4222-8333-944455556666"


# --------------------------------------------------------------------------- os-release


@pytest.mark.parametrize("content,expected", [
    (DEBIAN, {"id": "debian", "id_like": [], "version_id": "12", "major": "12", "codename": "bookworm",
              "pretty_name": "Debian GNU/Linux 12 (bookworm)"}),
    (ROCKY, {"id": "rocky", "id_like": ["rhel", "centos", "fedora"], "version_id": "9.3", "major": "9",
             "codename": None, "pretty_name": "Rocky Linux 9.3 (Blue Onyx)"}),
    (UBUNTU, {"id": "ubuntu", "id_like": ["debian"], "version_id": "22.04", "major": "22", "codename": "jammy",
              "pretty_name": "Ubuntu 22.04.4 LTS"}),
    ("ID=arch\nPRETTY_NAME=\"Arch Linux\"\n", {"id": "arch", "id_like": [], "version_id": None, "major": None,
                                               "codename": None, "pretty_name": "Arch Linux"}),
    ("", NONE_OS),
    ("garbage without equals\n  ID = fedora \nVERSION_ID=40\n",
     {"id": "fedora", "id_like": [], "version_id": "40", "major": "40", "codename": None, "pretty_name": None}),
])
def test_read_os_release(tmp_path, content, expected):
    tree = st.SysfsTree(tmp_path)
    tree.write("/etc/os-release", content)
    assert _host.read_os_release(tree.root) == expected


def test_os_release_fallback_to_usr_lib(tmp_path):
    tree = st.SysfsTree(tmp_path)
    tree.write("/usr/lib/os-release", ROCKY)
    assert _host.read_os_release(tree.root)["id"] == "rocky"


def test_os_release_relative_symlink_is_followed(tmp_path):
    tree = st.SysfsTree(tmp_path)
    tree.write("/usr/lib/os-release", DEBIAN)
    tree.link("/etc/os-release", "/usr/lib/os-release")
    assert _host.read_os_release(tree.root)["codename"] == "bookworm"


def test_os_release_etc_wins_over_usr_lib(tmp_path):
    tree = st.SysfsTree(tmp_path)
    tree.write("/etc/os-release", UBUNTU)
    tree.write("/usr/lib/os-release", ROCKY)
    assert _host.read_os_release(tree.root)["id"] == "ubuntu"


def test_os_release_dangling_etc_link_falls_back(tmp_path):
    tree = st.SysfsTree(tmp_path)
    tree.raw_link("/etc/os-release", "/nonexistent/os-release")
    tree.write("/usr/lib/os-release", ROCKY)
    assert _host.read_os_release(tree.root)["major"] == "9"


def test_os_release_missing(tmp_path):
    assert _host.read_os_release(str(tmp_path)) == NONE_OS


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=hs.text(max_size=200))
def test_os_release_never_raises(tmp_path, content):
    tree = st.SysfsTree(tmp_path)
    tree.write("/etc/os-release", content)
    info = _host.read_os_release(tree.root)
    assert sorted(info) == ["codename", "id", "id_like", "major", "pretty_name", "version_id"]
    assert isinstance(info["id_like"], list)


# --------------------------------------------------------------------------- managed files, kernel, mdev


def test_host_summary_of_a_bare_host(host):
    summary = _host.host_summary(host.root)
    fingerprint = summary.pop("fingerprint")
    assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0
    assert summary == {
        "os": NONE_OS, "kernel": None, "mdev_devices": [], "prepared": None,
        "managed_files": {"kernel_cmdline": [], "nouveau": [], "vfio_modules": [], "mdev_definitions": [],
                          "sriov_definitions": [], "vfio_rules": [], "pending": []},
        "sriov": {st.A100: {"numvfs": 2, "totalvfs": 20}, st.L40S: {"numvfs": 2, "totalvfs": 32}},
        "sriov_recorded": [],
        "nvidia_driver": {"loaded": False, "version": None, "host_module": None, "source": None},
        "kernels": [],
    }


def test_managed_files_detected(host):
    for path in ("/etc/default/grub.d/99-gpuops-sandbox.cfg", "/etc/modprobe.d/gpuops-nouveau.conf",
                 "/etc/modules-load.d/gpuops-vfio.conf", "/etc/gpuops/mdev-devices.conf",
                 "/etc/gpuops/sriov-vfs.conf"):
        host.write(path, "x\n")
    host.write("/etc/modprobe.d/other.conf", "x\n")
    managed = _host.host_summary(host.root)["managed_files"]
    assert managed == {
        "kernel_cmdline": ["/etc/default/grub.d/99-gpuops-sandbox.cfg"],
        "nouveau": ["/etc/modprobe.d/gpuops-nouveau.conf"],
        "vfio_modules": ["/etc/modules-load.d/gpuops-vfio.conf"],
        "mdev_definitions": ["/etc/gpuops/mdev-devices.conf"],
        "sriov_definitions": ["/etc/gpuops/sriov-vfs.conf"],
        "vfio_rules": [],
        "pending": [],
    }
    # A run cut short while the initramfs was generated left its pending record.
    host.write("/var/lib/gpuops/pending/initramfs.json", "{}\n")
    assert _host.host_summary(host.root)["managed_files"]["pending"] == ["/var/lib/gpuops/pending/initramfs.json"]
    host.write("/etc/kernel/cmdline.d/99-gpuops-sandbox.conf", "x\n")
    host.write("/etc/modprobe.d/gpuops-vfio.conf", "x\n")
    managed = _host.host_summary(host.root)["managed_files"]
    # Nothing in the collection writes a cmdline.d file: one found there is somebody else's.
    assert managed["kernel_cmdline"] == ["/etc/default/grub.d/99-gpuops-sandbox.cfg"]
    # A grubby host has no drop-in: the record of what kernel_cmdline replaced is how a switch to container
    # knows there are arguments to take off (and values to give back).
    os.unlink(host.path("/etc/default/grub.d/99-gpuops-sandbox.cfg"))
    os.unlink(host.path("/etc/kernel/cmdline.d/99-gpuops-sandbox.conf"))
    host.write("/var/lib/gpuops/kernel_cmdline.json", "{}\n")
    assert _host.host_summary(host.root)["managed_files"]["kernel_cmdline"] == ["/var/lib/gpuops/kernel_cmdline.json"]
    assert managed["vfio_modules"] == ["/etc/modprobe.d/gpuops-vfio.conf", "/etc/modules-load.d/gpuops-vfio.conf"]


def test_managed_file_names_match_the_kernel_modules_examples():
    """The nouveau/vfio sets documented in kernel_modules land where gpu_facts looks."""
    from ansible_collections.gpuops.sandbox.plugins.modules import kernel_modules
    assert "%s/gpuops-nouveau.conf" % kernel_modules.MODPROBE_DIR in _host.MANAGED_FILES["nouveau"]
    assert "%s/gpuops-vfio.conf" % kernel_modules.MODPROBE_DIR in _host.MANAGED_FILES["vfio_modules"]
    assert "%s/gpuops-vfio.conf" % kernel_modules.LOAD_DIR in _host.MANAGED_FILES["vfio_modules"]


def test_vfio_rules_listed_sorted_with_prefix_only(host):
    host.write("/etc/udev/rules.d/61-gpuops-vfio-0000:b1:00.0.rules", "x\n")
    host.write("/etc/udev/rules.d/61-gpuops-vfio-0000:65:00.0.rules", "x\n")
    host.write("/etc/udev/rules.d/60-other.rules", "x\n")
    host.write("/etc/udev/rules.d/61-gpuops-vfi.rules", "x\n")
    rules = _host.host_summary(host.root)["managed_files"]["vfio_rules"]
    assert rules == ["/etc/udev/rules.d/61-gpuops-vfio-0000:65:00.0.rules",
                     "/etc/udev/rules.d/61-gpuops-vfio-0000:b1:00.0.rules"]


def test_vfio_rules_dir_is_a_file(host):
    host.write("/etc/udev/rules.d", "not a directory\n")
    assert _host.host_summary(host.root)["managed_files"]["vfio_rules"] == []


def test_kernel_release(host):
    host.write("/proc/sys/kernel/osrelease", "6.1.0-18-amd64\n")
    assert _host.host_summary(host.root)["kernel"] == "6.1.0-18-amd64"


# The real H200 host of FACTS.md: Ubuntu 24.04 with driver 580.159.04 installed from the distribution (DKMS).
def test_a_pre_installed_driver_is_told_from_the_operators(host):
    host.write("/proc/sys/kernel/osrelease", "6.8.0-60-generic\n")
    host.write("/sys/module/nvidia/version", "580.159.04\n")
    host.write("/lib/modules/6.8.0-60-generic/modules.dep",
               "kernel/drivers/net/e1000e/e1000e.ko.zst:\nupdates/dkms/nvidia.ko.zst: kernel/drivers/i2c/i2c-core.ko.zst\n")
    assert _host.host_summary(host.root)["nvidia_driver"] == {
        "loaded": True, "version": "580.159.04", "host_module": "updates/dkms/nvidia.ko.zst", "source": "host"}
    # Installed on the host but not loaded (blacklisted, or before its first boot): still the host's driver.
    os.unlink(host.path("/sys/module/nvidia/version"))
    os.rmdir(host.path("/sys/module/nvidia"))
    assert _host.host_summary(host.root)["nvidia_driver"]["source"] == "host"
    # The GPU Operator's driver container: the module loaded, none in the host's tree, its driver root mounted.
    host.write("/lib/modules/6.8.0-60-generic/modules.dep", "kernel/drivers/net/e1000e/e1000e.ko.zst:\n")
    host.write("/sys/module/nvidia/version", "580.95.05\n")
    assert _host.host_summary(host.root)["nvidia_driver"]["source"] == "other"
    host.mkdir("/run/nvidia/driver")
    assert _host.host_summary(host.root)["nvidia_driver"] == {
        "loaded": True, "version": "580.95.05", "host_module": None, "source": "operator"}


# Debian 12's packaged driver: the modules are renamed (nvidia-current.ko, nvidia-current-open.ko, nvidia-tesla-535.ko)
# and load as nvidia through the kernel-support package's modprobe file; the name inside the module stays nvidia.
@pytest.mark.parametrize("prefix", ["nvidia-current", "nvidia-current-open", "nvidia-tesla-535"])
def test_debians_renamed_dkms_module_is_the_hosts_driver(host, prefix):
    nv.install_debian_dkms(host, prefix)
    module = "updates/dkms/%s.ko" % prefix
    assert _host.host_summary(host.root)["nvidia_driver"] == {
        "loaded": True, "version": nv.DEBIAN_VERSION, "host_module": module, "source": "host"}
    # Installed, not loaded (blacklisted, or before the first boot with it).
    os.unlink(host.path("/sys/module/nvidia/version"))
    os.rmdir(host.path("/sys/module/nvidia"))
    assert _host.host_summary(host.root)["nvidia_driver"] == {
        "loaded": False, "version": None, "host_module": module, "source": "host"}


def test_debians_module_is_known_by_its_modinfo_name_without_the_modprobe_file(host):
    nv.install_debian_dkms(host, "nvidia-current-open", modprobe_conf=False)
    assert _host.host_summary(host.root)["nvidia_driver"]["host_module"] == "updates/dkms/nvidia-current-open.ko"


def test_debians_module_is_known_by_the_modprobe_file_when_its_file_cannot_be_read(host):
    nv.install_debian_dkms(host, "nvidia-tesla-535")
    # Compressed (as trixie's DKMS writes it): .modinfo is not read, the modprobe file's install line says it.
    dep = host.path("/lib/modules/%s/modules.dep" % nv.DEBIAN_KERNEL)
    with open(dep) as handle:
        text = handle.read().replace(".ko", ".ko.xz")
    host.write("/lib/modules/%s/modules.dep" % nv.DEBIAN_KERNEL, text)
    assert _host.host_summary(host.root)["nvidia_driver"]["host_module"] == "updates/dkms/nvidia-tesla-535.ko.xz"
    # An older package's alias line says it as well.
    host.write("/etc/modprobe.d/nvidia.conf", "alias nvidia nvidia-tesla-535\n")
    assert _host.host_summary(host.root)["nvidia_driver"]["host_module"] == "updates/dkms/nvidia-tesla-535.ko.xz"
    # Without either, a file named otherwise is not taken for the driver.
    os.unlink(host.path("/etc/modprobe.d/nvidia.conf"))
    assert _host.host_summary(host.root)["nvidia_driver"]["source"] == "other"


def test_the_other_modules_of_a_flavour_are_not_the_driver(host):
    """nvidia-current-modeset.ko and the like carry name=nvidia-modeset: alone they are no driver."""
    nv.install_debian_dkms(host, "nvidia-current", loaded=False)
    dep = "/lib/modules/%s/modules.dep" % nv.DEBIAN_KERNEL
    with open(host.path(dep)) as handle:
        lines = [line for line in handle if not line.startswith("updates/dkms/nvidia-current.ko:")]
    host.write(dep, "".join(lines))
    assert _host.host_summary(host.root)["nvidia_driver"]["source"] is None


@pytest.mark.parametrize("kernel, module", [
    ("5.14.0-427.13.1.el9_4.x86_64", "extra/nvidia.ko.xz"),                   # RHEL's kmod-nvidia
    ("6.8.0-60-generic", "kernel/drivers/video/nvidia.ko"),                   # NVIDIA's installer
    ("6.8.0-60-generic", "/lib/modules/6.8.0-60-generic/updates/dkms/nvidia.ko.zst"),  # an absolute path (old depmod)
])
def test_other_ways_of_installing_the_driver_stay_the_hosts(host, kernel, module):
    host.write("/proc/sys/kernel/osrelease", kernel + "\n")
    host.write("/lib/modules/%s/modules.dep" % kernel, "kernel/drivers/net/e1000e/e1000e.ko:\n%s:\n" % module)
    assert _host.host_summary(host.root)["nvidia_driver"] == {
        "loaded": False, "version": None, "host_module": module, "source": "host"}


def test_a_damaged_module_file_is_read_as_no_name(host):
    nv.install_debian_dkms(host, "nvidia-current", modprobe_conf=False)
    for junk in (b"", b"\x7fELF", b"\x7fELF\x02\x01" + b"\xff" * 200, b"not an elf at all" * 10):
        for suffix in nv.SUFFIXES:
            with open(host.path("/lib/modules/%s/updates/dkms/nvidia-current%s.ko" % (nv.DEBIAN_KERNEL, suffix)),
                      "wb") as handle:
                handle.write(junk)
        assert _host.host_summary(host.root)["nvidia_driver"]["source"] == "other"


def add_mdev(tree, parent_address, uuid, type_id):
    parent_dir = tree.functions[parent_address]
    dev_dir = tree.mkdir("%s/%s" % (parent_dir, uuid.lower()))
    tree.link(dev_dir + "/mdev_type", "%s/mdev_supported_types/%s" % (parent_dir, type_id))
    tree.link("/sys/bus/mdev/devices/" + uuid, dev_dir)


def test_mdev_devices_listed_sorted_by_uuid(host):
    add_mdev(host, st.A100_VFS[0], UUID_A, "nvidia-692")
    add_mdev(host, st.A100_VFS[1], UUID_B.upper(), "nvidia-700")
    mdevs = _host.host_summary(host.root)["mdev_devices"]
    assert mdevs == [
        {"uuid": UUID_B, "parent": st.A100_VFS[1], "type_id": "nvidia-700"},
        {"uuid": UUID_A, "parent": st.A100_VFS[0], "type_id": "nvidia-692"},
    ]


def test_mdev_devices_of_a_non_pci_parent(tmp_path):
    tree = st.build_lab_host(tmp_path)
    dev_dir = tree.mkdir("/sys/devices/virtual/mtty/mtty/" + UUID_A)
    tree.link(dev_dir + "/mdev_type", "/sys/devices/virtual/mtty/mtty/mdev_supported_types/mtty-2")
    tree.link("/sys/bus/mdev/devices/" + UUID_A, dev_dir)
    assert _host.host_summary(tree.root)["mdev_devices"] == [
        {"uuid": UUID_A, "parent": "mtty", "type_id": "mtty-2"}]


# --------------------------------------------------------------------------- SR-IOV


def test_sriov_counts_read_numvfs_and_totalvfs(host):
    host.write(host.functions[st.A100] + "/sriov_numvfs", "4\n")
    assert _host.sriov_counts(host.root) == {
        st.A100: {"numvfs": 4, "totalvfs": 20}, st.L40S: {"numvfs": 2, "totalvfs": 32}}


def test_sriov_counts_skip_unreadable_or_bad_values(host):
    host.write(host.functions[st.L40S] + "/sriov_numvfs", "lots\n")
    os.unlink(host.path(host.functions[st.A100] + "/sriov_totalvfs"))
    assert _host.sriov_counts(host.root) == {}


def test_sriov_counts_empty_values_are_zero(host):
    host.write(host.functions[st.A100] + "/sriov_numvfs", "\n")
    assert _host.sriov_counts(host.root)[st.A100] == {"numvfs": 0, "totalvfs": 20}


def test_sriov_counts_lab_host(tmp_path):
    tree = st.build_lab_host(tmp_path)
    assert _host.sriov_counts(tree.root) == {"0000:02:00.0": {"numvfs": 0, "totalvfs": 4}}


def test_sriov_counts_without_pci_bus(tmp_path):
    assert _host.sriov_counts(str(tmp_path)) == {}


def test_recorded_sriov_pfs(host):
    host.write("/etc/gpuops/sriov-vfs.conf",
               "# Managed by gpuops.sandbox.sriov_vfs\n"
               "# <pf-address> <numvfs> [autoprobe 0|1]\n"
               "\n"
               "0000:cb:00.0 8 1\n"
               "   # indented comment\n"
               "0000:b1:00.0 4\n"
               "0000:b1:00.0 4\n")
    assert _host.recorded_sriov_pfs(host.root) == [st.A100, st.L40S]
    assert _host.host_summary(host.root)["sriov_recorded"] == [st.A100, st.L40S]


def test_recorded_sriov_pfs_reads_the_file_as_sriov_vfs_does(host):
    # A line sriov_vfs would not read (no count, a count that is not a number, extra fields) records no PF; the
    # fact once took the first word of any such line.
    host.write("/etc/gpuops/sriov-vfs.conf",
               "0000:cb:00.0 8 1\n"
               "0000:b1:00.0 four\n"
               "0000:01:00.0\n"
               "0000:02:00.0 4 1 extra\n")
    assert _host.recorded_sriov_pfs(host.root) == ["0000:cb:00.0"]


def test_the_managed_files_are_the_paths_their_owners_write():
    from ansible_collections.gpuops.sandbox.plugins.module_utils import _bootloader, _cmdline, _mdev, _persist, _sriov
    assert _host.MANAGED_FILES["mdev_definitions"] == [_mdev.DEFINITIONS_FILE]
    assert _host.MANAGED_FILES["sriov_definitions"] == [_sriov.DEFINITIONS_FILE]
    assert _host.MANAGED_FILES["kernel_cmdline"] == [
        "%s/%s" % (_cmdline.GRUB_DROPIN_DIR, _bootloader.DROPIN_NAME), _cmdline.RECORD_FILE]
    assert _host.MANAGED_FILES["pending"] == [_persist.pending_path("initramfs"), _persist.pending_path("bootloader")]


def test_recorded_sriov_pfs_missing_file(host):
    assert _host.recorded_sriov_pfs(host.root) == []


# --------------------------------------------------------------------------- through the module


def test_module_returns_gpuops_host(monkeypatch, host):
    host.write("/etc/os-release", DEBIAN)
    host.write("/proc/sys/kernel/osrelease", "6.1.0-18-amd64\n")
    before = host.snapshot()
    kind, result = call_main(monkeypatch, gpu_facts, host.root, {})
    assert kind == "exit" and result["changed"] is False
    facts = result["ansible_facts"]
    assert sorted(facts) == ["gpu_facts_gpus", "gpu_facts_host", "gpu_facts_iommu", "gpu_facts_mdev_parents", "gpu_facts_pci_ids"]
    assert facts["gpu_facts_host"]["os"]["id"] == "debian"
    assert facts["gpu_facts_host"]["kernel"] == "6.1.0-18-amd64"
    assert facts["gpu_facts_host"]["sriov"][st.A100] == {"numvfs": 2, "totalvfs": 20}
    assert host.snapshot() == before


def test_mig_instances_of_a_gpu_are_counted_from_the_drivers_capabilities(host):
    """The nvidia driver keeps a gi<N> directory per MIG GPU instance under capabilities/gpu<minor>/mig."""
    from ansible_collections.gpuops.sandbox.plugins.module_utils import _vfio
    address = st.A100
    assert _vfio.mig_instances(address, host.root) is None  # no nvidia information file: not the nvidia driver's
    host.write("/proc/driver/nvidia/gpus/%s/information" % address, "Model: A100\nDevice Minor: \t 3\n")
    assert _vfio.mig_instances(address, host.root) == 0
    for name in ("gi1/access", "gi2/access", "gi2/ci0/access", "config", "monitor"):
        host.write("/proc/driver/nvidia/capabilities/gpu3/mig/" + name, "DeviceFileMinor: 1\n")
    host.write("/proc/driver/nvidia/capabilities/gpu0/mig/gi9/access", "x\n")  # another GPU's
    assert _vfio.mig_instances(address, host.root) == 2


def test_module_returns_the_installed_kernels_and_their_problems(monkeypatch, host):
    host.write("/proc/sys/kernel/osrelease", "6.1.0-18-amd64\n")
    host.write("/etc/modprobe.d/gpuops-nouveau.conf", "blacklist nouveau\n")
    os.utime(host.path("/etc/modprobe.d/gpuops-nouveau.conf"), (1_700_000_100, 1_700_000_100))
    for version, built in (("6.1.0-18-amd64", 1_700_000_200), ("6.1.0-20-amd64", 1_700_000_000)):
        host.mkdir("/lib/modules/%s/kernel" % version)
        host.write("/boot/vmlinuz-" + version, "kernel")
        host.write("/boot/initrd.img-" + version, "image")
        os.utime(host.path("/boot/initrd.img-" + version), (built, built))
    kind, result = call_main(monkeypatch, gpu_facts, host.root, {})
    assert kind == "exit", result
    kernels = result["ansible_facts"]["gpu_facts_host"]["kernels"]
    assert [(k["version"], k["running"], k["initramfs_stale"]) for k in kernels] == [
        ("6.1.0-18-amd64", True, False), ("6.1.0-20-amd64", False, True)]
    assert kernels[1]["problems"] == [
        "initramfs /boot/initrd.img-6.1.0-20-amd64 is older than /etc/modprobe.d/gpuops-nouveau.conf"]


def test_a_kernel_with_problems_changes_the_fingerprint(host):
    host.write("/etc/modprobe.d/gpuops-nouveau.conf", "blacklist nouveau\n")
    os.utime(host.path("/etc/modprobe.d/gpuops-nouveau.conf"), (1_700_000_100, 1_700_000_100))
    first = _host.host_summary(host.root)["fingerprint"]
    host.mkdir("/lib/modules/6.1.0-20-amd64/kernel")
    host.write("/boot/vmlinuz-6.1.0-20-amd64", "kernel")
    second = _host.host_summary(host.root)["fingerprint"]
    assert second != first   # no initramfs: a problem, and another fingerprint, so the fast no-op run does not skip it
    assert _host.boot_fingerprint(host.root, None) == second
