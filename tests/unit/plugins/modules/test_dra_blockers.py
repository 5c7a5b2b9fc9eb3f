# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Unit tests for dra_blockers on a fake /proc under tmp_path.

``systemctl`` is a small script in a fake bin directory (command_host.CommandHost), so the module's command path
(run_timed, timeout(1) included) runs for real. Its units live in ``systemd.json`` at the fake root: each has an
ActiveState, a UnitFileState and the pids it runs; stopping one removes its processes from the fake /proc, as
systemd ends them. ``fail`` lists, per verb, the units for which it fails; ``stuck`` units report success on stop
but stay active; ``escape`` units keep their processes.
"""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _dra_blockers as _db, _holders
from ansible_collections.gpuops.sandbox.plugins.module_utils import _pci
from ansible_collections.gpuops.sandbox.plugins.modules import dra_blockers

from ansible_collections.gpuops.sandbox.tests.unit.fakes.command_host import CommandHost
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import command_runner, raise_on_exit
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sysfs_tree import SysfsTree, remove_process

# The body of the fake systemctl (see CommandHost.python_script).
FAKE_SYSTEMCTL = r'''import json, shutil
path = os.path.join(ROOT, "systemd.json")
with open(path) as handle:
    state = json.load(handle)
verb, unit = argv[0], argv[-1]
known = state["units"].get(unit)
if verb == "show":
    if known is None:
        print("LoadState=not-found\nActiveState=inactive\nUnitFileState=")
    else:
        print("LoadState=loaded\nActiveState=%s\nUnitFileState=%s" % (known["active"], known["file"]))
    sys.exit(0)
if known is None:
    sys.stderr.write("Failed to %s %s: Unit %s not found.\n" % (verb, unit, unit))
    sys.exit(5)
if unit in state.get("fail", {}).get(verb, []):
    sys.stderr.write("Job for %s failed because the control process exited with error code.\n" % unit)
    sys.exit(1)
if verb == "stop":
    if unit not in state.get("stuck", []):
        known["active"] = "inactive"
    if unit not in state.get("escape", []):
        for pid in known["pids"]:
            shutil.rmtree(os.path.join(ROOT, "proc", str(pid)), ignore_errors=True)
elif verb == "start":
    known["active"] = "active"
elif verb == "disable":
    if known["file"] in ("enabled", "enabled-runtime"):
        known["file"] = "disabled"
elif verb == "enable":
    known["file"] = "enabled"
else:
    sys.stderr.write("unexpected verb %s\n" % verb)
    sys.exit(2)
with open(path, "w") as handle:
    json.dump(state, handle)
'''

SERVICE_CGROUP = "0::/system.slice/{unit}\n"
POD_CGROUP = ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0c8a1f2e_5b7d_4c3e_9a1b_2d3e4f5a6b7c"
              ".slice/cri-containerd-4f9d8c7b6a5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b.scope\n")
SESSION_CGROUP = "0::/user.slice/user-120.slice/session-c1.scope\n"
V1_CGROUP = ("12:pids:/system.slice/nvidia-dcgm.service\n11:memory:/system.slice/nvidia-dcgm.service\n"
             "1:name=systemd:/system.slice/nvidia-dcgm.service\n")


class Host(CommandHost):
    """A fake host: /proc with processes holding NVIDIA nodes, and the fake systemctl."""

    def __init__(self, base):
        super().__init__(base)
        self.tree = SysfsTree(self.root)
        self.units = {}
        self.fail = {}
        self.stuck = []
        self.escape = []
        self.tree.add_process(1, "systemd", {0: "/dev/null"})
        self.tree.write("/proc/1/cgroup", "0::/init.scope\n")
        self.python_script("systemctl", FAKE_SYSTEMCTL)
        self.save()

    def process(self, pid, comm, fds, cmdline=None, cgroup=None):
        self.tree.add_process(pid, comm, fds)
        self.tree.write("/proc/%d/cmdline" % pid, "\0".join((cmdline or comm).split(" ")) + "\0")
        if cgroup is not None:
            self.tree.write("/proc/%d/cgroup" % pid, cgroup)

    def service(self, pid, comm, fds, unit, cmdline=None, active="active", file="enabled"):
        """A process run by the system service ``unit``."""
        self.process(pid, comm, fds, cmdline, SERVICE_CGROUP.format(unit=unit))
        entry = self.units.setdefault(unit, {"active": active, "file": file, "pids": []})
        entry["pids"].append(pid)
        self.save()

    def save(self):
        with open(self.path("/systemd.json"), "w") as handle:
            json.dump({"units": self.units, "fail": self.fail, "stuck": self.stuck, "escape": self.escape}, handle)

    def unit(self, name):
        with open(self.path("/systemd.json")) as handle:
            return json.load(handle)["units"][name]

    def calls(self, verb=None):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as handle:
            calls = [line.rstrip("\n").split("\t")[1:] for line in handle]
        return [c for c in calls if verb is None or c[0] == verb]

    def held(self, pid, fd):
        """Whether the fake process ``pid`` still has descriptor ``fd`` (its link's target does not exist here)."""
        return os.path.lexists(self.path("/proc/%d/fd/%d" % (pid, fd)))

    def changing_calls(self):
        return [c for c in self.calls() if c[0] != "show"]


run = command_runner(dra_blockers)


@pytest.fixture(autouse=True)
def _exits(monkeypatch):
    raise_on_exit(monkeypatch)


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


def persistenced(host, pid=1234):
    host.service(pid, "nvidia-persiste", {3: "/dev/nvidia0", 4: "/dev/nvidiactl"}, "nvidia-persistenced.service",
                 cmdline="/usr/bin/nvidia-persistenced --user nvidia-persistenced")


def dcgm(host, pid=2345):
    host.service(pid, "nv-hostengine", {5: "/dev/nvidia0", 6: "/dev/nvidiactl"}, "nvidia-dcgm.service",
                 cmdline="/usr/bin/nv-hostengine -n --service-account nvidia-dcgm")


def full_host(host):
    """One holder of each kind: the nodes of the host's driver and of the GPU Operator's driver container."""
    persistenced(host)
    dcgm(host)
    host.process(3456, "dcgm-exporter", {7: "/run/nvidia/driver/dev/nvidia0"}, "/usr/bin/dcgm-exporter -f /etc/dcgm",
                 POD_CGROUP)
    host.process(4567, "nvidia-device-p", {8: "/run/nvidia/driver/dev/nvidiactl"}, "nvidia-device-plugin", POD_CGROUP)
    host.process(5678, "Xorg", {9: "/dev/nvidia0", 10: "/dev/nvidia-modeset"}, "/usr/lib/xorg/Xorg vt1 -displayfd 3",
                 SESSION_CGROUP)
    host.process(6789, "python3", {11: "/dev/nvidia-uvm", 12: "/dev/null"}, "python3 train.py",
                 SERVICE_CGROUP.format(unit="trainer.service"))
    host.process(7890, "bash", {0: "/dev/pts/0", 1: "/dev/tty1"})


def by_pid(items):
    return dict((item["pid"], item) for item in items)


# --------------------------------------------------------------------------- the scan

def test_scan_finds_every_holder_with_its_kind_unit_and_paths(host):
    full_host(host)
    holders = by_pid(_db.scan(_db.DEFAULT_DRIVER_ROOTS, host.root))
    assert sorted(holders) == [1234, 2345, 3456, 4567, 5678, 6789]
    assert holders[1234]["paths"] == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert holders[3456]["paths"] == ["/run/nvidia/driver/dev/nvidia0"]
    assert holders[4567]["paths"] == ["/run/nvidia/driver/dev/nvidiactl"]
    assert dict((pid, h["kind"]) for pid, h in holders.items()) == {
        1234: "nvidia-persistenced", 2345: "dcgm", 3456: "dcgm-exporter", 4567: "nvidia-device-plugin",
        5678: "display-manager", 6789: "other"}
    assert (holders[1234]["unit"], holders[1234]["where"]) == ("nvidia-persistenced.service", "system")
    assert (holders[3456]["unit"], holders[3456]["where"]) == (None, "container")
    assert (holders[5678]["unit"], holders[5678]["where"]) == ("session-c1.scope", "user")


def test_the_host_driver_root_alone_does_not_see_the_operator_nodes(host):
    full_host(host)
    assert 3456 not in by_pid(_db.scan(["/"], host.root))
    assert sorted(by_pid(_db.scan(["/run/nvidia/driver"], host.root))) == [3456, 4567]


def test_find_holders_patterns_and_exact_paths_together(host):
    full_host(host)
    found = _holders.find_holders(["/dev/null"], host.root, patterns=["/dev/nvidia-*"])
    assert [(h["pid"], h["device"]) for h in found] == [
        (1, "/dev/null"), (5678, "/dev/nvidia-modeset"), (6789, "/dev/null"), (6789, "/dev/nvidia-uvm")]
    with pytest.raises(_pci.SysfsError, match="'dev/nvidia\\*' is not valid"):
        _holders.find_holders([], host.root, patterns=["dev/nvidia*"])


@pytest.mark.parametrize("cgroup, unit, where", [
    ("/system.slice/nvidia-persistenced.service", "nvidia-persistenced.service", "system"),
    ("/system.slice/containerd.service/kubepods-burstable-pod1234abcd_5678.slice:cri-containerd:abc", None, "container"),
    ("/kubepods/besteffort/pod0c8a1f2e-5b7d-4c3e-9a1b-2d3e4f5a6b7c/" + "a" * 64, None, "container"),
    ("/system.slice/docker-" + "b" * 64 + ".scope", None, "container"),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service", "foo.service", "user"),
    ("/init.scope", "init.scope", "system"),
    ("/", None, "unknown"),
    (None, None, "unknown"),
])
def test_placement(cgroup, unit, where):
    assert _db.placement(cgroup) == {"unit": unit, "where": where}


def test_cgroup_v1_uses_the_systemd_hierarchy(host):
    host.process(2345, "nv-hostengine", {5: "/dev/nvidia0"}, cgroup=V1_CGROUP)
    assert _db.read_cgroup(2345, host.root) == "/system.slice/nvidia-dcgm.service"
    assert _db.read_cgroup(99999, host.root) is None


@pytest.mark.parametrize("comm, cmdline, unit, kind", [
    ("nvidia-persiste", None, None, "nvidia-persistenced"),
    ("python3", "nvidia-persistenced --verbose", None, "nvidia-persistenced"),
    ("python3", "/usr/bin/python3 x.py", "nvidia-persistenced.service", "nvidia-persistenced"),
    ("nv-hostengine", None, None, "dcgm"),
    ("dcgm-exporter", None, None, "dcgm-exporter"),
    ("nvidia-device-p", None, None, "nvidia-device-plugin"),
    ("Xorg", None, None, "display-manager"),
    ("gnome-shell", None, None, "display-manager"),
    ("anything", None, "gdm.service", "display-manager"),
    ("python3", "python3 train.py", "trainer.service", "other"),
    (None, None, None, "other"),
])
def test_classify(comm, cmdline, unit, kind):
    assert _db.classify(comm, cmdline, unit) == kind


# --------------------------------------------------------------------------- the default: report and fail

def test_default_fails_naming_each_blocker_and_its_remedy_and_changes_nothing(host):
    full_host(host)
    result = run(host)
    assert result["failed"] and result["changed"] is False
    msg = result["msg"]
    assert msg.startswith("6 process(es) hold NVIDIA device nodes")
    assert msg.endswith("nothing was changed")
    assert "pid 1234 (/usr/bin/nvidia-persistenced --user nvidia-persistenced) in nvidia-persistenced.service" in msg
    assert "systemctl disable --now nvidia-persistenced.service" in msg
    assert "node label nvidia.com/gpu.deploy.dcgm-exporter=false" in msg
    assert "node label nvidia.com/gpu.deploy.device-plugin=false" in msg
    assert "systemctl set-default multi-user.target" in msg
    assert "does not recognise" in msg
    assert "version is not known (dra_driver_version)" in msg
    assert sorted(b["pid"] for b in result["blockers"]) == [1234, 2345, 3456, 4567, 5678, 6789]
    assert result["ok"] is False and result["stopped"] == []
    assert host.calls() == []


def test_a_free_host_is_ok(host):
    host.process(42, "bash", {0: "/dev/pts/0"}, cgroup=SESSION_CGROUP)
    result = run(host)
    assert not result["failed"]
    assert (result["changed"], result["ok"], result["blockers"], result["stopped"]) == (False, True, [], [])


def test_report_only_returns_stoppable_flags(host):
    full_host(host)
    result = run(host, check=True, fail_on_blocker=False)
    assert not result["failed"] and result["changed"] is False and result["ok"] is False
    stoppable = dict((b["pid"], b["stoppable"]) for b in result["blockers"])
    # Only known kinds in a system service: not the pods, not the session's Xorg, never "other".
    assert stoppable == {1234: True, 2345: True, 3456: False, 4567: False, 5678: False, 6789: False}


# --------------------------------------------------------------------------- versions

@pytest.mark.parametrize("version, blocks", [
    ("", True), ("0.3.9", True), ("0.3", True), ("0.4.0-rc.1", True),
    ("0.4.0", False), ("v0.4.1", False), ("0.4", False), ("1.0.0", False),
])
def test_persistenced_blocks_below_dra_driver_0_4_0(host, version, blocks):
    persistenced(host)
    result = run(host, check=True, fail_on_blocker=False, dra_driver_version=version)
    assert [b["pid"] for b in result["blockers"]] == ([1234] if blocks else [])
    assert [t["pid"] for t in result["tolerated"]] == ([] if blocks else [1234])
    assert result["ok"] is not blocks
    if blocks and version:
        shown = _db.version_text(_db.parse_version("dra_driver_version", version))
        assert "DRA driver %s does not switch persistence mode off" % shown in result["blockers"][0]["remedy"]


@pytest.mark.parametrize("option, version, blocks", [
    ("dcgm_version", "", True), ("dcgm_version", "4.4.9", True), ("dcgm_version", "4.5.0", False),
    ("dcgm_version", "4.5.0-1", False), ("dcgm_version", "4.5.0-beta", True),
    ("dcgm_exporter_version", "4.4.0-4.5.0-ubuntu22.04", True),
    ("dcgm_exporter_version", "4.5.0-4.6.0-ubuntu22.04", False),
])
def test_dcgm_and_exporter_from_4_5_0_are_warnings_not_blockers(host, option, version, blocks):
    dcgm(host)
    host.service(3456, "dcgm-exporter", {7: "/dev/nvidia0"}, "dcgm-exporter.service")
    other = "dcgm_exporter_version" if option == "dcgm_version" else "dcgm_version"
    result = run(host, fail_on_blocker=False, check=True, **{option: version, other: "4.6.0"})
    pid = 2345 if option == "dcgm_version" else 3456
    assert (pid in [b["pid"] for b in result["blockers"]]) is blocks
    warned = [w for w in result["warnings_list"] if "pid %d" % pid in w]
    assert len(warned) == (0 if blocks else 1)
    assert len(result["warnings"]) == len(result["warnings_list"])
    if option == "dcgm_exporter_version" and not blocks:
        assert "DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH=true" in warned[0]


# --------------------------------------------------------------------------- check mode, stop, idempotence

def test_check_mode_reports_what_it_would_stop_and_stops_nothing(host):
    persistenced(host)
    result = run(host, check=True, diff=True, stop=["nvidia-persistenced"])
    assert not result["failed"] and result["changed"] is True and result["ok"] is True
    assert result["stopped"] == ["nvidia-persistenced.service"]
    assert result["diff"]["before"] == "nvidia-persistenced.service: active, enabled\n"
    assert result["diff"]["after"] == "nvidia-persistenced.service: inactive, disabled\n"
    assert host.changing_calls() == []
    assert host.unit("nvidia-persistenced.service")["active"] == "active"
    assert host.held(1234, 3)


def test_stop_stops_disables_reads_back_and_a_rerun_is_unchanged(host):
    persistenced(host)
    dcgm(host)
    result = run(host, stop=["nvidia-persistenced", "dcgm"])
    assert not result["failed"] and result["changed"] is True and result["ok"] is True
    assert result["stopped"] == ["nvidia-persistenced.service", "nvidia-dcgm.service"]
    assert host.changing_calls() == [
        ["stop", "nvidia-persistenced.service"], ["disable", "nvidia-persistenced.service"],
        ["stop", "nvidia-dcgm.service"], ["disable", "nvidia-dcgm.service"]]
    for unit in ("nvidia-persistenced.service", "nvidia-dcgm.service"):
        assert (host.unit(unit)["active"], host.unit(unit)["file"]) == ("inactive", "disabled")
    # Each unit is read once to plan and once after its stop.
    assert len(host.calls("show")) == 4
    again = run(host, stop=["nvidia-persistenced", "dcgm"])
    assert not again["failed"] and again["changed"] is False and again["stopped"] == [] and again["ok"] is True
    assert len(host.changing_calls()) == 4
    checked = run(host, check=True, stop=["nvidia-persistenced", "dcgm"])
    assert checked["changed"] is False


def test_a_kind_not_listed_is_never_acted_on(host):
    persistenced(host)
    dcgm(host)
    result = run(host, stop=["nvidia-persistenced"])
    assert result["failed"] and result["changed"] is False
    assert "dcgm pid 2345" in result["msg"] and "nvidia-persistenced pid" not in result["msg"]
    assert host.changing_calls() == []
    partial = run(host, stop=["nvidia-persistenced"], fail_on_blocker=False)
    assert not partial["failed"] and partial["changed"] is True and partial["ok"] is False
    assert host.changing_calls() == [["stop", "nvidia-persistenced.service"], ["disable", "nvidia-persistenced.service"]]
    assert host.unit("nvidia-dcgm.service")["active"] == "active"
    assert [b["pid"] for b in partial["blockers"]] == [1234, 2345]


def test_pods_sessions_and_unknown_processes_are_never_stopped(host):
    full_host(host)
    everything = list(_db.STOPPABLE_KINDS)
    result = run(host, stop=everything, fail_on_blocker=False)
    assert not result["failed"]
    assert result["stopped"] == ["nvidia-persistenced.service", "nvidia-dcgm.service"]
    assert sorted(set(c[1] for c in host.changing_calls())) == ["nvidia-dcgm.service", "nvidia-persistenced.service"]
    assert host.held(3456, 7) and host.held(5678, 9) and host.held(6789, 11)
    assert not host.held(1234, 3) and not host.held(2345, 5)


def test_a_static_unit_is_stopped_with_a_warning(host):
    host.service(1234, "nvidia-persiste", {3: "/dev/nvidia0"}, "nvidia-persistenced.service", file="static")
    result = run(host, stop=["nvidia-persistenced"])
    assert not result["failed"] and result["changed"] is True
    assert host.changing_calls() == [["stop", "nvidia-persistenced.service"]]
    assert any("static" in w and "start it again" in w for w in result["warnings"])


def test_systemctl_missing_fails_before_anything(host):
    persistenced(host)
    os.unlink(os.path.join(host.bin, "systemctl"))
    result = run(host, stop=["nvidia-persistenced"])
    assert result["failed"] and "systemctl is needed" in result["msg"] and "nothing was changed" in result["msg"]


# --------------------------------------------------------------------------- rollback

def test_a_failing_stop_rolls_back_the_units_already_stopped(host):
    persistenced(host)
    dcgm(host)
    host.fail = {"stop": ["nvidia-dcgm.service"]}
    host.save()
    result = run(host, stop=["nvidia-persistenced", "dcgm"])
    assert result["failed"] and result["changed"] is False
    assert "systemctl stop nvidia-dcgm.service failed (rc=1)" in result["msg"]
    assert "control process exited with error code" in result["msg"]
    assert "rolled back: nvidia-persistenced.service enabled and started again" in result["msg"]
    assert result["rollback"] == ["nvidia-persistenced.service enabled and started again"]
    assert host.changing_calls()[-2:] == [["enable", "nvidia-persistenced.service"],
                                          ["start", "nvidia-persistenced.service"]]
    assert (host.unit("nvidia-persistenced.service")["active"], host.unit("nvidia-persistenced.service")["file"]) == \
        ("active", "enabled")


def test_a_failed_rollback_is_told_and_counts_as_a_change(host):
    persistenced(host)
    dcgm(host)
    host.fail = {"disable": ["nvidia-dcgm.service"], "enable": ["nvidia-persistenced.service"]}
    host.save()
    result = run(host, stop=["nvidia-persistenced", "dcgm"])
    assert result["failed"] and result["changed"] is True
    assert "systemctl disable nvidia-dcgm.service failed" in result["msg"]
    assert "nvidia-dcgm.service started again" in result["msg"]
    assert "nvidia-persistenced.service not put back (nothing done): systemctl" in result["msg"].replace(
        host.bin + "/", "")


@pytest.mark.parametrize("fault, fragments, rollback, unit_ok", [
    ("stuck", ["nvidia-persistenced.service is active and disabled after systemctl stop and disable"],
     ["nvidia-persistenced.service enabled and started again"], lambda unit: unit["file"] == "enabled"),
    ("escape", ["still hold(s) NVIDIA device nodes", "pid 1234"],
     None, lambda unit: unit == {"active": "active", "file": "enabled", "pids": [1234]}),
], ids=["a_unit_still_active_after_stop", "a_process_that_outlives_its_unit"])
def test_a_unit_that_does_not_stop_is_a_failure_and_rolls_back(host, fault, fragments, rollback, unit_ok):
    persistenced(host)
    setattr(host, fault, ["nvidia-persistenced.service"])
    host.save()
    result = run(host, stop=["nvidia-persistenced"])
    assert result["failed"]
    assert all(fragment in result["msg"] for fragment in fragments), result["msg"]
    if rollback is not None:
        assert result["rollback"] == rollback
    assert unit_ok(host.unit("nvidia-persistenced.service"))


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("params, fragments", [
    ({"stop": ["persistenced"]}, ["stop", "persistenced", "nvidia-persistenced", "display-manager"]),
    ({"stop": ["other"]}, ["stop", "other", "nvidia-device-plugin"]),
    ({"dra_driver_version": "latest"}, ["dra_driver_version 'latest' is not a version", "0.4.0", "nothing was changed"]),
    ({"dcgm_version": "4.5.0\nrm"}, ["dcgm_version '4.5.0\\nrm' is not a version"]),
    ({"dcgm_exporter_version": "4"}, ["dcgm_exporter_version '4' is not a version"]),
    ({"driver_roots": ["run/nvidia/driver"]}, ["driver_roots entry 'run/nvidia/driver' is not valid", "absolute"]),
    ({"driver_roots": ["/dev/*"]}, ["'/dev/*' is not valid", "without wildcards"]),
    ({"driver_roots": []}, ["driver_roots must name at least one directory"]),
    ({"command_timeout": 0}, ["command_timeout must be 1 to 3600 seconds, got 0"]),
])
def test_bad_input_fails_naming_the_value_and_changes_nothing(host, params, fragments):
    persistenced(host)
    result = run(host, **dict(params, stop=params.get("stop", ["nvidia-persistenced"])))
    assert result["failed"] and result.get("changed", False) is False
    for fragment in fragments:
        assert fragment in result["msg"]
    assert host.calls() == []
    assert host.unit("nvidia-persistenced.service")["active"] == "active"


def test_a_process_gone_during_the_scan_is_skipped(host):
    persistenced(host)
    dcgm(host)
    remove_process(host.tree, 2345)
    result = run(host, check=True, fail_on_blocker=False)
    assert [b["pid"] for b in result["blockers"]] == [1234]
