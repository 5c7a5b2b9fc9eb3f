"""Host preparation in the lab: one molecule scenario per workload type, and the failure paths.

The four workload-type scenarios (container, vm_passthrough, vm_vgpu, dra) run at the same time, each on its own lab
host (create resets the host to the pristine image; check mode (vm_passthrough and vm_vgpu), converge with at most
one reboot, testinfra verify; the second run that must change nothing is test_95's site.yml on every prepared host,
conftest.SCENARIO_ENV). They start in the background at the session's start (conftest.LabWork, beside the module
targets on the spare host) and leave their hosts prepared: the switch scenario then starts at once from the
vm_passthrough host and the power-loss run from the vm_vgpu host (test_85 and test_87 check them). As soon as
the container scenario has passed, the failure paths run against lab-container (whose VM has no IOMMU in its
firmware), then a run stopped by another run's lock on the same host, in the background too
(conftest.container_host_steps): the tests here read what they saw. test_95 runs the main job on all four.
"""

import re

import pytest

from conftest import PREFLIGHT_FAILURES, SCENARIO_ENV, SCENARIOS, action_output, console_tail, lab_file, reboots


@pytest.fixture(scope="module")
def scenario_runs(scenario_batch):
    # Started before the controller's tests (conftest.LabWork); this waits for them to end.
    return scenario_batch.results()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_workload_scenario(lab_work, scenario_runs, scenario):
    rc, out, elapsed = scenario_runs[scenario]
    assert rc == 0, out[-10000:] + "\n" + console_tail(SCENARIOS[scenario])
    converge = action_output(out, "converge")
    assert "PLAY RECAP" in converge, out[-4000:]
    # One reboot on the first converge (boot settings changed on the pristine host). The second run that must
    # change nothing is test_95's site.yml on every prepared host (conftest.SCENARIO_ENV); with molecule's own
    # idempotence step (a run by hand) it reboots nothing either.
    assert reboots(converge) == 1, converge[-6000:]
    # Before the first change the preflight role showed the host's plan (the host_plan filter, as playbooks/plan.yml
    # shows it), which named the reboot; the boot phase's modules then found the plan's reasons to reboot, no other
    # (prepare_hosts.yml says where they differ), in check mode as in the converge.
    assert re.search(r"reboots: [a-z]", converge), converge[-6000:]
    assert "did not foresee" not in out, out[out.find("did not foresee") - 3000:][:6000]
    idempotence = action_output(out, "idempotence")
    assert SCENARIO_ENV.get("GPUOPS_MOLECULE_IDEMPOTENCE") or "PLAY RECAP" in idempotence, out[-4000:]
    assert reboots(idempotence) == 0
    assert " passed" in action_output(out, "verify")
    # The reboot ended the host's QEMU and its reboot follower started the host again on its port (a cold
    # start; lab/gpulab.py follow_reboots), not QEMU's in-place reset.
    host = SCENARIOS[scenario]
    follower = lab_file(host, "reboots.log")[lab_work.follower_logs[host]:]
    assert re.search(r"the guest rebooted; started again \(ssh port \d+\)", follower), follower
    assert "error" not in follower, follower
    print("%s: molecule test %.0fs" % (scenario, elapsed))


def container_checks(lab_work):
    """What the plays on lab-container after its scenario saw (conftest.container_host_steps, in the background)."""
    steps = lab_work.container_checks.get()
    assert steps is not None, "the plays on lab-container follow its scenario, which failed"
    return steps.results()


@pytest.mark.parametrize("name,expected", [(name, expected) for name, _extra, expected in PREFLIGHT_FAILURES],
                         ids=[name for name, _extra, _expected in PREFLIGHT_FAILURES])
def test_preflight_failure_changes_nothing(lab_work, name, expected):
    seen = container_checks(lab_work)["preflight " + name]
    assert "error" not in seen, seen["error"]
    out = " ".join(seen["out"].split())
    assert seen["rc"] != 0, seen["out"][-4000:]
    assert re.search(expected, out), seen["out"][-4000:]
    assert "Traceback" not in seen["out"]
    assert "changed=0" in out
    assert seen["after"] == seen["before"]


@pytest.mark.slice("repairs")
def test_a_second_run_on_a_held_host_stops_naming_the_first(lab_work):
    """Another run holds lab-container (an AWX job, say): prepare_hosts.yml stops on it before any change,
    naming that run; once that run is gone (its lock broken on request), the play runs and frees the host."""
    seen = container_checks(lab_work)["held"]
    assert "error" not in seen, seen["error"]
    out = " ".join(seen["out"].split())
    assert seen["rc"] != 0, seen["out"][-4000:]
    assert "AWX job 4711 (Prepare GPU nodes, launched by scheduler)" in out and "awx-4711" in out, seen["out"][-4000:]
    assert "changed=0" in out and "Traceback" not in seen["out"]
    assert seen["after"] == seen["before"]
    # The other run's lock is still there: this run's release left it alone.
    assert "awx-4711" in seen["lock"]
    assert seen["broken_rc"] == 0, seen["broken_out"][-4000:]
    assert "changed=0" in " ".join(seen["broken_out"].split())
    assert seen["lock_gone"]
