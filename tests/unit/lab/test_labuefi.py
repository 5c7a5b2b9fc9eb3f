"""A lab host that boots the RHEL family's way (lab/labuefi.py, gpulab_boot: uefi): its setting, the machine it
boots as before and after its conversion, the saved boot that keeps its ESP disk and firmware variables, and the
guest's conversion script."""

import json
import os
import shutil
import subprocess

import pytest

from test_gpulab import gpulab  # noqa: F401  pylint: disable=unused-import
from test_labstate import hosts, make_saved, pristine_vm


@pytest.fixture
def firmware(tmp_path, monkeypatch, gpulab):  # noqa: F811
    """Stand-in OVMF files (the code's content is part of a saved boot's key)."""
    directory = tmp_path / "ovmf"
    directory.mkdir()
    (directory / "OVMF_CODE_4M.fd").write_bytes(b"code-1")
    (directory / "OVMF_VARS_4M.fd").write_bytes(b"vars-template")
    monkeypatch.setattr(gpulab.labhost.labuefi, "FIRMWARE_DIR", str(directory))
    return directory


def uefi_vm(gpulab, monkeypatch, converted=False):  # noqa: F811
    hosts(gpulab, "        lab-u: {gpulab_boot: uefi}\n        lab-b: {}\n")
    vm = pristine_vm(gpulab, "lab-u", monkeypatch)
    if converted:
        vm.save_meta(firmware="uefi")
    return vm


@pytest.mark.parametrize("value", ["UEFI", "efi", True, ""])
def test_a_bad_boot_setting_is_named_with_what_is_accepted(gpulab, value):  # noqa: F811
    with pytest.raises(gpulab.LabError, match=r"lab-x: gpulab_boot .* is not a boot path of the lab; expected one "
                                              r"of: bios, uefi"):
        gpulab.labhost.labuefi.boot_of({"gpulab_boot": value}, "lab-x")


def test_missing_firmware_names_the_files_and_the_package(gpulab, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gpulab.labhost.labuefi, "FIRMWARE_DIR", str(tmp_path / "none"))
    with pytest.raises(gpulab.LabError, match=r"OVMF_CODE_4M.fd.*make hostdeps.*ovmf"):
        gpulab.labhost.labuefi.firmware()


def test_before_its_conversion_the_host_boots_the_image_through_the_bios_beside_an_empty_esp(
        gpulab, monkeypatch, firmware):  # noqa: F811  pylint: disable=unused-argument
    vm = uefi_vm(gpulab, monkeypatch)
    made = []
    monkeypatch.setattr(gpulab.labhost.labuefi, "new_esp", made.append)
    disk, boot = vm.boot_args(gpulab.lab_host_settings("lab-u"))
    assert made == [vm.esp]
    assert disk[-1].endswith(",bootindex=0")
    assert not [arg for arg in boot if "pflash" in arg]
    assert "ide-hd,drive=esp0,bus=ide.0" in boot and vm.esp in boot[1]


def test_once_converted_it_boots_through_ovmf_from_its_esp(gpulab, monkeypatch, firmware):  # noqa: F811
    vm = uefi_vm(gpulab, monkeypatch, converted=True)
    disk, boot = vm.boot_args(gpulab.lab_host_settings("lab-u"))
    assert disk == gpulab.labhost.DISK_DEVICE
    assert "if=pflash,format=raw,unit=0,readonly=on,file=%s" % (firmware / "OVMF_CODE_4M.fd") in boot
    assert "if=pflash,format=raw,unit=1,file=%s" % vm.vars in boot
    assert "ide-hd,drive=esp0,bus=ide.0,bootindex=0" in boot
    # Its own copy of the variables template.
    with open(vm.vars, "rb") as handle:
        assert handle.read() == b"vars-template"


def test_a_bios_host_keeps_its_machine_and_its_saved_boot(gpulab, monkeypatch, firmware):  # noqa: F811
    hosts(gpulab, "        lab-u: {gpulab_boot: uefi}\n        lab-b: {}\n        lab-c: {gpulab_boot: bios}\n")
    vm = pristine_vm(gpulab, "lab-b", monkeypatch)
    assert vm.boot_args(gpulab.lab_host_settings("lab-b")) == (gpulab.labhost.DISK_DEVICE, [])
    keys = {name: pristine_vm(gpulab, name, monkeypatch).pristine_plan(
        {"id": "abc"}, "tcg", gpulab.lab_host_settings(name)).saved.key for name in ("lab-u", "lab-c")}
    assert keys["lab-c"] == vm.pristine_plan({"id": "abc"}, "tcg", gpulab.lab_host_settings("lab-b")).saved.key
    assert keys["lab-u"] != keys["lab-c"]


