"""Host preparation in the lab: one molecule scenario per workload type, and the failure paths.

The four workload-type scenarios (container, vm_passthrough, vm_vgpu, dra) run at the same time, each on its own lab host (create resets the host
to the pristine image; check mode (vm_passthrough and vm_vgpu), converge with at most one reboot, idempotence,
testinfra verify). They start in the background at the session's start (conftest.LabWork, beside the module
targets on the spare host) and leave their hosts prepared: the switch scenario then starts at once from the
vm_passthrough host and the power-loss run from the vm_vgpu host (test_85 and test_87 check them), the
failure paths here run against lab-container (whose VM has no IOMMU in its firmware), then a run stopped by
another run's lock on the same host (lab-container's work ends first: these plays are off the longest chain, the
one on lab-passthrough), and test_95 runs the main job on all four.
"""

import re

import pytest

from conftest import BOOT_STATE, SCENARIOS, action_output, console_tail, lab, lab_file, reboots, run


@pytest.fixture(scope="module")
def scenario_runs(scenario_batch):
    # Started before the controller's tests (conftest.LabWork); this waits for them to end.
    return scenario_batch.results()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_workload_scenario(lab_work, scenario_runs, scenario):
    rc, out, elapsed = scenario_runs[scenario]
    assert rc == 0, out[-10000:] + "\n" + console_tail(SCENARIOS[scenario])
    converge = action_output(out, "converge")
    idempotence = action_output(out, "idempotence")
    assert "PLAY RECAP" in converge and "PLAY RECAP" in idempotence, out[-4000:]
    # One reboot on the first converge (boot settings changed on the pristine host), none on the second.
    assert reboots(converge) == 1, converge[-6000:]
    assert reboots(idempotence) == 0
    assert " passed" in action_output(out, "verify")
    # The reboot ended the host's QEMU and its reboot follower started the host again on its port (a cold
    # start; lab/gpulab.py follow_reboots), not QEMU's in-place reset.
    host = SCENARIOS[scenario]
    follower = lab_file(host, "reboots.log")[lab_work.follower_logs[host]:]
    assert re.search(r"the guest rebooted; started again \(ssh port \d+\)", follower), follower
    assert "error" not in follower, follower
    print("%s: molecule test %.0fs" % (scenario, elapsed))


STATE = ("cat /proc/cmdline; ls -l --time-style=+%s /etc/modprobe.d /etc/default/grub.d /etc/modules-load.d "
         "/etc/udev/rules.d /boot; ls /sys/bus/mdev/devices 2>/dev/null; true")


def host_state(host):
    return lab("ssh", host, "--", STATE, check=True).stdout


@pytest.mark.parametrize("extra,expected", [
    (["-e", "gpuops_workload_type=vm-passthrough"],
     r"no IOMMU table \(no ACPI DMAR or IVRS\).*Nothing was changed"),
    # A DRA node needs the IOMMU as much: its driver binds the GPU to vfio-pci for a VM's claim.
    (["-e", "gpuops_workload_type=dra"],
     r"lab-container is a dra node but its firmware has no IOMMU table \(no ACPI DMAR or IVRS\).*Nothing was changed"),
    (["-e", '{"preflight_supported_os": {"ubuntu": ["24.04"], "rocky": ["9"]}}'],
     r"ID=debian, VERSION_ID=12\), which is not supported; supported: ubuntu 24.04, rocky 9.*Nothing was changed"),
    (["-e", "gpuops_workload_type=gpu-magic"],
     r"preflight_workload_type must be one of: , container, vm-passthrough, vm-vgpu, dra, got: gpu-magic"),
], ids=["iommu-off-in-firmware", "dra-iommu-off-in-firmware", "unsupported-os", "bad-workload-type"])
def test_preflight_failure_changes_nothing(scenario_runs, extra, expected):  # pylint: disable=unused-argument
    # The switch scenario may still run on lab-passthrough (test_85 checks it), and the power-loss run on
    # lab-vgpu (test_87 checks it).
    lab("start", "lab-container", check=True, timeout=1800)
    before = host_state("lab-container")
    proc = run(["ansible-playbook", "playbooks/prepare_hosts.yml", "-i", "inventories/lab/", "--limit",
                "lab-container"] + extra, timeout=1800)
    out = " ".join(proc.stdout.split())
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert re.search(expected, out), proc.stdout[-4000:]
    assert "Traceback" not in proc.stdout
    assert "changed=0" in out
    assert host_state("lab-container") == before


def test_a_second_run_on_a_held_host_stops_naming_the_first(scenario_runs):  # pylint: disable=unused-argument
    """Another run holds lab-container (an AWX job, say): prepare_hosts.yml stops on it before any change,
    naming that run; once that run is gone (its lock broken on request), the play runs and frees the host."""
    other = "run_id=awx-4711 owner='AWX job 4711 (Prepare GPU nodes, launched by scheduler)'"
    run(["ansible", "lab-container", "-i", "inventories/lab/", "-m", "gpuops.sandbox.host_lock", "-a", other],
        check=True)
    before = lab("ssh", "lab-container", "--", BOOT_STATE, check=True).stdout
    proc = run(["ansible-playbook", "playbooks/prepare_hosts.yml", "-i", "inventories/lab/", "--limit",
                "lab-container"], timeout=1800)
    out = " ".join(proc.stdout.split())
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert "AWX job 4711 (Prepare GPU nodes, launched by scheduler)" in out and "awx-4711" in out, proc.stdout[-4000:]
    assert "changed=0" in out and "Traceback" not in proc.stdout
    assert lab("ssh", "lab-container", "--", BOOT_STATE, check=True).stdout == before
    # The other run's lock is still there: this run's release left it alone.
    assert "awx-4711" in lab("ssh", "lab-container", "--", "cat /var/lib/gpuops/lock.json", check=True).stdout
    proc = run(["ansible-playbook", "playbooks/prepare_hosts.yml", "-i", "inventories/lab/", "--limit",
                "lab-container", "-e", "gpuops_host_lock_break=true"], timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "changed=0" in " ".join(proc.stdout.split())
    assert lab("ssh", "lab-container", "--", "test ! -e /var/lib/gpuops/lock.json", check=False).returncode == 0
