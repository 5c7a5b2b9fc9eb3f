# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""sriov_vfs persistent=true (boot records, restore script, unit) and the _sriov helpers behind it."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ansible.module_utils import basic

from ansible_collections.gpuops.sandbox.plugins.module_utils import _host, _sriov
from ansible_collections.gpuops.sandbox.plugins.modules import sriov_vfs
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sriov_kernel import (
    NVME_PF,
    FakeTree,
    add_nvme_pf,
    install_kernel,
)
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sysfs_tree import failing_atomic_move

SECOND_PF = "0000:01:08.0"
CONF = _sriov.DEFINITIONS_FILE
SCRIPT = _sriov.RESTORE_SCRIPT
UNIT = _sriov.UNIT_FILE
LINK = _sriov.WANTS_LINK
BOOT_FILES = sorted([CONF, SCRIPT, UNIT, LINK])


@pytest.fixture
def host(tmp_path, monkeypatch):
    tree = FakeTree(tmp_path)
    kernel = install_kernel(tree, monkeypatch)
    monkeypatch.setattr(sriov_vfs, "ROOT", tree.root)
    add_nvme_pf(tree)
    tree.add_pf(SECOND_PF, "0x1b36", "0x0010", "0x010802", "nvme", 8, 1, "0x0010")
    return tree, kernel


def run(monkeypatch, args, check=False, diff=False):
    full = dict(args)
    full["_ansible_check_mode"] = check
    full["_ansible_diff"] = diff
    full.setdefault("timeout", 0)
    return call(monkeypatch, sriov_vfs.main, full)


def text(tree, path):
    full = tree.p(path)
    if not os.path.lexists(full):
        return None
    if os.path.islink(full):
        return "-> " + os.readlink(full)
    with open(full) as handle:
        return handle.read()


def numvfs(tree, pf=NVME_PF):
    return int(tree.read("/sys/bus/pci/devices/%s/sriov_numvfs" % pf))


def definitions(*lines):
    return _sriov.DEFINITIONS_HEADER + "".join(line + "\n" for line in lines)


# --------------------------------------------------------------------------- the module


def test_persistent_writes_boot_files_after_the_live_change(monkeypatch, host):
    tree, kernel = host
    seen = []

    def record(_kernel, _path, rel, _value):
        if rel.endswith("/sriov_numvfs"):
            seen.append(os.path.lexists(tree.p(CONF)))
        return False

    kernel.hooks.append(record)
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 3, "persistent": True})
    assert kind == "exit", result
    assert seen == [False] and numvfs(tree) == 3
    assert result["changed"] is True and result["boot_files_changed"] == BOOT_FILES
    assert text(tree, CONF) == definitions("0000:01:00.0 3")
    assert text(tree, SCRIPT) == _sriov.RESTORE_SCRIPT_TEXT
    assert text(tree, UNIT) == _sriov.UNIT_TEXT
    assert text(tree, LINK) == "-> " + UNIT  # absolute, as systemctl enable makes it


def test_unit_runs_the_script_on_the_definitions(monkeypatch, host):
    assert "ExecStart=/bin/sh %s %s\n" % (SCRIPT, CONF) in _sriov.UNIT_TEXT
    assert "ConditionPathExists=%s\n" % CONF in _sriov.UNIT_TEXT
    assert "Before=gpuops-mdev-restore.service" in _sriov.UNIT_TEXT
    assert "WantedBy=multi-user.target" in _sriov.UNIT_TEXT
    assert LINK == "/etc/systemd/system/multi-user.target.wants/gpuops-sriov-restore.service"


def test_short_address_is_recorded_canonical(monkeypatch, host):
    tree, _kernel = host
    kind, _result = run(monkeypatch, {"pf": "01:00.0", "count": 2, "persistent": True})
    assert kind == "exit" and text(tree, CONF) == definitions("0000:01:00.0 2")


def test_autoprobe_is_recorded(monkeypatch, host):
    tree, _kernel = host
    run(monkeypatch, {"pf": NVME_PF, "count": 2, "autoprobe": False, "persistent": True})
    assert text(tree, CONF) == definitions("0000:01:00.0 2 0")
    run(monkeypatch, {"pf": NVME_PF, "count": 2, "autoprobe": True, "persistent": True})
    assert text(tree, CONF) == definitions("0000:01:00.0 2 1")


