# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""_kernels: the installed kernels, their initramfs against the collection's files, and their boot entries."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _kernels
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sysfs_tree import SysfsTree

OLD = "6.1.0-18-amd64"
NEW = "6.1.0-20-amd64"
NOUVEAU = "/etc/modprobe.d/gpuops-nouveau.conf"
VFIO_LOAD = "/etc/modules-load.d/gpuops-vfio.conf"
ITOOLS = "/usr/share/initramfs-tools/modules.d/gpuops-vfio"
RECORD = {"version": 1, "keys": {"intel_iommu": {"original": ["intel_iommu=off"], "set": ["intel_iommu=on"]},
                                 "iommu": {"original": [], "set": ["iommu=pt"]}}}
# Times: the preparation wrote its files at T_FILES; images built before or after.
T_BEFORE, T_FILES, T_AFTER = 1_700_000_000, 1_700_000_100, 1_700_000_200


def grub_cfg(entries, marked=True):
    """A Debian grub.cfg: ``entries`` is [(title, version, args)]; a recovery entry and a custom one follow."""
    body = []
    for title, version, args in entries:
        body.append("menuentry '%s' --class debian --class gnu-linux $menuentry_id_option 'gnulinux-%s' {\n"
                    "\tlinux\t/boot/vmlinuz-%s root=UUID=1234 ro %s\n\tinitrd\t/boot/initrd.img-%s\n}\n"
                    % (title, version, version, args, version))
        body.append("menuentry '%s (recovery mode)' {\n\tlinux\t/boot/vmlinuz-%s root=UUID=1234 ro single\n}\n"
                    % (title, version))
    text = "".join(body)
    custom = "menuentry 'my own' {\n\tlinux\t/boot/vmlinuz-%s root=UUID=1234 ro\n}\n" % OLD
    if not marked:
        return text
    return ("### BEGIN /etc/grub.d/00_header ###\nset default=0\n### END /etc/grub.d/00_header ###\n\n"
            "### BEGIN /etc/grub.d/10_linux ###\n" + text + "### END /etc/grub.d/10_linux ###\n\n"
            "### BEGIN /etc/grub.d/40_custom ###\n" + custom + "### END /etc/grub.d/40_custom ###\n")


def stamp(tree, path, when):
    os.utime(tree.path(path), (when, when))


def install(tree, version, image="initrd.img-%s", built=T_AFTER):
    """A kernel: its modules directory, vmlinuz and (unless ``image`` is None) its initramfs built at ``built``."""
    tree.mkdir("/lib/modules/%s/kernel" % version)
    tree.write("/boot/vmlinuz-%s" % version, "kernel")
    if image:
        tree.write("/boot/" + image % version, "image")
        stamp(tree, "/boot/" + image % version, built)


@pytest.fixture
def tree(tmp_path):
    """A prepared Debian host running OLD: the collection's files, OLD's image built after them, grub.cfg right."""
    tree = SysfsTree(tmp_path)
    tree.write("/proc/sys/kernel/osrelease", OLD + "\n")
    for path in (NOUVEAU, VFIO_LOAD, ITOOLS):
        tree.write(path, "# gpuops\n")
        stamp(tree, path, T_FILES)
    tree.write("/etc/modprobe.d/alsa-base.conf", "options snd-hda-intel model=auto\n")   # not the collection's
    stamp(tree, "/etc/modprobe.d/alsa-base.conf", T_AFTER + 100)
    tree.write("/var/lib/gpuops/kernel_cmdline.json", json.dumps(RECORD))
    install(tree, OLD)
    tree.write("/usr/sbin/grub-mkconfig", "#!/bin/sh\n")
    tree.write("/boot/grub/grub.cfg", grub_cfg([("Debian GNU/Linux", OLD, "quiet intel_iommu=on iommu=pt")]))
    return tree


def by_version(tree):
    return dict((k["version"], k) for k in _kernels.installed_kernels(tree.root))


