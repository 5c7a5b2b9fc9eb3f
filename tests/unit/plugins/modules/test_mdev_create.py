# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Module tests for mdev_create on fake hosts with a simulated kernel (see fakes/mdev_hosts.py)."""

from __future__ import annotations

import errno
import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


from ansible_collections.gpuops.sandbox.plugins.module_utils import _mdev, _sysfs
from ansible_collections.gpuops.sandbox.plugins.modules import mdev_create
from ansible_collections.gpuops.sandbox.tests.unit.fakes.mdev_hosts import (
    A100_PF,
    A100_VFS,
    L40S_PF,
    L40S_VFS,
    avail,
    build_a100,
    build_l40s,
    build_mtty,
)
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import (
    TIMEOUTS_OUT_OF_BOUNDS,
    assert_run_ends_cleanly,
    raise_on_exit,
    run_main,
)
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sriov_kernel import FakeTree
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sysfs_tree import HOSTILE_VALUES, failing_atomic_move
from ansible_collections.gpuops.sandbox.tests.unit.plugins.mdev_fakes import fake_host, refuse_create

UUID1 = "4b20d080-1b54-4048-85b3-a6a62d165c01"


@pytest.fixture(autouse=True)
def patched(monkeypatch):
    raise_on_exit(monkeypatch)


def run(tree, args, check=False, diff=False):
    """Run the module on the fake tree; return (result, failed)."""
    full = dict(args)
    full.setdefault("timeout", 0)
    return run_main(mdev_create, tree.root, full, check=check, diff=diff)


@pytest.fixture
def host(tmp_path, monkeypatch):
    return fake_host(tmp_path, monkeypatch, build_a100, build_mtty)


@pytest.fixture
def vgpu_host(tmp_path, monkeypatch):
    return fake_host(tmp_path, monkeypatch, build_l40s)


def live(tree):
    return sorted(os.listdir(tree.p("/sys/bus/mdev/devices")))


# --------------------------------------------------------------------------- the four-step sequence


def test_mtty_check_run_check_run(host):
    tree, kernel = host
    args = {"type": "mtty-1", "parents": ["mtty"], "count": 2}
    before = tree.snapshot()
    result, failed = run(tree, args, check=True)
    assert not failed and result["changed"]
    assert [d["uuid"] for d in result["created"]] == [_mdev.derive_uuid("mtty", "mtty-1", i) for i in (0, 1)]
    assert tree.snapshot() == before and kernel.writes == []

    result, failed = run(tree, args)
    assert not failed and result["changed"] and result["definitions_changed"]
    assert live(tree) == sorted(d["uuid"] for d in result["created"])
    assert avail(tree, "mtty", "mtty-1") == 22

    result, failed = run(tree, args, check=True)
    assert not failed and not result["changed"] and result["created"] == []
    result, failed = run(tree, args)
    assert not failed and not result["changed"] and len(result["devices"]) == 2


def test_persistence_files(host):
    tree, _kernel = host
    result, failed = run(tree, {"type": "Single port serial", "parent": "mtty", "uuids": [UUID1.upper()]})
    assert not failed and result["changed"]
    conf = tree.p(_mdev.DEFINITIONS_FILE)
    assert _mdev.parse_definitions(open(conf).read()) == [("mdev", "mtty", "mtty-1", UUID1)]
    for path in (_mdev.DEFINITIONS_FILE, _mdev.UNIT_FILE, _mdev.RESTORE_SCRIPT):
        mode = os.stat(tree.p(path))
        assert stat.S_IMODE(mode.st_mode) == 0o644
        if os.geteuid() == 0:
            assert (mode.st_uid, mode.st_gid) == (0, 0)
    assert os.readlink(tree.p(_mdev.WANTS_LINK)) == _mdev.UNIT_FILE
    assert "ExecStart=/bin/sh %s %s" % (_mdev.RESTORE_SCRIPT, _mdev.DEFINITIONS_FILE) in open(
        tree.p(_mdev.UNIT_FILE)).read()
    assert [f for f in os.listdir(os.path.dirname(conf)) if f.startswith(".gpuops-")] == []