def test_the_uefi_shape_follows_the_firmware_not_the_hosts_paths(gpulab, monkeypatch, firmware):  # noqa: F811
    labuefi = gpulab.labhost.labuefi
    shape = labuefi.shape_args()
    assert not [arg for arg in shape if gpulab.STATE in arg or str(firmware) in arg]
    (firmware / "OVMF_CODE_4M.fd").write_bytes(b"code-2")
    assert labuefi.shape_args() != shape
    shape = labuefi.shape_args()
    monkeypatch.setattr(labuefi, "DRACUT_CONF", labuefi.DRACUT_CONF + 'omit_dracutmodules+=" i18n "\n')
    assert labuefi.shape_args() != shape


def test_a_saved_uefi_boot_keeps_the_esp_and_variables_and_a_restore_gets_them(
        gpulab, monkeypatch, firmware, tmp_path):  # noqa: F811  pylint: disable=unused-argument
    vm = uefi_vm(gpulab, monkeypatch, converted=True)
    assert set(vm.saved_extras()) == {"esp.qcow2", "vars.fd"}
    plan = vm.pristine_plan({"id": "abc"}, "tcg", gpulab.lab_host_settings("lab-u"))
    make_saved(plan.saved)
    meta = plan.saved.meta()
    for name, data in (("esp.qcow2", b"esp"), ("vars.fd", b"variables")):
        with open(os.path.join(plan.saved.dir, name), "wb") as handle:
            handle.write(data)
    meta["extra_bytes"] = {"esp.qcow2": 3, "vars.fd": 9}
    with open(plan.saved.meta_path, "w") as handle:
        json.dump(meta, handle)
    assert plan.saved.ready()
    with open(os.path.join(plan.saved.dir, "vars.fd"), "wb") as handle:
        handle.write(b"var")
    assert not plan.saved.ready()
    with open(os.path.join(plan.saved.dir, "vars.fd"), "wb") as handle:
        handle.write(b"variables")
    # A restore: the ESP disk on the saved one (qemu-img), the variables copied, the host known as converted.
    calls = []
    monkeypatch.setattr(gpulab.labhost, "run", lambda cmd, **kwargs: calls.append(cmd) or open(cmd[-1], "w").close())
    other = gpulab.Vm("lab-u")
    other.save_meta(firmware=None)
    other.restore_extras(plan.saved)
    assert other.converted()
    assert calls[0][-3:-1] == ["-b", os.path.join(plan.saved.dir, "esp.qcow2")]
    with open(other.vars, "rb") as handle:
        assert handle.read() == b"variables"


def test_a_new_overlay_forgets_the_conversion(gpulab, monkeypatch, firmware):  # noqa: F811
    vm = uefi_vm(gpulab, monkeypatch, converted=True)
    for path in (vm.esp, vm.vars):
        open(path, "w").close()
    monkeypatch.setattr(gpulab.labhost, "run", lambda cmd, **kwargs: open(cmd[-1], "w").close())
    vm.new_overlay({"id": "abc"})
    assert not vm.converted() and not os.path.exists(vm.esp) and not os.path.exists(vm.vars)
    assert vm.saved_extras() == {}


@pytest.mark.skipif(not shutil.which("sfdisk") or not shutil.which("qemu-img"), reason="needs sfdisk and qemu-img")
def test_the_esp_disk_has_one_efi_system_partition(gpulab, tmp_path):  # noqa: F811
    (tmp_path / "disk").mkdir()
    path = str(tmp_path / "disk" / "esp.qcow2")
    gpulab.labhost.labuefi.new_esp(path)
    # Nothing left beside it (the raw file it was partitioned in).
    assert os.listdir(str(tmp_path / "disk")) == ["esp.qcow2"]
    raw = str(tmp_path / "esp.raw")
    subprocess.run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", path, raw], check=True)
    table = json.loads(subprocess.run(["sfdisk", "--json", raw], check=True, capture_output=True, text=True).stdout)
    parts = table["partitiontable"]["partitions"]
    assert table["partitiontable"]["label"] == "gpt" and len(parts) == 1
    assert parts[0]["type"] == "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"


