# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_persist.Transaction's backups: kept in the collection's state directory under the root, the newest
BACKUPS_KEPT of each file, and what a rollback copies back."""

from __future__ import annotations

import os
import stat
from unittest import mock

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _persist
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError

DROPIN = "/etc/default/grub.d/99-gpuops-sandbox.cfg"


class Module:
    """What a Transaction needs of an AnsibleModule: an atomic move and warnings."""

    def __init__(self):
        self.warnings = []

    def atomic_move(self, src, dest, keep_dest_attrs=True):  # pylint: disable=unused-argument
        os.rename(src, dest)

    def warn(self, text):
        self.warnings.append(text)


def real(root, path):
    return os.path.join(root, path.lstrip("/"))


def put(root, path, data, mode=0o644):
    full = real(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as handle:
        handle.write(data)
    os.chmod(full, mode)
    return full


def get(root, path):
    with open(real(root, path), "rb") as handle:
        return handle.read()


def stamps(*values):
    """Stand-in for _persist._stamp giving ``values`` in turn."""
    return mock.patch.object(_persist, "_stamp", side_effect=list(values))


def test_backup_names_escape_the_path():
    assert _persist.backup_prefix(DROPIN) == "etc%2Fdefault%2Fgrub.d%2F99-gpuops-sandbox.cfg."
    assert _persist.backup_prefix("/boot/loader/entries/a%2Fb.conf") == "boot%2Floader%2Fentries%2Fa%252Fb.conf."


def test_backup_lands_in_the_state_directory_under_the_root(tmp_path):
    root = str(tmp_path)
    path = put(root, DROPIN, b"GRUB_CMDLINE_LINUX=\"iommu=pt\"\n")
    txn = _persist.Transaction(Module(), root)
    with stamps("20250131T120000.000001Z"):
        txn.write(path, "GRUB_CMDLINE_LINUX=\"intel_iommu=on\"\n")
    backup = real(root, "/var/lib/gpuops/backups/etc%2Fdefault%2Fgrub.d%2F99-gpuops-sandbox.cfg.20250131T120000.000001Z")
    assert txn.backups == [backup] and txn.backed_up == [(path, backup)]
    assert get(root, backup[len(root):]) == b"GRUB_CMDLINE_LINUX=\"iommu=pt\"\n"
    assert os.listdir(os.path.dirname(path)) == ["99-gpuops-sandbox.cfg"]
    assert _persist.list_backups(root, DROPIN) == [backup]


def test_only_the_newest_backups_of_each_file_stay(tmp_path):
    root = str(tmp_path)
    path = put(root, DROPIN, b"0\n")
    other = put(root, "/etc/default/grub", b"defaults\n")
    with stamps("20250101T000000.000000Z"):
        _persist.Transaction(Module(), root).backup(other)
    for count in range(1, 6):
        with stamps("20250131T12000%d.000000Z" % count):
            _persist.Transaction(Module(), root).write(path, "%d\n" % count)
    left = _persist.list_backups(root, DROPIN)
    prefix = _persist.backup_prefix(DROPIN)
    assert [os.path.basename(p) for p in left] == [prefix + "20250131T12000%d.000000Z" % n for n in (3, 4, 5)]
    assert [get(root, p[len(root):]) for p in left] == [b"2\n", b"3\n", b"4\n"]
    # The backups of another file (whose escaped name starts the same) are neither counted nor removed.
    assert len(_persist.list_backups(root, "/etc/default/grub")) == 1
    assert len(os.listdir(real(root, _persist.BACKUP_DIR))) == _persist.BACKUPS_KEPT + 1


def test_the_backup_just_made_stays_when_the_clock_went_back(tmp_path):
    root = str(tmp_path)
    path = put(root, DROPIN, b"0\n")
    for count in range(1, 4):
        with stamps("20250131T12000%d.000000Z" % count):
            _persist.Transaction(Module(), root).write(path, "%d\n" % count)
    txn = _persist.Transaction(Module(), root)
    with stamps("20240101T000000.000000Z"):
        txn.write(path, "late\n")
    left = _persist.list_backups(root, DROPIN)
    assert txn.backups[0] in left and len(left) == _persist.BACKUPS_KEPT
    assert txn.rollback()[1] == [] and get(root, DROPIN) == b"3\n"


def test_same_time_gets_a_name_of_its_own(tmp_path):
    root = str(tmp_path)
    path = put(root, DROPIN, b"0\n")
    made = []
    for count in range(1, 3):
        txn = _persist.Transaction(Module(), root)
        with stamps("20250131T120000.000000Z"):
            txn.write(path, "%d\n" % count)
        made.extend(txn.backups)
    prefix = _persist.backup_prefix(DROPIN)
    assert [os.path.basename(p) for p in made] == [prefix + "20250131T120000.000000Z", prefix + "20250131T120000.000000Z-1"]
    assert _persist.list_backups(root, DROPIN) == made


def test_rollback_copies_the_backup_back(tmp_path):
    root = str(tmp_path)
    path = put(root, "/boot/loader/entries/a.conf", b"options quiet \xff\n", mode=0o600)
    new = real(root, "/boot/loader/entries/b.conf")
    txn = _persist.Transaction(Module(), root)
    txn.write(path, "options intel_iommu=on\n")
    txn.write(new, "options new\n")
    done, errors = txn.rollback()
    assert errors == []
    assert "restored %s from %s" % (path, txn.backups[0]) in done
    assert get(root, "/boot/loader/entries/a.conf") == b"options quiet \xff\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not os.path.exists(new)
    assert os.listdir(os.path.dirname(path)) == ["a.conf"]
    assert os.path.exists(txn.backups[0])  # the backup stays after the run


def test_a_backup_that_fails_changes_nothing_and_leaves_no_directory(tmp_path):
    root = str(tmp_path)
    path = put(root, DROPIN, b"0\n")
    txn = _persist.Transaction(Module(), root)
    with mock.patch.object(_persist.shutil, "copy2", side_effect=OSError(28, "No space left on device")):
        with pytest.raises(GpuopsError) as err:
            txn.write(path, "1\n")
    assert "could not back up %s" % path in str(err.value) and "No space left on device" in str(err.value)
    assert txn.rollback() == ([], [])
    assert get(root, DROPIN) == b"0\n"
    assert not os.path.exists(real(root, "/var"))


def test_a_file_that_did_not_exist_has_no_backup(tmp_path):
    root = str(tmp_path)
    txn = _persist.Transaction(Module(), root)
    txn.write(real(root, DROPIN), "1\n")
    assert txn.backups == [] and not os.path.exists(real(root, "/var"))
