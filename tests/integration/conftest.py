"""Shared helpers for the integration tests: they run the real lab, playbooks and molecule."""

import fcntl
import functools
import importlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import yaml

import tiers

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = [sys.executable, os.path.join(TOP, "lab", "gpulab.py")]
# A lab host starved by the four others and the controller's tests is slow, not broken: on 2026-11-27 the four
# scenario hosts, booting at once, answered SSH 712-762 s after their start on plain SSH (3.3 min in CI's run the day
# before), close to the lab's 900 s. The tests' lab commands wait up to 25 minutes for a boot (a value set outside is
# kept); the commands that start hosts here have a 30-minute limit of their own.
os.environ.setdefault("GPUOPS_LAB_BOOT_TIMEOUT", "1500")


# The module targets' plays and the molecule scenarios of the VM types run on the mitogen strategy (one Python per
# host for a whole play, modules run in it): under emulation a module's start costs a guest about 3 s of CPU, mostly
# importing ansible.module_utils.basic, again for every task. Measured 2026-11-27: a target's guest CPU fell to a
# third (gpu_facts: 70 s against 22 s), a container converge from the pristine image on a quiet machine cost the
# guest 170 s against 218 s on plain SSH, the controller 34 s either way. Users run plain SSH: the container
# scenario, host_lock's target and every other lab playbook (the power-loss run, the preflight failures, the drift
# repair, site.yml as AWX runs it through ansible-runner) stay on it. GPUOPS_TEST_MITOGEN=0 runs everything on
# plain SSH.
MITOGEN_ENV = "GPUOPS_TEST_MITOGEN"
MITOGEN_MODES = ("0", "1")
MITOGEN_PARTS = ("targets", "scenario")
PLAIN_SSH_SCENARIOS = ("container",)
# Module targets that run on plain SSH (PLAIN_SSH_TARGETS, from their aliases, below): host_lock's race starts two
# async jobs of one loop at once, and under mitogen 0.3.54 both forked jobs waited on a futex for good (seen on
# lab-modules, 2026-11-27; the targets with one async job at a time pass on mitogen).


def mitogen_env(part="lab"):
    """The environment that puts an ansible-playbook of `part` ("targets": a module target's play, "scenario": a
    molecule scenario's, "lab": any other lab playbook) on the mitogen strategy; {} when it stays on plain SSH."""
    mode = os.environ.get(MITOGEN_ENV, "1")
    if mode not in MITOGEN_MODES:
        raise ValueError("%s=%r: expected one of %s" % (MITOGEN_ENV, mode, ", ".join(MITOGEN_MODES)))
    if mode == "0" or part not in MITOGEN_PARTS:
        return {}
    import ansible_mitogen  # pylint: disable=import-outside-toplevel
    strategies = os.path.join(os.path.dirname(ansible_mitogen.__file__), "plugins", "strategy")
    # Mitogen's connection is up once the guest's Python has started and loaded mitogen's core, all within the
    # connection timeout: molecule's 10 s default ran out under load, and 60 s on a host just cold-started beside
    # four busy ones (the module targets' restart step, 2026-11-27); mitogen does not retry as plain SSH does.
    return {"ANSIBLE_STRATEGY_PLUGINS": strategies, "ANSIBLE_STRATEGY": "mitogen_linear", "ANSIBLE_TIMEOUT": "240"}


# The tests' own thread (the controller's tests, then site.yml) is one chain of processes beside five to seven
# busy lab chains, and measured 2026-11-27 it was the one the tier waited on: at a seventh of the machine the
# controller's tests were still in test_70 an hour in, after every lab chain but one had ended. The session
# raises its own priority (nice -5, when it may) and puts what its background threads start back at the usual
# one: the lab's hosts and plays keep equal shares among themselves, as measured necessary (a lab host starved by
# its neighbours timed out in update-initramfs and in systemd's device waits), and the tests' thread gets about
# three times a lab chain's share. At nice -3 (twice a lab chain's share) on 2026-11-28 the lab's work ended 2300 s
# into the tier and the tests' own chain 2830 s, the machine half idle in between.
PRIORITY_BOOST = 5


def boost_priority():
    """Raise this process's priority by PRIORITY_BOOST; False when it may not (not root)."""
    try:
        os.nice(-PRIORITY_BOOST)
    except OSError:
        return False
    return True


BOOSTED = {"on": False}


def at_lab_priority(cmd):
    """`cmd` as run from a background thread of a boosted session: back at the usual priority."""
    if BOOSTED["on"] and threading.current_thread() is not threading.main_thread():
        return ["nice", "-n", str(PRIORITY_BOOST)] + list(cmd)
    return list(cmd)


# The deep slices this session runs beside the landing tier (tests/integration/tiers.py: GPUOPS_SLICES).
SELECTED = {"slices": []}


def pytest_configure(config):
    config.addinivalue_line("markers", "slice(name): the test belongs to the deep slice `name` "
                                       "(tests/integration/tiers.py), run when GPUOPS_SLICES names it")
    labconfig = lab_module("labconfig")
    try:
        SELECTED["slices"] = tiers.selected_slices()
        # A slice that shapes a lab host otherwise (the uefi slice's lab-passthrough) says so to the lab's every
        # command of this session: the lab reads GPUOPS_LAB_SETTINGS over its inventory (lab/labconfig.py).
        settings = tiers.lab_settings(SELECTED["slices"], labconfig.settings_overrides())
    except (ValueError, labconfig.LabError) as exc:
        raise pytest.UsageError(str(exc)) from None
    if settings:
        os.environ[tiers.LAB_SETTINGS_ENV] = json.dumps(settings, sort_keys=True)
    BOOSTED["on"] = os.environ.get("GPUOPS_TEST_BOOST", "1") != "0" and boost_priority()


def slice_of(item):
    """The deep slice a test belongs to (its slice marker), or tiers.LANDING."""
    marker = item.get_closest_marker("slice")
    if marker is None:
        return tiers.LANDING
    if len(marker.args) != 1 or marker.args[0] not in tiers.SLICES:
        raise pytest.UsageError("%s: slice(%s) names no slice of tests/integration/tiers.py (%s)"
                                % (item.nodeid, ", ".join(map(repr, marker.args)), ", ".join(tiers.SLICES)))
    return marker.args[0]