def test_not_persistent_writes_no_files(host):
    tree, _kernel = host
    result, failed = run(tree, {"type": "mtty-1", "parents": ["mtty"], "persistent": False})
    assert not failed and result["changed"] and not result["definitions_changed"]
    assert not os.path.exists(tree.p("/etc"))


def test_absent_removes_devices_and_definitions(host):
    tree, _kernel = host
    run(tree, {"type": "mtty-1", "parents": ["mtty"], "count": 3})
    run(tree, {"type": "mtty-2", "parents": ["mtty"], "count": 1})
    args = {"type": "mtty-1", "parents": ["mtty"], "state": "absent"}
    result, failed = run(tree, args, check=True, diff=True)
    assert not failed and result["changed"] and len(result["removed"]) == 3 and len(live(tree)) == 4
    assert result["diff"][0]["after"] == ""
    result, failed = run(tree, args)
    assert not failed and result["changed"] and len(live(tree)) == 1
    defs = _mdev.read_definitions(tree.root)
    assert [d[2] for d in defs] == ["mtty-2"]
    result, failed = run(tree, args)
    assert not failed and not result["changed"]


def test_absent_explicit_uuid(host):
    tree, _kernel = host
    run(tree, {"type": "mtty-1", "parents": ["mtty"], "uuids": [UUID1]})
    run(tree, {"type": "mtty-1", "parents": ["mtty"], "count": 2})
    result, failed = run(tree, {"type": "mtty-1", "parents": ["mtty"], "uuids": [UUID1], "state": "absent"})
    assert not failed and [d["uuid"] for d in result["removed"]] == [UUID1]
    assert UUID1 not in live(tree) and len(live(tree)) == 1
    assert UUID1 not in [d[3] for d in _mdev.read_definitions(tree.root)]


def test_diff_shows_devices_and_definitions(host):
    tree, _kernel = host
    result, failed = run(tree, {"type": "mtty-1", "parents": ["mtty"]}, check=True, diff=True)
    assert not failed
    dev = _mdev.derive_uuid("mtty", "mtty-1", 0)
    assert result["diff"][0]["before"] == "" and dev in result["diff"][0]["after"]
    assert "mdev mtty mtty-1 %s" % dev in result["diff"][1]["after"]


def test_a100_pf_count(host):
    tree, _kernel = host
    args = {"type": "NVIDIA A100-4C", "pf": A100_PF, "count": 3}
    result, failed = run(tree, args)
    assert not failed and result["backend"] == "mdev"
    assert [d["parent"] for d in result["created"]] == A100_VFS[:3]
    result, failed = run(tree, args)
    assert not failed and not result["changed"]


def test_vendor_specific_sequence(vgpu_host):
    tree, kernel = vgpu_host
    args = {"type": "NVIDIA L40S-8Q", "pf": L40S_PF, "count": 2}
    before = tree.snapshot()
    result, failed = run(tree, args, check=True)
    assert not failed and result["changed"] and result["backend"] == "nvidia"
    assert tree.snapshot() == before
    result, failed = run(tree, args)
    assert not failed and result["changed"]
    assert [tree.read("/sys/bus/pci/devices/%s/nvidia/current_vgpu_type" % vf) for vf in L40S_VFS] == [
        "1155", "1155", "0", "0"]
    assert _mdev.read_definitions(tree.root) == [("vgpu", L40S_VFS[0], "1155", ""), ("vgpu", L40S_VFS[1], "1155", "")]
    result, failed = run(tree, args, check=True)
    assert not failed and not result["changed"]
    result, failed = run(tree, args)
    assert not failed and not result["changed"]
    assert not any(rel.endswith("/bind") or "driver_override" in rel for rel, _v in kernel.writes)
    result, failed = run(tree, {"type": "1155", "pf": L40S_PF, "state": "absent"})
    assert not failed and result["changed"] and _mdev.read_definitions(tree.root) == []
    assert [tree.read("/sys/bus/pci/devices/%s/nvidia/current_vgpu_type" % vf) for vf in L40S_VFS] == ["0"] * 4


# --------------------------------------------------------------------------- failures: message and nothing changed


