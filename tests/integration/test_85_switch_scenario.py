"""The switch scenarios: a host goes from vm-passthrough to container and back (molecule, scenario switch), and
lab-dra from dra to vm-passthrough and back (scenario dra_switch).

Each starts, in the background, from the host its workload scenario of test_82 left prepared (molecule create
reuses it; no converge or idempotence step, see switched()) as soon as that scenario has passed, and runs while the image, API server and docs tests
use the controller; this test waits for it. Each switch undoes the old type and reboots once; host_verify
fails the scenario when a leg keeps anything of the type it left.
"""

import re

from conftest import BOOT_STATE, action_output, console_tail, lab, reboots, run


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


def test_refused_switch_changes_nothing(switch_run):
    """A process holding the GPU's VFIO group: the switch to container is refused by preflight, naming the
    process by its command line, and every file, the initramfs and the boot configuration stay as they were."""
    assert switch_run is not None and switch_run.results()["switch"][0] == 0, "needs the switch scenario's host"
    group = lab("ssh", "lab-passthrough", "--", "basename $(readlink /sys/bus/pci/devices/0000:00:03.0/iommu_group)",
                check=True).stdout.strip()
    assert group.isdigit(), group
    holder = "sleep 1800"
    lab("ssh", "lab-passthrough", "--",
        "setsid sh -c 'exec 3<>/dev/vfio/%s; exec %s' </dev/null >/dev/null 2>&1 &" % (group, holder), check=True)
    try:
        pid = lab("ssh", "lab-passthrough", "--", "sleep 1; pgrep -xf '%s'" % holder, check=True).stdout.split()
        assert len(pid) == 1, pid
        before = lab("ssh", "lab-passthrough", "--", BOOT_STATE, check=True).stdout
        proc = run(["ansible-playbook", "playbooks/prepare_hosts.yml", "-i", "inventories/lab/", "--limit",
                    "lab-passthrough", "-e", "gpuops_workload_type=container"], timeout=1800)
        out = " ".join(proc.stdout.split())
        assert proc.returncode != 0, proc.stdout[-4000:]
        assert "pid %s (%s) holds /dev/vfio/%s" % (pid[0], holder, group) in out, proc.stdout[-4000:]
        assert "cannot be prepared as a container node" in out and "Nothing was changed" in out
        assert "changed=0" in out and "Traceback" not in proc.stdout
        assert lab("ssh", "lab-passthrough", "--", BOOT_STATE, check=True).stdout == before
    finally:
        lab("ssh", "lab-passthrough", "--", "pkill -xf '%s' || true" % holder)