def test_a_prepared_host_has_no_problem(tree):
    assert _kernels.installed_kernels(tree.root) == [{
        "version": OLD, "running": True, "initramfs": "/boot/initrd.img-" + OLD, "initramfs_stale": False,
        "entries": [{"file": "/boot/grub/grub.cfg", "title": "Debian GNU/Linux", "missing": []}], "problems": []}]


def test_a_kernel_installed_after_the_preparation_has_an_image_older_than_the_files(tree):
    # The distribution installed NEW with an image built without the collection's files: its time predates them.
    install(tree, NEW, built=T_BEFORE)
    tree.write("/boot/grub/grub.cfg", grub_cfg([("Debian GNU/Linux", NEW, "quiet intel_iommu=on iommu=pt"),
                                                ("Debian GNU/Linux, with Linux " + OLD, OLD,
                                                 "quiet intel_iommu=on iommu=pt")]))
    kernels = by_version(tree)
    assert kernels[OLD]["problems"] == []
    new = kernels[NEW]
    assert new["running"] is False and new["initramfs_stale"] is True
    assert new["problems"] == ["initramfs /boot/initrd.img-%s is older than %s, %s, %s"
                               % (NEW, NOUVEAU, VFIO_LOAD, ITOOLS)]


def test_only_the_collections_newer_files_are_named(tree):
    install(tree, NEW, built=T_FILES + 10)
    stamp(tree, ITOOLS, T_FILES + 50)
    assert by_version(tree)[NEW]["problems"] == ["initramfs /boot/initrd.img-%s is older than %s" % (NEW, ITOOLS)]


def test_an_image_as_old_as_the_files_is_current(tree):
    install(tree, NEW, built=T_FILES)
    assert by_version(tree)[NEW]["initramfs_stale"] is False


def test_a_missing_initramfs(tree):
    install(tree, NEW, image=None)
    new = by_version(tree)[NEW]
    assert new["initramfs"] is None and new["initramfs_stale"] is True
    assert new["problems"] == ["has no initramfs (/boot/initrd.img-%s or /boot/initramfs-%s.img)" % (NEW, NEW)]


def test_a_dracut_image_is_found(tree):
    install(tree, NEW, image="initramfs-%s.img", built=T_AFTER)
    assert by_version(tree)[NEW]["initramfs"] == "/boot/initramfs-%s.img" % NEW


def test_a_grub_entry_without_the_recorded_arguments(tree):
    install(tree, NEW)
    tree.write("/boot/grub/grub.cfg", grub_cfg([("Debian GNU/Linux", NEW, "quiet intel_iommu=off"),
                                                ("Debian GNU/Linux, with Linux " + OLD, OLD,
                                                 "quiet intel_iommu=on iommu=pt")]))
    kernels = by_version(tree)
    assert kernels[OLD]["problems"] == []
    assert kernels[NEW]["entries"] == [{"file": "/boot/grub/grub.cfg", "title": "Debian GNU/Linux",
                                        "missing": ["intel_iommu=on", "iommu=pt"]}]
    assert kernels[NEW]["problems"] == [
        "boot entry /boot/grub/grub.cfg entry 'Debian GNU/Linux' lacks intel_iommu=on iommu=pt"]
    # Only the arguments: the image is current.
    assert kernels[NEW]["initramfs_stale"] is False


def test_recovery_and_custom_entries_are_not_checked(tree):
    with open(tree.path("/boot/grub/grub.cfg")) as handle:
        cfg = handle.read()
    assert "(recovery mode)" in cfg and "my own" in cfg
    assert [e["title"] for e in by_version(tree)[OLD]["entries"]] == ["Debian GNU/Linux"]


def test_a_grub_cfg_without_section_marks_is_read_whole(tree):
    tree.write("/boot/grub/grub.cfg", grub_cfg([("Debian GNU/Linux", OLD, "quiet")], marked=False))
    assert by_version(tree)[OLD]["problems"] == [
        "boot entry /boot/grub/grub.cfg entry 'Debian GNU/Linux' lacks intel_iommu=on iommu=pt"]