@pytest.mark.parametrize("args,message", [
    ({"type": "mtty-9", "parents": ["mtty"]},
     "mdev type 'mtty-9' does not exist on parent mtty; types there: mtty-1 (Single port serial), "
     "mtty-2 (Dual port serial)"),
    ({"type": "mtty-1", "parents": ["MTTY"]},
     "mdev parent 'MTTY' does not exist (parent names are case-sensitive); existing parents: "
     "0000:3b:00.4, 0000:3b:00.5, 0000:3b:00.6, 0000:3b:00.7, mtty"),
    ({"type": "mtty-2", "parents": ["mtty"], "count": 13},
     "not enough instances of type mtty-2 (Dual port serial) on parent mtty: 12 available, 13 needed "
     "(0 already exist, count 13)"),
    ({"type": "mtty-1", "parents": ["mtty"], "count": 0}, "count must be a positive integer, got 0"),
    ({"type": "mtty-1", "parents": ["mtty"], "count": -2}, "count must be a positive integer, got -2"),
    ({"type": "mtty-1", "parents": ["mtty"], "uuids": ["4b20d080-1b54-4048-85b3-a6a62d165c0"]},
     "UUID '4b20d080-1b54-4048-85b3-a6a62d165c0' is not valid: the kernel wants exactly 36 characters, "
     "8-4-4-4-12 hex digits (e.g. 4b20d080-1b54-4048-85b3-a6a62d165c01)"),
    ({"type": "mtty-1", "parents": ["mtty", A100_VFS[0]], "uuids": [UUID1]}, "uuids needs exactly one parent"),
    ({"type": "mtty-1", "parents": ["../../etc"]}, "parent '../../etc' is not valid"),
    ({"type": "mtty-1", "pf": "0000:3b:00.8"}, "PCI address '0000:3b:00.8' is not valid"),
    ({"type": "mtty-1", "parents": ["mtty"], "timeout": -1}, "timeout must be 0 or a positive"),
    ({"type": "mtty-1"}, "one of the following is required: parents, pf"),
    ({"type": "mtty-1", "parents": ["mtty"], "pf": A100_PF}, "parameters are mutually exclusive: parents|pf"),
])
def test_errors_change_nothing(host, args, message):
    tree, kernel = host
    before = tree.snapshot()
    result, failed = run(tree, args)
    assert failed
    assert result["msg"].startswith(message)
    assert tree.snapshot() == before and kernel.writes == []


def test_exhausted_after_creating_some(host):
    tree, _kernel = host
    run(tree, {"type": "mtty-2", "parents": ["mtty"], "count": 4})
    before = tree.snapshot()
    result, failed = run(tree, {"type": "mtty-2", "parents": ["mtty"], "count": 13})
    assert failed and result["kind"] == "capacity"
    assert "8 available, 9 needed (4 already exist, count 13)" in result["msg"]
    assert tree.snapshot() == before


def test_uuid_active_with_another_type(host):
    tree, _kernel = host
    run(tree, {"type": "mtty-2", "parents": ["mtty"], "uuids": [UUID1]})
    before = tree.snapshot()
    result, failed = run(tree, {"type": "mtty-1", "parents": ["mtty"], "uuids": [UUID1]})
    assert failed and result["kind"] == "conflict"
    assert result["msg"] == ("UUID %s is already active with another type: type mtty-2 on parent mtty "
                             "(wanted mtty-1 on mtty)" % UUID1)
    assert tree.snapshot() == before


def test_kernel_refusal_rolls_back_and_persists_nothing(host):
    tree, kernel = host
    before = tree.snapshot()
    third = _mdev.derive_uuid("mtty", "mtty-1", 2)
    refuse_create(kernel, third, errno.EIO)
    result, failed = run(tree, {"type": "mtty-1", "parents": ["mtty"], "count": 3})
    assert failed and result["kind"] == "apply"
    assert "Input/output error" in result["msg"] and "rolled back 2 change(s) of this run" in result["msg"]
    assert len(result["rollback"]["rolled_back"]) == 2 and result["rollback"]["rollback_errors"] == []
    assert tree.snapshot() == before


