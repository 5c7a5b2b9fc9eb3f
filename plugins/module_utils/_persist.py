# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Files the host modules keep on disk: atomic writes, comparisons, removal, rollback and boot units.

Every function takes ``root`` (the filesystem root, ``/`` on a host, a temp dir in unit tests) and
paths as they are on the host.

Every failure of :func:`write_text` (creating the directory, writing the temp file, the final move, which
ansible-core 2.19 reports as a bare ``Exception``, the mode and owner) is raised as :class:`PersistError`,
a GpuopsError that is also an OSError, so each caller handles it with its rollback.

A step that writes files and then runs a command that builds something from them (the initramfs from
modprobe.d, grub.cfg from /etc/default/grub.d) leaves a *pending record* (:func:`mark_pending`) on disk
before it starts and clears it once the command succeeded. A run cut short in between (a power loss, a
killed controller) leaves the record behind; the next run sees it (:func:`read_pending`) and runs the
command again, although the files already hold what they should.

Two ways to roll back live here: :func:`snapshot` and :func:`restore` (content kept in memory, used by
most modules), and :class:`Transaction` (backup files on disk, used by kernel_cmdline for the boot
configuration; its docstring says why it is not built on the first). Those backups go to the collection's
state directory (:data:`BACKUP_DIR`), never next to the file they copy, and only the newest
:data:`BACKUPS_KEPT` of each file are kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path, read_file


class PersistError(GpuopsError, OSError):
    """Writing a host file failed. ``path`` is the host path, ``reason`` what went wrong (without the path)."""

    def __init__(self, path, reason):
        super().__init__("writing %s failed: %s" % (path, reason))
        self.path = path
        self.reason = reason


def _reason(exc):
    """Text of ``exc`` and of the OSError it was raised from (ansible-core's atomic_move chains one)."""
    if isinstance(exc, OSError) and not isinstance(exc, GpuopsError):
        text = str(exc)
    else:
        text = (str(exc) or type(exc).__name__).rstrip(".")
    cause = exc.__cause__ or exc.__context__
    if cause is not None and not isinstance(exc, OSError):
        detail = getattr(cause, "strerror", None) or str(cause)
        if detail and detail not in text:
            text = "%s (%s)" % (text, detail)
    return text


def read_text(root, path):
    """Return the text of ``path`` under ``root``, or None when it does not exist or cannot be read.

    The one reader of this collection's own files (records, definitions, rules): UTF-8, an undecodable byte read
    as U+FFFD rather than an error, whatever the host's locale."""
    try:
        return read_file(host_path(root, path))
    except (IOError, OSError):
        return None


def write_text(module, root, path, content, mode=0o644, durable=False):
    """Write ``content`` to ``path`` via a temp file in the same directory and an atomic move.

    The file ends up root:root (when run as root) with ``mode``; parent directories are created 0755.
    ``durable``: the temp file's data reaches the disk before the move and the move before the return, so a
    power loss at any moment leaves the old file or the new one, never an empty one (a rename whose data
    is still in the page cache can reach the disk first: ext4 then shows an empty file after the crash).
    Raises PersistError, whatever failed.
    """
    try:
        _write(module, host_path(root, path), content, mode, durable)
    except PersistError:
        raise
    except Exception as exc:  # pylint: disable=broad-exception-caught
        # ansible-core 2.19's atomic_move raises Exception (chained to the OSError) where it used to fail_json.
        raise PersistError(path, _reason(exc)) from exc


