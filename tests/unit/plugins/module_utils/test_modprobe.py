# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""_modprobe: the files of a set by name, the set name rule, and modprobe.d read and edited as modprobe reads it."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _modprobe


def test_the_files_of_a_set_are_named_after_it():
    assert _modprobe.set_files("acme") == {
        "modprobe": "/etc/modprobe.d/acme.conf", "load": "/etc/modules-load.d/acme.conf",
        "initramfs_tools": "/usr/share/initramfs-tools/modules.d/acme", "dracut": "/etc/dracut.conf.d/acme.conf"}


@pytest.mark.parametrize("name, ok", [("gpuops-vfio", True), ("a.b_c-d", True), ("9", True), ("x" * 64, True),
                                      ("x" * 65, False), ("-a", False), (".a", False), ("a/b", False),
                                      ("a\n", False), ("", False), (None, False)])
def test_the_set_name_rule(name, ok):
    assert (_modprobe.set_name_problem(name) is None) is ok


@pytest.mark.parametrize("line, values", [
    ("options vfio-pci ids=10de:2236,10de:1aef disable_vga=1", ["10de:2236", "10de:1aef"]),
    ("options vfio_pci ids=10de:2236 # a comment", ["10de:2236"]),
    ("  options   vfio-pci   disable_vga=1", []),
    ("options vfio-pcix ids=10de:2236", None),
    ("options nouveau modeset=0", None),
    ("# options vfio-pci ids=10de:2236", None),
])
def test_option_values_compare_module_names_as_modprobe_does(line, values):
    assert _modprobe.option_values(line, "vfio-pci", "ids") == values


def test_keep_option_values_edits_only_the_values_it_drops():
    text = ("options vfio-pci ids=10de:2236,10de:1aef \\\n  disable_vga=1 # mine\n"
            "options vfio-pci ids=10de:2236\n"
            "blacklist nouveau\n")
    kept = _modprobe.keep_option_values(text, "vfio-pci", "ids", lambda value: value != "10de:2236")
    assert kept == "options vfio-pci ids=10de:1aef disable_vga=1 # mine\nblacklist nouveau\n"
    assert _modprobe.keep_option_values(text, "vfio-pci", "ids", lambda value: True) == text


def test_modprobe_files_in_modprobe_order(tmp_path):
    for directory, name in (("/etc/modprobe.d", "b.conf"), ("/lib/modprobe.d", "b.conf"), ("/lib/modprobe.d", "a.conf"),
                            ("/etc/modprobe.d", "c.txt")):
        path = tmp_path / directory.lstrip("/") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(directory + "\n")
    assert _modprobe.modprobe_files(str(tmp_path)) == [("/etc/modprobe.d/b.conf", "/etc/modprobe.d\n"),
                                                       ("/lib/modprobe.d/a.conf", "/lib/modprobe.d\n")]
    assert _modprobe.is_modprobe_path("/run/modprobe.d/x.conf") and not _modprobe.is_modprobe_path("/etc/modprobe.conf")