def pytest_collection_modifyitems(config, items):
    """Tests of the deep slices this session does not run are deselected (and their lab work never starts)."""
    keep, dropped = [], []
    for item in items:
        (keep if tiers.runs(slice_of(item), SELECTED["slices"]) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_report_header(config):  # pylint: disable=unused-argument
    slices = SELECTED["slices"]
    return "tier: landing%s (deep slices: %s)" % (
        " + " + ", ".join(slices) if slices else " only", ", ".join(tiers.SLICES))


def run(cmd, timeout=1800, env=None, check=False, part="lab"):
    """Run a command from the top of the checkout; return the CompletedProcess (text, merged output). Ansible
    commands of a `part` that runs on mitogen (see MITOGEN_ENV) get its strategy."""
    cmd = at_lab_priority(cmd)
    full_env = dict(os.environ)
    full_env.setdefault("ANSIBLE_CONFIG", os.path.join(TOP, "ansible.cfg"))
    full_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full_env.get("PATH", "")
    full_env.update(mitogen_env(part))
    full_env.update(env or {})
    proc = subprocess.run(cmd, cwd=TOP, env=full_env, timeout=timeout, text=True, check=False,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError("%s failed (rc=%s):\n%s" % (" ".join(cmd), proc.returncode, proc.stdout[-6000:]))
    return proc


def lab(*args, **kwargs):
    return run(LAB + list(args), **kwargs)


def console_tail(host, lines=60):
    """The end of a lab host's serial console (and of the boot before, which a start keeps; a reboot goes on in
    the same file) and what its reboot follower did, for a failure's message: a host that did not come back
    from a reboot says why only there."""
    parts = []
    for name in ("console.log.previous", "console.log", "reboots.log"):
        text = lab_file(host, name).splitlines()[-lines:]
        if not text:
            continue
        parts.append("--- %s %s (last %d lines)\n%s" % (host, name, len(text), "\n".join(text)))
    return "\n".join(parts) or "(no console log of %s)" % host


def lab_file(host, name):
    """The text of a file of the lab's own for a host (.lab/<host>/<name>), or "" when there is none."""
    state = os.environ.get("GPUOPS_LAB_STATE") or os.path.join(TOP, ".lab")
    try:
        with open(os.path.join(state, host, name), errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def lab_status():
    return json.loads(lab("status", "--json", check=True).stdout)["hosts"]


@pytest.fixture(scope="session")
def running_lab():
    """The lab's GPU hosts, running (a no-op once the scenarios have booted them); the spare host
    (gpulab_autostart: false) is left out."""
    lab("start", check=True)
    return {name: host for name, host in lab_status().items() if host.get("autostart", True)}


# ---------------------------------------------------------------------------------------------
# The workload-type molecule scenarios, run in the background on the four GPU hosts
# ---------------------------------------------------------------------------------------------

SCENARIOS = {"container": "lab-container", "vm_passthrough": "lab-passthrough", "vm_vgpu": "lab-vgpu", "dra": "lab-dra"}
# The workload scenarios' idempotence step (a second converge that must change nothing) is not run here: test_95's
# site.yml on the prepared lab asserts the same of every host (changed=0, no reboot), after the scenarios and what
# follows them. A run by hand (`molecule test -s vm_vgpu`) keeps it. Each such step cost its host 100-126 s of wall
# time beside the tier (run 7), an emulated guest's Python and every module once more.
SCENARIO_ENV = {"GPUOPS_MOLECULE_KEEP": "1", "GPUOPS_MOLECULE_IDEMPOTENCE": "side_effect"}


def molecule(scenario, env, output, state_dir):
    """Start `molecule test -s scenario`; its plain-text output goes to the open file `output`.

    Molecule keeps a scenario's state (created, prepared...) under the user's home, keyed by the name of
    the checkout's directory only, so a clone named like another checkout would inherit that checkout's
    state (and skip create for hosts that are not running): each run gets its own empty state directory.
    """
    full_env = dict(os.environ)
    full_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full_env.get("PATH", "")
    full_env.setdefault("ANSIBLE_CONFIG", os.path.join(TOP, "ansible.cfg"))
    if scenario not in PLAIN_SSH_SCENARIOS:
        full_env.update(mitogen_env("scenario"))
    full_env.update(env or {})
    full_env.update(NO_COLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", COLUMNS="400",
                    MOLECULE_EPHEMERAL_DIRECTORY=state_dir)
    return subprocess.Popen(at_lab_priority(["molecule", "test", "-s", scenario]), cwd=TOP, env=full_env, text=True,
                            stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


class BackgroundRuns:
    """Molecule scenarios started at once in the background; results() waits for them.

    They run while other tests work elsewhere (the module targets on the spare host, the image, API server
    and docs tests on the controller), so their output goes to files rather than pipes nobody reads yet.
    With `boot` (a LabBoot), they start once it has booted their hosts from the pristine image, and their
    create step keeps those hosts (GPUOPS_MOLECULE_REUSE=1); if the boot failed, each create resets and boots
    its own host as without it.
    """

    def __init__(self, specs, boot=None):
        self.started = time.monotonic()
        self.dir = tempfile.mkdtemp(prefix="gpuops-scenarios-")
        self.procs = {}
        self._results = None
        self._lock = threading.Lock()
        self._killed = False
        self._launched = threading.Event()
        # When each molecule action began, from the logs (timeline.json beside them): what each step costs.
        self.timeline = {name: [] for name in specs}
        threading.Thread(target=self._launch, args=(specs, boot), daemon=True).start()

    def _launch(self, specs, boot):
        reuse = boot is not None and boot.wait()
        with self._lock:
            if not self._killed:
                for name, env in specs.items():
                    if reuse:
                        env = dict(env, GPUOPS_MOLECULE_REUSE="1")
                    handle = open(os.path.join(self.dir, name + ".log"), "w+", encoding="utf-8")  # pylint: disable=consider-using-with
                    state_dir = os.path.join(self.dir, name + ".state")
                    self.procs[name] = (molecule(name, env, output=handle, state_dir=state_dir), handle)
            self._launched.set()
        self._watch()

    def _watch(self):
        while True:
            running = False
            for name, (proc, _handle) in self.procs.items():
                try:
                    with open(os.path.join(self.dir, name + ".log"), encoding="utf-8", errors="replace") as log:
                        marks = [m.group(1) or m.group(2) for m in ACTION_MARK.finditer(plain(log.read()))]
                except OSError:
                    marks = []
                # One entry per action (verify logs two "Executing" lines), at the time it was first seen.
                actions = [mark for index, mark in enumerate(marks) if index == 0 or marks[index - 1] != mark]
                seen = self.timeline[name]
                now = round(time.monotonic() - self.started)
                seen.extend([step, now] for step in actions[len(seen):])
                if proc.poll() is None:
                    running = True
                elif not seen or seen[-1][0] != "end":
                    seen.append(["end", now])
            try:
                with open(os.path.join(self.dir, "timeline.json"), "w", encoding="utf-8") as out:
                    json.dump(self.timeline, out)
            except OSError:
                pass
            if not running:
                return
            time.sleep(5)

    def wait(self, name, timeout=3600):
        """The return code of one run, once it has ended (None when the runs were killed before they began)."""
        self._launched.wait(timeout)
        if name not in self.procs:
            return None
        return self.procs[name][0].wait(timeout=timeout)

    def results(self, timeout=3600):
        """{scenario: (returncode, output, seconds from the start to its end)}"""
        if self._results is None:
            self._launched.wait(timeout)
            results = {}
            for name, (proc, handle) in self.procs.items():
                proc.wait(timeout=timeout)
                elapsed = time.monotonic() - self.started
                handle.seek(0)
                results[name] = (proc.returncode, handle.read(), elapsed)
                handle.close()
            self._results = results
        return self._results

    def kill(self):
        with self._lock:
            self._killed = True
        for proc, handle in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if not handle.closed:
                handle.close()


# ---------------------------------------------------------------------------------------------
# A power loss in the middle of a first preparation (test_87), in the background on lab-vgpu
# ---------------------------------------------------------------------------------------------

POWER_LOSS_HOST = "lab-vgpu"
PENDING_INITRAMFS = "/var/lib/gpuops/pending/initramfs.json"
# What the initramfs carries of this collection, whether an initramfs rebuild is due, and the command line.
INITRAMFS_STATE = ("lsinitramfs /boot/initrd.img-$(uname -r) | grep -c 'etc/modprobe.d/gpuops-nouveau.conf' || true; "
                   "ls /var/lib/gpuops/pending 2>/dev/null | tr '\\n' ' '; echo; cat /proc/cmdline")


class PowerLossRun:
    """The preparation of a pristine lab-vgpu, powered off (QEMU quits: no flush, no shutdown) while its
    initramfs is being generated, booted again, then prepared once more, all in a thread beside the other
    tests. results() waits for it: a dict of what each step saw (see run_power_loss)."""

    def __init__(self):
        self.started = time.monotonic()
        self.dir = tempfile.mkdtemp(prefix="gpuops-power-loss-")
        self._results = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            run_power_loss(self._results, self.dir)
        except Exception as exc:  # pylint: disable=broad-except
            self._results["error"] = "%s: %s" % (type(exc).__name__, exc)
        self._results["elapsed"] = time.monotonic() - self.started

    def results(self, timeout=3600):
        self._thread.join(timeout)
        return self._results

    def kill(self):
        """Nothing to kill: the thread's commands have their own time limits."""


# The first task of the host preparation role in a play's output: the initramfs is generated after it.
PREPARE_TASK = "TASK [gpuops.sandbox.host_prepare : "


def run_power_loss(seen, directory, host=POWER_LOSS_HOST):
    lab("reset", "--no-start", host, check=True)
    lab("start", host, check=True, timeout=1800)
    playbook = ["ansible-playbook", "playbooks/prepare_hosts.yml", "-i", "inventories/lab/", "--limit", host]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    with open(os.path.join(directory, "first.log"), "w+", encoding="utf-8") as first_log:
        first = subprocess.Popen(  # pylint: disable=consider-using-with
            at_lab_priority(playbook), cwd=TOP, env=env, stdout=first_log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 1800
        # The host is asked only once the play has reached host_prepare (its log, read locally): each question is
        # a lab CLI and an SSH session, and asked every second through preflight they cost the machine minutes of
        # CPU under load. The generation takes tens of seconds under emulation; a question every 2 s finds it.
        while time.monotonic() < deadline and first.poll() is None:
            first_log.seek(0)
            if PREPARE_TASK in first_log.read():
                break
            time.sleep(1)
        while time.monotonic() < deadline and first.poll() is None:
            busy = lab("ssh", host, "--", "pgrep -f '[m]kinitramfs|[u]pdate-initramfs' >/dev/null && echo busy || true",
                       timeout=120).stdout
            if "busy" in busy:
                seen["generating"] = True
                break
            time.sleep(2)
        # Well into the generation (it takes tens of seconds under emulation), then the power goes.
        time.sleep(5)
        seen["still_generating"] = "busy" in lab(
            "ssh", host, "--", "pgrep -f '[m]kinitramfs|[u]pdate-initramfs' >/dev/null && echo busy || true",
            timeout=120).stdout
        lab("stop", "--force", host, check=True, timeout=300)
        first.wait(timeout=900)
        first_log.seek(0)
        seen["first_rc"], seen["first_out"] = first.returncode, first_log.read()
    lab("start", host, check=True, timeout=1800)
    seen["after_power_loss"] = lab("ssh", host, "--", INITRAMFS_STATE, check=True, timeout=300).stdout
    again = run(playbook, timeout=3000)
    seen["again_rc"], seen["again_out"] = again.returncode, again.stdout
    seen["after_again"] = lab("ssh", host, "--", INITRAMFS_STATE, check=True, timeout=300).stdout


# ---------------------------------------------------------------------------------------------
# Each module's integration target on lab-modules, the spare host, in the background (test_88 checks)
# ---------------------------------------------------------------------------------------------

MODULES_HOST = "lab-modules"
TARGETS_DIR = os.path.join(TOP, "tests", "integration", "targets")
# Each directory of TARGETS_DIR is a module target, found there (tiers.module_targets_found: its aliases say when
# it runs on lab-modules and whether its play stays on plain SSH).
_FOUND, PLAIN_SSH_TARGETS = tiers.module_targets_found(TARGETS_DIR)
# kernel_cmdline first (it needs the pristine command line); the rest after the restart into the new one.
BEFORE_REBOOT = _FOUND["before_reboot"]
AFTER_REBOOT = _FOUND["after_reboot"]
# Between the two: the host's QEMU is killed (a power loss) and the lab starts it again (the lab CLI's crash
# recovery, test_88), and it boots the command line kernel_cmdline wrote. Host preparation's graceful reboot is
# the scenarios' (host_reboot): every one of them reboots its host once.
REBOOT_STEP = "restart"
REBOOT_TASKS = """    - name: Read the running command line and the IOMMU groups
      ansible.builtin.command: cat /proc/cmdline /sys/kernel/iommu_groups/0/type
      register: after
      changed_when: false
    - name: The IOMMU is on
      ansible.builtin.assert:
        that:
          - "'intel_iommu=on' in after.stdout_lines[0].split()"
          - "'intel_iommu=off' not in after.stdout_lines[0].split()"
"""


# Everything a refused switch (test_85) or a run stopped by another run's lock (test_82) could have touched: boot
# files, udev rules, this collection's records, the boot loader configuration and the initramfs (by checksum), the
# running command line, every function's driver and driver_override.
BOOT_STATE = (
    "set -e; sha256sum /etc/modprobe.d/* /etc/modules-load.d/* /etc/udev/rules.d/* /etc/default/grub "
    "/etc/default/grub.d/* /boot/grub/grub.cfg /boot/initrd.img-* /etc/kernel/cmdline /boot/efi/loader/entries/* "
    "/boot/efi/*/*/initrd* $(find /var/lib/gpuops /etc/gpuops -type f "
    "! -name lock.json 2>/dev/null) 2>/dev/null | sort -k2; cat /proc/cmdline; "
    "for f in /sys/bus/pci/devices/*; do echo \"$f $(readlink $f/driver || true) $(cat $f/driver_override)\"; done")


def target_tasks(target):
    return "    - name: Run %s\n      ansible.builtin.include_tasks: %s\n" % (
        target, os.path.join(TARGETS_DIR, target, "tasks", "main.yml"))


def run_host_tasks(directory, host, name, tasks, timeout=2400):
    """A play of `tasks` on one lab host; the CompletedProcess."""
    playbook = os.path.join(directory, "%s.yml" % name)
    with open(playbook, "w", encoding="utf-8") as handle:
        handle.write("- name: Integration target %s\n  hosts: %s\n  gather_facts: false\n  tasks:\n%s"
                     % (name, host, tasks))
    return run(["ansible-playbook", "-i", "inventories/lab/", playbook], timeout=timeout,
               part="lab" if name in PLAIN_SSH_TARGETS else "targets")


def start_again(host):
    """`gpulab start` of a host already running: what the lab CLI test (test_81) checks."""
    before = lab_status()[host]
    started = time.monotonic()
    proc = lab("start", host)
    return {"rc": proc.returncode, "out": proc.stdout, "seconds": time.monotonic() - started,
            "before": before, "after": lab_status()[host]}


def crash_and_start(host):
    """The host's QEMU killed (no shutdown, no flush of the guest's caches: the guest syncs first, so the command
    line kernel_cmdline wrote is on the disk), its SSH port taken by something else meanwhile, then `gpulab
    start`: what the lab saw and did, for test_88 to check."""
    lab("ssh", host, "--", "sync", check=True, timeout=600)
    seen = {"before": lab_status()[host]}
    pid = seen["before"]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists("/proc/%d" % pid):
        time.sleep(0.5)
    seen["killed"] = lab_status()[host]
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        squatter.bind(("127.0.0.1", seen["before"]["ssh_port"]))
        squatter.listen(1)
        proc = lab("start", host, timeout=1800)
    finally:
        squatter.close()
    seen["start_rc"], seen["start_out"] = proc.returncode, proc.stdout
    seen["after"] = lab_status()[host]
    with open(os.path.join(TOP, "inventories", "lab", "zz-lab-connection.yml"), encoding="utf-8") as handle:
        seen["inventory"] = handle.read()
    ping = run(["ansible", host, "-i", "inventories/lab/", "-m", "ansible.builtin.ping"], timeout=600)
    seen["ping_rc"], seen["ping_out"] = ping.returncode, ping.stdout
    return seen


class ModuleTargetsRun:
    """The module targets, one play each, on lab-modules from the pristine image, from the session's start (the
    tier's longest chain): the host boots, the lab CLI starts it again (a no-op, test_81), kernel_cmdline turns
    the IOMMU on through grub, the host loses its power and the lab starts it again (test_88), the other targets
    run on the IOMMU-enabled kernel; the host is reset and stopped at the end. All in a thread beside the other
    tests; results() waits for it: {step: (returncode, output, seconds)} for each target and the restart, in
    order. `lab_cli` holds what the lab's own commands did on the host ("start_again", "crash")."""

    steps = BEFORE_REBOOT + [REBOOT_STEP] + AFTER_REBOOT

    def __init__(self, host=MODULES_HOST, boot=None):
        self.host = host
        self.boot = boot
        self.started = time.monotonic()
        self.dir = tempfile.mkdtemp(prefix="gpuops-module-targets-")
        self._results = {}
        self.lab_cli = {}
        self.booted = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _step(self, name, tasks):
        begun = time.monotonic()
        try:
            proc = run_host_tasks(self.dir, self.host, name, tasks)
            self._results[name] = (proc.returncode, proc.stdout, time.monotonic() - begun)
        except Exception as exc:  # pylint: disable=broad-except
            self._results[name] = (None, "%s: %s" % (type(exc).__name__, exc), time.monotonic() - begun)
        # Each play's output is also kept in a file, to follow the run before its test reads it.
        with open(os.path.join(self.dir, "%s.log" % name), "w", encoding="utf-8") as handle:
            rc, out, elapsed = self._results[name]
            handle.write("rc=%s after %.0fs\n%s" % (rc, elapsed, out))

    def _fail_all(self, why):
        for name in self.steps:
            self._results.setdefault(name, (None, why, 0.0))

    def _run(self):
        try:
            # The lab's boot of every host has reset and booted this one; without it (or when it failed), the
            # chain does both itself.
            if self.boot is None or not self.boot.wait():
                lab("reset", "--no-start", self.host, check=True)
                lab("start", self.host, check=True, timeout=1800)
            self.lab_cli["start_again"] = start_again(self.host)
        except Exception as exc:  # pylint: disable=broad-except
            self._fail_all("%s did not start: %s" % (self.host, exc))
            return
        finally:
            self.booted.set()
        for name in BEFORE_REBOOT:
            self._step(name, target_tasks(name))
        try:
            self.lab_cli["crash"] = crash_and_start(self.host)
        except Exception as exc:  # pylint: disable=broad-except
            self._fail_all("%s did not come back from a power loss: %s: %s" % (self.host, type(exc).__name__, exc))
            return
        self._step(REBOOT_STEP, REBOOT_TASKS)
        for name in AFTER_REBOOT:
            self._step(name, target_tasks(name))
        lab("reset", "--no-start", self.host)

    def results(self, timeout=5400):
        self._thread.join(timeout)
        return self._results

    def kill(self):
        """Nothing to kill: the thread's commands have their own time limits."""


# ---------------------------------------------------------------------------------------------
# The lab's work, in the background: scenarios, what follows each on its host, the module targets
# ---------------------------------------------------------------------------------------------

class LabBoot:
    """Every host the lab work uses, reset to the pristine image and booted at once, before any of them works.

    Booting is what an emulated host does worst beside busy neighbours: on 2026-11-27, with the hosts booted by
    each chain's own first step, a host still booting got a fifth of a core while its neighbours already ran
    Ansible, and on mitogen two hosts did not answer SSH within 900 s. Booted together, the five share the
    machine with nothing heavier than the quick tiers. wait() says whether every host came up."""

    def __init__(self, hosts):
        self.hosts = list(hosts)
        self.started = time.monotonic()
        self.seconds = None
        self.error = None
        self._done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            lab("reset", "--no-start", *self.hosts, check=True, timeout=600)
            lab("start", *self.hosts, check=True, timeout=1800)
        except Exception as exc:  # pylint: disable=broad-except
            self.error = "%s: %s" % (type(exc).__name__, exc)
        finally:
            self.seconds = time.monotonic() - self.started
            self._done.set()

    def wait(self, timeout=2400):
        """True once every host answers SSH; False if the boot failed or did not end within `timeout`."""
        return self._done.wait(timeout) and self.error is None

    def results(self, timeout=2400):
        self._done.wait(timeout)
        return {"error": self.error, "seconds": self.seconds}

    def kill(self):
        """Nothing to kill: the lab commands have their own time limits."""


class NoNetworkRun:
    """A host without a NIC (gpulab_network: false) in a lab of its own (state and inventory in a temporary
    directory, beside the real lab, which it must not touch), started once the lab's boot has ended: it reaches its
    login prompt and SSH never answers, so the lab reads the guest's rescue report without SSH, starts it again
    once, and fails with the report (test_81 checks). In a thread: its two boots overlap the other lab work instead
    of holding the session's first tests (they took about 10 minutes of the tests' own chain, the tier's longest)."""

    def __init__(self, boot=None):
        self.dir = tempfile.mkdtemp(prefix="gpuops-nonet-")
        self.state = os.path.join(self.dir, "state")
        self._results = {}
        self._thread = threading.Thread(target=self._run, args=(boot,), daemon=True)
        self._thread.start()

    def _run(self, boot):
        if boot is not None:
            boot.wait()
        inventory = os.path.join(self.dir, "inventory")
        os.makedirs(inventory)
        with open(os.path.join(inventory, "hosts.yml"), "w", encoding="utf-8") as handle:
            handle.write("all:\n  hosts:\n    lab-nonet:\n      gpulab_network: false\n      gpulab_autostart: false\n")
        env = {"GPUOPS_LAB_STATE": self.state, "GPUOPS_LAB_INVENTORY": inventory, "GPUOPS_LAB_ANSWER_TIMEOUT": "5"}
        try:
            try:
                proc = lab("start", "lab-nonet", env=env, timeout=3600)
                self._results.update(rc=proc.returncode, out=proc.stdout)
            finally:
                lab("stop", "--force", "lab-nonet", env=env, timeout=300)
            # Still in the thread: the real lab's status, while the real lab runs beside it.
            self._results["real_status"] = lab("status").stdout
        except Exception as exc:  # pylint: disable=broad-except
            self._results["error"] = "%s: %s" % (type(exc).__name__, exc)

    def results(self, timeout=3600):
        """{"rc", "out", "real_status"} (or {"error"}), and "state": the lab state directory it used."""
        self._thread.join(timeout)
        return dict(self._results, state=self.state)

    def kill(self):
        """Nothing to kill: the lab commands have their own time limits."""


class After:
    """A run started on a host once that host's scenario has passed (None when it failed), by a thread that
    waits for the scenario: the run follows at once, not when a test first asks for it. `batch` is a
    BackgroundRuns, or a callable that returns one (or None) once it exists."""

    def __init__(self, batch, scenario, start):
        self.run = None
        self._thread = threading.Thread(target=self._follow, args=(batch, scenario, start), daemon=True)
        self._thread.start()

    def _follow(self, batch, scenario, start):
        if callable(batch):
            # A batch that is itself started by another After (the switch scenario): None when that one did not run.
            batch = batch()
        # Waited for as long as the tier may run: a scenario still running after an hour on a slow day is not a
        # failure of the run that follows it.
        if batch is not None and batch.wait(scenario, timeout=7200) == 0:
            self.run = start()

    def get(self, timeout=5400):
        self._thread.join(timeout)
        return self.run

    def results(self, timeout=5400):
        run_ = self.get(timeout)
        return run_.results(timeout) if run_ is not None else None

    def kill(self):
        if self.run is not None:
            self.run.kill()


class HostSteps:
    """Named steps, each a callable, run one after the other in a thread: the plays that check a host after its
    scenario (the preflight failures and a held host on lab-container, the refused switch and the drift repair on
    lab-passthrough). They used to run in the tests themselves, after the controller's own tests, at the end of
    the session's longest chain; here they run as soon as their host is free, and the tests read what each saw.
    results() waits: {name: what the step returned, or {"error": ...} when it raised}."""

    def __init__(self, steps):
        self._results = {}
        self.times = {}  # {name: (seconds it took, time.monotonic() when it ended)}
        self._thread = threading.Thread(target=self._run, args=(list(steps),), daemon=True)
        self._thread.start()

    def _run(self, steps):
        for name, step in steps:
            begun = time.monotonic()
            try:
                self._results[name] = step()
            except Exception as exc:  # pylint: disable=broad-except
                self._results[name] = {"error": "%s: %s" % (type(exc).__name__, exc)}
            self.times[name] = (time.monotonic() - begun, time.monotonic())

    def results(self, timeout=5400):
        self._thread.join(timeout)
        return self._results

    def kill(self):
        """Nothing to kill: the steps' commands have their own time limits."""


def prepare_hosts(host, *extra, timeout=1800):
    """playbooks/prepare_hosts.yml on one lab host (plain SSH); the CompletedProcess."""
    return run(["ansible-playbook", "playbooks/prepare_hosts.yml", "-i", "inventories/lab/", "--limit", host]
               + list(extra), timeout=timeout)


# The preflight failures on lab-container (no IOMMU in its firmware): (id, extra arguments, what the play must say).
PREFLIGHT_FAILURES = [
    ("iommu-off-in-firmware", ["-e", "gpuops_workload_type=vm-passthrough"],
     r"no IOMMU table \(no ACPI DMAR or IVRS\).*Nothing was changed"),
    # A DRA node needs the IOMMU as much: its driver binds the GPU to vfio-pci for a VM's claim.
    ("dra-iommu-off-in-firmware", ["-e", "gpuops_workload_type=dra"],
     r"lab-container cannot be prepared as a dra node: the firmware has no IOMMU table \(no ACPI DMAR or IVRS\)"
     r".*Nothing was changed"),
    ("unsupported-os", ["-e", '{"preflight_supported_os": {"ubuntu": ["24.04"], "rocky": ["9"]}}'],
     r"\(ID=debian, VERSION_ID=12\) is not supported \(operating system\); use one of: ubuntu 24\.04, rocky 9"
     r".*Nothing was changed"),
    ("bad-workload-type", ["-e", "gpuops_workload_type=gpu-magic"],
     r"preflight_workload_type must be one of: , container, vm-passthrough, vm-vgpu, dra, got: gpu-magic"),
]
HOST_STATE = ("cat /proc/cmdline; ls -l --time-style=+%s /etc/modprobe.d /etc/default/grub.d /etc/modules-load.d "
              "/etc/udev/rules.d /boot; ls /sys/bus/mdev/devices 2>/dev/null; true")


def host_state(host):
    return lab("ssh", host, "--", HOST_STATE, check=True).stdout


def preflight_failure(host, extra):
    lab("start", host, check=True, timeout=1800)
    before = host_state(host)
    proc = prepare_hosts(host, *extra)
    return {"rc": proc.returncode, "out": proc.stdout, "before": before, "after": host_state(host)}


OTHER_RUN = "run_id=awx-4711 owner='AWX job 4711 (Prepare GPU nodes, launched by scheduler)'"


def held_host(host):
    """Another run holds the host (an AWX job, say): prepare_hosts.yml on it, then again with the lock broken."""
    run(["ansible", host, "-i", "inventories/lab/", "-m", "gpuops.sandbox.host_lock", "-a", OTHER_RUN], check=True)
    seen = {"before": lab("ssh", host, "--", BOOT_STATE, check=True).stdout}
    proc = prepare_hosts(host)
    seen.update(rc=proc.returncode, out=proc.stdout, after=lab("ssh", host, "--", BOOT_STATE, check=True).stdout,
                lock=lab("ssh", host, "--", "cat /var/lib/gpuops/lock.json", check=True).stdout)
    proc = prepare_hosts(host, "-e", "gpuops_host_lock_break=true")
    seen.update(broken_rc=proc.returncode, broken_out=proc.stdout,
                lock_gone=lab("ssh", host, "--", "test ! -e /var/lib/gpuops/lock.json").returncode == 0)
    return seen


def container_host_steps(host="lab-container", held=True):
    """The preflight failures on lab-container, then (in the repairs slice) a host held by another run."""
    return HostSteps([("preflight " + name, functools.partial(preflight_failure, host, extra))
                      for name, extra, _expected in PREFLIGHT_FAILURES]
                     + ([("held", functools.partial(held_host, host))] if held else []))


VFIO_HOLDER = "sleep 1800"
# The lone edu device behind a root port (its own IOMMU group) and the audio function beside the first edu.
LONE_GPU = "0000:02:00.0"
AUDIO_RULE = "/etc/udev/rules.d/61-gpuops-vfio-0000:00:03.1.rules"


def refused_switch(host):
    """A process holds the GPU's VFIO group; the switch to container is asked for."""
    group = lab("ssh", host, "--", "basename $(readlink /sys/bus/pci/devices/0000:00:03.0/iommu_group)",
                check=True).stdout.strip()
    seen = {"group": group}
    if not group.isdigit():
        return seen
    lab("ssh", host, "--", "setsid sh -c 'exec 3<>/dev/vfio/%s; exec %s' </dev/null >/dev/null 2>&1 &"
        % (group, VFIO_HOLDER), check=True)
    try:
        seen["pid"] = lab("ssh", host, "--", "sleep 1; pgrep -xf '%s'" % VFIO_HOLDER, check=True).stdout.split()
        seen["before"] = lab("ssh", host, "--", BOOT_STATE, check=True).stdout
        proc = prepare_hosts(host, "-e", "gpuops_workload_type=container")
        seen.update(rc=proc.returncode, out=proc.stdout, after=lab("ssh", host, "--", BOOT_STATE, check=True).stdout)
    finally:
        lab("ssh", host, "--", "pkill -xf '%s' || true" % VFIO_HOLDER)
    return seen


def drift(host):
    """A GPU taken off vfio-pci and a persistence rule deleted behind the collection's back, then two runs."""
    lab("ssh", host, "--", "echo %s > /sys/bus/pci/drivers/vfio-pci/unbind; rm -f %s" % (LONE_GPU, AUDIO_RULE),
        check=True)
    repair = prepare_hosts(host, timeout=2400)
    seen = {"repair_rc": repair.returncode, "repair_out": repair.stdout,
            "state": lab("ssh", host, "--", "readlink /sys/bus/pci/devices/%s/driver; ls %s" % (LONE_GPU, AUDIO_RULE),
                         check=True).stdout}
    again = prepare_hosts(host, timeout=2400)
    seen.update(again_rc=again.returncode, again_out=again.stdout)
    return seen


# A systemd-boot host (lab-passthrough boots the RHEL family's way, lab/labuefi.py): the boot id, the running
# kernel, each entry ("entry <version> <options>") and each initramfs image of /boot and of the ESP ("image <path>
# <mtime> <what it carries of the collection and vfio-pci.ko>"), one line each.
ENTRIES_STATE = (
    "echo boot $(cat /proc/sys/kernel/random/boot_id); echo running $(uname -r); "
    "for e in /boot/efi/loader/entries/*.conf; do echo entry $(sed -n 's/^version[[:space:]]*//p' $e) "
    "$(sed -n 's/^options[[:space:]]*//p' $e); done")
# lsinitrd unpacks each image: about 15 s of an emulated guest's CPU per image, so only where the test reads them.
IMAGES_STATE = (
    "; for i in /boot/initrd.img-* $(sed -n 's|^initrd[[:space:]]*|/boot/efi|p' /boot/efi/loader/entries/*.conf); do "
    "echo image $i $(stat -c %Y $i) $(lsinitrd $i | grep -oE '[^ ]*(gpuops-[a-z]*[.]conf|vfio-pci[.]ko[.a-z]*)$' "
    "| sort -u | tr '\\n' ' '); done")


def entries_state(host, images=False):
    seen = {"entries": {}, "images": {}}
    for line in lab("ssh", host, "--", ENTRIES_STATE + (IMAGES_STATE if images else ""), check=True).stdout.splitlines():
        key, _sep, rest = line.partition(" ")
        if key == "entry":
            version, _sep, options = rest.partition(" ")
            seen["entries"][version] = options.split()
        elif key == "image":
            path, mtime, *carried = rest.split()
            seen["images"][path] = {"mtime": int(mtime), "carries": carried}
        elif key in ("boot", "running"):
            seen[key] = rest.strip()
    return seen


def kernel_entry(host):
    """The RHEL family's kernel update on the systemd-boot host, after the drift repair: the distribution installs
    another kernel with dpkg, whose hooks build its dracut image and write its entry with kernel-install (from
    /etc/kernel/cmdline, which has the collection's arguments). Then that entry loses them, as an entry written
    before the preparation or copied from another by a tool has them not: verify_hosts.yml fails naming it, and
    prepare_hosts.yml writes it again without a reboot (the running kernel's entry is right)."""
    package = json.loads(lab("kernel-package", check=True).stdout)
    seen = {"package": package, "before": entries_state(host)}
    copy = run(["ansible", host, "-i", "inventories/lab/", "-m", "ansible.builtin.copy", "-a",
                "src=%s dest=/var/tmp/gpuops-lab-kernel.deb mode=0644" % package["deb"]], timeout=900)
    seen.update(copy_rc=copy.returncode, copy_out=copy.stdout[-2000:])
    started = time.monotonic()
    install = lab("ssh", host, "--", "DEBIAN_FRONTEND=noninteractive dpkg --force-unsafe-io -i "
                  "/var/tmp/gpuops-lab-kernel.deb > /var/tmp/gpuops-lab-kernel.log 2>&1; rc=$?; "
                  "rm -f /var/tmp/gpuops-lab-kernel.deb; tail -n 15 /var/tmp/gpuops-lab-kernel.log; exit $rc",
                  timeout=1800)
    seen.update(install_rc=install.returncode, install_out=install.stdout, install_seconds=time.monotonic() - started,
                installed=entries_state(host, images=True))
    new = package["kernel"]
    pristine = " ".join(a for a in lab("ssh", host, "--", "cat /var/tmp/gpuops-pristine-cmdline", check=True)
                        .stdout.split() if not a.startswith(("BOOT_IMAGE=", "initrd=")))
    lab("ssh", host, "--", "sed -i 's|^options.*|options %s|' /boot/efi/loader/entries/debian-%s.conf"
        % (pristine, new), check=True)
    seen["stripped"] = entries_state(host)
    verify = run(["ansible-playbook", "playbooks/verify_hosts.yml", "-i", "inventories/lab/", "--limit", host],
                 timeout=1800)
    seen.update(verify_rc=verify.returncode, verify_out=verify.stdout)
    repair = prepare_hosts(host, timeout=2400)
    seen.update(repair_rc=repair.returncode, repair_out=repair.stdout, after=entries_state(host))
    facts = run(["ansible", host, "-i", "inventories/lab/", "-m", "gpuops.sandbox.gpu_facts", "-o"], timeout=600)
    seen.update(facts_rc=facts.returncode, facts_out=facts.stdout)
    return seen


def lab_module(name):
    """A module of the lab tool (lab/<name>.py), imported as gpulab imports its parts."""
    sys.path.insert(0, os.path.join(TOP, "lab"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def lab_settings(host):
    """A lab host's gpulab_* settings as the lab reads them: the tracked inventory's (inventories/lab/hosts.yml), with
    this session's slices' over them (GPUOPS_LAB_SETTINGS)."""
    return lab_module("labconfig").lab_host_settings(host)


def passthrough_host_steps(host="lab-passthrough", drift_too=True, entry_too=True):
    """The refused switch on lab-passthrough, then the drift repair (the repairs slice) and the kernel entry (the
    uefi slice, where the host boots through systemd-boot)."""
    steps = [("refused switch", functools.partial(refused_switch, host))]
    if drift_too:
        steps.append(("drift", functools.partial(drift, host)))
    # The kernel update whose entry lost its arguments needs per-entry arguments: a host that boots through
    # systemd-boot (gpulab_boot: uefi, which the uefi slice sets).
    if entry_too and lab_settings(host).get("gpulab_boot") == "uefi":
        steps.append(("kernel entry", functools.partial(kernel_entry, host)))
    return HostSteps(steps)


# The kernel update on lab-dra (the dra_switch scenario installs it and boots it): what each kernel's initramfs and
# the boot look like, one line each: "boot <boot_id>", "running <release>", "image <release> <mtime>".
KERNELS_STATE = ("echo boot $(cat /proc/sys/kernel/random/boot_id); echo running $(uname -r); "
                 "for i in /boot/initrd.img-*; do echo image ${i#/boot/initrd.img-} $(stat -c %Y $i); done")


def kernels_state(host):
    seen = {"images": {}}
    for line in lab("ssh", host, "--", KERNELS_STATE, check=True).stdout.splitlines():
        key, _sep, rest = line.partition(" ")
        if key == "image":
            version, _sep, mtime = rest.partition(" ")
            seen["images"][version] = int(mtime)
        elif key in ("boot", "running"):
            seen[key] = rest.strip()
    return seen


def kernel_repair(host):
    """After the kernel update (dra_switch): the kernel the host ran before it has an image older than the
    collection's files (its mtime set back, as when the files changed while that kernel was not rebuilt), so
    verify_hosts.yml fails naming it and prepare_hosts.yml rebuilds that image alone without a reboot. Then the
    distribution removes that kernel (dpkg -r, which leaves the lab's mtty.ko in its modules directory, as DKMS
    modules are left) and gpu_facts reads the one kernel left."""
    before = kernels_state(host)
    old = sorted(v for v in before["images"] if v != before.get("running"))
    seen = {"before": before, "old": old}
    if len(old) != 1:
        return seen
    lab("ssh", host, "--", "touch -d 2020-01-01 /boot/initrd.img-%s" % old[0], check=True)
    verify = run(["ansible-playbook", "playbooks/verify_hosts.yml", "-i", "inventories/lab/", "--limit", host],
                 timeout=1800)
    seen.update(verify_rc=verify.returncode, verify_out=verify.stdout)
    repair = prepare_hosts(host, timeout=2400)
    seen.update(repair_rc=repair.returncode, repair_out=repair.stdout, after=kernels_state(host))
    removed = lab("ssh", host, "--", "DEBIAN_FRONTEND=noninteractive dpkg --force-unsafe-io -r linux-image-amd64 "
                  "linux-image-%s >/dev/null && ls /lib/modules && ls /boot" % old[0])
    seen.update(remove_rc=removed.returncode, remove_out=removed.stdout)
    facts = run(["ansible", host, "-i", "inventories/lab/", "-m", "gpuops.sandbox.gpu_facts", "-o"], timeout=600)
    seen.update(facts_rc=facts.returncode, facts_out=facts.stdout)
    return seen


def dra_host_steps(host="lab-dra"):
    return HostSteps([("kernel repair", functools.partial(kernel_repair, host))])


def autogroup_nice(pid):
    """The nice value of the scheduling group of process `pid` (/proc/<pid>/autogroup: "/autogroup-N nice V")."""
    with open("/proc/%d/autogroup" % pid, encoding="ascii") as handle:
        return int(handle.read().split()[-1])


def set_autogroup_nice(pid, value):
    """A daemonized QEMU runs in a session of its own, and with the kernel's autogroup on (as here) the CPU share of
    a session is set by its group's nice value, not by its processes' own (lab/labhost.py keep_priority): the
    group's value is written, and the process's too (what ps shows)."""
    with open("/proc/%d/autogroup" % pid, "w", encoding="ascii") as handle:
        handle.write(str(value))
    os.setpriority(os.PRIO_PROCESS, pid, value)


class CriticalPriority:
    """While the lab's work runs, each host of tiers.CRITICAL_HOSTS has its QEMU's scheduling group at its nice
    value: its pid file is read every 10 s (a reboot starts a new QEMU) and the group reniced when it is not there
    yet. Nothing when the session may not raise a priority (not root)."""

    def __init__(self, hosts=None):
        self.hosts = dict(tiers.CRITICAL_HOSTS if hosts is None else hosts)
        self.reniced = []  # (host, pid) each time a QEMU was set to its value
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop.wait(10):
            for host, value in self.hosts.items():
                try:
                    pid = int(lab_file(host, "qemu.pid").strip() or 0)
                    if pid and autogroup_nice(pid) != value:
                        set_autogroup_nice(pid, value)
                        self.reniced.append((host, pid))
                except (ValueError, OSError):
                    continue

    def results(self, timeout=None):  # pylint: disable=unused-argument
        return list(self.reniced)

    def kill(self):
        self._stop.set()


class NotRun:
    """A part of the lab's work that this session does not run (its slice is not selected): it has no run and no
    results, as an After whose scenario failed, and its tests are deselected."""

    @staticmethod
    def get(timeout=None):  # pylint: disable=unused-argument
        return None

    @staticmethod
    def results(timeout=None):  # pylint: disable=unused-argument
        return None

    def kill(self):
        """Nothing runs."""


NOT_RUN = NotRun()


class LabWork:
    """Everything the lab hosts do for the session, started at once and run beside the controller's tests
    (the image, API server, chart, operator and docs tests): the module targets on lab-modules (the longest
    chain), the four workload-type scenarios on the GPU hosts, then on lab-passthrough the switch scenario, on
    lab-dra the dra_switch scenario and on lab-vgpu the power-loss run as soon as their scenario passed; the
    preflight failures and a held host on lab-container after its scenario, the refused switch, the drift repair and
    a kernel update (the uefi slice: lab-passthrough boots through systemd-boot) on lab-passthrough after the
    switch scenario, the stale kernel's repair on lab-dra after the dra_switch scenario; a network-less host in a
    lab of its own once the boot has ended.
    The tests from test_81 on check what each left: the controller's own tests (test_50 to test_80) run first, from
    the session's start, and nothing lab-bound runs in the tests themselves but site.yml at the end (test_95).

    All at the same priority. Measured 2026-11-26 on 2 cores, with the work beside the module targets at a lower
    one: at nice 5 the scenario hosts got 0.10-0.15 of a core each and update-initramfs on two of them ran past
    the collection's 900-second limit; at nice 2 a host came back from its reboot with systemd's device waits
    timed out and its root file system read-only. An emulated host needs its fair share of the CPU to boot at
    all, and the tier is bound by its total CPU time: an order of priority only moves work around."""

    def __init__(self, slices=None):
        # The deep slices whose lab work runs (tests/integration/tiers.py); the landing tier's always does.
        self.slices = SELECTED["slices"] if slices is None else slices
        on = functools.partial(tiers.part_runs, slices=self.slices)
        # How much each host's reboot follower had written before: what this session's reboots add follows.
        self.follower_logs = {host: len(lab_file(host, "reboots.log")) for host in SCENARIOS.values()}
        self.boot = LabBoot([MODULES_HOST] + list(SCENARIOS.values()))
        self.priority = CriticalPriority()
        self.modules = ModuleTargetsRun(boot=self.boot)
        self.scenarios = BackgroundRuns({name: dict(SCENARIO_ENV) for name in SCENARIOS}, boot=self.boot)
        self.switch = After(self.scenarios, "vm_passthrough", lambda: BackgroundRuns(
            {"switch": {"GPUOPS_MOLECULE_REUSE": "1", "GPUOPS_MOLECULE_KEEP": "1"}}))
        self.dra_switch = NOT_RUN
        if on("dra_switch"):
            self.dra_switch = After(self.scenarios, "dra", lambda: BackgroundRuns(
                {"dra_switch": {"GPUOPS_MOLECULE_REUSE": "1", "GPUOPS_MOLECULE_KEEP": "1"}}))
        self.power_loss = After(self.scenarios, "vm_vgpu", PowerLossRun) if on("power loss") else NOT_RUN
        self.nonet = NoNetworkRun(boot=self.boot) if on("no network") else NOT_RUN
        self.container_checks = After(self.scenarios, "container", functools.partial(
            container_host_steps, held=on("held host")))
        self.passthrough_checks = After(self.switch.get, "switch", functools.partial(
            passthrough_host_steps, drift_too=on("drift"), entry_too=on("kernel entry")))
        self.dra_checks = After(self.dra_switch.get, "dra_switch", dra_host_steps) if on("kernel repair") else NOT_RUN

    @property
    def parts(self):
        return [self.boot, self.modules, self.scenarios, self.switch, self.dra_switch, self.power_loss, self.nonet,
                self.container_checks, self.passthrough_checks, self.dra_checks]

    def settle(self):
        for part in self.parts:
            part.results()
        self.priority.kill()

    def kill(self):
        for part in self.parts:
            part.kill()
        self.priority.kill()


@pytest.fixture(scope="session")
def lab_work():
    """The lab's work for the session; the scenarios and the module targets boot the hosts they use."""
    work = LabWork()
    TIMES["lab_work"] = work
    yield work
    work.kill()


def session_checks_lab_work(session):
    return any("lab_work" in item.fixturenames for item in session.items)


@pytest.fixture(scope="session", autouse=True)
def lab_work_from_the_start(request):
    """The lab's work (module targets, scenarios and what follows them) starts before the session's first test
    when later tests check it: the hosts work while the controller runs its own tests. A no-op in a session
    without such tests."""
    if session_checks_lab_work(request.session):
        request.getfixturevalue("lab_work")


@pytest.fixture(scope="session")
def scenario_batch(lab_work):  # pylint: disable=redefined-outer-name
    """The four workload-type scenarios on the four GPU hosts; every host stays as its scenario left it
    (for the switch scenario, the failure paths and site.yml)."""
    return lab_work.scenarios


@pytest.fixture(scope="session")
def switch_run(lab_work):  # pylint: disable=redefined-outer-name
    """The switch scenario (vm-passthrough -> container -> vm-passthrough) on the host the vm_passthrough
    scenario left prepared; None when that scenario failed."""
    return lab_work.switch.get()


@pytest.fixture(scope="session")
def dra_switch_run(lab_work):  # pylint: disable=redefined-outer-name
    """The dra_switch scenario (dra -> vm-passthrough -> dra) on the host the dra scenario left prepared; None
    when that scenario failed."""
    return lab_work.dra_switch.get()


@pytest.fixture(scope="session")
def power_loss_run(lab_work):  # pylint: disable=redefined-outer-name
    """The power-loss run on lab-vgpu after the vm_vgpu scenario; None when that scenario failed (the lab
    host may be in any state)."""
    return lab_work.power_loss.get()


@pytest.fixture(scope="session")
def module_targets(lab_work):  # pylint: disable=redefined-outer-name
    """{step: (returncode, output, seconds)} of the module targets on lab-modules."""
    return lab_work.modules.results()


@pytest.fixture(scope="session")
def settled_lab(running_lab, lab_work):  # pylint: disable=redefined-outer-name
    """The running lab once all of the session's lab work has ended (for tests that use all the GPU hosts)."""
    lab_work.settle()
    return running_lab


ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
REBOOT_TASK = "Reboot once ("


def plain(text):
    """Molecule's output without colours, its box margin, or the wrapping of long lines."""
    text = ANSI_RE.sub("", text)
    text = re.sub(r"\n[ \t]*│ {3}", " ", text)
    return re.sub(r"(?m)^[ \t]*[│┌└][─ ]?", "", text)


# Where a molecule action starts in its output: "container ➜ converge: Executing" with colours, "[container >
# converge] Executing" without (NO_COLOR); verify logs a second "Executing" line for its testinfra run.
ACTION_MARK = re.compile(r"INFO\s+(?:\w+\s+➜\s+(\w+):|\[\w+ > (\w+)\]) Executing")


def action_output(out, action):
    """The part of a molecule run's output that belongs to one action (converge, idempotence...)."""
    out = plain(out)
    marks = [(m.start(), m.group(1) or m.group(2)) for m in ACTION_MARK.finditer(out)]
    for index, (start, name) in enumerate(marks):
        if name == action:
            # An action may log several "Executing" lines; it ends where another action starts.
            end = next((pos for pos, other in marks[index + 1:] if other != action), len(out))
            return out[start:end]
    return ""


def reboots(text):
    """Reboot tasks that really ran (changed) in a play's output."""
    return len(re.findall(r"TASK \[[^\]]*%s[^\]]*\][^\n]*\n(?:(?![^\n]*TASK \[)[^\n]*\n)*?[^\n]*changed: " % re.escape(REBOOT_TASK), text))


# ---------------------------------------------------------------------------------------------
# The cluster lab: a real etcd + kube-apiserver on loopback (lab/kubelab.py)
# ---------------------------------------------------------------------------------------------

KUBELAB = [sys.executable, os.path.join(TOP, "lab", "kubelab.py")]

# The tests' own API server, in a state directory of their own (GPUOPS_KUBE_TEST_STATE, default
# .lab/kube-tests; `make kube-stop` stops it too), never the main job's (.lab/kube, or whatever
# GPUOPS_KUBE_STATE names in the caller's environment): `make site` before `make test` leaves nothing the
# tests can see, and the tests leave nothing in the main job's server. A session holds session.lock in that
# directory until it ends; a second session of the same checkout running at the same time takes
# KUBE_TEST_STATE-<pid> instead, so neither stops or wipes the other's server.
# GPUOPS_KUBE_STATE is set here, before any subprocess starts, so every kubelab and ansible process of the
# session inherits it (`kubelab status`, `env`, ...).
MAIN_KUBE_STATE = os.environ.get("GPUOPS_KUBE_STATE") or os.path.join(TOP, ".lab", "kube")
KUBE_TEST_STATE_BASE = os.path.abspath(os.environ.get("GPUOPS_KUBE_TEST_STATE")
                                       or os.path.join(TOP, ".lab", "kube-tests"))
SESSION_LOCK = "session.lock"


def try_lock(directory):
    """An open file holding the exclusive session lock of `directory`, or None when a live session has it."""
    os.makedirs(directory, exist_ok=True)
    handle = open(os.path.join(directory, SESSION_LOCK), "a+", encoding="utf-8")  # pylint: disable=consider-using-with
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def claim_kube_state():
    """(state directory, its lock): the base directory when no other session holds it, else base-<pid>."""
    for directory in (KUBE_TEST_STATE_BASE, "%s-%d" % (KUBE_TEST_STATE_BASE, os.getpid())):
        handle = try_lock(directory)
        if handle is not None:
            return directory, handle
    raise RuntimeError("cannot lock a state directory for the tests' API server in %s" % KUBE_TEST_STATE_BASE)


KUBE_TEST_STATE, _KUBE_SESSION_LOCK = claim_kube_state()
os.environ["GPUOPS_KUBE_STATE"] = KUBE_TEST_STATE


def kubelab(*args, **kwargs):
    """Run lab/kubelab.py with the given arguments (env= overrides, e.g. GPUOPS_KUBE_STATE)."""
    kwargs.setdefault("timeout", 5400)
    return run(KUBELAB + list(args), **kwargs)


def kubelab_status(env=None):
    return json.loads(kubelab("status", "--json", check=True, env=env, timeout=120).stdout)


def gone(pid):
    """True when `pid` no longer runs (absent, or a zombie nobody has reaped yet)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def kubectl(api, *args, check=True, stdin=None, kubeconfig=None, timeout=120):
    """kubectl with the API server's admin kubeconfig (or ``kubeconfig``); AssertionError on failure when ``check``."""
    proc = subprocess.run([os.path.join(api["bin_dir"], "kubectl"), "--kubeconfig", kubeconfig or api["kubeconfig"]]
                          + list(args), text=True, capture_output=True, timeout=timeout, check=False, input=stdin)
    if check and proc.returncode:
        raise AssertionError("kubectl %s: %s" % (" ".join(args), proc.stderr))
    return proc


def wait_established(api, crd, timeout=60):
    """Wait until the CRD ``crd`` (``crd/<name>``) is Established. Right after it is created the API server may
    not have given it any status yet, and ``kubectl wait`` then fails at once ("accessor error: <nil>") instead
    of waiting: that answer is retried until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(1, int(deadline - time.monotonic()))
        proc = kubectl(api, "wait", "--for=condition=Established", crd, "--timeout=%ds" % left, check=False)
        if proc.returncode == 0:
            return proc
        if "accessor error" not in proc.stderr or time.monotonic() >= deadline:
            raise AssertionError("kubectl wait --for=condition=Established %s: %s" % (crd, proc.stderr))
        time.sleep(1)


def kget(api, *args):
    return json.loads(kubectl(api, "get", *args, "-o", "json").stdout)


def kfind(api, *args):
    """The object, or None when it does not exist."""
    proc = kubectl(api, "get", *args, "-o", "json", "--ignore-not-found")
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def helm(api, env, *args, check=True):
    proc = subprocess.run([os.path.join(api["bin_dir"], "helm"), "--kubeconfig", api["kubeconfig"]] + list(args),
                          text=True, capture_output=True, timeout=300, check=False, env=env)
    if check and proc.returncode:
        raise AssertionError("helm %s: %s" % (" ".join(args), proc.stderr))
    return proc


def delete_crds(api, names, timeout=180):
    """Delete CRDs (kubectl names, e.g. `customresourcedefinition.apiextensions.k8s.io/x`) and wait until
    they are gone; raise AssertionError naming the ones left after `timeout` seconds.

    The API server's CRD finalizer lists a CRD's instances before it lets the CRD go; on the lab's server
    that list sometimes fails right after the CRD's storage is set up ("storage is (re)initializing") and is
    not tried again until the CRD changes. A changed annotation is such a change: it is repeated every 5
    seconds while a CRD stays, and finalizers left on its instances (their controller is gone) are removed.
    No kubectl call waits on its own, so a stalled finalizer cannot turn into a subprocess timeout.
    """
    if not names:
        return

    def call(*args):
        try:
            return kubectl(api, *args, check=False, timeout=60).stdout
        except subprocess.TimeoutExpired:
            return None

    call("delete", *names, "--wait=false", "--ignore-not-found")
    started = time.monotonic()
    left, poked = list(names), started
    while left and time.monotonic() < started + timeout:
        seen = call("get", *left, "-o", "name", "--ignore-not-found")
        left = left if seen is None else seen.split()
        if left and time.monotonic() > poked + 5:
            call("annotate", "--overwrite", *left, "gpuops-test/retry-finalizer=%d" % int(time.monotonic()))
            for crd in left:  # an instance with a finalizer whose controller is gone holds its CRD forever
                found = call("get", crd.split("/", 1)[-1], "-A", "-o", "json")
                for item in json.loads(found or "{}").get("items", []):
                    meta = item["metadata"]
                    if meta.get("finalizers"):
                        call("patch", crd.split("/", 1)[-1], meta["name"], "--type=merge",
                             "-p", '{"metadata":{"finalizers":null}}',
                             *(["-n", meta["namespace"]] if meta.get("namespace") else []))
            poked = time.monotonic()
        if left:
            time.sleep(1)
    assert not left, "CRDs still there after %ss: %s" % (timeout, left)


def sweep_session_states():
    """Stop the servers of per-session state directories (base-<pid>) whose session is gone; remove them."""
    parent, name = os.path.split(KUBE_TEST_STATE_BASE)
    for entry in sorted(os.listdir(parent)):
        directory = os.path.join(parent, entry)
        if not re.fullmatch(re.escape(name) + r"-\d+", entry) or directory == KUBE_TEST_STATE:
            continue
        handle = try_lock(directory)
        if handle is None:
            continue  # a session that still runs
        try:
            kubelab("stop", check=True, timeout=120, env={"GPUOPS_KUBE_STATE": directory})
            shutil.rmtree(directory)
        finally:
            handle.close()


@pytest.fixture(scope="session")
def kube_api():
    """The tests' own API server with the project's fixtures, fresh for the whole session.

    Builds the binaries (cached for the machine, lab/kubebuild.py), then starts etcd and kube-apiserver in KUBE_TEST_STATE from
    an empty store: a server left there by an earlier session (GPUOPS_KUBE_KEEP=1, an interrupted run) is
    stopped and its state wiped first, so no test sees what ran before the session. Applies the fixture
    CRDs, objects and lab Nodes. Yields a dict: server, kubeconfig (admin), kubeconfig_unauthorised (no RBAC
    rights), bin_dir (kube-apiserver, kubectl, helm), versions, pids, ports, state_dir, start_seconds.
    Stops the server at the end unless GPUOPS_KUBE_KEEP=1.
    """
    assert os.path.realpath(KUBE_TEST_STATE_BASE) != os.path.realpath(MAIN_KUBE_STATE), \
        "GPUOPS_KUBE_TEST_STATE names the main job's state directory; the tests would wipe its server"
    kubelab("build", check=True)
    sweep_session_states()
    kubelab("start", "--fresh", check=True, timeout=600)
    kubelab("fixtures", check=True, timeout=600)
    status = kubelab_status()
    assert status["state"] == "running", status
    assert status["state_dir"] == KUBE_TEST_STATE, status
    yield status
    if os.environ.get("GPUOPS_KUBE_KEEP") != "1":
        kubelab("stop", check=True, timeout=120)
        if KUBE_TEST_STATE != KUBE_TEST_STATE_BASE:
            shutil.rmtree(KUBE_TEST_STATE, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The cluster half's tests (test_70, test_72, test_75): the GPU hosts' inventory and what they read back
# ---------------------------------------------------------------------------------------------

# The upstream charts and sources, beside the checkout (see its README).
UPSTREAM = os.path.join(os.path.dirname(TOP), "shared", "upstream")
UPSTREAM_CHARTS = {"gpu-operator": os.path.join(UPSTREAM, "gpu-operator", "chart"),
                   "dra-driver-nvidia-gpu": os.path.join(UPSTREAM, "dra-driver-nvidia-gpu", "chart")}
VENV_PYTHON = os.path.join(TOP, ".venv", "bin", "python")
# What gpu_facts would give for an A10 on vfio-pci, and for the same A10 on the vGPU host driver.
A10 = {"address": "0000:65:00.0", "vendor": "10de", "device": "2236", "class": "030200", "driver": "vfio-pci",
       "is_vf": False, "sandbox_resource_name": "nvidia.com/GA102GL_A10", "mdev_types": [], "vgpu": None}
A10_VGPU = dict(A10, driver="nvidia", mdev_types=[
    {"id": "nvidia-593", "name": "NVIDIA A10-4Q", "available_instances": 6, "resource_name": "nvidia.com/NVIDIA_A10-4Q"},
    {"id": "nvidia-595", "name": "NVIDIA A10-12Q", "available_instances": 2, "resource_name": "nvidia.com/NVIDIA_A10-12Q"}])
VGPU_CONFIG = {"version": "v1", "vgpu-configs": {
    "A10-4Q": [{"devices": "all", "vgpu-devices": {"A10-4Q": 6}}],
    "A10-12Q": [{"devices": "all", "vgpu-devices": {"A10-12Q": 2}}]}}


def gpu_host_vars(nodes, hosts=None):
    """The variables of the GPU hosts ``nodes`` ({host: workload type}), with the facts gpu_facts would give for
    an A10 (the vm-vgpu host's on the vGPU driver, with the vGPU config A10-12Q); ``hosts`` ({host: variables})
    adds to or replaces a host's."""
    host_vars = {}
    for host, wtype in nodes.items():
        entry = {"ansible_connection": "local", "gpuops_workload_type": wtype,
                 "gpu_facts_gpus": [A10_VGPU if wtype == "vm-vgpu" else A10], "gpu_facts_mdev_parents": []}
        if wtype == "vm-vgpu":
            entry["gpuops_vgpu_config_name"] = "A10-12Q"
        entry.update((hosts or {}).get(host, {}))
        host_vars[host] = entry
    return host_vars


def write_inventory(tmp_path, name, all_vars, host_vars, python, groups=None):
    """Write ``<tmp_path>/<name>.yml``: the GPU hosts in group gpu_nodes (those ``groups`` names, {group: [host]}, in
    that child group of it instead), localhost run with ``python``; return its path."""
    host_vars = dict(host_vars)
    children = {group: {"hosts": {host: host_vars.pop(host) for host in hosts}} for group, hosts in (groups or {}).items()}
    gpu_nodes = {"hosts": host_vars}
    if children:
        gpu_nodes["children"] = children
    doc = {"all": {"vars": all_vars, "children": {"gpu_nodes": gpu_nodes},
                   "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": python}}}}
    path = tmp_path / ("%s.yml" % name)
    path.write_text(yaml.safe_dump(doc))
    return str(path)


# What the image role (vgpu_manager_image) hands the GPU Operator role.
VGPU_MANAGER = {"enabled": True, "repository": "registry.example/nvidia", "image": "vgpu-manager", "version": "550.90.05"}


def chart_path_vars(api, charts, pull_secret, claim_templates):
    """The cluster half's variables for installing ``charts`` ({chart name: directory}) by path with the lab's
    helm: the vGPU Manager image pulled with ``pull_secret`` (name, registry, username, password), the DRA
    driver's ``claim_templates``."""
    return {
        "gpuops_kubeconfig": api["kubeconfig"],
        "gpuops_vgpu_device_config": VGPU_CONFIG,
        "vgpu_manager_image_helm_values": {"vgpuManager": VGPU_MANAGER},
        "gpu_operator_chart_repo_url": "",
        "gpu_operator_chart_ref": charts["gpu-operator"],
        "gpu_operator_helm_binary": os.path.join(api["bin_dir"], "helm"),
        "gpu_operator_default_workload": "vm-passthrough",
        "gpu_operator_pull_secret_name": pull_secret[0],
        "gpu_operator_pull_secret_registry": pull_secret[1],
        "gpu_operator_pull_secret_username": pull_secret[2],
        "gpu_operator_pull_secret_password": pull_secret[3],
        "dra_driver_chart_repo_url": "",
        "dra_driver_chart_ref": charts["dra-driver-nvidia-gpu"],
        "dra_driver_helm_binary": os.path.join(api["bin_dir"], "helm"),
        "dra_driver_claim_templates": claim_templates,
        "ansible_python_interpreter": VENV_PYTHON,
    }


def timed_playbook(helm_env, inv, name="cluster.yml", *extra):
    """playbooks/``name`` on the inventory ``inv`` with --diff, Helm's homes from ``helm_env``; returns
    (process, wall seconds)."""
    env = dict(helm_env, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"))
    started = time.monotonic()
    proc = run([os.path.join(TOP, ".venv", "bin", "ansible-playbook"), os.path.join(TOP, "playbooks", name),
                "-i", inv, "--diff"] + list(extra), timeout=1200, env=env)
    return proc, time.monotonic() - started


def helm_home_env(root):
    """The environment with Helm's cache, configuration and data under ``root`` (a pathlib.Path)."""
    return dict(os.environ, HELM_CACHE_HOME=str(root / "cache"), HELM_CONFIG_HOME=str(root / "config"),
                HELM_DATA_HOME=str(root / "data"))


def recaps(output):
    """{host: {ok, changed, unreachable, failed}} from a play's PLAY RECAP (which must list localhost)."""
    found = {host: dict(zip(("ok", "changed", "unreachable", "failed"), map(int, counts))) for host, *counts in re.findall(
        r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output, re.M)}
    assert "localhost" in found, output[-3000:]
    return found


def flat(output):
    """``output`` with every run of white space one space (messages wrap differently)."""
    return " ".join(output.split())


def value_paths(tree, prefix=()):
    """The key paths to the leaves of a values tree (an empty map is a leaf)."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from value_paths(value, prefix + (key,))
        else:
            yield prefix + (key,)


def in_values(upstream, path):
    """Whether a chart's values.yaml (``upstream``) has the key path ``path``."""
    node = upstream
    for key in path:
        if isinstance(node, dict) and node == {}:
            return True  # a free-form map upstream (featureGates: {}, nodeSelector: {})
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def restore_cluster_policy(api, policy):
    """Create the ClusterPolicy ``policy`` (as read before a test module) again, with its status."""
    kept = {k: policy[k] for k in ("apiVersion", "kind", "spec")}
    kept["metadata"] = {k: v for k, v in policy["metadata"].items() if k in ("name", "labels", "annotations")}
    kubectl(api, "create", "-f", "-", stdin=json.dumps(kept), check=False)
    if policy.get("status"):
        kubectl(api, "patch", "clusterpolicy", "cluster-policy", "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": policy["status"]}), check=False)


# ---------------------------------------------------------------------------------------------
# Each test's wall and core-seconds, printed at the end of the tier (and written to .build/)
# ---------------------------------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")
TIMES = {"started": time.monotonic(), "tests": [], "lab_work": None}
# A session beside the main one (scripts/integration.sh) writes its table to a file of its own.
TIMES_JSON = os.path.abspath(os.environ.get("GPUOPS_TEST_TIMES_JSON")
                             or os.path.join(TOP, ".build", "test-times-integration.json"))


def machine_busy_seconds():
    """Core-seconds the machine has been busy since it booted (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat", encoding="ascii") as handle:
        values = [int(value) for value in handle.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICKS


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
    """Each test's wall time (setup, call and teardown: a fixture that waits for the lab's work counts there) and
    the machine's busy core-seconds meanwhile, which include the lab work running beside it."""
    begun, busy = time.monotonic(), machine_busy_seconds()
    result = yield
    TIMES["tests"].append({"test": item.nodeid, "started": round(begun - TIMES["started"]),
                           "wall": round(time.monotonic() - begun, 1),
                           "core_seconds": round(machine_busy_seconds() - busy, 1)})
    return result


def lab_work_times(work):
    """When each part of the lab's work ended (seconds into the tier) and what its steps took."""
    parts = []
    if work is None:
        return parts
    offset = work.modules.started - TIMES["started"]
    if work.boot.seconds is not None:
        parts.append({"part": "boot of every lab host (reset, start, SSH)", "seconds": round(work.boot.seconds),
                      "ended": round(work.boot.started - TIMES["started"] + work.boot.seconds)})
    for step, (_rc, _out, seconds) in work.modules.results(timeout=0).items():
        parts.append({"part": "module target " + step, "seconds": round(seconds)})
    for batch in (work.scenarios, work.switch.get(timeout=0), work.dra_switch.get(timeout=0)):
        if batch is None:
            continue
        for name, steps in batch.timeline.items():
            begun = batch.started - TIMES["started"]
            for (step, at), (_next, until) in zip(steps, steps[1:]):
                parts.append({"part": "scenario %s %s" % (name, step), "seconds": until - at,
                              "ended": round(begun + until)})
    power_loss = work.power_loss.get(timeout=0)
    if power_loss is not None and "elapsed" in power_loss.results(timeout=0):
        parts.append({"part": "power loss run", "seconds": round(power_loss.results(timeout=0)["elapsed"])})
    for follow in (work.container_checks, work.passthrough_checks, work.dra_checks):
        steps = follow.get(timeout=0)
        for name, (seconds, ended) in dict(steps.times if steps is not None else {}).items():
            parts.append({"part": name, "seconds": round(seconds), "ended": round(ended - TIMES["started"])})
    parts.insert(0, {"part": "module targets (started)", "seconds": round(offset)})
    return parts


def pytest_terminal_summary(terminalreporter):
    """The table of each test's wall and core-seconds, and of the lab work's parts, at the end of the tier."""
    if not TIMES["tests"]:
        return
    write = terminalreporter.write_line
    write("")
    write("each test: started (s into the tier), wall s, machine core-seconds meanwhile (lab work beside included)")
    for row in TIMES["tests"]:
        write("  %6d %8.1f %9.1f  %s" % (row["started"], row["wall"], row["core_seconds"], row["test"]))
    try:
        parts = lab_work_times(TIMES["lab_work"])
    except Exception as exc:  # pylint: disable=broad-except
        # A report: whatever it cannot read must not turn the tier's result into an error.
        parts = []
        write("could not read the lab work's times: %s: %s" % (type(exc).__name__, exc))
    if parts:
        write("the lab work in the background: seconds of each part (and when it ended, s into the tier)")
        for part in parts:
            write("  %8s %8s  %s" % (part["seconds"], part.get("ended", ""), part["part"]))
    if TIMES["lab_work"] is not None:
        reniced = TIMES["lab_work"].priority.results()
        write("the longest chain's hosts (tiers.CRITICAL_HOSTS): %s; QEMUs reniced: %s" % (
            ", ".join("%s at nice %d" % item for item in tiers.CRITICAL_HOSTS.items()),
            ", ".join("%s pid %d" % item for item in reniced) or "none"))
        write("the lab work as declared (tests/integration/tiers.py): tier or slice, host, part, and whether it ran")
        for part in tiers.LAB_WORK:
            write("  %-9s %-16s %-24s %s" % (part.tier, part.host, part.name,
                                             "ran" if tiers.part_runs(part.name, SELECTED["slices"])
                                             else "not run: slice %s not selected" % part.tier))
    try:
        os.makedirs(os.path.dirname(TIMES_JSON), exist_ok=True)
        with open(TIMES_JSON, "w", encoding="utf-8") as handle:
            json.dump({"tests": TIMES["tests"], "lab_work": parts}, handle, indent=2)
    except OSError as exc:
        write("could not write %s: %s" % (TIMES_JSON, exc))