def test_second_pf_is_added_to_the_same_file(monkeypatch, host):
    tree, _kernel = host
    run(monkeypatch, {"pf": SECOND_PF, "count": 5, "persistent": True})
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 2, "persistent": True})
    assert kind == "exit", result
    assert result["boot_files_changed"] == [CONF]
    assert text(tree, CONF) == definitions("0000:01:00.0 2", "0000:01:08.0 5")
    assert numvfs(tree) == 2 and numvfs(tree, SECOND_PF) == 5


def test_count_change_updates_the_record(monkeypatch, host):
    tree, _kernel = host
    run(monkeypatch, {"pf": NVME_PF, "count": 2, "persistent": True})
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 4, "persistent": True})
    assert kind == "exit" and result["boot_files_changed"] == [CONF]
    assert text(tree, CONF) == definitions("0000:01:00.0 4")


def test_idempotent(monkeypatch, host):
    tree, kernel = host
    args = {"pf": NVME_PF, "count": 3, "persistent": True}
    run(monkeypatch, args)
    kernel.writes.clear()
    before = tree.snapshot()
    for check in (True, False):
        kind, result = run(monkeypatch, args, check=check)
        assert kind == "exit", result
        assert result["changed"] is False and result["boot_files_changed"] == []
    assert kernel.writes == [] and tree.snapshot() == before


def test_check_mode_writes_nothing(monkeypatch, host):
    tree, kernel = host
    before = tree.snapshot()
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 3, "persistent": True}, check=True)
    assert kind == "exit", result
    assert result["changed"] is True and result["boot_files_changed"] == BOOT_FILES
    assert tree.snapshot() == before and kernel.writes == []


def test_check_mode_absent_writes_nothing(monkeypatch, host):
    tree, kernel = host
    run(monkeypatch, {"pf": NVME_PF, "count": 3, "persistent": True})
    kernel.writes.clear()
    before = tree.snapshot()
    kind, result = run(monkeypatch, {"pf": NVME_PF, "state": "absent", "persistent": True}, check=True)
    assert kind == "exit" and result["changed"] and result["boot_files_changed"] == BOOT_FILES
    assert tree.snapshot() == before and kernel.writes == []


def test_records_only_when_the_live_count_is_already_right(monkeypatch, host):
    tree, kernel = host
    run(monkeypatch, {"pf": NVME_PF, "count": 2})
    kernel.writes.clear()
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 2, "persistent": True})
    assert kind == "exit" and result["changed"] is True and result["boot_files_changed"] == BOOT_FILES
    assert kernel.writes == [] and text(tree, CONF) == definitions("0000:01:00.0 2")


def test_dropping_one_pf_keeps_the_unit_then_the_last_removes_everything(monkeypatch, host):
    tree, _kernel = host
    run(monkeypatch, {"pf": NVME_PF, "count": 2, "persistent": True})
    run(monkeypatch, {"pf": SECOND_PF, "count": 5, "persistent": True})
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 0, "persistent": True})
    assert kind == "exit", result
    assert result["boot_files_changed"] == [CONF] and numvfs(tree) == 0
    assert text(tree, CONF) == definitions("0000:01:08.0 5")
    assert text(tree, UNIT) == _sriov.UNIT_TEXT and text(tree, LINK) == "-> " + UNIT
    kind, result = run(monkeypatch, {"pf": SECOND_PF, "state": "absent", "persistent": True})
    assert kind == "exit", result
    assert result["boot_files_changed"] == BOOT_FILES and numvfs(tree, SECOND_PF) == 0
    assert [text(tree, path) for path in BOOT_FILES] == [None] * 4
    kind, result = run(monkeypatch, {"pf": SECOND_PF, "state": "absent", "persistent": True})
    assert kind == "exit" and result["changed"] is False and result["boot_files_changed"] == []


def test_absent_of_an_unrecorded_pf_keeps_the_others(monkeypatch, host):
    tree, _kernel = host
    run(monkeypatch, {"pf": SECOND_PF, "count": 5, "persistent": True})
    kind, result = run(monkeypatch, {"pf": NVME_PF, "state": "absent", "persistent": True})
    assert kind == "exit" and result["changed"] is False and result["boot_files_changed"] == []
    assert text(tree, CONF) == definitions("0000:01:08.0 5") and text(tree, LINK) == "-> " + UNIT


def test_stale_link_is_removed(monkeypatch, host):
    tree, _kernel = host
    os.makedirs(os.path.dirname(tree.p(LINK)))
    os.symlink(UNIT, tree.p(LINK))
    kind, result = run(monkeypatch, {"pf": NVME_PF, "state": "absent", "persistent": True})
    assert kind == "exit" and result["changed"] and result["boot_files_changed"] == [LINK]
    assert not os.path.lexists(tree.p(LINK))


