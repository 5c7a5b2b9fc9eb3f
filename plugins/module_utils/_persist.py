# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Files the host modules keep on disk: atomic writes, comparisons, removal and boot units.

Every function takes ``root`` (the filesystem root, ``/`` on a host, a temp dir in unit tests) and
paths as they are on the host.
"""

from __future__ import annotations

import os
import tempfile

from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path


def read_text(root, path):
    """Return the text of ``path`` under ``root``, or None when it does not exist or cannot be read."""
    try:
        with open(host_path(root, path), "r") as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def write_text(module, root, path, content, mode=0o644):
    """Write ``content`` to ``path`` via a temp file in the same directory and an atomic move.

    The file ends up root:root (when run as root) with ``mode``; parent directories are created 0755.
    """
    dest = host_path(root, path)
    directory = os.path.dirname(dest)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    fd, tmp = tempfile.mkstemp(prefix=".gpuops-", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        module.atomic_move(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    os.chmod(dest, mode)
    if os.geteuid() == 0:
        os.chown(dest, 0, 0)


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


def snapshot(root, paths):
    """Return ``{path: text_or_None}`` of the current content of ``paths`` (for rollback)."""
    return dict((path, read_text(root, path)) for path in paths)


def restore(module, root, saved):
    """Put back the content recorded by :func:`snapshot`; return the list of errors (empty when fine)."""
    errors = []
    for path, text in saved.items():
        try:
            if text is None:
                remove_file(root, path)
            else:
                write_text(module, root, path, text)
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


def wants_link_missing(root, link, unit_file):
    """True when the ``multi-user.target.wants`` link ``link`` does not point at ``unit_file``."""
    dest = host_path(root, link)
    return not (os.path.islink(dest) and os.readlink(dest) == unit_file)


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
