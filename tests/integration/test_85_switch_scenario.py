"""The switch scenarios: a host goes from vm-passthrough to container and back (molecule, scenario switch), and
lab-dra from dra to vm-passthrough and back (scenario dra_switch).

Each starts, in the background, from the host its workload scenario of test_82 left prepared (molecule create
reuses it; no converge or idempotence step, see switched()) as soon as that scenario has passed, and runs while the image, API server and docs tests
use the controller; this test waits for it. Each switch undoes the old type and reboots once; host_verify
fails the scenario when a leg keeps anything of the type it left.
"""

import re

from conftest import VFIO_HOLDER, action_output, console_tail, reboots


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