def _write(module, dest, content, mode, durable=False):
    directory = os.path.dirname(dest)
    created = []
    missing = directory
    while missing and not os.path.lexists(missing) and missing != os.path.dirname(missing):
        created.append(missing)
        missing = os.path.dirname(missing)
    try:
        if created:
            os.makedirs(directory, 0o755)
        fd, tmp = tempfile.mkstemp(prefix=".gpuops-", dir=directory)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(content)
                if durable:
                    handle.flush()
                    os.fsync(handle.fileno())
            module.atomic_move(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except BaseException:
        # Leave no directory behind for a file that was not written (deepest first; only empty ones go).
        for path in created:
            try:
                os.rmdir(path)
            except OSError:
                break
        raise
    os.chmod(dest, mode)
    if os.geteuid() == 0:
        os.chown(dest, 0, 0)
    if durable:
        _sync(dest)


def remove_file(root, path):
    """Remove ``path`` under ``root`` if it exists; return True when something was removed."""
    dest = host_path(root, path)
    if os.path.lexists(dest):
        os.unlink(dest)
        return True
    return False


def changed_files(root, wanted):
    """Return ``{path: text_or_None}`` for the entries of ``wanted`` that differ from the disk.

    ``wanted`` maps host paths to the text they should hold, or to None for a file that should not exist.
    """
    changes = {}
    for path, text in wanted.items():
        current = read_text(root, path)
        if text is None:
            if os.path.lexists(host_path(root, path)):
                changes[path] = None
        elif current != text:
            changes[path] = text
    return changes


# The collection's own state on the host: records, pending records, backups.
STATE_DIR = "/var/lib/gpuops"
PENDING_DIR = STATE_DIR + "/pending"
# The pending records there: an initramfs rebuild of kernel_modules, a grub.cfg or BLS generation of kernel_cmdline.
PENDING_INITRAMFS = "initramfs"
PENDING_BOOTLOADER = "bootloader"


def pending_path(name):
    """Host path of the pending record ``name`` (``initramfs``, ``bootloader``)."""
    return "%s/%s.json" % (PENDING_DIR, name)


def read_pending(root, name):
    """The pending record ``name`` an unfinished step left (a dict), or None when there is none.

    A record that cannot be parsed (cut short while it was written) still means pending: it reads as {}."""
    text = read_text(root, pending_path(name))
    if text is None:
        return None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def mark_pending(module, root, name, what):
    """Record, durably, that ``what`` (a label: the settings set, the drop-in) changed and the command that
    builds from it has not finished yet; labels of an earlier unfinished step are kept.

    Returns the directories it had to create (deepest first), for :func:`clear_pending` after a rollback."""
    record = read_pending(root, name) or {}
    earlier = record.get("changed")
    labels = set(str(x) for x in earlier) if isinstance(earlier, list) else set()
    labels.add(what)
    since = record.get("since") if isinstance(record.get("since"), str) else None
    record = {"changed": sorted(labels), "since": since or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = pending_path(name)
    created = []
    missing = os.path.dirname(host_path(root, path))
    while not os.path.lexists(missing) and missing != os.path.dirname(missing):
        created.append(missing)
        missing = os.path.dirname(missing)
    write_text(module, root, path, json.dumps(record, sort_keys=True) + "\n", durable=True)
    return created


def clear_pending(root, name, created=()):
    """Remove the pending record ``name`` once its command succeeded (durably, like its writing), and the
    directories ``created`` for it when they are empty (a rollback leaves no trace on a fresh host)."""
    path = host_path(root, pending_path(name))
    if remove_file(root, pending_path(name)):
        _sync(os.path.dirname(path))
    for directory in created:
        try:
            os.rmdir(directory)
        except OSError:
            break


def describe_pending(record):
    """'an earlier run changed X and did not finish (since T)' for messages and results."""
    changed = record.get("changed")
    changed = ", ".join(str(x) for x in changed) if isinstance(changed, list) and changed else "boot files"
    since = record.get("since") if isinstance(record.get("since"), str) else None
    return "an earlier run changed %s and did not finish%s" % (changed, " (since %s)" % since if since else "")


def _sync(path):
    """fsync ``path`` and its directory, so a power loss right after cannot lose what was just written."""
    for target in (path, os.path.dirname(path)):
        try:
            fd = os.open(target, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def snapshot(root, paths):
    """Return ``{path: text_or_None}`` of the current content of ``paths`` (for rollback)."""
    return dict((path, read_text(root, path)) for path in paths)


def restore(module, root, saved):
    """Put back the content recorded by :func:`snapshot`; return the list of errors (empty when fine).

    A file that still holds its recorded content (the write that failed never replaced it) is left alone.
    """
    errors = []
    for path, text in sorted(saved.items()):
        try:
            if text is None:
                remove_file(root, path)
            elif read_text(root, path) != text:
                write_text(module, root, path, text)
        except PersistError as exc:
            errors.append("%s: %s" % (path, exc.reason))
        except (IOError, OSError) as exc:
            errors.append("%s: %s" % (path, exc))
    return errors


def apply_files(module, root, changes):
    """Write or remove the files of ``changes`` (as returned by :func:`changed_files`)."""
    for path, text in sorted(changes.items()):
        if text is None:
            remove_file(root, path)
        else:
            write_text(module, root, path, text)


def write_files(module, root, changes):
    """Write or remove the files of ``changes`` (``[(path, text_or_None)]``) in that order; when one fails, put
    back the ones already done and raise PersistError naming the file that failed and each one not put back.

    For callers whose files go with other changes they undo themselves (vfio_bind's udev rules and module
    files, after the drivers were changed).
    """
    saved = []
    for path, text in changes:
        try:
            before = read_text(root, path)
            if text is None:
                remove_file(root, path)
            else:
                write_text(module, root, path, text)
        except Exception as exc:  # pylint: disable=broad-exception-caught
            # PersistError (a failed write) or an OSError (a failed removal); anything else (a bug) must not skip
            # the rollback either.
            reason = exc.reason if isinstance(exc, PersistError) else _reason(exc)
            errors = restore(module, root, dict(saved))
            raise PersistError(path, reason + "".join("; not restored: %s" % error for error in errors)) from exc
        saved.append((path, before))


def _write_as_is(module, path, text):
    """Write ``text`` to ``path`` through a temp file in the same directory, then root:root 0644."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        module.atomic_move(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    os.chmod(path, 0o644)
    if os.geteuid() == 0:
        os.chown(path, 0, 0)


def _copy_back(module, backup, path):
    """Put ``backup`` (a copy made by :meth:`Transaction.backup`) back at ``path`` through a temp file and a move."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        shutil.copy2(backup, tmp)
        module.atomic_move(tmp, path, keep_dest_attrs=False)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# Backups of the files a Transaction changes: BACKUP_DIR/<host path, "%" and "/" escaped>.<UTC time>, e.g.
# etc%2Fdefault%2Fgrub.d%2F99-gpuops-sandbox.cfg.20250131T120000.123456Z; the newest BACKUPS_KEPT of each file stay.
BACKUP_DIR = STATE_DIR + "/backups"
BACKUPS_KEPT = 3
_BACKUP_STAMP_RE = re.compile(r"[0-9]{8}T[0-9]{6}\.[0-9]{6}Z(-[0-9]+)?")


def backup_prefix(host_file):
    """The start of the names of the backups of ``host_file`` in BACKUP_DIR (up to the time, dot included)."""
    return host_file.lstrip("/").replace("%", "%25").replace("/", "%2F") + "."


def list_backups(root, host_file):
    """The backups of ``host_file`` in BACKUP_DIR under ``root``, oldest first (full paths)."""
    directory = host_path(root, BACKUP_DIR)
    prefix = backup_prefix(host_file)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [os.path.join(directory, name) for name in sorted(names)
            if name.startswith(prefix) and _BACKUP_STAMP_RE.fullmatch(name[len(prefix):])]


def _stamp():
    now = time.time()
    return "%s.%06dZ" % (time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)), int(now % 1 * 1000000))


class Transaction:
    """Backs up each file before it changes and can put every one of them back (kernel_cmdline's boot files).

    It is not built on :func:`snapshot` and :func:`restore`, because that would change what it does:
    every file it changes or lets a command regenerate (grub.cfg, grubenv, BLS entries) gets a backup on
    disk, in :data:`BACKUP_DIR` under ``root`` (see :func:`backup_prefix`), which the module returns
    (``backup_file``, ``backup_files``) and which stays after the run, the newest :data:`BACKUPS_KEPT` of
    each file; a file is put back by copying that backup, its bytes, mode and times (:func:`shutil.copy2`),
    where :func:`restore` writes text root:root 0644; boot files are read and written with
    ``surrogateescape``, so bytes that are not UTF-8 survive, where :func:`read_text` reads in the locale's
    encoding; and it removes the directories it created. Only the module's own record (a small JSON file
    with no backup) goes through :func:`write_text` and is put back with :func:`restore`, as the other
    modules' files are.

    Paths given to its methods are real paths (under ``root``); backups are named after the host path.
    """

    def __init__(self, module, root="/"):
        self.module = module
        self.root = root
        self.records = []  # (path, backup path or None when the file did not exist)
        self.saved = []  # (root, host path, text or None): files put back from memory (the module's record)
        self.created_dirs = []

    @property
    def backups(self):
        return [backup for _path, backup in self.records if backup]

    @property
    def backed_up(self):
        """``[(path, backup)]`` of every file backed up, in the order they were."""
        return [(path, backup) for path, backup in self.records if backup]

    def host_file(self, path):
        """``path`` as it is on the host (without the root)."""
        root = os.path.abspath(self.root or "/")
        path = os.path.abspath(path)
        if root != "/" and path.startswith(root + os.sep):
            return path[len(root):]
        return path

    def backup(self, path):
        if any(path == recorded for recorded, _backup in self.records):
            return None
        backup = None
        if os.path.exists(path):
            try:
                backup = self._store(path)
            except (OSError, IOError, shutil.Error) as exc:
                raise GpuopsError("could not back up %s to %s, nothing changed: %s"
                                  % (path, host_path(self.root, BACKUP_DIR), exc))
        self.records.append((path, backup))
        return backup

    def _store(self, path):
        """Copy ``path`` into BACKUP_DIR (a temp file, then a rename) and drop its older backups beyond BACKUPS_KEPT."""
        directory = host_path(self.root, BACKUP_DIR)
        self.make_dirs(directory)
        host_file = self.host_file(path)
        base = os.path.join(directory, backup_prefix(host_file) + _stamp())
        dest, count = base, 0
        while os.path.lexists(dest):
            count += 1
            dest = "%s-%d" % (base, count)
        fd, tmp = tempfile.mkstemp(prefix=".gpuops-", dir=directory)
        os.close(fd)
        try:
            shutil.copy2(path, tmp)
            os.rename(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _sync(dest)
        # The one just made always stays, even when the clock went back and it does not sort last.
        older = [old for old in list_backups(self.root, host_file) if old != dest]
        for old in older[:max(len(older) - (BACKUPS_KEPT - 1), 0)]:
            try:
                os.unlink(old)
            except OSError as exc:
                self.module.warn("could not remove the old backup %s: %s" % (old, exc))
        return dest

    def make_dirs(self, directory):
        """Create ``directory`` and its missing parents (0755), each recorded so that rollback removes it."""
        missing = []
        while directory and not os.path.isdir(directory) and directory != os.path.dirname(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for path in reversed(missing):
            os.mkdir(path, 0o755)
            self.created_dirs.append(path)

    def write(self, path, text):
        self.make_dirs(os.path.dirname(path))
        self.backup(path)
        _write_as_is(self.module, path, text)

    def write_record(self, root, host_file, before, after):
        """Write the module's record (``after``; None removes it) with write_text; ``before`` is put back on rollback."""
        if not any(saved_file == host_file for _root, saved_file, _text in self.saved):
            self.saved.append((root, host_file, before))
        if after is None:
            remove_file(root, host_file)
        else:
            self.make_dirs(os.path.dirname(host_path(root, host_file)))
            write_text(self.module, root, host_file, after)

    def remove(self, path):
        self.backup(path)
        if os.path.exists(path):
            os.unlink(path)

    def rollback(self):
        """Restore every recorded file; return (list of actions, list of errors)."""
        done, errors = [], []
        for root, host_file, text in reversed(self.saved):
            path = host_path(root, host_file)
            problems = restore(self.module, root, {host_file: text})
            if problems:
                errors.extend("could not restore %s" % problem for problem in problems)
            elif text is None:
                done.append("removed %s (it did not exist before)" % path)
            else:
                done.append("restored %s" % path)
        for path, backup in reversed(self.records):
            try:
                if backup:
                    _copy_back(self.module, backup, path)
                    done.append("restored %s from %s" % (path, backup))
                elif os.path.exists(path):
                    os.unlink(path)
                    done.append("removed %s (it did not exist before)" % path)
            except (OSError, IOError, shutil.Error) as exc:
                errors.append("could not restore %s: %s" % (path, exc))
        for directory in reversed(self.created_dirs):
            try:
                os.rmdir(directory)
            except OSError:
                pass
        return done, errors


def restore_retry_end(missing):
    """The end of the retry loop of a boot-time restore script (``gpuops-mdev-restore``, ``gpuops-sriov-restore``):
    the lines not done yet (``$retry``) are tried again after 2 seconds, up to ``$tries`` attempts, then given up
    with ``missing`` (what was still absent) and the lines; the script exits with ``$status``."""
    return """    pending=$(printf '%%s' "$retry")
    [ -n "$pending" ] || break
    if [ "$attempt" -ge "$tries" ]; then
        echo "gave up after $attempt attempts; %s:" >&2
        echo "$pending" >&2
        status=1
        break
    fi
    sleep 2
done
exit $status
""" % missing


def wants_link_missing(root, link, unit_file):
    """True when the ``multi-user.target.wants`` link ``link`` does not point at ``unit_file``."""
    dest = host_path(root, link)
    return not (os.path.islink(dest) and os.readlink(dest) == unit_file)


def read_link(root, link):
    """Target of the symlink ``link``, or None when it is not a symlink (for rollback)."""
    dest = host_path(root, link)
    return os.readlink(dest) if os.path.islink(dest) else None


def restore_link(root, link, target):
    """Put back a link recorded by :func:`read_link` (None: remove it); return the list of errors."""
    try:
        if target is None:
            dest = host_path(root, link)
            if os.path.islink(dest):
                os.unlink(dest)
        elif read_link(root, link) != target:
            make_wants_link(root, link, target)
    except (IOError, OSError) as exc:
        return ["%s: %s" % (link, exc)]
    return []


def make_wants_link(root, link, unit_file):
    dest = host_path(root, link)
    os.makedirs(os.path.dirname(dest), 0o755, exist_ok=True)
    if os.path.lexists(dest):
        os.unlink(dest)
    os.symlink(unit_file, dest)


def daemon_reload(module, root):
    """Ask systemd to re-read unit files when systemd runs on the host; a failure is a warning."""
    if not os.path.isdir(host_path(root, "/run/systemd/system")):
        return
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return
    rc, out, err = module.run_command([systemctl, "daemon-reload"], environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.warn("systemctl daemon-reload failed (rc=%d): %s %s" % (rc, out.strip(), err.strip()))
