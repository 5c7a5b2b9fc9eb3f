# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one reader of the collection's own files (_persist.read_text): a byte that is not UTF-8 is read, not fatal,
whatever the locale; a missing file is None. _vfio, _cmdline and the modules use it and _sysfs.host_path."""

from __future__ import annotations

from ansible_collections.gpuops.sandbox.plugins.module_utils import _bootloader, _cmdline, _kexec, _persist, _shellvars, _sysfs, _vfio


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


def test_the_boot_files_reader_keeps_undecodable_bytes_for_writing_back(tmp_path):
    path = tmp_path / "grub"
    path.write_bytes(b'GRUB_CMDLINE_LINUX="quiet \xe9"\r\n')
    text = _cmdline.read_text(str(path))
    assert text == 'GRUB_CMDLINE_LINUX="quiet \udce9"\n'
    assert text.encode("utf-8", "surrogateescape") == b'GRUB_CMDLINE_LINUX="quiet \xe9"\n'
    assert _cmdline.read_text(str(tmp_path / "absent"), missing="") == ""


def test_the_boot_files_reader_names_a_file_it_cannot_read(tmp_path):
    try:
        _cmdline.read_text(str(tmp_path))
    except _cmdline.CmdlineError as exc:
        assert exc.msg == "cannot read %s: Is a directory" % tmp_path
    else:
        raise AssertionError("a directory was read as a file")


def test_kexec_refuses_a_file_past_its_limit_and_reads_one_at_it(tmp_path):
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot" / "grub.cfg").write_bytes(b"x" * 8)
    assert _kexec.read_text(str(tmp_path), "/boot/grub.cfg", limit=8) == "x" * 8
    try:
        _kexec.read_text(str(tmp_path), "/boot/grub.cfg", limit=7)
    except _kexec.NotLoadable as exc:
        assert exc.msg == "/boot/grub.cfg is larger than 7 bytes; not a boot loader file this module reads"
    else:
        raise AssertionError("a file past the limit was read")


def test_one_file_reader_behind_the_three():
    for reader in (_persist.read_text, _cmdline.read_text, _kexec.read_text):
        assert "read_file" in reader.__code__.co_names
