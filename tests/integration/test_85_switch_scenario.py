"""The switch scenarios: a host goes from vm-passthrough to container and back (molecule, scenario switch), and
lab-dra, after a kernel update, from dra to vm-passthrough and back (scenario dra_switch); then the old kernel's
stale image on lab-dra.

Each starts, in the background, from the host its workload scenario of test_82 left prepared (molecule create
reuses it; no converge or idempotence step, see switched()) as soon as that scenario has passed, and runs while the image, API server and docs tests
use the controller; this test waits for it. Each switch undoes the old type and reboots once; host_verify
fails the scenario when a leg keeps anything of the type it left.
"""

import json
import re

import pytest

from conftest import VFIO_HOLDER, action_output, console_tail, lab_settings, reboots


def switched(background, scenario, source, host):
    """The output of a switch scenario that passed: one reboot per switch (side_effect goes there and back). The
    scenario runs no converge or idempotence step: the host's workload scenario made that no-op run before, and
    after the switch back the refused switch below, the drift repair (test_86) and test_95's site run find the host
    prepared."""
    assert background is not None, "the %s scenario starts from the %s host, whose scenario failed" % (scenario, source)
    rc, out, elapsed = background.results()[scenario]
    assert rc == 0, out[-10000:] + "\n" + console_tail(host)
    assert reboots(action_output(out, "side_effect")) == 2
    # The verifier ran its checks (one that collected nothing passes too).
    passed = re.findall(r"(\d+) passed", action_output(out, "verify"))
    assert passed, action_output(out, "verify")[-4000:]
    print("%s: molecule test %.0fs, %s verifier checks passed" % (scenario, elapsed, passed[-1]))
    return int(passed[-1])


def test_switch_scenario(switch_run):
    """vm-passthrough -> container -> vm-passthrough on lab-passthrough."""
    assert switched(switch_run, "switch", "vm_passthrough", "lab-passthrough") >= 15


@pytest.mark.slice("kernels")
def test_dra_switch_scenario(dra_switch_run):
    """dra -> vm-passthrough -> dra on lab-dra, the host of another shape (a GPU slot with audio and USB
    functions, a GPU behind a PCIe switch): the dra node's checks and those of both legs (the passthrough leg's
    binding and VFIO probe, the dra leg's drivers given back)."""
    assert switched(dra_switch_run, "dra_switch", "dra", "lab-dra") >= 10


def passthrough_checks(lab_work):
    """What the plays on lab-passthrough after the switch scenario saw (conftest.passthrough_host_steps)."""
    steps = lab_work.passthrough_checks.get()
    assert steps is not None, "the plays on lab-passthrough follow the switch scenario, which failed"
    return steps.results()


def test_refused_switch_changes_nothing(lab_work):
    """A process holding the GPU's VFIO group: the switch to container is refused by preflight, naming the
    process by its command line, and every file, the initramfs and the boot configuration stay as they were."""
    seen = passthrough_checks(lab_work)["refused switch"]
    assert "error" not in seen, seen["error"]
    group = seen["group"]
    assert group.isdigit(), group
    assert len(seen["pid"]) == 1, seen["pid"]
    out = " ".join(seen["out"].split())
    assert seen["rc"] != 0, seen["out"][-4000:]
    assert "pid %s (%s) holds /dev/vfio/%s" % (seen["pid"][0], VFIO_HOLDER, group) in out, seen["out"][-4000:]
    assert "cannot be prepared as a container node" in out and "Nothing was changed" in out
    assert "changed=0" in out and "Traceback" not in seen["out"]
    assert seen["after"] == seen["before"]


