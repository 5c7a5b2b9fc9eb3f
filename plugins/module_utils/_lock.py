# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The host lock of a preparation run (module host_lock): its record, its checks and its critical section.

This file is private to the gpuops.sandbox collection: its interface may change at any time.

The lock is the JSON record ``LOCK_FILE`` (run_id, owner, started, updated, boot_id, expect_reboot). One module
call reads, checks and writes it while it holds ``fcntl.flock(LOCK_EX)`` on the record's directory, so two
calls at the same instant are serialised; the record is written atomically (``_persist.write_text``). The
directory is locked rather than a side file: nothing extra lies on the disk to be removed by hand in the
middle of a call, and check mode can take the same lock without writing anything.

Every function takes ``root`` (``/`` on a host, a temp dir in unit tests). Unit tests replace ``now``
(the wall clock of the records), ``_sleep`` and ``_monotonic`` (the wait for the flock).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import re
import socket
import stat
import time
import unicodedata

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError, shown
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path

LOCK_FILE = "/var/lib/gpuops/lock.json"
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
RUN_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_OWNER = 512
STALE_MIN = 60
STALE_MAX = 604800
# How long a call waits for another call's read-check-write (milliseconds in practice) before failing.
FLOCK_WAIT = 10
FLOCK_POLL = 0.05
# A record is a few hundred bytes; anything much larger is not one (and is not read whole).
MAX_RECORD_BYTES = 65536
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
FIELDS = ("run_id", "owner", "started", "updated", "boot_id", "expect_reboot")
BREAK_HINT = "break=true (gpuops_host_lock_break=true in the playbooks)"
# Characters refused in owner: control, format (bidirectional overrides, zero-width), surrogates, line and
# paragraph separators. They would garble or disguise the messages that quote the owner.
REFUSED_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")

_sleep = time.sleep
_monotonic = time.monotonic


class LockError(GpuopsError):
    """A bad option, an unreadable record or boot id, or the lock held by another run (``held_by`` in extra)."""


def now():
    """The host's wall clock, in UTC (unit tests replace this function)."""
    return datetime.datetime.now(datetime.timezone.utc)


def stamp(moment):
    """``moment`` as the records write it: ``2026-05-09T07:35:25Z``."""
    return moment.astimezone(datetime.timezone.utc).strftime(TIME_FORMAT)


def parse_stamp(text):
    """The UTC datetime of a record's timestamp, or None when ``text`` is not one."""
    if not isinstance(text, str) or len(text) != 20:
        return None
    try:
        return datetime.datetime.strptime(text, TIME_FORMAT).replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return None


def printable(text, limit=MAX_OWNER):
    """``text`` of a record for a message: control and format characters escaped, at most ``limit`` characters."""
    text = "".join(c if unicodedata.category(c) not in REFUSED_CATEGORIES else repr(c)[1:-1] for c in str(text))
    return text if len(text) <= limit else text[:limit] + "..."


def hostname():
    try:
        return socket.gethostname() or "this host"
    except (OSError, UnicodeError):
        return "this host"


# --------------------------------------------------------------------------- options


def check_run_id(value):
    if not isinstance(value, str) or not RUN_ID_RE.fullmatch(value):
        raise LockError("run_id %s is not valid: expected 1 to 128 of the characters A-Z a-z 0-9 . _ : - "
                        "(for example awx-job-42 or ctl-1:4242:20260509T073525); nothing was changed" % shown(value))
    return value