def test_missing_or_wrong_link_is_put_back(monkeypatch, host):
    tree, _kernel = host
    args = {"pf": NVME_PF, "count": 2, "persistent": True}
    run(monkeypatch, args)
    os.unlink(tree.p(LINK))
    kind, result = run(monkeypatch, args)
    assert kind == "exit" and result["changed"] and result["boot_files_changed"] == [LINK]
    assert text(tree, LINK) == "-> " + UNIT
    os.unlink(tree.p(LINK))
    os.symlink("/dev/null", tree.p(LINK))  # masked by hand
    kind, result = run(monkeypatch, args)
    assert kind == "exit" and result["boot_files_changed"] == [LINK] and text(tree, LINK) == "-> " + UNIT


def test_hand_edited_script_is_put_back(monkeypatch, host):
    tree, _kernel = host
    args = {"pf": NVME_PF, "count": 2, "persistent": True}
    run(monkeypatch, args)
    tree.write(SCRIPT, "#!/bin/sh\nexit 0\n")
    kind, result = run(monkeypatch, args)
    assert kind == "exit" and result["boot_files_changed"] == [SCRIPT]
    assert text(tree, SCRIPT) == _sriov.RESTORE_SCRIPT_TEXT


def test_not_persistent_leaves_the_records(monkeypatch, host):
    tree, _kernel = host
    run(monkeypatch, {"pf": NVME_PF, "count": 3, "persistent": True})
    before = {path: text(tree, path) for path in BOOT_FILES}
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 1})
    assert kind == "exit" and result["changed"] and result["boot_files_changed"] == []
    kind, result = run(monkeypatch, {"pf": NVME_PF, "state": "absent"})
    assert kind == "exit" and numvfs(tree) == 0
    assert {path: text(tree, path) for path in BOOT_FILES} == before


def test_failed_live_change_records_nothing(monkeypatch, host):
    tree, kernel = host
    kernel.refuse["/sriov_numvfs"] = errno.ENOMEM
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 3, "persistent": True})
    assert kind == "fail" and "Cannot allocate memory" in result["msg"]
    assert [text(tree, path) for path in BOOT_FILES] == [None] * 4


def test_refused_count_records_nothing(monkeypatch, host):
    tree, kernel = host
    before = tree.snapshot()
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 9, "persistent": True})
    assert kind == "fail" and result["msg"].startswith("cannot enable 9 VFs on 0000:01:00.0")
    assert tree.snapshot() == before and kernel.writes == []


def test_recording_failure_is_reported(monkeypatch, host):
    tree, _kernel = host
    tree.write("/etc/gpuops", "a file where the directory should be\n")
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 2, "persistent": True})
    assert kind == "fail"
    assert result["msg"].startswith("the VF count was set, but recording it for boot failed: ")
    # Since the shared error path: the live change is rolled back too, and the message says so.
    assert result["msg"].endswith("; rolled back: boot files put back; sriov_numvfs of 0000:01:00.0 set back to 0")
    assert result["rollback"] == "boot files put back; sriov_numvfs of 0000:01:00.0 set back to 0"
    assert numvfs(tree) == 0
    assert [text(tree, path) for path in BOOT_FILES] == [None] * 4


def files_only(tree):
    """The tree without its directories (those made on the way may stay)."""
    return {path: entry for path, entry in tree.snapshot().items() if entry != "<dir>"}


def test_failed_final_write_rolls_back_the_vfs_autoprobe_and_files(monkeypatch, host):
    # ansible-core 2.19's atomic_move raises a bare Exception; only OSError was caught, so the new VFs
    # stayed with half of the boot files written.
    tree, kernel = host
    run(monkeypatch, {"pf": NVME_PF, "count": 2})
    before = files_only(tree)
    failing_atomic_move(monkeypatch, SCRIPT)  # the last boot file written: the others are put back
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 3, "autoprobe": False, "persistent": True})
    assert kind == "fail", result
    rollback = ("boot files put back; sriov_drivers_autoprobe restored to 1; sriov_numvfs of 0000:01:00.0 set back "
                "to 2")
    assert result["msg"] == (
        "the VF count was set, but recording it for boot failed: writing %s failed: Could not replace "
        "'gpuops-sriov-restore' (File name too long); rolled back: %s" % (SCRIPT, rollback))
    assert result["rollback"] == rollback
    assert numvfs(tree) == 2
    assert [text(tree, path) for path in BOOT_FILES] == [None] * 4
    assert files_only(tree) == before


