"""Each module's integration target (tests/integration/targets/<module>) on a real lab host.

They run on lab-modules, the lab's spare host (outside gpu_nodes, started only when named), in the
background from the start of the session (conftest.ModuleTargetsRun), while the workload-type scenarios use
the GPU hosts and the controller runs the image, API server and chart tests. The host starts from the
pristine image (IOMMU off); kernel_cmdline turns the IOMMU on through grub; the host then loses its power
(its QEMU killed) and the lab starts it again on another port, and the other targets run on the IOMMU-enabled
kernel it boots. The host is reset and stopped at the end. Each target is one play; these tests read how each
ended.
"""

import pytest

from conftest import AFTER_REBOOT, BEFORE_REBOOT, REBOOT_STEP


def ended_well(module_targets, step):
    rc, out, elapsed = module_targets[step]
    assert rc == 0, out[-8000:]
    print("%s: %.0fs" % (step, elapsed))


@pytest.mark.parametrize("target", BEFORE_REBOOT)
def test_target_before_reboot(module_targets, target):
    ended_well(module_targets, target)


def test_crashed_vm_is_detected_and_restarted_on_a_new_port(lab_work, module_targets):
    """The lab CLI after a power loss: `gpulab status` calls the host stale, `gpulab start` says so, finds
    its old SSH port taken by something else meanwhile, boots it on a new port, rewrites the inventory, and
    Ansible reaches the host there."""
    seen = lab_work.modules.lab_cli.get("crash")
    assert seen, module_targets.get(REBOOT_STEP)
    host, before = lab_work.modules.host, seen["before"]
    assert seen["killed"]["state"] == "stale"
    assert seen["start_rc"] == 0, seen["start_out"]
    assert "%s: found stale" % host in seen["start_out"]
    assert "port %d is taken" % before["ssh_port"] in seen["start_out"]
    assert seen["after"]["state"] == "running" and seen["after"]["ssh_port"] != before["ssh_port"]
    assert "ansible_port: %d" % seen["after"]["ssh_port"] in seen["inventory"]
    assert seen["ping_rc"] == 0 and "SUCCESS" in seen["ping_out"] and "pong" in seen["ping_out"], seen["ping_out"]


def test_restart_boots_the_new_iommu_arguments(module_targets):
    # After the power loss the host boots what kernel_cmdline wrote: intel_iommu=on and no intel_iommu=off.
    ended_well(module_targets, REBOOT_STEP)


@pytest.mark.parametrize("target", AFTER_REBOOT)
def test_target_after_reboot(module_targets, target):
    ended_well(module_targets, target)