def check_owner(value):
    """``value`` when it is a usable owner text; None stays None (the module requires it for state=present)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise LockError("owner must be a non-empty text naming the run (for example 'AWX job 42 (Prepare GPU nodes)'), "
                        "got %s; nothing was changed" % shown(value))
    if len(value) > MAX_OWNER:
        raise LockError("owner must be at most %d characters, got %d characters (%s); nothing was changed"
                        % (MAX_OWNER, len(value), shown(value)))
    for index, char in enumerate(value):
        if unicodedata.category(char) in REFUSED_CATEGORIES:
            raise LockError("owner must not contain control or format characters, got %s at position %d of %s; "
                            "nothing was changed" % (repr(char), index, shown(value)))
    return value


# --------------------------------------------------------------------------- the host


def read_boot_id(root):
    """The current boot id of the host; LockError when it cannot be read (the lock depends on it)."""
    path = host_path(root, BOOT_ID_FILE)
    try:
        with open(path, "rb") as handle:
            text = handle.read(128).decode("ascii").strip()
    except (IOError, OSError, UnicodeError) as exc:
        raise LockError("cannot read the boot id of the host from %s (%s): host_lock needs it to tell a run that "
                        "died with the host; nothing was changed" % (BOOT_ID_FILE, exc)) from exc
    if not re.fullmatch(r"[0-9a-fA-F-]{8,64}", text):
        raise LockError("the boot id in %s is not valid (%s); nothing was changed" % (BOOT_ID_FILE, shown(text)))
    return text


def _make_dirs(directory):
    """Create ``directory`` and its missing parents, each 0755 whatever the umask.

    A directory another call created in the meantime (two first runs at once) is fine.
    """
    missing = []
    path = directory
    while not os.path.lexists(path) and path != os.path.dirname(path):
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if os.path.isdir(path):
                continue
            raise
        os.chmod(path, 0o755)
    if not os.path.isdir(directory):
        raise NotADirectoryError(errno.ENOTDIR, "it exists and is not a directory")


@contextlib.contextmanager
def exclusive(root, create):
    """Hold ``flock(LOCK_EX)`` on the directory of the record for the ``with`` body.

    ``create``: make the directory (0755) when it is missing. Without it, a missing directory means there is
    no record and nothing to serialise: the body runs without the flock (check mode, a release).
    Yields True when the flock is held. Waits up to FLOCK_WAIT seconds for another call, then LockError.
    """
    directory = os.path.dirname(host_path(root, LOCK_FILE))
    shown_dir = os.path.dirname(LOCK_FILE)
    if not os.path.isdir(directory):
        if not create:
            yield False
            return
        try:
            _make_dirs(directory)
        except (IOError, OSError) as exc:
            raise LockError("cannot create the directory %s of the host lock: %s; nothing was changed"
                            % (shown_dir, exc)) from exc
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (IOError, OSError) as exc:
        raise LockError("cannot open %s to lock it: %s; nothing was changed" % (shown_dir, exc)) from exc
    try:
        deadline = _monotonic() + FLOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (IOError, OSError) as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise LockError("cannot flock %s: %s; nothing was changed" % (shown_dir, exc)) from exc
                if _monotonic() >= deadline:
                    raise LockError("another host_lock call has held the flock on %s for more than %d s; "
                                    "nothing was changed" % (shown_dir, FLOCK_WAIT)) from exc
                _sleep(FLOCK_POLL)
        yield True
    finally:
        os.close(fd)  # releases the flock


# --------------------------------------------------------------------------- the record


def problem_of(data):
    """Why ``data`` (parsed JSON) is not a lock record, or None when it is one."""
    if not isinstance(data, dict):
        return "a JSON %s, not an object" % type(data).__name__
    missing = [f for f in FIELDS if f not in data]
    if missing:
        return "no %s" % ", ".join(missing)
    if not isinstance(data["run_id"], str) or not RUN_ID_RE.fullmatch(data["run_id"]):
        return "run_id %s is not a run id" % shown(data["run_id"])
    if not isinstance(data["owner"], str):
        return "owner %s is not a text" % shown(data["owner"])
    for field in ("started", "updated"):
        if parse_stamp(data[field]) is None:
            return "%s %s is not a UTC timestamp like 2026-05-09T07:35:25Z" % (field, shown(data[field]))
    if not isinstance(data["boot_id"], str):
        return "boot_id %s is not a text" % shown(data["boot_id"])
    if not isinstance(data["expect_reboot"], bool):
        return "expect_reboot %s is not true or false" % shown(data["expect_reboot"])
    return None


def read_record(root):
    """``(record, problem, text)`` of the lock file: (None, None, None) when there is none; ``problem`` says why
    the file is not a valid record (``record`` is then None, ``text`` what could be read of it).

    LockError when the path is not a regular file (a directory, a symlink): no option replaces that.
    """
    path = host_path(root, LOCK_FILE)
    try:
        info = os.lstat(path)
    except (IOError, OSError) as exc:
        if exc.errno == errno.ENOENT:
            return None, None, None
        raise LockError("cannot read the host lock %s: %s; nothing was changed" % (LOCK_FILE, exc)) from exc
    if not stat.S_ISREG(info.st_mode):
        if stat.S_ISLNK(info.st_mode):
            kind = "a symlink"
        else:
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a special file"
        raise LockError("the host lock %s is %s, not a file written by host_lock; remove it by hand once no "
                        "preparation runs on this host; nothing was changed" % (LOCK_FILE, kind))
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_RECORD_BYTES + 1)
    except (IOError, OSError) as exc:
        return None, "it cannot be read: %s" % exc, None
    text = raw.decode("utf-8", "replace")
    if len(raw) > MAX_RECORD_BYTES:
        return None, "it is larger than %d bytes" % MAX_RECORD_BYTES, text[:4096]
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeError, ValueError, RecursionError) as exc:
        return None, "it is not JSON: %s" % printable(exc, 200), text
    problem = problem_of(data)
    if problem:
        return None, problem, text
    return dict((f, data[f]) for f in FIELDS), None, text


def render(record):
    """The text of the lock file (ASCII whatever the owner, so the host's locale cannot matter)."""
    return json.dumps(record, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def age_of(record, moment):
    """Whole seconds from the record's last refresh to ``moment`` (negative when the host clock went back)."""
    return int((moment - parse_stamp(record["updated"])).total_seconds())


def describe(record, moment):
    """The public view of another run's record: its fields and ``age`` (seconds since its last refresh)."""
    view = dict(record)
    view["age"] = age_of(record, moment)
    return view


def staleness(record, boot_id, moment, stale_after):
    """``(code, why)`` when another run's record is stale, else None. ``code`` is ``boot`` or ``age``."""
    if record["boot_id"] != boot_id and not record["expect_reboot"]:
        return ("boot", "the host booted since that run last refreshed the lock (boot id %s then, %s now) and that "
                        "run did not announce a reboot: it ended with the host (power loss, crash, a reboot by "
                        "someone else)" % (printable(record["boot_id"], 64), boot_id))
    age = age_of(record, moment)
    if age > stale_after:
        return ("age", "its last refresh was %d s ago, more than stale_after=%d s" % (age, stale_after))
    return None


def refreshed_text(age):
    if age >= 0:
        return "last refreshed %d s ago" % age
    return "last refreshed %d s in the future by the host clock (the clock went back)" % -age


def held_message(record, boot_id, moment, stale_after):
    age = age_of(record, moment)
    rebooting = ""
    if record["expect_reboot"]:
        rebooting = (" (it rebooted the host and has not refreshed the lock since)" if record["boot_id"] != boot_id
                     else " (it announced a reboot of the host)")
    remaining = max(stale_after - age + 1, 0)
    return ("the gpuops host lock of %s (%s) is held by another run: %s (run %s), started %s, %s%s; wait for it to "
            "finish, or when that run is gone, run again with %s or wait until it goes stale %d s after its last "
            "refresh (in %d s); nothing was changed"
            % (hostname(), LOCK_FILE, printable(record["owner"]), record["run_id"], record["started"],
               refreshed_text(age), rebooting, BREAK_HINT, stale_after, remaining))


def corrupt_message(problem):
    return ("the gpuops host lock %s on %s is not a valid lock record: %s; if no other run is preparing this host, "
            "run again with %s, which replaces it, or remove the file; nothing was changed"
            % (LOCK_FILE, hostname(), problem, BREAK_HINT))


def took_over(record, code, why):
    """The ``took_over`` result: the replaced record's fields (None for a corrupt one), ``reason`` and ``why``."""
    view = dict((f, (record or {}).get(f)) for f in FIELDS)
    view["reason"] = code
    view["why"] = why
    return view


def takeover_warning(view):
    if view["reason"] == "corrupt":
        return "replaced the invalid host lock %s (%s)" % (LOCK_FILE, view["why"])
    return "took over the host lock %s from %s (run %s, started %s): %s" % (
        LOCK_FILE, printable(view["owner"]), view["run_id"], view["started"], view["why"])
