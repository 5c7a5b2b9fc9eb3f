"""Host preparation in the lab: one molecule scenario per workload type, the switch scenario, failure paths.

The three workload-type scenarios run at the same time, each on its own lab host (create resets the host to
the pristine image; check, converge with at most one reboot, idempotence, testinfra verify), and leave their
hosts prepared: the switch scenario (passthrough -> container -> passthrough) starts from the vm_passthrough
host, the failure paths run against lab-container (whose VM has no IOMMU in its firmware), and
test_90_site.py runs the main job on all three.
"""

import os
import re
import subprocess
import sys
import time

import pytest

from conftest import TOP, lab, run

SCENARIOS = {"container": "lab-container", "vm_passthrough": "lab-passthrough", "vm_vgpu": "lab-vgpu"}
REBOOT_TASK = "Reboot once ("


def molecule(scenario, env=None):
    full_env = dict(os.environ)
    full_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full_env.get("PATH", "")
    full_env.setdefault("ANSIBLE_CONFIG", os.path.join(TOP, "ansible.cfg"))
    full_env.update(env or {})
    full_env.update(NO_COLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", COLUMNS="400")
    return subprocess.Popen(["molecule", "test", "-s", scenario], cwd=TOP, env=full_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain(text):
    """Molecule's output without colours, its box margin, or the wrapping of long lines."""
    text = ANSI_RE.sub("", text)
    text = re.sub(r"\n[ \t]*│ {3}", " ", text)
    return re.sub(r"(?m)^[ \t]*[│┌└][─ ]?", "", text)


def action_output(out, action):
    """The part of a molecule run's output that belongs to one action (converge, idempotence...)."""
    out = plain(out)
    # "container ➜ converge: Executing" with colours, "[container > converge] Executing" without (NO_COLOR).
    marks = [(m.start(), m.group(1) or m.group(2)) for m in re.finditer(
        r"INFO\s+(?:\w+\s+➜\s+(\w+):|\[\w+ > (\w+)\]) Executing", out)]
    for index, (start, name) in enumerate(marks):
        if name == action:
            # An action may log several "Executing" lines; it ends where another action starts.
            end = next((pos for pos, other in marks[index + 1:] if other != action), len(out))
            return out[start:end]
    return ""


def reboots(text):
    """Reboot tasks that really ran (changed) in a play's output."""
    return len(re.findall(r"TASK \[[^\]]*%s[^\]]*\][^\n]*\n(?:(?![^\n]*TASK \[)[^\n]*\n)*?[^\n]*changed: " % re.escape(REBOOT_TASK), text))


@pytest.fixture(scope="module")
def scenario_runs(running_lab):
    started = time.monotonic()
    # Every host stays as its scenario left it, for the switch scenario, the failure paths and site.yml.
    procs = {name: molecule(name, {"GPUOPS_MOLECULE_KEEP": "1"}) for name in SCENARIOS}
    results = {}
    for name, proc in procs.items():
        out = proc.communicate(timeout=3600)[0]
        results[name] = (proc.returncode, out, time.monotonic() - started)
    return results


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_workload_scenario(scenario_runs, scenario):
    rc, out, elapsed = scenario_runs[scenario]
    assert rc == 0, out[-10000:]
    converge = action_output(out, "converge")
    idempotence = action_output(out, "idempotence")
    assert "PLAY RECAP" in converge and "PLAY RECAP" in idempotence, out[-4000:]
    # One reboot on the first converge (boot settings changed on the pristine host), none on the second.
    assert reboots(converge) == 1, converge[-6000:]
    assert reboots(idempotence) == 0
    assert " passed" in action_output(out, "verify")
    print("%s: molecule test %.0fs" % (scenario, elapsed))


def test_switch_scenario(scenario_runs):
    assert scenario_runs["vm_passthrough"][0] == 0, "the switch scenario starts from the vm_passthrough host"
    proc = molecule("switch", {"GPUOPS_MOLECULE_REUSE": "1", "GPUOPS_MOLECULE_KEEP": "1"})
    out = proc.communicate(timeout=3600)[0]
    assert proc.returncode == 0, out[-10000:]
    # The host was already a vm-passthrough node: no reboot on converge; one per switch.
    assert reboots(action_output(out, "converge")) == 0
    assert reboots(action_output(out, "side_effect")) == 2
    assert reboots(action_output(out, "idempotence")) == 0


STATE = ("cat /proc/cmdline; ls -l --time-style=+%s /etc/modprobe.d /etc/default/grub.d /etc/modules-load.d "
         "/etc/udev/rules.d /boot; ls /sys/bus/mdev/devices 2>/dev/null; true")


def host_state(host):
    return lab("ssh", host, "--", STATE, check=True).stdout


@pytest.mark.parametrize("extra,expected", [
    (["-e", "gpuops_workload_type=vm-passthrough"],
     r"no IOMMU table \(no ACPI DMAR or IVRS\).*Nothing was changed"),
    (["-e", '{"preflight_supported_os": {"ubuntu": ["24.04"], "rocky": ["9"]}}'],
     r"ID=debian, VERSION_ID=12\), which is not supported; supported: ubuntu 24.04, rocky 9.*Nothing was changed"),
    (["-e", "gpuops_workload_type=gpu-magic"],
     r"preflight_workload_type must be one of: , container, vm-passthrough, vm-vgpu, dra, got: gpu-magic"),
], ids=["iommu-off-in-firmware", "unsupported-os", "bad-workload-type"])
def test_preflight_failure_changes_nothing(scenario_runs, extra, expected):
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
