# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""host_lock on a fake root (tmp_path with proc/sys/kernel/random/boot_id) with an injected clock."""

from __future__ import annotations

import datetime
import fcntl
import json
import multiprocessing
import os
import stat
import traceback

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ansible.module_utils import basic

from ansible_collections.gpuops.sandbox.plugins.module_utils import _lock
from ansible_collections.gpuops.sandbox.plugins.modules import host_lock
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import raise_on_exit, run_main
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sysfs_tree import HOSTILE_VALUES, failing_atomic_move

BOOT1 = "3f1c9a52-6d0b-4e8f-a1b2-0c9d8e7f6a51"
BOOT2 = "9b7e2d14-58a3-4c6f-b0e1-d2c3b4a59687"
T0 = datetime.datetime(2026, 5, 9, 7, 0, 0, tzinfo=datetime.timezone.utc)
RUN_A = "ctl-1:4242:20260509T070000"
OWNER_A = "alice@ctl-1 pid 4242, playbooks/prepare_hosts.yml"
RUN_B = "awx-42"
OWNER_B = "AWX job 42 (Prepare GPU nodes)"
LOCK = _lock.LOCK_FILE
A = {"run_id": RUN_A, "owner": OWNER_A}
B = {"run_id": RUN_B, "owner": OWNER_B}


class Host:
    """A fake root with a boot id, a clock the test moves, and the warnings the module gave."""

    def __init__(self, root):
        self.root = str(root)
        self.moment = T0
        self.warnings = []
        os.makedirs(self.p("/proc/sys/kernel/random"))
        self.boot(BOOT1)

    def p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def boot(self, boot_id):
        with open(self.p(_lock.BOOT_ID_FILE), "w") as handle:
            handle.write(boot_id + "\n")

    def later(self, seconds):
        self.moment += datetime.timedelta(seconds=seconds)

    def raw(self):
        path = self.p(LOCK)
        if not os.path.lexists(path):
            return None
        with open(path, "rb") as handle:
            return handle.read()

    def record(self):
        raw = self.raw()
        return None if raw is None else json.loads(raw.decode("ascii"))

    def put(self, content):
        os.makedirs(os.path.dirname(self.p(LOCK)), exist_ok=True)
        with open(self.p(LOCK), "wb") as handle:
            handle.write(content if isinstance(content, bytes) else content.encode("utf-8"))

    def snapshot(self):
        found = {}
        for top, dirs, files in os.walk(self.root):
            for name in dirs + files:
                path = os.path.join(top, name)
                info = os.lstat(path)
                content = None
                if stat.S_ISREG(info.st_mode):
                    with open(path, "rb") as handle:
                        content = handle.read()
                found[os.path.relpath(path, self.root)] = (stat.S_IMODE(info.st_mode), content)
        return found


@pytest.fixture
def host(tmp_path, monkeypatch):
    raise_on_exit(monkeypatch)
    fake = Host(tmp_path / "root")
    monkeypatch.setattr(_lock, "now", lambda: fake.moment)
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: fake.warnings.append(text))
    return fake


def run(host, args, check=False, diff=False):
    """Run the module on the fake root; return (result, failed)."""
    return run_main(host_lock, host.root, args, check=check, diff=diff)


def ok(host, args, check=False, diff=False):
    result, failed = run(host, args, check=check, diff=diff)
    assert not failed, result
    return result


def record_of(run_id, owner, started, updated, boot_id, expect_reboot=False):
    return {"run_id": run_id, "owner": owner, "started": started, "updated": updated, "boot_id": boot_id,
            "expect_reboot": expect_reboot}


# --------------------------------------------------------------------------- taking and refreshing


