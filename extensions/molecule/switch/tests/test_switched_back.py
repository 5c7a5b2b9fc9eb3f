"""The host after passthrough -> container -> passthrough: a prepared vm-passthrough node again (the vm_passthrough
scenario's own checks, imported below), and what the container leg left, recorded by side_effect.yml."""

import importlib.util
import os

import pytest

_FUNCTIONS = importlib.util.spec_from_file_location(
    "lab_functions", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                  "lab_functions.py"))
lab_functions = importlib.util.module_from_spec(_FUNCTIONS)
_FUNCTIONS.loader.exec_module(lab_functions)

# The vm_passthrough scenario's checks of a prepared node, run here as they are (pytest collects the test_
# functions of this module's namespace) with the fixtures they use.
_SPEC = importlib.util.spec_from_file_location(
    "passthrough_node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "vm_passthrough",
                                     "tests", "test_passthrough_node.py"))
_PASSTHROUGH = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_PASSTHROUGH)
globals().update((name, value) for name, value in vars(_PASSTHROUGH).items()
                 if name.startswith("test_") or name in ("found", "handed"))


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
    # Every image of the running kernel was read: /boot's, and on systemd-boot the ESP's copy the boot loads.
    assert len(lines.get("image", [])) == (2 if lab_functions.boot_path(host) == "systemd-boot" else 1), lines
    carried = lines.get("initramfs", [])
    assert not [entry for entry in carried if "gpuops-vfio" in entry or "vfio-pci.ko" in entry], carried
    # The blacklist of nouveau stays, in every image.
    for image in lines["image"]:
        assert [entry for entry in carried if entry.startswith(image + " ") and "gpuops-nouveau.conf" in entry], image


def test_container_leg_entries_carry_nothing_of_the_collection(host):
    """On systemd-boot every entry carries its own arguments: after the container leg each entry, and
    /etc/kernel/cmdline, has the host's intel_iommu=off back and none of the VM node's arguments."""
    if lab_functions.boot_path(host) != "systemd-boot":
        pytest.skip("a grub host: one configuration for every entry (the command line checks)")
    _report, lines = container_leg(host)
    assert lines.get("entry"), lines
    for options in lines["entry"] + lines["kernelcmdline"]:
        args = options.split()
        assert "intel_iommu=off" in args, options
        assert not [a for a in args if a in ("intel_iommu=on", "iommu=pt") or a.startswith("vfio-pci.ids=")], options


def test_container_leg_has_the_original_command_line(host):
    """passthrough -> container gives the distribution drop-in's intel_iommu=off back: the command line is the
    one the host booted with before its first preparation (recorded by the scenario's prepare step)."""
    _report, lines = container_leg(host)
    pristine = host.file("/var/tmp/gpuops-pristine-cmdline").content_string.strip()
    assert [lab_functions.comparable(line) for line in lines["cmdline"]] == [lab_functions.comparable(pristine)]
    assert "intel_iommu=off" in pristine.split()


def test_distribution_drop_in_left_alone(host):
    if lab_functions.boot_path(host) == "systemd-boot":
        pytest.skip("a systemd-boot host: its intel_iommu=off is in /etc/kernel/cmdline (the entries' checks)")
    dropin = host.file("/etc/default/grub.d/50-distro-iommu.cfg")
    assert dropin.exists and "intel_iommu=off" in dropin.content_string


def test_the_way_back_fell_back_to_a_firmware_reboot(host):
    """The way back asked for kexec on a host without kexec-tools: the role rebooted through the firmware (and
    the passthrough checks above ran on the kernel that reboot started)."""
    import json  # pylint: disable=import-outside-toplevel
    report, _lines = container_leg(host)
    back = json.loads(host.file("/var/tmp/gpuops-switch-back-reboot.json").content_string)
    assert not host.exists("kexec")
    assert report["reboot"]["method"] == "reboot" and back["method"] == "reboot", (report["reboot"], back)
    assert int(float(back["seconds"])) > 0


def test_the_hand_made_claim_came_off_in_the_container_legs_reboot(host):
    """The vm_passthrough scenario's host claimed its GPU stand-ins with vfio-pci.ids in /etc/default/grub (in
    effect since its preparation, its verifier checks). The container leg, allowed to remove claims, took it off in
    the boot change of the switch: the command line after its one reboot is the pristine one (above) and has no
    vfio-pci.ids. On a grub host it took that token alone out of the owner's file, with a backup of the file, so the
    collection's drop-in after the switch back only adds to the owner's value and a later edit of the owner's still
    counts (a full value there froze the owner's command line: issue 43)."""
    marker = host.file("/var/tmp/gpuops-hand-made-claim")
    if not marker.exists:
        pytest.skip("the host was prepared before the vm_passthrough scenario: no hand-made claim")
    claim = marker.content_string.strip()
    _report, lines = container_leg(host)
    assert [arg for arg in lines["cmdline"][0].split() if arg.startswith("vfio-pci.ids=")] == []
    if lab_functions.boot_path(host) == "systemd-boot":
        # The claim was in /etc/kernel/cmdline and every entry: the leg took it off both (the entries' check above).
        assert claim not in lines["kernelcmdline"][0].split()
        assert claim not in host.file("/proc/cmdline").content_string.split()
        return
    assert claim not in host.file("/etc/default/grub").content_string
    assert claim not in host.file("/proc/cmdline").content_string.split()
    backed_up = host.run("grep -rlF -- %s /var/lib/gpuops/backups" % claim)
    assert backed_up.rc == 0 and backed_up.stdout.strip(), (backed_up.stdout, backed_up.stderr)
    dropin = host.file("/etc/default/grub.d/99-gpuops-sandbox.cfg").content_string
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in dropin.splitlines(), dropin


def test_an_edit_of_the_owners_after_the_switch_still_counts(host):
    """After the switch back the owner added panic=30 to /etc/default/grub and ran update-grub (side_effect.yml):
    every menu entry of the running kernel in the regenerated grub.cfg has the owner's argument and the
    collection's iommu=pt, and no vfio-pci.ids. A drop-in holding a fixed GRUB_CMDLINE_LINUX would have dropped the
    owner's argument (issue 43)."""
    if lab_functions.boot_path(host) == "systemd-boot":
        pytest.skip("a systemd-boot host has no /etc/default/grub: its owner edits /etc/kernel/cmdline")
    owners = [line for line in host.file("/etc/default/grub").content_string.splitlines()
              if line.startswith("GRUB_CMDLINE_LINUX=")]
    assert owners and owners[-1].startswith('GRUB_CMDLINE_LINUX="panic=30 '), owners
    kernel = host.run("uname -r").stdout.strip()
    entries = [line.split() for line in host.file("/boot/grub/grub.cfg").content_string.splitlines()
               if line.strip().startswith("linux") and ("vmlinuz-%s" % kernel) in line]
    assert entries, "no menu entry of %s in grub.cfg" % kernel
    for words in entries:
        assert "panic=30" in words and "iommu=pt" in words, words
        assert not [word for word in words if word.startswith("vfio-pci.ids=")], words