def test_keys_compare_as_the_kernel_compares_them(tree):
    tree.write("/var/lib/gpuops/kernel_cmdline.json", json.dumps(
        {"version": 1, "keys": {"vfio_pci.ids": {"original": [], "set": ["vfio_pci.ids=10de:2236"]}}}))
    tree.write("/boot/grub/grub.cfg", grub_cfg([("Debian GNU/Linux", OLD, "vfio-pci.ids=10de:2236")]))
    assert by_version(tree)[OLD]["problems"] == []


def test_without_a_record_no_argument_is_wanted(tree):
    os.unlink(tree.path("/var/lib/gpuops/kernel_cmdline.json"))
    tree.write("/boot/grub/grub.cfg", grub_cfg([("Debian GNU/Linux", OLD, "quiet")]))
    assert by_version(tree)[OLD]["problems"] == []


@pytest.mark.parametrize("text", ["{not json", '{"version": 7}', "[]"])
def test_an_invalid_record_wants_nothing_and_does_not_raise(tree, text):
    tree.write("/var/lib/gpuops/kernel_cmdline.json", text)
    assert by_version(tree)[OLD]["problems"] == []


def rhel(tree, version, options, kernelopts=None):
    tree.write("/boot/loader/entries/abc-%s.conf" % version,
               "title Rocky Linux (%s)\nversion %s\nlinux /vmlinuz-%s\ninitrd /initramfs-%s.img\noptions %s\n"
               % (version, version, version, version, options))
    if kernelopts is not None:
        tree.write("/boot/grub2/grubenv", "# GRUB Environment Block\nkernelopts=%s\n%s" % (kernelopts, "#" * 100))


RHEL_NEW = "5.14.0-427.el9.x86_64"


def test_a_bls_entry_without_the_recorded_arguments(tree):
    install(tree, RHEL_NEW, image="initramfs-%s.img")
    rhel(tree, RHEL_NEW, "root=/dev/mapper/rl-root ro intel_iommu=on")
    new = by_version(tree)[RHEL_NEW]
    assert new["entries"] == [{"file": "/boot/loader/entries/abc-%s.conf" % RHEL_NEW,
                               "title": "Rocky Linux (%s)" % RHEL_NEW, "missing": ["iommu=pt"]}]
    assert new["problems"] == ["boot entry /boot/loader/entries/abc-%s.conf entry 'Rocky Linux (%s)' lacks iommu=pt"
                               % (RHEL_NEW, RHEL_NEW)]


def test_a_bls_entry_with_the_arguments_passes(tree):
    install(tree, RHEL_NEW, image="initramfs-%s.img")
    rhel(tree, RHEL_NEW, "root=/dev/mapper/rl-root ro intel_iommu=on iommu=pt")
    assert by_version(tree)[RHEL_NEW]["problems"] == []


def test_kernelopts_of_grubenv_are_the_options_of_a_rhel8_entry(tree):
    install(tree, RHEL_NEW, image="initramfs-%s.img")
    rhel(tree, RHEL_NEW, "$kernelopts $tuned_params", kernelopts="root=/dev/rl/root ro intel_iommu=on iommu=pt")
    assert by_version(tree)[RHEL_NEW]["problems"] == []
    rhel(tree, RHEL_NEW, "$kernelopts $tuned_params", kernelopts="root=/dev/rl/root ro intel_iommu=on")
    assert by_version(tree)[RHEL_NEW]["entries"][0]["missing"] == ["iommu=pt"]


def test_a_modules_directory_without_vmlinuz_is_not_a_kernel(tree):
    # Left by DKMS or a removed kernel's extra modules: nothing boots it.
    tree.mkdir("/lib/modules/5.10.0-old-amd64/updates/dkms")
    assert list(by_version(tree)) == [OLD]