def test_the_conversion_installs_dracut_before_systemd_boot_and_checks_what_boots(gpulab):  # noqa: F811
    labuefi = gpulab.labhost.labuefi
    debs = ["/c/%s_1_all.deb" % name for name in labuefi.GUEST_PACKAGES]
    script = labuefi.conversion_script(debs)
    first, second = script.index("./dracut_1_all.deb"), script.index("./systemd-boot_1_all.deb")
    assert script.index("/etc/dracut.conf.d/50-gpulab.conf") < first < script.index("mount /boot/efi") < second
    assert "echo debian > /etc/kernel/entry-token" in script
    assert "apt-get purge" in script and "grub-common" in script and "initramfs-tools" in script
    # The kernel arguments grub booted with go into /etc/kernel/cmdline without grub's BOOT_IMAGE=.
    assert "s/^BOOT_IMAGE=[^ ]* //' /proc/cmdline > /etc/kernel/cmdline" in script
    assert 'cmp -s /boot/initrd.img-$kernel "$initrd"' in script


def test_guest_packages_cached_are_used_as_they_are(gpulab, monkeypatch):  # noqa: F811
    labuefi = gpulab.labhost.labuefi
    os.makedirs(labuefi.GUEST_DEBS)
    for name in labuefi.GUEST_PACKAGES:
        open(os.path.join(labuefi.GUEST_DEBS, "%s_1_amd64.deb" % name), "w").close()
    monkeypatch.setattr(labuefi.subprocess, "run", lambda *a, **k: pytest.fail("nothing is downloaded"))
    assert [os.path.basename(p).split("_")[0] for p in labuefi.guest_debs()] == list(labuefi.GUEST_PACKAGES)


def test_a_host_set_back_to_bios_starts_from_a_fresh_copy_of_the_image(gpulab, monkeypatch, firmware):  # noqa: F811
    vm = uefi_vm(gpulab, monkeypatch, converted=True)
    hosts(gpulab, "        lab-u: {}\n")
    fresh = []
    monkeypatch.setattr(vm, "new_overlay", lambda manifest, backing=None: fresh.append(manifest) or vm.save_meta(
        firmware=None, pristine=True))
    monkeypatch.setattr(vm, "ensure_overlay", lambda manifest: None)
    monkeypatch.setattr(vm, "_launch", lambda *args: 2222)
    assert vm.launch({"id": "abc"}, "tcg", "key.pub") == 2222
    assert fresh == [{"id": "abc"}] and not vm.converted()


def test_the_uefi_host_nic_has_no_option_rom_and_its_shape_says_so(gpulab, monkeypatch, firmware):  # noqa: F811
    hosts(gpulab, "        lab-u: {gpulab_boot: uefi}\n        lab-b: {}\n")
    labhost = gpulab.labhost
    assert labhost.nic_device(gpulab.lab_host_settings("lab-b"), "lab-b") == labhost.NIC_DEVICE
    uefi_nic = labhost.nic_device(gpulab.lab_host_settings("lab-u"), "lab-u")
    assert uefi_nic[1].endswith(",romfile=") and uefi_nic[1].startswith(labhost.NIC_DEVICE[1])
    with pytest.raises(gpulab.LabError, match="gpulab_boot 'efi'.*bios, uefi"):
        labhost.nic_device({"gpulab_boot": "efi"}, "lab-x")


def test_the_conversion_masks_kernel_installs_depmod_before_systemd_boot_writes_entries(gpulab):  # noqa: F811
    script = gpulab.labhost.labuefi.conversion_script(["/c/systemd-boot_1.deb", "/c/dracut_1.deb"])
    mask = script.index("ln -sf /dev/null /etc/kernel/install.d/50-depmod.install")
    assert mask < script.index("apt_install ./systemd-boot_1.deb")


def test_the_esp_is_mounted_at_boot_without_a_check(gpulab):  # noqa: F811
    script = gpulab.labhost.labuefi.conversion_script(["/c/systemd-boot_1.deb", "/c/dracut_1.deb"])
    fstab = [line for line in script.splitlines() if "/boot/efi vfat" in line]
    assert len(fstab) == 1 and fstab[0].rstrip().endswith('0 0" >> /etc/fstab')
