"""Each module's integration target (tests/integration/targets/<module>) on a real lab host.

They run on lab-modules, the lab's spare host (outside gpu_nodes, started only when named), in the
background from the start of the session (conftest.ModuleTargetsRun), while the workload-type scenarios use
the GPU hosts and the controller runs the image, API server and chart tests. The host starts from the
pristine image (IOMMU off); kernel_cmdline turns the IOMMU on through grub; the host then reboots once, and
the other targets run on the IOMMU-enabled kernel. The host is reset and stopped at the end. Each target is
one play; these tests read how each ended.
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


def test_reboot_applies_the_iommu_arguments(module_targets):
    # The play reboots once and asserts intel_iommu=on (and no intel_iommu=off) on the running kernel.
    ended_well(module_targets, REBOOT_STEP)


@pytest.mark.parametrize("target", AFTER_REBOOT)
def test_target_after_reboot(module_targets, target):
    ended_well(module_targets, target)