def test_acquire_on_a_clean_host(host):
    old = os.umask(0o077)
    try:
        result = ok(host, A)
    finally:
        os.umask(old)
    expected = record_of(RUN_A, OWNER_A, "2026-05-09T07:00:00Z", "2026-05-09T07:00:00Z", BOOT1)
    assert result["changed"] is True and result["action"] == "acquired"
    assert result["record"] == expected and host.record() == expected
    assert result["held_by"] is None and result["took_over"] is None and result["lock_file"] == LOCK
    assert host.raw() == _lock.render(expected).encode("ascii")
    assert stat.S_IMODE(os.stat(host.p(LOCK)).st_mode) == 0o644
    for directory in ("/var", "/var/lib", "/var/lib/gpuops"):
        assert stat.S_IMODE(os.stat(host.p(directory)).st_mode) == 0o755, directory
    assert os.listdir(host.p("/var/lib/gpuops")) == ["lock.json"]  # no temp file, no side file
    assert host.warnings == []


def test_the_record_reaches_the_disk_before_it_replaces_the_old_one(host, monkeypatch):
    # A power loss after the rename but before writeback left an empty lock.json on the lab (ext4): the new
    # record's data must be synced before the move, and the directory (the move itself) after it.
    events = []
    real_fsync, real_move = os.fsync, basic.AnsibleModule.atomic_move

    def fsync(fd):
        path = os.readlink("/proc/self/fd/%d" % fd)
        events.append(("fsync", os.path.basename(path) if not os.path.isdir(path) else "dir:" + os.path.basename(path),
                       os.path.getsize(path) if not os.path.isdir(path) else None))
        return real_fsync(fd)

    def atomic_move(self, src, dest, *args, **kwargs):
        events.append(("move", os.path.basename(dest), None))
        return real_move(self, src, dest, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(basic.AnsibleModule, "atomic_move", atomic_move)
    ok(host, A)
    moved = events.index(("move", "lock.json", None))
    before, after = events[:moved], events[moved + 1:]
    # The temp file, with the whole record in it, was synced before the move.
    assert [e for e in before if e[0] == "fsync" and e[1].startswith(".gpuops-") and e[2] == len(host.raw())], events
    assert ("fsync", "dir:gpuops", None) in after, events


def test_refresh_of_the_same_run_moves_only_updated_and_is_no_change(host):
    ok(host, A)
    host.later(300)
    before = host.snapshot()
    result = ok(host, A, check=True)
    assert result["changed"] is False and result["action"] == "refreshed" and host.snapshot() == before
    result = ok(host, A)
    assert result["changed"] is False and result["action"] == "refreshed"
    assert host.record() == record_of(RUN_A, OWNER_A, "2026-05-09T07:00:00Z", "2026-05-09T07:05:00Z", BOOT1)
    assert result["record"] == host.record() and host.warnings == []


def test_refresh_that_changes_the_owner_or_announces_a_reboot_is_a_change(host):
    ok(host, A)
    result = ok(host, dict(A, owner="alice@ctl-1 pid 4242, playbooks/site.yml"))
    assert result["changed"] is True and result["action"] == "refreshed"
    assert host.record()["owner"] == "alice@ctl-1 pid 4242, playbooks/site.yml"
    result = ok(host, dict(A, expect_reboot=True))
    assert result["changed"] is True and host.record()["expect_reboot"] is True
    assert ok(host, dict(A, expect_reboot=True))["changed"] is False


def test_non_ascii_owner_is_kept_in_an_ascii_file(host):
    ok(host, {"run_id": RUN_A, "owner": "Zoë Ångström @ ctl-1"})
    assert host.raw().decode("ascii")
    assert host.record()["owner"] == "Zoë Ångström @ ctl-1"
    assert ok(host, {"run_id": RUN_A, "owner": "Zoë Ångström @ ctl-1"})["changed"] is False


# --------------------------------------------------------------------------- another run holds the lock


def test_conflict_names_owner_run_and_age_and_changes_nothing(host):
    ok(host, A)
    host.later(125)
    before = host.snapshot()
    for check in (True, False):
        result, failed = run(host, B, check=check)
        assert failed and result["changed"] is False
        assert result["msg"] == (
            "the gpuops host lock of %s (/var/lib/gpuops/lock.json) is held by another run: %s (run %s), started "
            "2026-05-09T07:00:00Z, last refreshed 125 s ago; wait for it to finish, or when that run is gone, run "
            "again with break=true (gpuops_host_lock_break=true in the playbooks) or wait until it goes stale "
            "3600 s after its last refresh (in 3476 s); nothing was changed" % (_lock.hostname(), OWNER_A, RUN_A))
        assert result["held_by"] == dict(host.record(), age=125)
        assert result["lock_file"] == LOCK
        assert host.snapshot() == before


def test_conflict_says_the_holder_announced_a_reboot(host):
    ok(host, dict(A, expect_reboot=True))
    result, failed = run(host, B)
    assert failed and "(it announced a reboot of the host)" in result["msg"]


def test_owner_of_a_record_is_shown_escaped(host):
    host.put(_lock.render(record_of(RUN_A, "evil\x1b[31m\nowner", "2026-05-09T07:00:00Z", "2026-05-09T07:00:00Z",
                                    BOOT1)))
    result, failed = run(host, B)
    assert failed and "evil\\x1b[31m\\nowner (run %s)" % RUN_A in result["msg"]
    assert "\x1b" not in result["msg"] and "\n" not in result["msg"]


def test_stale_by_boot_id_is_taken_over(host):
    ok(host, A)
    host.boot(BOOT2)
    host.later(60)
    result = ok(host, B)
    assert result["changed"] is True and result["action"] == "taken_over"
    took = result["took_over"]
    assert took["reason"] == "boot" and took["run_id"] == RUN_A and took["owner"] == OWNER_A
    assert took["boot_id"] == BOOT1 and "did not announce a reboot" in took["why"] and BOOT2 in took["why"]
    assert host.record() == record_of(RUN_B, OWNER_B, "2026-05-09T07:01:00Z", "2026-05-09T07:01:00Z", BOOT2)
    assert len(host.warnings) == 1 and OWNER_A in host.warnings[0] and RUN_A in host.warnings[0]


def test_not_stale_across_the_holders_own_announced_reboot(host):
    ok(host, A)
    assert ok(host, dict(A, expect_reboot=True))["changed"] is True
    host.boot(BOOT2)
    host.later(200)
    result, failed = run(host, B)
    assert failed and "(it rebooted the host and has not refreshed the lock since)" in result["msg"]
    result = ok(host, A)  # the run is back after its reboot
    assert result["changed"] is True and result["action"] == "refreshed" and result["took_over"] is None
    assert host.record() == record_of(RUN_A, OWNER_A, "2026-05-09T07:00:00Z", "2026-05-09T07:03:20Z", BOOT2)
    assert host.warnings == []
    host.later(10)
    assert ok(host, A)["changed"] is False


def test_own_run_after_an_unannounced_reboot_keeps_the_lock_and_warns(host):
    ok(host, A)
    host.boot(BOOT2)
    result = ok(host, A)
    assert result["action"] == "refreshed" and result["changed"] is True and host.record()["boot_id"] == BOOT2
    assert len(host.warnings) == 1 and "had not announced a reboot" in host.warnings[0]


def test_stale_by_age(host):
    ok(host, A)
    host.later(3600)
    result, failed = run(host, B)
    assert failed and "last refreshed 3600 s ago" in result["msg"] and "(in 1 s)" in result["msg"]
    host.later(1)
    result = ok(host, B)
    assert result["action"] == "taken_over" and result["took_over"]["reason"] == "age"
    assert result["took_over"]["why"] == "its last refresh was 3601 s ago, more than stale_after=3600 s"
    assert host.record()["run_id"] == RUN_B


def test_stale_after_is_the_callers(host):
    ok(host, A)
    host.later(61)
    assert run(host, B)[1] is True
    result = ok(host, dict(B, stale_after=60))
    assert result["took_over"]["reason"] == "age"


def test_a_refresh_keeps_the_lock_from_going_stale(host):
    ok(host, A)
    host.later(3000)
    ok(host, A)
    host.later(3000)
    result, failed = run(host, B)
    assert failed and "last refreshed 3000 s ago" in result["msg"]


def test_clock_that_went_back(host):
    ok(host, A)
    host.later(-120)
    result, failed = run(host, B)
    assert failed and "last refreshed 120 s in the future by the host clock (the clock went back)" in result["msg"]
    assert "(in 3721 s)" in result["msg"] and result["held_by"]["age"] == -120


def test_break_takes_over_a_live_lock(host):
    ok(host, A)
    host.later(30)
    before = host.snapshot()
    result = ok(host, dict(B, **{"break": True}), check=True)
    assert result["changed"] is True and result["action"] == "taken_over" and host.snapshot() == before
    assert result["record"]["run_id"] == RUN_B
    result = ok(host, dict(B, **{"break": True}))
    took = result["took_over"]
    assert took["reason"] == "break" and took["run_id"] == RUN_A and took["owner"] == OWNER_A
    assert took["why"] == "break=true (the lock was not stale: last refreshed 30 s ago)"
    assert host.record()["run_id"] == RUN_B
    assert any(OWNER_A in w and "break=true" in w for w in host.warnings)


def test_break_on_a_stale_lock_reports_why_it_was_stale(host):
    ok(host, A)
    host.boot(BOOT2)
    assert ok(host, dict(B, **{"break": True}))["took_over"]["reason"] == "boot"


def test_break_on_our_own_lock_is_a_refresh(host):
    ok(host, A)
    result = ok(host, dict(A, **{"break": True}))
    assert result["action"] == "refreshed" and result["took_over"] is None and result["changed"] is False


# --------------------------------------------------------------------------- releasing


def test_release_our_own_lock(host):
    ok(host, A)
    before = host.snapshot()
    result = ok(host, {"run_id": RUN_A, "state": "absent"}, check=True)
    assert result["changed"] is True and result["action"] == "released" and host.snapshot() == before
    result = ok(host, {"run_id": RUN_A, "state": "absent"})
    assert result["changed"] is True and result["action"] == "released" and result["record"] is None
    assert host.raw() is None and os.path.isdir(host.p("/var/lib/gpuops"))
    result = ok(host, {"run_id": RUN_A, "state": "absent"})
    assert result["changed"] is False and result["action"] == "none" and host.warnings == []


def test_release_on_a_host_that_never_had_a_lock_creates_nothing(host):
    before = host.snapshot()
    result = ok(host, {"run_id": RUN_A, "state": "absent"})
    assert result["changed"] is False and result["action"] == "none" and host.snapshot() == before


def test_release_of_someone_elses_lock_changes_nothing_and_warns(host):
    ok(host, A)
    host.later(42)
    before = host.snapshot()
    result = ok(host, {"run_id": RUN_B, "state": "absent"})
    assert result["changed"] is False and result["action"] == "none" and host.snapshot() == before
    assert result["held_by"] == dict(host.record(), age=42) and result["record"] == host.record()
    assert host.warnings == ["the host lock /var/lib/gpuops/lock.json is held by another run, %s (run %s, started "
                             "2026-05-09T07:00:00Z, last refreshed 42 s ago); it was left in place" % (OWNER_A, RUN_A)]


def test_release_with_break_removes_someone_elses_lock(host):
    ok(host, A)
    result = ok(host, {"run_id": RUN_B, "state": "absent", "break": True})
    assert result["changed"] is True and result["action"] == "released" and host.raw() is None
    assert result["took_over"]["run_id"] == RUN_A and result["took_over"]["reason"] == "break"


# --------------------------------------------------------------------------- records that are not valid

GOOD = json.loads(_lock.render(record_of(RUN_A, OWNER_A, "2026-05-09T07:00:00Z", "2026-05-09T07:00:00Z", BOOT1)))
CORRUPT = [
    ("", "it is not JSON"),
    ("{\"run_id\": \"a\"", "it is not JSON"),
    (b"\xff\xfe\x00garbage", "it is not JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    ("null", "a JSON NoneType, not an object"),
    (json.dumps({"run_id": RUN_A}), "no owner, started, updated, boot_id, expect_reboot"),
    (json.dumps(dict(GOOD, run_id="a b")), "run_id 'a b' is not a run id"),
    (json.dumps(dict(GOOD, owner=7)), "owner 7 is not a text"),
    (json.dumps(dict(GOOD, updated="yesterday")), "updated 'yesterday' is not a UTC timestamp"),
    (json.dumps(dict(GOOD, started="2026-13-40T99:00:00Z")), "started '2026-13-40T99:00:00Z' is not a UTC"),
    (json.dumps(dict(GOOD, boot_id=None)), "boot_id None is not a text"),
    (json.dumps(dict(GOOD, expect_reboot="yes")), "expect_reboot 'yes' is not true or false"),
    ("x" * (_lock.MAX_RECORD_BYTES + 1), "it is larger than 65536 bytes"),
    # Nested deeper than Python's parser recurses (RecursionError, not ValueError), yet within the size limit.
    ("[" * 60000 + "]" * 5000, "it is not JSON"),
]


@pytest.mark.parametrize("content, problem", CORRUPT)
def test_corrupt_record_fails_naming_the_file_and_the_remedy(host, content, problem):
    host.put(content)
    before = host.snapshot()
    result, failed = run(host, B)
    assert failed and result["changed"] is False and host.snapshot() == before
    assert result["msg"].startswith("the gpuops host lock /var/lib/gpuops/lock.json on %s is not a valid lock "
                                    "record: " % _lock.hostname())
    assert problem in result["msg"], result["msg"]
    assert result["msg"].endswith("; if no other run is preparing this host, run again with break=true "
                                  "(gpuops_host_lock_break=true in the playbooks), which replaces it, or remove the "
                                  "file; nothing was changed")
    assert "Traceback" not in result["msg"]


@pytest.mark.parametrize("content, problem", CORRUPT[:4])
def test_break_replaces_a_corrupt_record(host, content, problem):
    host.put(content)
    result = ok(host, dict(B, **{"break": True}))
    assert result["action"] == "taken_over" and result["took_over"]["reason"] == "corrupt"
    assert problem in result["took_over"]["why"] and result["took_over"]["run_id"] is None
    assert host.record()["run_id"] == RUN_B
    assert any("replaced the invalid host lock" in w for w in host.warnings)


def test_release_leaves_a_corrupt_record_with_a_warning(host):
    host.put("{")
    before = host.snapshot()
    result = ok(host, {"run_id": RUN_A, "state": "absent"})
    assert result["changed"] is False and host.snapshot() == before
    assert len(host.warnings) == 1 and "not a valid lock record" in host.warnings[0]
    result = ok(host, {"run_id": RUN_A, "state": "absent", "break": True})
    assert result["changed"] is True and host.raw() is None and result["took_over"]["reason"] == "corrupt"


def test_unreadable_record_is_reported_as_such(host, monkeypatch):
    host.put(_lock.render(GOOD))
    real_open = open

    def failing_open(path, *args, **kwargs):
        if str(path).endswith("lock.json"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    result, failed = run(host, B)
    monkeypatch.setattr("builtins.open", real_open)
    assert failed and "it cannot be read: [Errno 13] Permission denied" in result["msg"]


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_something_else_in_place_of_the_record_is_never_replaced(host, kind):
    os.makedirs(host.p("/var/lib/gpuops"))
    if kind == "directory":
        os.mkdir(host.p(LOCK))
    else:
        host.put(_lock.render(GOOD))
        os.rename(host.p(LOCK), host.p("/var/lib/gpuops/elsewhere"))
        os.symlink("elsewhere", host.p(LOCK))
    before = host.snapshot()
    for args in (B, dict(B, **{"break": True}), {"run_id": RUN_A, "state": "absent", "break": True}):
        result, failed = run(host, args)
        assert failed and result["msg"] == (
            "the host lock /var/lib/gpuops/lock.json is a %s, not a file written by host_lock; remove it by hand "
            "once no preparation runs on this host; nothing was changed" % kind)
        assert host.snapshot() == before


# --------------------------------------------------------------------------- options


BAD_OPTIONS = [
    ({"run_id": ""}, "run_id '' is not valid: expected 1 to 128 of the characters A-Z a-z 0-9 . _ : -"),
    ({"run_id": "a b"}, "run_id 'a b' is not valid"),
    ({"run_id": "awx-42\n"}, "run_id 'awx-42\\n' is not valid"),
    ({"run_id": "run/1"}, "run_id 'run/1' is not valid"),
    ({"run_id": "r\u00fcn"}, "run_id 'r\u00fcn' is not valid"),
    ({"run_id": "\u0661\u0662"}, "is not valid"),
    ({"run_id": "x" * 129}, "(129 characters)"),
    ({"owner": ""}, "owner must be a non-empty text"),
    ({"owner": "   "}, "owner must be a non-empty text"),
    ({"owner": "x" * 513}, "owner must be at most 512 characters, got 513 characters"),
    ({"owner": "alice\nbob"}, "owner must not contain control or format characters, got '\\n' at position 5"),
    ({"owner": "a\tb"}, "got '\\t' at position 1"),
    ({"owner": "\x1b[31mred"}, "got '\\x1b' at position 0"),
    ({"owner": "evil\u202eowner"}, "got '\\u202e' at position 4"),
    ({"owner": "zero\u200bwidth"}, "got '\\u200b' at position 4"),
    ({"stale_after": 59}, "stale_after must be 60 to 604800 seconds, got 59"),
    ({"stale_after": 604801}, "stale_after must be 60 to 604800 seconds, got 604801"),
    ({"stale_after": -1}, "stale_after must be 60 to 604800 seconds, got -1"),
    ({"stale_after": True}, "stale_after must be a whole number of seconds, got True"),
    ({"stale_after": 10 ** 30}, "stale_after must be 60 to 604800 seconds, got a number of 31 digits"),
    ({"stale_after": "inf"}, "stale_after='inf': expected a whole number of a sensible size"),
    ({"stale_after": "9" * 5000}, "expected a whole number of a sensible size"),
]


@pytest.mark.parametrize("bad, text", BAD_OPTIONS)
@pytest.mark.parametrize("state", ["present", "absent"])
def test_bad_options_name_the_value_and_change_nothing(host, bad, text, state):
    # Every option is checked whatever the state (owner too, when given).
    ok(host, A)
    before = host.snapshot()
    result, failed = run(host, dict(B, state=state, **bad))
    assert failed and result.get("changed", False) is False, result
    assert text in result["msg"], result["msg"]
    assert "nothing was changed" in result["msg"]
    assert host.snapshot() == before


def test_bad_options_on_a_clean_host_create_no_directory(host):
    before = host.snapshot()
    for bad in BAD_OPTIONS:
        result, failed = run(host, dict(B, **bad[0]))
        assert failed, (bad, result)
    assert host.snapshot() == before


def test_owner_is_required_to_take_the_lock_only(host):
    result, failed = run(host, {"run_id": RUN_A})
    assert failed and "owner" in result["msg"] and host.snapshot().get("var") is None
    assert ok(host, {"run_id": RUN_A, "state": "absent"})["changed"] is False


def test_unknown_option_is_refused(host):
    result, failed = run(host, dict(A, bogus=1))
    assert failed and "bogus" in result["msg"]


# --------------------------------------------------------------------------- check mode, diff, failures


def test_check_mode_writes_nothing(host):
    before = host.snapshot()
    result = ok(host, A, check=True)
    assert result["changed"] is True and result["action"] == "acquired"
    assert result["record"] == record_of(RUN_A, OWNER_A, "2026-05-09T07:00:00Z", "2026-05-09T07:00:00Z", BOOT1)
    assert host.snapshot() == before  # not even the directory
    ok(host, A)
    host.boot(BOOT2)
    before = host.snapshot()
    result = ok(host, B, check=True)
    assert result["action"] == "taken_over" and result["took_over"]["reason"] == "boot" and host.snapshot() == before


def test_diff_shows_the_record_before_and_after(host):
    result = ok(host, A, diff=True)
    assert result["diff"] == {"before_header": LOCK, "after_header": LOCK, "before": "",
                              "after": _lock.render(host.record())}
    old = _lock.render(host.record())
    host.later(5)
    result = ok(host, A, diff=True, check=True)
    assert result["diff"]["before"] == old and '"updated": "2026-05-09T07:00:05Z"' in result["diff"]["after"]
    result = ok(host, {"run_id": RUN_A, "state": "absent"}, diff=True)
    assert result["diff"]["before"] == old and result["diff"]["after"] == ""
    ok(host, A)
    result = ok(host, {"run_id": RUN_B, "state": "absent"}, diff=True)
    assert result["diff"]["before"] == result["diff"]["after"] != ""


def test_missing_boot_id_fails_clearly(host):
    os.unlink(host.p(_lock.BOOT_ID_FILE))
    result, failed = run(host, A)
    assert failed and result["msg"].startswith("cannot read the boot id of the host from "
                                               "/proc/sys/kernel/random/boot_id (")
    assert host.snapshot().get("var") is None


def test_garbage_boot_id_fails_clearly(host):
    host.boot("not a boot id")
    result, failed = run(host, A)
    assert failed and result["msg"] == ("the boot id in /proc/sys/kernel/random/boot_id is not valid "
                                        "('not a boot id'); nothing was changed")


def test_failed_write_leaves_the_old_record(host, monkeypatch):
    ok(host, A)
    before = host.raw()
    host.later(10)
    failing_atomic_move(monkeypatch, "lock.json")
    result, failed = run(host, A)
    assert failed and result["msg"].startswith("writing /var/lib/gpuops/lock.json failed: Could not replace "
                                               "'lock.json'")
    assert host.raw() == before and os.listdir(host.p("/var/lib/gpuops")) == ["lock.json"]


def test_directory_that_cannot_be_made_fails_clearly(host):
    os.makedirs(host.p("/var/lib"))
    with open(host.p("/var/lib/gpuops"), "w") as handle:
        handle.write("a file in the way")
    result, failed = run(host, A)
    assert failed and result["msg"].startswith("cannot create the directory /var/lib/gpuops of the host lock: ")


def test_flock_held_too_long_fails_clearly(host, monkeypatch):
    os.makedirs(host.p("/var/lib/gpuops"))
    clock = [0.0]
    monkeypatch.setattr(_lock, "_monotonic", lambda: clock[0])
    monkeypatch.setattr(_lock, "_sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    fd = os.open(host.p("/var/lib/gpuops"), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        result, failed = run(host, A)
    finally:
        os.close(fd)
    assert failed and result["msg"] == ("another host_lock call has held the flock on /var/lib/gpuops for more "
                                        "than 10 s; nothing was changed")
    assert host.raw() is None
    assert ok(host, A)["action"] == "acquired"


# --------------------------------------------------------------------------- two runs at the same instant


def _contender(root, args, barrier, queue):
    """A child process: wait for the other, then run the module once; put (run_id, result, failed) on queue."""
    try:
        barrier.wait(10)
        result, failed = run_main(host_lock, root, args)
        queue.put((args["run_id"], result, failed))
    except BaseException:  # pylint: disable=broad-exception-caught
        queue.put((args["run_id"], {"msg": traceback.format_exc()}, None))


def race(host, monkeypatch, hold=0.3):
    """Start two processes taking the lock at once; the read-check-write of each is made to last ``hold``
    seconds (sleep after the read), so without the flock both would read no record and both would win."""
    real_read = _lock.read_record

    def slow_read(root):
        found = real_read(root)
        _lock.time.sleep(hold)
        return found

    monkeypatch.setattr(_lock, "read_record", slow_read)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    queue = context.Queue()
    contenders = [context.Process(target=_contender, args=(host.root, args, barrier, queue)) for args in (A, B)]
    for process in contenders:
        process.start()
    outcomes = [queue.get(timeout=30) for _process in contenders]
    for process in contenders:
        process.join(10)
    for run_id, result, failed in outcomes:
        assert failed is not None, (run_id, result["msg"])
    return outcomes


def test_two_runs_at_the_same_instant_exactly_one_wins(host, monkeypatch):
    outcomes = race(host, monkeypatch)
    winners = [o for o in outcomes if not o[2]]
    losers = [o for o in outcomes if o[2]]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    winner = winners[0][0]
    assert host.record()["run_id"] == winner
    owner = OWNER_A if winner == RUN_A else OWNER_B
    assert "is held by another run: %s (run %s)" % (owner, winner) in losers[0][1]["msg"]


def test_without_the_flock_both_would_win(host, monkeypatch):
    # The control for the test above: it fails for the reason the flock is there.
    monkeypatch.setattr(_lock.fcntl, "flock", lambda fd, how: None)
    outcomes = race(host, monkeypatch)
    assert [o[2] for o in outcomes] == [False, False], outcomes


# --------------------------------------------------------------------------- fuzzing

_SAMPLES = [RUN_A, RUN_B, OWNER_A, OWNER_B, "present", "absent", "x" * 129, "o" * 513, "a\nb", "\u202e", "-", ":",
            "60", "604800", "3600", "yes", "no", "on"]
_text = hs.one_of(hs.text(max_size=20), hs.sampled_from(_SAMPLES))
_value = hs.one_of(hs.none(), hs.booleans(), hs.integers(-10, 10 ** 6), _text, hs.lists(_text, max_size=2),
                   hs.dictionaries(hs.text(max_size=5), hs.integers(), max_size=2), hs.sampled_from(HOSTILE_VALUES))
_args = hs.dictionaries(hs.sampled_from(["state", "run_id", "owner", "expect_reboot", "stale_after", "break",
                                         "bogus"]), _value, max_size=6)
_BEFORE = {
    "none": None,
    "ours": _lock.render(record_of(RUN_A, OWNER_A, "2026-05-09T06:00:00Z", "2026-05-09T06:59:00Z", BOOT1)),
    "theirs": _lock.render(record_of(RUN_B, OWNER_B, "2026-05-09T06:00:00Z", "2026-05-09T06:59:00Z", BOOT1)),
    "rebooted": _lock.render(record_of(RUN_B, OWNER_B, "2026-05-09T06:00:00Z", "2026-05-09T06:59:00Z", BOOT2)),
    "corrupt": "{\"run_id\": ",
}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=_args, before=hs.sampled_from(sorted(_BEFORE)), check=hs.booleans(), minutes=hs.integers(-90, 200))
def test_fuzz_arguments_end_cleanly(monkeypatch, tmp_path_factory, args, before, check, minutes):
    raise_on_exit(monkeypatch)
    fake = Host(tmp_path_factory.mktemp("fuzz"))
    fake.later(minutes * 60)
    monkeypatch.setattr(_lock, "now", lambda: fake.moment)
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: fake.warnings.append(text))
    if _BEFORE[before] is not None:
        fake.put(_BEFORE[before])
    snapshot = fake.snapshot()
    result, failed = run_main(host_lock, fake.root, args, check=check)
    assert isinstance(result["msg"] if failed else result["changed"], (str, bool))
    if failed:
        assert result["msg"] and "Traceback" not in result["msg"] and "unexpectedly" not in result["msg"]
        assert fake.snapshot() == snapshot
    else:
        assert isinstance(result["changed"], bool) and result["action"] in (
            "acquired", "refreshed", "taken_over", "released", "none")
        if check:
            assert fake.snapshot() == snapshot
        elif result["record"] is not None:
            assert fake.record() == result["record"]