def test_a_vmlinuz_without_modules_is_not_a_kernel(tree):
    tree.write("/boot/vmlinuz-9.9.9", "kernel")
    assert list(by_version(tree)) == [OLD]


def test_a_kernel_removed_between_listing_and_reading_is_left_out(tree, monkeypatch):
    install(tree, NEW, built=T_BEFORE)
    real = _kernels.initramfs_of

    def removed_meanwhile(root, version):
        # The package manager removes NEW while its image is looked at.
        if version == NEW:
            for path in ("/boot/vmlinuz-%s" % NEW, "/boot/initrd.img-%s" % NEW):
                os.unlink(tree.path(path))
            os.rename(tree.path("/lib/modules/" + NEW), tree.path("/lib/modules/.gone"))
        return real(root, version)

    monkeypatch.setattr(_kernels, "initramfs_of", removed_meanwhile)
    assert list(by_version(tree)) == [OLD]


def test_a_kernel_listed_then_gone_is_left_out(tree, monkeypatch):
    monkeypatch.setattr(_kernels, "kernel_versions", lambda root: [OLD, "6.1.0-99-amd64"])
    assert list(by_version(tree)) == [OLD]


def test_never_raises_on_an_unexpected_fault(tree, monkeypatch):
    def broken(root, version):
        raise RuntimeError("unforeseen")

    monkeypatch.setattr(_kernels, "initramfs_of", broken)
    assert _kernels.installed_kernels(tree.root) == []


def test_a_bare_root_has_no_kernel(tmp_path):
    assert _kernels.installed_kernels(str(tmp_path)) == []


def test_the_running_kernel_can_be_given(tree):
    install(tree, NEW)
    assert [k["running"] for k in _kernels.installed_kernels(tree.root, running=NEW)] == [False, True]


def test_extra_sources_count(tree):
    install(tree, NEW, built=T_AFTER)
    tree.write("/etc/modprobe.d/mine.conf", "blacklist x\n")
    stamp(tree, "/etc/modprobe.d/mine.conf", T_AFTER + 10)
    assert by_version(tree)[NEW]["problems"] == []
    kernels = dict((k["version"], k) for k in _kernels.installed_kernels(tree.root,
                                                                         extra_sources=["/etc/modprobe.d/mine.conf"]))
    assert kernels[NEW]["problems"] == ["initramfs /boot/initrd.img-%s is older than /etc/modprobe.d/mine.conf" % NEW]


# Debian with systemd-boot, as kernel-install 252 and bootctl laid out a lab host's ESP (2026-11-28): the entry
# token "debian" (bootctl install --entry-token=os-id), the kernel and the image copied beside the entry.
ESP_ENTRY = ("title      Debian GNU/Linux 12 (bookworm)\nversion    %(v)s\nsort-key   debian\n"
             "options    root=LABEL=gpulab-root ro console=ttyS0,115200 %(args)s\n"
             "linux      /debian/%(v)s/linux\ninitrd     /debian/%(v)s/initrd.img-%(v)s\n")


def systemd_boot(tree, version, args, esp="/boot/efi", copied=T_AFTER):
    """The host boots through systemd-boot: grub's packages purged (its grub.cfg left behind), the ESP's entry."""
    os.unlink(tree.path("/usr/sbin/grub-mkconfig"))
    tree.write("%s/loader/entries/debian-%s.conf" % (esp, version), ESP_ENTRY % {"v": version, "args": args})
    copy = "%s/debian/%s/initrd.img-%s" % (esp, version, version)
    tree.write(copy, "image")
    stamp(tree, copy, copied)