def test_late_parent_times_out_with_clear_error(tmp_path, monkeypatch):
    tree = FakeTree(tmp_path)
    clock = [0.0]
    from ansible_collections.gpuops.sandbox.plugins.module_utils import _sriov
    monkeypatch.setattr(_sysfs, "_monotonic", lambda: clock[0])
    monkeypatch.setattr(_sysfs, "_sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    result, failed = run(tree, {"type": "mtty-1", "parents": ["mtty"], "timeout": 3})
    assert failed and result["kind"] == "missing_parent"
    assert "this host has no mdev parents" in result["msg"] and result["msg"].endswith("(waited 3s)")


def test_vendor_specific_errors(vgpu_host):
    tree, kernel = vgpu_host
    before = tree.snapshot()
    result, failed = run(tree, {"type": "0", "pf": L40S_PF})
    assert failed and "type ids are integers greater than 0" in result["msg"]
    result, failed = run(tree, {"type": "NVIDIA L40S-8Q", "pf": L40S_PF, "count": 7})
    assert failed and "4 available, 7 needed" in result["msg"]
    result, failed = run(tree, {"type": "1155", "parents": [L40S_VFS[0]], "uuids": [UUID1]})
    assert failed and "uuids cannot be used with the NVIDIA vendor-specific interface" in result["msg"]
    assert tree.snapshot() == before and kernel.writes == []


# --------------------------------------------------------------------------- bounds checked before any change


@pytest.mark.parametrize("timeout,message", TIMEOUTS_OUT_OF_BOUNDS + [
    ("1e400", "timeout must be 0 to 3600 seconds, got a number of 401 digits; nothing was changed"),
])
def test_timeout_out_of_bounds_is_refused_before_any_change(host, timeout, message):
    tree, kernel = host
    before = tree.snapshot()
    for check in (True, False):
        result, failed = run(tree, {"type": "mtty-1", "parents": ["mtty"], "count": 2, "timeout": timeout},
                             check=check)
        assert failed, result
        assert result["msg"] == message and result["kind"] == "input"
    assert tree.snapshot() == before and kernel.writes == []


@pytest.mark.parametrize("spec,message", [
    ("\uff11\uff11\uff15\uff15",
     "vGPU type id '\uff11\uff11\uff15\uff15' is not valid: write type ids with the ASCII digits 0-9 (e.g. 1155)"),
    ("\u0661\u0661\u0665\u0665",
     "vGPU type id '\u0661\u0661\u0665\u0665' is not valid: write type ids with the ASCII digits 0-9 (e.g. 1155)"),
    ("1234567890", "vGPU type id '1234567890' is not valid: type ids have at most 9 digits (e.g. 1155)"),
    ("1" * 5000, "type '" + "1" * 29 + "... (5000 characters) is not valid: mdev type ids and names have at most "
                 "200 characters"),
])
@pytest.mark.parametrize("state", ["present", "absent"])
def test_bad_vgpu_type_id_is_refused(vgpu_host, spec, message, state):
    # Thousands of digits escaped as ValueError (Python's integer string limit) with a traceback;
    # fullwidth or Arabic-Indic digits were taken as type 1155 and vGPUs created.
    tree, kernel = vgpu_host
    before = tree.snapshot()
    result, failed = run(tree, {"type": spec, "pf": L40S_PF, "count": 2, "state": state})
    assert failed, result
    assert result["msg"] == message and result["kind"] == "input"
    assert tree.snapshot() == before and kernel.writes == []


def files_only(tree):
    """The tree without its directories (those made on the way may stay)."""
    return {path: entry for path, entry in tree.snapshot().items() if entry != "<dir>"}


def test_failed_final_write_removes_the_new_devices(host, monkeypatch):
    # ansible-core 2.19's atomic_move raises a bare Exception; only OSError was caught, so the devices and
    # half of the boot unit were left behind.
    tree, _kernel = host
    before = files_only(tree)
    failing_atomic_move(monkeypatch, _mdev.DEFINITIONS_FILE)  # written last: the script and unit go back
    result, failed = run(tree, {"type": "mtty-1", "parents": ["mtty"], "count": 2})
    assert failed and result["kind"] == "apply"
    assert result["msg"] == (
        "the devices were changed, but writing the boot definitions failed: writing %s failed: Could not replace "
        "'mdev-devices.conf' (File name too long); boot files put back; rolled back 2 change(s) of this run"
        % _mdev.DEFINITIONS_FILE)
    assert len(result["rollback"]["rolled_back"]) == 2 and result["rollback"]["rollback_errors"] == []
    assert live(tree) == [] and avail(tree, "mtty", "mtty-1") == 24
    assert files_only(tree) == before


def test_failed_final_write_on_absent_makes_the_devices_again(host, monkeypatch):
    tree, _kernel = host
    run(tree, {"type": "mtty-1", "parents": ["mtty"], "count": 2})
    devices = live(tree)
    before = files_only(tree)
    failing_atomic_move(monkeypatch, _mdev.DEFINITIONS_FILE)
    result, failed = run(tree, {"type": "mtty-1", "parents": ["mtty"], "state": "absent"})
    assert failed and result["kind"] == "apply"
    assert result["msg"].endswith("; boot files put back; rolled back 2 change(s) of this run")
    assert live(tree) == devices and len(devices) == 2
    assert files_only(tree) == before


# --------------------------------------------------------------------------- fuzzing

TEXT = st.one_of(st.none(), st.text(max_size=40), st.integers(), st.booleans(),
                 st.lists(st.text(max_size=12), max_size=3), st.sampled_from(HOSTILE_VALUES),
                 st.lists(st.sampled_from(HOSTILE_VALUES), max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.fixed_dictionaries({}, optional={
    "type": st.one_of(TEXT, st.sampled_from(["mtty-1", "mtty-2", "Dual port serial", "nvidia-692"])),
    "parents": st.one_of(TEXT, st.lists(st.sampled_from(["mtty", "MTTY", A100_VFS[0], "3b:00.5", "", "/"]),
                                        max_size=3)),
    "pf": st.one_of(TEXT, st.sampled_from([A100_PF, "3b:00.0", "0000:zz:00.0"])),
    "count": st.one_of(TEXT, st.integers(min_value=-3, max_value=30)),
    "uuids": st.one_of(TEXT, st.lists(st.sampled_from([UUID1, "bad", UUID1.upper(), ""]), max_size=3)),
    "state": st.one_of(TEXT, st.sampled_from(["present", "absent"])),
    "persistent": st.one_of(TEXT, st.booleans()),
    "backend": st.one_of(TEXT, st.sampled_from(["auto", "mdev", "nvidia"])),
    "timeout": st.one_of(st.integers(min_value=-2, max_value=0), st.text(max_size=5), st.sampled_from(HOSTILE_VALUES)),
}), check=st.booleans())
def test_fuzz_never_raises(host, args, check):
    tree, _kernel = host
    assert_run_ends_cleanly(*run(tree, args, check=check))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.fixed_dictionaries({}, optional={
    "type": st.one_of(TEXT, st.sampled_from(["1155", "NVIDIA L40S-8Q", "0", "1155\n", "\uff11\uff11\uff15\uff15"])),
    "parents": st.one_of(TEXT, st.lists(st.sampled_from(L40S_VFS + ["c1:00.5", "0000:c1:00.4\n"]), max_size=3)),
    "pf": st.one_of(TEXT, st.sampled_from([L40S_PF, "c1:00.0"])),
    "count": st.one_of(TEXT, st.integers(min_value=-3, max_value=6)),
    "state": st.one_of(TEXT, st.sampled_from(["present", "absent"])),
    "backend": st.one_of(TEXT, st.sampled_from(["auto", "mdev", "nvidia"])),
    "timeout": st.one_of(st.integers(min_value=0, max_value=3), st.sampled_from(HOSTILE_VALUES)),
}), check=st.booleans())
def test_fuzz_vendor_specific_never_raises(vgpu_host, args, check):
    tree, _kernel = vgpu_host
    assert_run_ends_cleanly(*run(tree, args, check=check))


@pytest.mark.parametrize("value", ["inf", "INFINITY", "-Infinity", "nan"])
def test_integer_option_that_is_not_finite_fails_cleanly(host, value):
    # ansible-core's int conversion raises OverflowError/ValueError on these; the module must fail instead.
    tree, _kernel = host
    result, failed = run(tree, {"type": "mtty-1", "parents": ["mtty"], "count": value})
    assert failed, result
    # Either ansible-core's own message or the module's; both name the option and the value.
    assert "count" in result["msg"] and value.lower() in result["msg"].lower()