def test_failed_final_write_keeps_the_previous_records(monkeypatch, host):
    tree, _kernel = host
    run(monkeypatch, {"pf": SECOND_PF, "count": 5, "persistent": True})
    before = files_only(tree)
    failing_atomic_move(monkeypatch, CONF)
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 1, "persistent": True})
    assert kind == "fail", result
    assert result["msg"].endswith("; rolled back: boot files put back; sriov_numvfs of 0000:01:00.0 set back to 0")
    assert text(tree, CONF) == definitions("0000:01:08.0 5")
    assert files_only(tree) == before


def test_daemon_reload_only_when_the_unit_changes(monkeypatch, host):
    tree, _kernel = host
    os.makedirs(tree.p("/run/systemd/system"))
    commands = []
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path",
                        lambda _self, arg, required=False, opt_dirs=None: "/usr/bin/" + arg)
    monkeypatch.setattr(basic.AnsibleModule, "run_command",
                        lambda _self, args, **kwargs: commands.append(list(args)) or (0, "", ""))
    run(monkeypatch, {"pf": NVME_PF, "count": 2, "persistent": True})
    assert commands == [["/usr/bin/systemctl", "daemon-reload"]]
    run(monkeypatch, {"pf": SECOND_PF, "count": 2, "persistent": True})
    assert len(commands) == 1
    run(monkeypatch, {"pf": NVME_PF, "state": "absent", "persistent": True})
    run(monkeypatch, {"pf": SECOND_PF, "state": "absent", "persistent": True})
    assert len(commands) == 2


def test_gpu_facts_sees_the_recorded_pfs(monkeypatch, host):
    tree, _kernel = host
    run(monkeypatch, {"pf": SECOND_PF, "count": 5, "persistent": True})
    run(monkeypatch, {"pf": NVME_PF, "count": 2, "autoprobe": False, "persistent": True})
    assert _host.recorded_sriov_pfs(tree.root) == [NVME_PF, SECOND_PF]
    assert _host.host_summary(tree.root)["managed_files"]["sriov_definitions"] == [CONF]


# --------------------------------------------------------------------------- _sriov helpers


def test_parse_definitions():
    parsed = _sriov.parse_definitions(
        "# comment\n"
        "\n"
        "   \n"
        "0000:01:00.0 4\n"
        "  0000:02:00.0   8  1  \n"
        "0000:03:00.0 2 0\n"
        "0000:04:00.0 two\n"          # bad count: skipped
        "0000:05:00.0\n"              # too few fields
        "0000:06:00.0 1 1 extra\n"    # too many fields
        "#0000:07:00.0 1\n"
        "0000:01:00.0 6\n")           # a later line wins
    assert parsed == {"0000:01:00.0": (6, None), "0000:02:00.0": (8, True), "0000:03:00.0": (2, False)}


@pytest.mark.parametrize("value", [None, ""])
def test_parse_definitions_empty(value):
    assert _sriov.parse_definitions(value) == {}


def test_render_definitions():
    rendered = _sriov.render_definitions({"0000:b1:00.0": (4, None), "0000:01:00.0": (2, True),
                                          "0000:65:00.0": (1, False)})
    assert rendered == definitions("0000:01:00.0 2 1", "0000:65:00.0 1 0", "0000:b1:00.0 4")
    assert rendered.startswith("# Managed by gpuops.sandbox.sriov_vfs")
    assert _sriov.render_definitions({}) == _sriov.DEFINITIONS_HEADER


PF_ADDRESSES = hs.builds(lambda d, b, s, f: "%04x:%02x:%02x.%d" % (d, b, s, f),
                         hs.integers(0, 0xffff), hs.integers(0, 255), hs.integers(0, 31), hs.integers(0, 7))
ENTRIES = hs.dictionaries(PF_ADDRESSES, hs.tuples(hs.integers(0, 4096), hs.sampled_from([None, True, False])),
                          max_size=6)


@settings(max_examples=200, deadline=None)
@given(entries=ENTRIES)
def test_render_then_parse_round_trips(entries):
    rendered = _sriov.render_definitions(entries)
    assert _sriov.parse_definitions(rendered) == entries
    assert gpu_facts_recorded(rendered) == sorted(entries)


