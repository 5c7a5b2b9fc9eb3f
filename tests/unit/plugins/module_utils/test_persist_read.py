# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one reader of the collection's own files (_persist.read_text): a byte that is not UTF-8 is read, not fatal,
whatever the locale; a missing file is None. _vfio, _cmdline and the modules use it and _sysfs.host_path."""

from __future__ import annotations

from ansible_collections.gpuops.sandbox.plugins.module_utils import _bootloader, _cmdline, _persist, _shellvars, _sysfs, _vfio


def test_a_byte_that_is_not_utf8_is_replaced_not_fatal(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "rule").write_bytes(b"ACTION==\"add\" \xff\n")
    assert _persist.read_text(str(tmp_path), "/etc/rule") == "ACTION==\"add\" \ufffd\n"


def test_a_missing_file_is_none(tmp_path):
    assert _persist.read_text(str(tmp_path), "/etc/absent") is None


def test_one_reader_and_one_host_path():
    assert _vfio.read_text is _persist.read_text
    assert _cmdline.host_path is _sysfs.host_path
    assert _bootloader.host_path is _sysfs.host_path and _shellvars.host_path is _sysfs.host_path
