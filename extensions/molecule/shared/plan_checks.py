"""The verifiers' checks of a scenario's host against its plan: playbooks/plan.yml ran on the host before the
converge (shared/plan_before.yml, the scenario's last prepare step), and the converged host must show what that plan
said it would - its kernel arguments on the running command line (so its reboot happened), the functions it binds
on vfio-pci, the VF counts it sets - and plan.yml on the converged host must find nothing left to change."""

import json
import os
import subprocess
import sys

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")


def _driver(host, address):
    link = "/sys/bus/pci/devices/%s/driver" % address
    return os.path.basename(host.check_output("readlink %s || true" % link).strip()) or None


def plan_before(host):
    """The host's plan before the converge, as plan.yml wrote it."""
    path = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "plan-before.json")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["hosts"][host.backend.get_hostname()]


def plan_now(host, tmp_path):
    """plan.yml on the host as the converge left it (the scenario's inventory, this host alone): its plan and the
    run's output."""
    name = host.backend.get_hostname()
    document = str(tmp_path / "plan-after.json")
    inventory = os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"])
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory,
                           os.path.join(TOP, "playbooks", "plan.yml"),
                           "-e", "gpuops_plan_file=" + document], cwd=TOP, check=False, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    with open(document, encoding="utf-8") as handle:
        return json.load(handle)["hosts"][name], proc.stdout


def check_host_is_as_planned(host):
    """The converged host against the plan made before it: nothing refused, each planned kernel argument on the
    running command line (a reboot the plan called for has happened), each function it binds on vfio-pci, each VF
    count it sets."""
    plan = plan_before(host)
    assert plan["refusals"] == [], plan["refusals"]
    assert plan["changes"], "the plan of the pristine host has nothing to change: %r" % plan
    assert plan["reboot"]["required"] == bool(plan["reboot"]["reasons"]), plan["reboot"]
    expected = plan["expected"]
    running = host.file("/proc/cmdline").content_string.split()
    missing = [a for a in expected["kernel_arguments"] if a not in running]
    assert not missing, (missing, running, plan["reboot"])
    off = [a for a in expected["vfio"] if _driver(host, a) != "vfio-pci"]
    assert not off, ("planned for vfio-pci, found elsewhere", off, expected["vfio"])
    for pf, count in (expected.get("sriov") or {}).items():
        assert int(host.file("/sys/bus/pci/devices/%s/sriov_numvfs" % pf).content_string) == count, (pf, count)
    return plan


def check_nothing_left_to_plan(host, tmp_path):
    """plan.yml on the converged host: no change, no refusal, no reboot."""
    plan, out = plan_now(host, tmp_path)
    assert plan["changes"] == [] and plan["refusals"] == [], (plan["changes"], plan["refusals"], out[-3000:])
    assert plan["empty"] is True and plan["reboot"]["required"] is False, plan
    assert "Traceback" not in out and "changed=0" in out, out[-3000:]


def scenario_tests(workload_type):
    """The two verifier tests of a scenario whose node is of ``workload_type``, for its tests/test_plan.py."""

    def test_the_host_is_what_its_plan_said(host):
        plan = check_host_is_as_planned(host)
        assert plan["workload_type"] == workload_type, plan["workload_type"]
        # From pristine the preparation reboots once (the kernel arguments, the initramfs): the plan said so first.
        assert plan["reboot"]["required"] is True, plan["reboot"]

    def test_nothing_is_left_to_plan(host, tmp_path):
        check_nothing_left_to_plan(host, tmp_path)

    return test_the_host_is_what_its_plan_said, test_nothing_is_left_to_plan