def gpu_facts_recorded(rendered):
    """gpu_facts' reading of the same file agrees with the module's."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "etc/gpuops"))
        with open(os.path.join(root, CONF.lstrip("/")), "w") as handle:
            handle.write(rendered)
        return _host.recorded_sriov_pfs(root)


@settings(max_examples=200, deadline=None)
@given(entries=ENTRIES, pf=PF_ADDRESSES, count=hs.integers(0, 64), autoprobe=hs.sampled_from([None, True, False]))
def test_persistence_wanted_property(entries, pf, count, autoprobe):
    current = _sriov.render_definitions(entries) if entries else None
    wanted = _sriov.persistence_wanted(current, pf, count, autoprobe)
    assert sorted(wanted) == sorted([CONF, SCRIPT, UNIT])
    expected = dict(entries)
    if count:
        expected[pf] = (count, autoprobe)
    else:
        expected.pop(pf, None)
    if expected:
        assert _sriov.parse_definitions(wanted[CONF]) == expected
        assert wanted[SCRIPT] == _sriov.RESTORE_SCRIPT_TEXT and wanted[UNIT] == _sriov.UNIT_TEXT
    else:
        assert wanted == {CONF: None, SCRIPT: None, UNIT: None}


def test_persistence_wanted_examples():
    assert _sriov.persistence_wanted(None, NVME_PF, 0, None) == {CONF: None, SCRIPT: None, UNIT: None}
    wanted = _sriov.persistence_wanted(None, NVME_PF, 4, None)
    assert wanted[CONF] == definitions("0000:01:00.0 4")
    wanted = _sriov.persistence_wanted(wanted[CONF], SECOND_PF, 2, False)
    assert wanted[CONF] == definitions("0000:01:00.0 4", "0000:01:08.0 2 0")
    wanted = _sriov.persistence_wanted(wanted[CONF], NVME_PF, 0, None)
    assert wanted[CONF] == definitions("0000:01:08.0 2 0")


@pytest.mark.parametrize("shell", ["sh", "dash", "bash"])
def test_restore_script_parses(tmp_path, shell):
    binary = shutil.which(shell)
    if binary is None:
        pytest.skip("%s is not installed" % shell)
    script = tmp_path / "restore"
    script.write_text(_sriov.RESTORE_SCRIPT_TEXT)
    done = subprocess.run([binary, "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert _sriov.RESTORE_SCRIPT_TEXT.startswith("#!/bin/sh\n")
    assert "conf=${1:-%s}" % CONF in _sriov.RESTORE_SCRIPT_TEXT


def test_restore_script_with_no_entries_exits_cleanly(tmp_path):
    """A definitions file with only comments never touches /sys: the loop body is not entered."""
    conf = tmp_path / "sriov-vfs.conf"
    conf.write_text(_sriov.DEFINITIONS_HEADER)
    script = tmp_path / "restore"
    script.write_text(_sriov.RESTORE_SCRIPT_TEXT)
    done = subprocess.run(["/bin/sh", str(script), str(conf)], capture_output=True, text=True, check=False,
                          timeout=30)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""


def test_restore_script_gives_up_on_a_missing_pf(tmp_path):
    """A PF that never appears is retried GPUOPS_SRIOV_TRIES times, then reported (nothing is written)."""
    conf = tmp_path / "sriov-vfs.conf"
    conf.write_text(definitions("ffff:ff:1f.7 2"))
    script = tmp_path / "restore"
    script.write_text(_sriov.RESTORE_SCRIPT_TEXT)
    if os.path.exists("/sys/bus/pci/devices/ffff:ff:1f.7"):
        pytest.skip("the host has the made-up PCI address")
    done = subprocess.run(["/bin/sh", str(script), str(conf)], capture_output=True, text=True, check=False,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GPUOPS_SRIOV_TRIES": "1"},
                          timeout=30)
    assert done.returncode == 1
    assert "gave up after 1 attempts" in done.stderr and "ffff:ff:1f.7 2" in done.stderr


def test_persistent_run_without_autoprobe_keeps_the_recorded_autoprobe(monkeypatch, host):
    tree, _kernel = host
    run(monkeypatch, {"pf": NVME_PF, "count": 2, "autoprobe": False, "persistent": True})
    kind, result = run(monkeypatch, {"pf": NVME_PF, "count": 2, "persistent": True})
    assert kind == "exit" and result["autoprobe"] is False
    assert text(tree, CONF) == definitions("0000:01:00.0 2 0")
    assert result["changed"] is False