@pytest.mark.parametrize("esp", ["/boot/efi", "/efi"])
def test_the_esp_entry_systemd_boot_boots_is_checked(tree, esp):
    """/etc/kernel/cmdline changed, the entry kernel-install wrote before not: the entry lacks the arguments."""
    systemd_boot(tree, OLD, "intel_iommu=off", esp=esp)
    old = by_version(tree)[OLD]
    assert old["entries"] == [{"file": "%s/loader/entries/debian-%s.conf" % (esp, OLD),
                               "title": "Debian GNU/Linux 12 (bookworm)", "missing": ["intel_iommu=on", "iommu=pt"]}]
    assert old["problems"] == ["boot entry %s/loader/entries/debian-%s.conf entry 'Debian GNU/Linux 12 (bookworm)' "
                               "lacks intel_iommu=on iommu=pt" % (esp, OLD)]


def test_an_esp_entry_with_the_arguments_passes_and_a_left_grub_cfg_is_not_read(tree):
    """The grub.cfg of the fixture has the arguments; here it lacks them, but nothing generates or boots it."""
    tree.write("/boot/grub/grub.cfg", grub_cfg([("Debian GNU/Linux", OLD, "quiet intel_iommu=off")]))
    systemd_boot(tree, OLD, "intel_iommu=on iommu=pt")
    old = by_version(tree)[OLD]
    assert [e["file"] for e in old["entries"]] == ["/boot/efi/loader/entries/debian-%s.conf" % OLD]
    assert old["problems"] == []


def test_a_grub_cfg_is_read_while_grub_generates_it(tree):
    tree.write("/boot/grub/grub.cfg", grub_cfg([("Debian GNU/Linux", OLD, "quiet intel_iommu=off")]))
    assert by_version(tree)[OLD]["entries"][0]["missing"] == ["intel_iommu=on", "iommu=pt"]


def test_an_esp_entry_without_a_version_key_is_named_by_its_directory(tree):
    systemd_boot(tree, OLD, "intel_iommu=off")
    path = "/boot/efi/loader/entries/debian-%s.conf" % OLD
    with open(tree.path(path)) as handle:
        text = "".join(line for line in handle if not line.startswith("version"))
    tree.write(path, text)
    assert by_version(tree)[OLD]["entries"][0]["missing"] == ["intel_iommu=on", "iommu=pt"]


def test_a_rhel_rescue_entry_names_no_installed_kernel(tree):
    install(tree, RHEL_NEW, image="initramfs-%s.img")
    rhel(tree, RHEL_NEW, "root=/dev/mapper/rl-root ro intel_iommu=on iommu=pt")
    tree.write("/boot/loader/entries/abc-0-rescue.conf",
               "title Rocky Linux (0-rescue-abc)\nversion %s\nlinux /vmlinuz-0-rescue-abc\noptions ro\n" % RHEL_NEW)
    assert by_version(tree)[RHEL_NEW]["problems"] == []


def test_an_esp_copy_of_the_initramfs_older_than_the_files_is_stale(tree):
    """systemd-boot boots the copy kernel-install put on the ESP: /boot's image rebuilt by dracut is not enough."""
    systemd_boot(tree, OLD, "intel_iommu=on iommu=pt", copied=T_BEFORE)
    old = by_version(tree)[OLD]
    assert old["initramfs_stale"] is True
    assert old["problems"] == ["boot entry /boot/efi/loader/entries/debian-%s.conf entry 'Debian GNU/Linux 12 "
                               "(bookworm)' boots /boot/efi/debian/%s/initrd.img-%s, older than %s, %s, %s"
                               % (OLD, OLD, OLD, NOUVEAU, VFIO_LOAD, ITOOLS)]
    assert _kernels.esp_kernels(tree.root) == [OLD]


def test_an_esp_entry_whose_initramfs_copy_is_gone_is_stale(tree):
    systemd_boot(tree, OLD, "intel_iommu=on iommu=pt")
    os.unlink(tree.path("/boot/efi/debian/%s/initrd.img-%s" % (OLD, OLD)))
    assert by_version(tree)[OLD]["problems"][0].endswith("initrd.img-%s, which is missing" % OLD)