@pytest.mark.slice("kernels")
def test_a_stale_kernel_image_is_named_and_rebuilt_alone_then_its_removal_is_no_error(lab_work):
    """On lab-dra after the kernel update (the dra_switch scenario): the kernel it ran before has an image older
    than the collection's files. verify_hosts.yml fails naming that kernel; prepare_hosts.yml rebuilds that image
    alone, with no reboot (the running kernel is right); then dpkg removes that kernel, its modules directory stays
    behind (the lab's mtty.ko in it), and gpu_facts reads the one kernel left."""
    steps = lab_work.dra_checks.get()
    assert steps is not None, "the stale kernel's repair follows the dra_switch scenario, which failed"
    seen = steps.results()["kernel repair"]
    assert "error" not in seen, seen["error"]
    assert len(seen["old"]) == 1, seen["before"]
    old, running = seen["old"][0], seen["before"]["running"]
    verify = " ".join(seen["verify_out"].split())
    assert seen["verify_rc"] != 0, seen["verify_out"][-4000:]
    assert "other installed kernels" in verify and "initramfs /boot/initrd.img-%s is older than" % old in verify, \
        seen["verify_out"][-4000:]
    assert "Traceback" not in seen["verify_out"]
    assert seen["repair_rc"] == 0, seen["repair_out"][-6000:]
    after = seen["after"]
    assert after["boot"] == seen["before"]["boot"] and after["running"] == running, (seen["before"], after)
    assert after["images"][running] == seen["before"]["images"][running], (seen["before"], after)
    assert after["images"][old] > seen["before"]["images"][old], (seen["before"], after)
    assert seen["remove_rc"] == 0, seen["remove_out"]
    assert "vmlinuz-%s" % old not in seen["remove_out"] and old in seen["remove_out"].split(), seen["remove_out"]
    assert seen["facts_rc"] == 0, seen["facts_out"][-4000:]
    line = next(l for l in seen["facts_out"].splitlines() if " | SUCCESS => " in l)
    facts = json.loads(line.split(" => ", 1)[1])["ansible_facts"]["gpu_facts_host"]
    assert [(k["version"], k["running"], k["problems"]) for k in facts["kernels"]] == [(running, True, [])], facts


@pytest.mark.slice("uefi")
def test_a_new_kernels_entry_gets_the_arguments_and_one_that_lacks_them_is_named_and_written_again(lab_work):
    """On lab-passthrough, which boots the RHEL family's way in the uefi slice (systemd-boot entries written by
    kernel-install, dracut), after the refused switch (and the drift repair when the repairs slice runs too): the
    distribution installs another kernel. Its entry has the collection's arguments
    (kernel-install took them from /etc/kernel/cmdline) and both its images (/boot's and the ESP's copy) carry the
    collection's files and vfio-pci.ko. Then the entry loses the arguments, as one written before the preparation
    has them not (each entry carries its own): verify_hosts.yml fails naming that kernel, and prepare_hosts.yml
    writes the entry again with them, with no reboot (the running kernel's entry was right)."""
    # The uefi slice shapes the host so (tests/integration/tiers.py, through GPUOPS_LAB_SETTINGS).
    assert lab_settings("lab-passthrough").get("gpulab_boot") == "uefi", lab_settings("lab-passthrough")
    steps = lab_work.passthrough_checks.get()
    assert steps is not None, "the kernel update on lab-passthrough follows the switch scenario, which failed"
    seen = steps.results()["kernel entry"]
    assert "error" not in seen, seen["error"]
    new, running = seen["package"]["kernel"], seen["before"]["running"]
    assert new != running and new not in seen["before"]["entries"], seen["before"]
    assert seen["copy_rc"] == 0, seen["copy_out"]
    assert seen["install_rc"] == 0, seen["install_out"]
    print("kernel %s installed with dpkg in %.0fs" % (new, seen["install_seconds"]))
    installed = seen["installed"]
    args = installed["entries"][new]
    assert "intel_iommu=on" in args and "iommu=pt" in args and "intel_iommu=off" not in args, args
    images = sorted(path for path in installed["images"] if new in path)
    assert len(images) == 2 and images[0].startswith("/boot/efi/"), installed["images"]
    for path in images:
        carried = [item.rsplit("/", 1)[-1] for item in installed["images"][path]["carries"]]
        assert "gpuops-vfio.conf" in carried and "gpuops-nouveau.conf" in carried, (path, carried)
        assert [item for item in carried if item.startswith("vfio-pci.ko")], (path, carried)
    stripped = seen["stripped"]["entries"][new]
    assert "intel_iommu=on" not in stripped and "intel_iommu=off" in stripped, stripped
    verify = " ".join(seen["verify_out"].split())
    assert seen["verify_rc"] != 0, seen["verify_out"][-4000:]
    assert "other installed kernels" in verify and new in verify, seen["verify_out"][-4000:]
    assert "Traceback" not in seen["verify_out"]
    assert seen["repair_rc"] == 0, seen["repair_out"][-6000:]
    after = seen["after"]
    assert after["boot"] == seen["before"]["boot"] and after["running"] == running, (seen["before"], after)
    assert after["entries"][running] == seen["before"]["entries"][running]
    assert after["entries"][new] == args, (args, after["entries"][new])
    assert seen["facts_rc"] == 0, seen["facts_out"][-4000:]
    line = next(l for l in seen["facts_out"].splitlines() if " | SUCCESS => " in l)
    facts = json.loads(line.split(" => ", 1)[1])["ansible_facts"]["gpu_facts_host"]
    assert sorted((k["version"], k["problems"]) for k in facts["kernels"]) == sorted([(running, []), (new, [])]), facts
