# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_persist.write_files: the files of a change are written in order, and a failure puts back those already done."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _persist


class Module:
    """What write_text needs of an AnsibleModule: an atomic move, failing for the names in ``fail``."""

    def __init__(self, fail=()):
        self.fail = set(fail)

    def atomic_move(self, src, dest):
        if os.path.basename(dest) in self.fail:
            os.unlink(src)
            raise OSError(errno.ENOSPC, "No space left on device")
        shutil.move(src, dest)


def files(root):
    found = {}
    for base, _dirs, names in os.walk(root):
        for name in names:
            with open(os.path.join(base, name), encoding="utf-8") as handle:
                found["/" + os.path.relpath(os.path.join(base, name), root)] = handle.read()
    return found


@pytest.fixture
def root(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "a").write_text("old a\n")
    (tmp_path / "etc" / "gone").write_text("old gone\n")
    return str(tmp_path)


def test_every_file_is_written_or_removed(root):
    _persist.write_files(Module(), root, [("/etc/a", "new a\n"), ("/etc/gone", None), ("/etc/new/b", "b\n")])
    assert files(root) == {"/etc/a": "new a\n", "/etc/new/b": "b\n"}


def test_a_failed_write_puts_back_the_files_already_done(root):
    before = files(root)
    with pytest.raises(_persist.PersistError) as err:
        _persist.write_files(Module(fail={"c"}), root, [("/etc/a", "new a\n"), ("/etc/gone", None), ("/etc/c", "c\n")])
    assert err.value.msg == "writing /etc/c failed: [Errno 28] No space left on device"
    assert files(root) == before


def test_a_file_that_cannot_be_put_back_is_named(root):
    # The first file is written; the second fails; putting the first back fails as well.
    module = Module()
    real = module.atomic_move

    def atomic_move(src, dest):
        if os.path.basename(dest) == "b" or (os.path.basename(dest) == "a" and module.fail):
            os.unlink(src)
            raise OSError(errno.EROFS, "Read-only file system")
        real(src, dest)
        if os.path.basename(dest) == "a":
            module.fail = {"a"}

    module.atomic_move = atomic_move
    with pytest.raises(_persist.PersistError) as err:
        _persist.write_files(module, root, [("/etc/a", "new a\n"), ("/etc/b", "b\n")])
    assert err.value.msg == ("writing /etc/b failed: [Errno 30] Read-only file system; not restored: /etc/a: "
                             "[Errno 30] Read-only file system")
    assert files(root)["/etc/a"] == "new a\n"


def test_nothing_to_do_changes_nothing(root):
    before = files(root)
    _persist.write_files(Module(fail={"a"}), root, [])
    assert files(root) == before
