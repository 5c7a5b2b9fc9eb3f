# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Module tests for kernel_modules on a fake host tree; the initramfs generator is a recorded fake."""

from __future__ import annotations

import json
import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ansible.module_utils import basic

from ansible_collections.gpuops.sandbox.plugins.modules import kernel_modules
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sysfs_tree import (
    HOSTILE_VALUES,
    SysfsTree,
    failing_atomic_move,
)

HEADER = "# Managed by gpuops.sandbox (kernel_modules, set %s); changes here are overwritten.\n"
UPDATE_INITRAMFS = "/usr/sbin/update-initramfs"
DRACUT = "/usr/bin/dracut"
TIMEOUT = "/usr/bin/timeout"

VFIO_ARGS = {
    "name": "gpuops-vfio",
    "blacklist": ["nouveau"],
    "options": {"nouveau": "modeset=0", "vfio_pci": "disable_vga=1"},
    "softdeps": {"nvidia": ["vfio-pci"], "nouveau": ["vfio-pci", "vfio"]},
    "load": ["vfio", "vfio_iommu_type1", "vfio_pci"],
    "initramfs": ["vfio", "vfio_iommu_type1", "vfio_pci"],
}

MODPROBE = "/etc/modprobe.d/gpuops-vfio.conf"
LOAD = "/etc/modules-load.d/gpuops-vfio.conf"
ITOOLS = "/usr/share/initramfs-tools/modules.d/gpuops-vfio"
DRACUT_CONF = "/etc/dracut.conf.d/gpuops-vfio.conf"
ALL_FILES = sorted([MODPROBE, LOAD, ITOOLS, DRACUT_CONF])
PENDING_FILE = "/var/lib/gpuops/pending/initramfs.json"

MODPROBE_TEXT = (HEADER % "gpuops-vfio"
                 + "blacklist nouveau\n"
                 + "options nouveau modeset=0\n"
                 + "options vfio_pci disable_vga=1\n"
                 + "softdep nouveau pre: vfio-pci vfio\n"
                 + "softdep nvidia pre: vfio-pci\n")
LIST_TEXT = HEADER % "gpuops-vfio" + "vfio\nvfio_iommu_type1\nvfio_pci\n"
DRACUT_TEXT = HEADER % "gpuops-vfio" + 'force_drivers+=" vfio vfio_iommu_type1 vfio_pci "\n'


class Host:
    """A fake host tree plus the programs the module finds and runs."""

    def __init__(self, tree):
        self.tree = tree
        self.bins = {"update-initramfs": UPDATE_INITRAMFS, "dracut": DRACUT}
        self.commands = []
        self.results = []  # (rc, out, err) returned by the next commands; default success
        self.warnings = []
        self.effect = None  # called with each command before it "succeeds" (what the generator would leave)

    def get_bin_path(self, _module, arg, required=False, opt_dirs=None):  # pylint: disable=unused-argument
        return self.bins.get(arg)

    def run_command(self, _module, args, **kwargs):
        self.commands.append(list(args))
        if self.effect:
            self.effect(list(args))
        # The files are on disk when the generator runs: record what it would have copied.
        self.seen = {path: self.text(path) for path in ALL_FILES + [PENDING_FILE]}
        return self.results.pop(0) if self.results else (0, "", "")

    def warn(self, _module, msg):
        self.warnings.append(msg)

    def text(self, path):
        full = self.tree.path(path)
        if not os.path.lexists(full):
            return None
        with open(full) as handle:
            return handle.read()

    def files(self):
        return {path: self.text(path) for path in ALL_FILES}


@pytest.fixture
def host(tmp_path, monkeypatch):
    tree = SysfsTree(tmp_path)
    tree.write("/usr/sbin/update-initramfs", "#!/bin/sh\n")
    tree.mkdir("/etc/modprobe.d")
    tree.mkdir("/sys/module/vfio")
    fake = Host(tree)
    # A lambda, not fake.get_bin_path itself: a bound method put on the class would not receive the module.
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path",
                        lambda module, *a, **kw: fake.get_bin_path(module, *a, **kw))  # pylint: disable=unnecessary-lambda
    # A lambda, not fake.run_command itself: a bound method put on the class would not receive the module.
    monkeypatch.setattr(basic.AnsibleModule, "run_command",
                        lambda module, *a, **kw: fake.run_command(module, *a, **kw))  # pylint: disable=unnecessary-lambda
    # A lambda, not fake.warn itself: a bound method put on the class would not receive the module.
    monkeypatch.setattr(basic.AnsibleModule, "warn",
                        lambda module, *a, **kw: fake.warn(module, *a, **kw))  # pylint: disable=unnecessary-lambda
    monkeypatch.setattr(kernel_modules, "ROOT", tree.root)
    return fake


def files_of(snapshot):
    """File and link entries of a snapshot, without mtimes (directories created on the way may stay)."""
    return {path: entry[:2] for path, entry in snapshot.items() if entry[0] != "dir"}


def run(monkeypatch, args, check=False, diff=False):
    full = dict(args)
    full["_ansible_check_mode"] = check
    full["_ansible_diff"] = diff
    return call(monkeypatch, kernel_modules.main, full)


# --------------------------------------------------------------------------- rendering


def test_initramfs_tools_files_and_rebuild(monkeypatch, host):
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "exit", result
    assert host.files() == {MODPROBE: MODPROBE_TEXT, LOAD: LIST_TEXT, ITOOLS: LIST_TEXT, DRACUT_CONF: None}
    assert result["changed"] is True
    assert result["initramfs_tool"] == "initramfs-tools"
    assert result["initramfs_rebuilt"] is True
    assert result["reboot_required"] is True
    assert result["files"] == [
        {"path": MODPROBE, "state": "present", "changed": True},
        {"path": LOAD, "state": "present", "changed": True},
        {"path": ITOOLS, "state": "present", "changed": True},
    ]
    assert host.commands == [[UPDATE_INITRAMFS, "-u", "-k", "all"]]
    # The generator ran after the files were written (modprobe.d is copied into the initramfs).
    assert host.seen[MODPROBE] == MODPROBE_TEXT and host.seen[ITOOLS] == LIST_TEXT


def test_files_are_0644(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    for path in (MODPROBE, LOAD, ITOOLS):
        assert stat.S_IMODE(os.stat(host.tree.path(path)).st_mode) == 0o644
    leftovers = [name for top, _dirs, names in os.walk(host.tree.root) for name in names
                 if name.startswith(".gpuops-")]
    assert leftovers == []


def test_blacklist_order_kept_options_and_softdeps_sorted(monkeypatch, host):
    args = {"name": "s", "blacklist": ["zz", "aa"], "options": {"b": "x=1", "a": "y=2"},
            "softdeps": {"d": ["c"], "a": ["b"]}}
    run(monkeypatch, args)
    assert host.text("/etc/modprobe.d/s.conf") == (HEADER % "s" + "blacklist zz\nblacklist aa\n"
                                                   "options a y=2\noptions b x=1\n"
                                                   "softdep a pre: b\nsoftdep d pre: c\n")


def test_dracut_detected_and_used(monkeypatch, host):
    os.unlink(host.tree.path("/usr/sbin/update-initramfs"))
    host.tree.write("/usr/bin/dracut", "#!/bin/sh\n")
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "exit", result
    assert result["initramfs_tool"] == "dracut"
    assert host.files() == {MODPROBE: MODPROBE_TEXT, LOAD: LIST_TEXT, ITOOLS: None, DRACUT_CONF: DRACUT_TEXT}
    assert host.commands == [[DRACUT, "-f", "--regenerate-all"]]


@pytest.mark.parametrize("location", ["/usr/sbin", "/sbin", "/usr/bin"])
def test_detection_looks_in_the_sbin_directories(monkeypatch, host, location):
    os.unlink(host.tree.path("/usr/sbin/update-initramfs"))
    host.tree.write(location + "/dracut", "")
    _kind, result = run(monkeypatch, {"name": "x", "blacklist": ["nouveau"]}, check=True)
    assert result["initramfs_tool"] == "dracut"


def test_initramfs_tools_preferred_when_both_present(monkeypatch, host):
    host.tree.write("/usr/bin/dracut", "")
    _kind, result = run(monkeypatch, VFIO_ARGS, check=True)
    assert result["initramfs_tool"] == "initramfs-tools"


def test_explicit_tool_overrides_detection(monkeypatch, host):
    kind, result = run(monkeypatch, dict(VFIO_ARGS, initramfs_tool="dracut"))
    assert kind == "exit", result
    assert result["initramfs_tool"] == "dracut"
    assert host.text(DRACUT_CONF) == DRACUT_TEXT and host.text(ITOOLS) is None
    assert host.commands == [[DRACUT, "-f", "--regenerate-all"]]


def test_switching_generator_moves_the_initramfs_list(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    host.commands.clear()
    kind, result = run(monkeypatch, dict(VFIO_ARGS, initramfs_tool="dracut"))
    assert kind == "exit", result
    assert host.files() == {MODPROBE: MODPROBE_TEXT, LOAD: LIST_TEXT, ITOOLS: None, DRACUT_CONF: DRACUT_TEXT}
    assert {f["path"]: (f["state"], f["changed"]) for f in result["files"]} == {
        MODPROBE: ("present", False), LOAD: ("present", False), ITOOLS: ("absent", True),
        DRACUT_CONF: ("present", True)}
    assert host.commands == [[DRACUT, "-f", "--regenerate-all"]]


def test_no_generator_writes_files_warns_and_never_rebuilds(monkeypatch, host):
    os.unlink(host.tree.path("/usr/sbin/update-initramfs"))
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "exit", result
    assert result["initramfs_tool"] == "none" and result["initramfs_rebuilt"] is False
    assert result["changed"] is True and result["reboot_required"] is True
    assert host.text(ITOOLS) == LIST_TEXT and host.commands == []
    assert len(host.warnings) == 1 and "rebuild the initramfs yourself" in host.warnings[0]
    assert "gpuops-vfio" in host.warnings[0]


def test_tool_none_without_initramfs_list_does_not_warn(monkeypatch, host):
    kind, result = run(monkeypatch, {"name": "n", "blacklist": ["nouveau"], "initramfs_tool": "none"})
    assert kind == "exit" and result["changed"] and not result["initramfs_rebuilt"]
    assert host.warnings == [] and host.commands == []


def test_empty_set_writes_nothing(monkeypatch, host):
    before = host.tree.snapshot()
    kind, result = run(monkeypatch, {"name": "empty"})
    assert kind == "exit" and result["changed"] is False and result["files"] == []
    assert result["reboot_required"] is False and host.commands == []
    assert host.tree.snapshot() == before


def test_file_with_nothing_left_is_removed(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    host.commands.clear()
    kind, result = run(monkeypatch, {"name": "gpuops-vfio", "load": ["vfio"]})
    assert kind == "exit", result
    assert host.files() == {MODPROBE: None, LOAD: HEADER % "gpuops-vfio" + "vfio\n", ITOOLS: None,
                            DRACUT_CONF: None}
    assert {f["path"]: (f["state"], f["changed"]) for f in result["files"]} == {
        MODPROBE: ("absent", True), LOAD: ("present", True), ITOOLS: ("absent", True)}
    assert host.commands == [[UPDATE_INITRAMFS, "-u", "-k", "all"]]


def test_other_files_are_left_alone(monkeypatch, host):
    host.tree.write("/etc/modprobe.d/blacklist.conf", "blacklist pcspkr\n")
    host.tree.write("/etc/modprobe.d/gpuops-nouveau.conf", "blacklist nouveau\n")
    run(monkeypatch, VFIO_ARGS)
    run(monkeypatch, {"name": "gpuops-vfio", "state": "absent"})
    assert host.text("/etc/modprobe.d/blacklist.conf") == "blacklist pcspkr\n"
    assert host.text("/etc/modprobe.d/gpuops-nouveau.conf") == "blacklist nouveau\n"


# --------------------------------------------------------------------------- check mode, diff, idempotence


def test_check_mode_writes_nothing_but_reports(monkeypatch, host):
    before = host.tree.snapshot()
    kind, result = run(monkeypatch, VFIO_ARGS, check=True, diff=True)
    assert kind == "exit", result
    assert host.tree.snapshot() == before and host.commands == []
    assert result["changed"] is True and result["initramfs_rebuilt"] is True and result["reboot_required"] is True
    assert [f["path"] for f in result["files"] if f["changed"]] == [MODPROBE, LOAD, ITOOLS]
    assert result["diff"] == [
        {"before_header": MODPROBE, "after_header": MODPROBE, "before": "", "after": MODPROBE_TEXT},
        {"before_header": LOAD, "after_header": LOAD, "before": "", "after": LIST_TEXT},
        {"before_header": ITOOLS, "after_header": ITOOLS, "before": "", "after": LIST_TEXT},
    ]


def test_check_mode_absent_writes_nothing(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    host.commands.clear()
    before = host.tree.snapshot()
    kind, result = run(monkeypatch, {"name": "gpuops-vfio", "state": "absent"}, check=True)
    assert kind == "exit" and result["changed"] and result["initramfs_rebuilt"]
    assert host.tree.snapshot() == before and host.commands == []


def test_diff_shows_old_and_new_content(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    new = dict(VFIO_ARGS, options={"nouveau": "modeset=0"})
    kind, result = run(monkeypatch, new, diff=True)
    assert kind == "exit", result
    assert result["diff"] == [{
        "before_header": MODPROBE, "after_header": MODPROBE, "before": MODPROBE_TEXT,
        "after": MODPROBE_TEXT.replace("options vfio_pci disable_vga=1\n", ""),
    }]
    kind, result = run(monkeypatch, {"name": "gpuops-vfio", "state": "absent"}, diff=True)
    assert [(d["before_header"], d["after"]) for d in result["diff"]] == [(MODPROBE, ""), (LOAD, ""), (ITOOLS, "")]
    assert result["diff"][1]["before"] == LIST_TEXT


def test_no_diff_key_without_diff_mode(monkeypatch, host):
    _kind, result = run(monkeypatch, VFIO_ARGS)
    assert "diff" not in result


def test_second_run_is_idempotent(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    host.commands.clear()
    before = host.tree.snapshot()
    for check in (True, False):
        kind, result = run(monkeypatch, VFIO_ARGS, check=check, diff=True)
        assert kind == "exit", result
        assert result["changed"] is False and result["initramfs_rebuilt"] is False
        assert result["reboot_required"] is False and result["diff"] == []
        wanted = [(MODPROBE, False), (LOAD, False), (ITOOLS, False)]
        assert [(f["path"], f["changed"]) for f in result["files"]] == wanted
    assert host.commands == [] and host.tree.snapshot() == before  # mtimes included


def test_hand_edited_file_is_put_back(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    host.commands.clear()
    host.tree.write(MODPROBE, MODPROBE_TEXT + "blacklist something\n")
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "exit" and result["changed"]
    assert host.text(MODPROBE) == MODPROBE_TEXT and len(host.commands) == 1


# --------------------------------------------------------------------------- state=absent


def test_absent_removes_every_file_of_the_set(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    # Leftover of an earlier dracut run too.
    host.tree.write(DRACUT_CONF, DRACUT_TEXT)
    host.commands.clear()
    kind, result = run(monkeypatch, {"name": "gpuops-vfio", "state": "absent"})
    assert kind == "exit", result
    assert host.files() == {path: None for path in ALL_FILES}
    assert result["files"] == [{"path": path, "state": "absent", "changed": True} for path in ALL_FILES]
    assert result["changed"] and result["initramfs_rebuilt"] and result["reboot_required"]
    assert host.commands == [[UPDATE_INITRAMFS, "-u", "-k", "all"]]
    host.commands.clear()
    kind, result = run(monkeypatch, {"name": "gpuops-vfio", "state": "absent"})
    assert kind == "exit" and result["changed"] is False and result["files"] == []
    assert result["reboot_required"] is False and host.commands == []


def test_absent_ignores_the_other_options(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    kind, _result = run(monkeypatch, dict(VFIO_ARGS, state="absent"))
    assert kind == "exit" and host.files() == {path: None for path in ALL_FILES}


def test_absent_removes_a_dangling_symlink(monkeypatch, host):
    host.tree.raw_link(MODPROBE, "/nonexistent")
    kind, result = run(monkeypatch, {"name": "gpuops-vfio", "state": "absent"})
    assert kind == "exit" and result["changed"]
    assert not os.path.lexists(host.tree.path(MODPROBE))


# --------------------------------------------------------------------------- rebuild and rollback


def test_rebuild_failure_restores_previous_files(monkeypatch, host):
    run(monkeypatch, {"name": "gpuops-vfio", "blacklist": ["nouveau"], "initramfs": ["vfio"]})
    before_files = host.files()
    before = host.tree.snapshot()
    host.commands.clear()
    host.results.append((1, "some output\n", "E: mkinitramfs failure cpio 141\n"))
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "fail"
    msg = result["msg"]
    assert msg.startswith("%s -u -k all failed (rc=1): E: mkinitramfs failure cpio 141; " % UPDATE_INITRAMFS)
    assert "the module files were put back as they were" in msg
    assert "the initramfs may need `%s -u -k all` again" % UPDATE_INITRAMFS in msg
    # The generator saw the new files, then they were put back (the new load file removed again).
    assert host.seen[MODPROBE] == MODPROBE_TEXT
    assert host.files() == before_files and host.text(LOAD) is None
    assert files_of(host.tree.snapshot()) == files_of(before)


def test_rebuild_failure_on_first_run_leaves_no_files(monkeypatch, host):
    host.results.append((2, "", "dracut: cannot write\n"))
    kind, result = run(monkeypatch, dict(VFIO_ARGS, initramfs_tool="dracut"))
    assert kind == "fail"
    assert result["msg"].startswith("%s -f --regenerate-all failed (rc=2): dracut: cannot write; " % DRACUT)
    assert host.files() == {path: None for path in ALL_FILES}
    # Nothing recorded as done: the next run tries again.
    kind, result = run(monkeypatch, dict(VFIO_ARGS, initramfs_tool="dracut"))
    assert kind == "exit" and result["changed"] and len(host.commands) == 2


def test_rebuild_failure_uses_stdout_when_stderr_is_empty(monkeypatch, host):
    host.results.append((1, "update-initramfs: out of space\n", ""))
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "fail" and "failed (rc=1): update-initramfs: out of space;" in result["msg"]


def test_rebuild_failure_with_absent_puts_files_back(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    before = host.files()
    host.results.append((1, "", "boom\n"))
    kind, result = run(monkeypatch, {"name": "gpuops-vfio", "state": "absent"})
    assert kind == "fail" and "boom" in result["msg"] and "put back" in result["msg"]
    assert host.files() == before


def test_rebuild_runs_under_timeout(monkeypatch, host):
    host.bins["timeout"] = TIMEOUT
    kind, _result = run(monkeypatch, dict(VFIO_ARGS, timeout=120))
    assert kind == "exit"
    assert host.commands == [[TIMEOUT, "--kill-after=30", "120", UPDATE_INITRAMFS, "-u", "-k", "all"]]


def test_rebuild_timeout_is_named_and_rolled_back(monkeypatch, host):
    host.bins["timeout"] = TIMEOUT
    host.results.append((124, "", ""))
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "fail"
    assert "failed (rc=124): " in result["msg"] and "did not finish within 900 seconds (timeout)" in result["msg"]
    assert host.files() == {path: None for path in ALL_FILES}


def test_write_failure_rolls_back_written_files(monkeypatch, host):
    # /etc/modules-load.d is a file: the load file cannot be written after the modprobe.d one was.
    host.tree.write("/etc/modules-load.d", "not a directory\n")
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "fail"
    assert result["msg"].startswith("writing the module settings failed (")
    assert result["msg"].endswith("the files were put back as they were")
    assert host.text(MODPROBE) is None and host.commands == []


def test_missing_generator_fails_before_writing(monkeypatch, host):
    kind, result = run(monkeypatch, dict(VFIO_ARGS, initramfs_tool="dracut"))
    assert kind == "exit", result
    del host.bins["dracut"]
    kind, result = run(monkeypatch, dict(VFIO_ARGS, initramfs_tool="dracut", load=["vfio"]))
    assert kind == "fail"
    assert result["msg"].startswith("the initramfs generator dracut is not installed")
    assert host.text(LOAD) == LIST_TEXT  # unchanged: the failure must not leave the new files behind


def test_missing_generator_message(monkeypatch, host):
    del host.bins["dracut"]
    kind, result = run(monkeypatch, dict(VFIO_ARGS, initramfs_tool="dracut"))
    assert kind == "fail"
    assert result["msg"] == ("the initramfs generator dracut is not installed; install it or set "
                             "initramfs_tool")


# --------------------------------------------------------------------------- loaded modules, reboot


def test_loaded_blacklisted_module_needs_reboot_even_without_change(monkeypatch, host):
    host.tree.mkdir("/sys/module/nouveau")
    args = {"name": "gpuops-nouveau", "blacklist": ["nouveau", "rivafb"], "options": {"nouveau": "modeset=0"}}
    kind, result = run(monkeypatch, args)
    assert kind == "exit" and result["loaded_blacklisted"] == ["nouveau"] and result["reboot_required"]
    kind, result = run(monkeypatch, args)
    assert kind == "exit" and result["changed"] is False
    assert result["loaded_blacklisted"] == ["nouveau"] and result["reboot_required"] is True
    os.rmdir(host.tree.path("/sys/module/nouveau"))
    _kind, result = run(monkeypatch, args)
    assert result["loaded_blacklisted"] == [] and result["reboot_required"] is False


def test_loaded_blacklisted_dash_matches_underscore(monkeypatch, host):
    host.tree.mkdir("/sys/module/nvidia_drm")
    _kind, result = run(monkeypatch, {"name": "x", "blacklist": ["nvidia-drm", "nvidia_modeset"]}, check=True)
    assert result["loaded_blacklisted"] == ["nvidia-drm"]


def test_loaded_module_not_blacklisted_is_not_reported(monkeypatch, host):
    # vfio is loaded (fixture) and only listed in load/initramfs.
    run(monkeypatch, VFIO_ARGS)
    _kind, result = run(monkeypatch, VFIO_ARGS)
    assert result["loaded_blacklisted"] == [] and result["reboot_required"] is False


def test_absent_does_not_report_loaded_modules(monkeypatch, host):
    host.tree.mkdir("/sys/module/nouveau")
    _kind, result = run(monkeypatch, {"name": "x", "blacklist": ["nouveau"], "state": "absent"})
    assert result["loaded_blacklisted"] == [] and result["reboot_required"] is False


def test_reboot_required_in_check_mode(monkeypatch, host):
    _kind, result = run(monkeypatch, {"name": "x", "load": ["vfio"]}, check=True)
    assert result["reboot_required"] is True and result["loaded_blacklisted"] == []


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("args,message", [
    ({"name": "bad name"}, "name 'bad name' is not valid"),
    ({"name": "../etc"}, "name '../etc' is not valid"),
    ({"name": "-x"}, "name '-x' is not valid"),
    ({"name": ""}, "name '' is not valid"),
    ({"name": "a/b"}, "name 'a/b' is not valid"),
    ({"name": "s", "blacklist": ["nou veau"]}, "blacklist: 'nou veau' is not a kernel module name"),
    ({"name": "s", "load": ["vfio", "vfio pci"]}, "load: 'vfio pci' is not a kernel module name"),
    ({"name": "s", "initramfs": ["../x"]}, "initramfs: '../x' is not a kernel module name"),
    ({"name": "s", "options": {"bad mod": "x=1"}}, "options: 'bad mod' is not a kernel module name"),
    ({"name": "s", "options": {"nouveau": "modeset=0\nblacklist nvidia"}},
     "options for nouveau: 'modeset=0\\nblacklist nvidia' is not a parameter string"),
    ({"name": "s", "options": {"nouveau": "modeset=0 # off"}},
     "options for nouveau: 'modeset=0 # off' is not a parameter string"),
    ({"name": "s", "options": {"nouveau": "a=1\rb=2"}}, "options for nouveau: 'a=1\\rb=2' is not a parameter"),
    ({"name": "s", "options": {"nouveau": ""}}, "options for nouveau: '' is not a parameter string"),
    ({"name": "s", "options": {"nouveau": " modeset=0"}}, "options for nouveau: ' modeset=0' is not a parameter"),
    ({"name": "s", "options": {"nouveau": ["modeset=0"]}}, "options for nouveau: ['modeset=0'] is not a parameter"),
    ({"name": "s", "softdeps": {"nvidia": "vfio-pci"}},
     "softdeps for nvidia: expected a non-empty list of module names, got 'vfio-pci'"),
    ({"name": "s", "softdeps": {"nvidia": []}}, "softdeps for nvidia: expected a non-empty list of module names, got []"),
    ({"name": "s", "softdeps": {"nvidia": None}}, "softdeps for nvidia: expected a non-empty list"),
    ({"name": "s", "softdeps": {"nvidia": ["vfio pci"]}}, "softdeps for nvidia: 'vfio pci' is not a kernel module"),
    ({"name": "s", "softdeps": {"nv idia": ["vfio"]}}, "softdeps: 'nv idia' is not a kernel module name"),
    ({"name": "s", "timeout": 0}, "timeout must be a positive number of seconds, got 0"),
    ({"name": "s", "timeout": -5}, "timeout must be a positive number of seconds, got -5"),
])
def test_bad_input_fails_naming_the_value_and_writes_nothing(monkeypatch, host, args, message):
    before = host.tree.snapshot()
    for check in (False, True):
        kind, result = run(monkeypatch, dict(args, blacklist=args.get("blacklist", ["nouveau"])), check=check)
        assert kind == "fail", result
        assert result["msg"].startswith(message), result["msg"]
    assert host.tree.snapshot() == before and host.commands == []


@pytest.mark.parametrize("args", [
    {"name": "gpuops\n", "blacklist": ["nouveau"]},
    {"name": "s", "blacklist": ["nouveau\n"]},
    {"name": "s", "options": {"nouveau": "modeset=0\n"}},
])
def test_trailing_newline_is_refused(monkeypatch, host, args):
    before = host.tree.snapshot()
    kind, _result = run(monkeypatch, args)
    assert kind == "fail"
    assert host.tree.snapshot() == before


@pytest.mark.parametrize("args,message", [
    ({"name": "s", "options": {"nouveau": "modeset=0\\"}},
     "options for nouveau: 'modeset=0\\\\' is not a parameter string: it ends in a backslash, which modprobe reads "
     "as a line continuation (the next line would be joined to it)"),
    ({"name": "s", "options": {"nouveau": "a=1 \\"}}, "options for nouveau: 'a=1 \\\\' is not a parameter string: it ends"),
    ({"name": "s", "options": {"nouveau": "a=1\tb=2"}},
     "options for nouveau: 'a=1\\tb=2' is not a parameter string (one line of printable characters, no '#', not "
     "empty, not starting with a space)"),
    ({"name": "s", "options": {"nouveau": "a=1\x00"}}, "options for nouveau: 'a=1\\x00' is not a parameter string"),
    ({"name": "s", "options": {"nouveau": "a=\x1b[31m"}}, "options for nouveau: 'a=\\x1b[31m' is not a parameter"),
    ({"name": "s", "options": {"nouveau": "a=1\u2028b=2"}}, "options for nouveau: 'a=1\\u2028b=2' is not a parameter"),
    ({"name": "s", "options": {"nouveau": "a=1\x85"}}, "options for nouveau: 'a=1\\x85' is not a parameter"),
    ({"name": "a" * 300}, "name '" + "a" * 49 + "... (300 characters) is not valid: it has 300 characters, at most 64 "
                          "are allowed (it is the stem of the file names)"),
    ({"name": "a" * 65}, "name '" + "a" * 49 + "... (65 characters) is not valid: it has 65 characters, at most 64"),
    ({"name": "s", "blacklist": ["n" * 56]},
     "blacklist: '" + "n" * 56 + "' is not a kernel module name: it has 56 characters, the kernel allows at most 55"),
    ({"name": "s", "options": {"m" * 300: "a=1"}}, "options: '" + "m" * 49 + "... (300 characters) is not a kernel"),
    ({"name": "s", "softdeps": {"nvidia": ["v" * 100]}}, "softdeps for nvidia: '" + "v" * 49 + "... (100 characters)"),
    ({"name": "s", "timeout": 10 ** 30},
     "timeout must be 1 to 86400 seconds, got a number of 31 digits; nothing was changed"),
    ({"name": "s", "timeout": 86401}, "timeout must be 1 to 86400 seconds, got 86401; nothing was changed"),
    ({"name": "s", "timeout": "1e400"}, "timeout must be 1 to 86400 seconds, got a number of 401 digits; nothing was changed"),
    ({"name": "s", "timeout": True}, "timeout must be a whole number of seconds, got True; nothing was changed"),
])
def test_unsafe_values_are_refused_before_anything_is_written(monkeypatch, host, args, message):
    # A trailing backslash joined the next modprobe.d line to the options; a 300-character name failed only
    # at the final file move (ansible-core 2.19 raises a bare Exception there), with a traceback.
    before = host.tree.snapshot()
    for check in (False, True):
        kind, result = run(monkeypatch, dict(args, blacklist=args.get("blacklist", ["nouveau"])), check=check)
        assert kind == "fail", result
        assert result["msg"].startswith(message), result["msg"]
    assert host.tree.snapshot() == before and host.commands == []


def test_longest_names_are_accepted(monkeypatch, host):
    kind, result = run(monkeypatch, {"name": "a" * 64, "blacklist": ["n" * 55], "timeout": 86400,
                                     "options": {"n" * 55: "a=1 b=\\x"}})
    assert kind == "exit", result
    assert host.text("/etc/modprobe.d/%s.conf" % ("a" * 64)).endswith("options %s a=1 b=\\x\n" % ("n" * 55))


def test_failed_final_write_puts_the_files_back(monkeypatch, host):
    # ansible-core 2.19's atomic_move raises a bare Exception; only OSError was caught, so the modprobe.d
    # file written just before stayed (with a traceback instead of a message).
    run(monkeypatch, {"name": "gpuops-vfio", "blacklist": ["nouveau"], "load": ["vfio"]})
    before_files = host.files()
    before = host.tree.snapshot()
    host.commands.clear()
    failing_atomic_move(monkeypatch, LOAD)
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "fail", result
    assert result["msg"] == ("writing the module settings failed (writing %s failed: Could not replace "
                             "'gpuops-vfio.conf' (File name too long)); the files were put back as they were" % LOAD)
    assert host.files() == before_files and host.commands == []
    assert files_of(host.tree.snapshot()) == files_of(before)


def test_failed_final_write_on_a_first_run_leaves_no_files(monkeypatch, host):
    before = host.tree.snapshot()
    failing_atomic_move(monkeypatch, ITOOLS)
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "fail", result
    assert result["msg"].endswith("; the files were put back as they were")
    assert host.files() == {path: None for path in ALL_FILES} and host.commands == []
    assert files_of(host.tree.snapshot()) == files_of(before)


def test_name_is_required(monkeypatch, host):
    kind, result = run(monkeypatch, {"blacklist": ["nouveau"]})
    assert kind == "fail" and "name" in result["msg"]


# --------------------------------------------------------------------------- never a traceback

HOSTILE = hs.sampled_from(HOSTILE_VALUES)
MODULE_NAMES = hs.one_of(hs.sampled_from(["nouveau", "vfio_pci", "vfio-pci", "bad name", "", "a#b", "n" * 56,
                                          "nouveau\n"]),
                         hs.text(max_size=6), HOSTILE)
OPTION_VALUES = hs.one_of(hs.sampled_from(["modeset=0", "a=1 b=2", "x\ny", "#", "", "a=1\\", "a=1\\\n"]),
                          hs.text(max_size=8), hs.integers(), hs.none(), hs.lists(hs.text(max_size=3), max_size=2),
                          HOSTILE)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=hs.fixed_dictionaries({"name": hs.one_of(hs.sampled_from(["gpuops-x", "a b", "", "a" * 300]),
                                                     hs.text(max_size=8), HOSTILE)},
                                  optional={
    "blacklist": hs.lists(MODULE_NAMES, max_size=3),
    "load": hs.lists(MODULE_NAMES, max_size=3),
    "initramfs": hs.lists(MODULE_NAMES, max_size=3),
    "options": hs.dictionaries(MODULE_NAMES, OPTION_VALUES, max_size=2),
    "softdeps": hs.dictionaries(MODULE_NAMES, hs.one_of(hs.lists(MODULE_NAMES, max_size=2), OPTION_VALUES),
                                max_size=2),
    "state": hs.sampled_from(["present", "absent", "bogus"]),
    "initramfs_tool": hs.sampled_from(["auto", "dracut", "initramfs-tools", "none", "mkinitcpio"]),
    "timeout": hs.one_of(hs.integers(min_value=-2, max_value=5), hs.text(max_size=3), HOSTILE),
    "rebuild": hs.one_of(hs.sampled_from(["changed", "always", "never"]), HOSTILE),
}), check=hs.booleans())
def test_fuzz_never_raises(monkeypatch, host, args, check):
    kind, result = run(monkeypatch, args, check=check)
    if kind == "fail":
        assert isinstance(result["msg"], str) and result["msg"]
        assert "Traceback" not in result["msg"]
    else:
        assert isinstance(result["changed"], bool)


# --------------------------------------------------------------------------- rebuild option


def test_rebuild_never_writes_files_and_reports_the_pending_rebuild(monkeypatch, host):
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild="never"))
    assert kind == "exit", result
    assert result["changed"] is True and result["initramfs_rebuilt"] is False
    assert result["initramfs_pending"] is True
    assert host.commands == []
    assert host.files()[MODPROBE] == MODPROBE_TEXT


def test_rebuild_always_rebuilds_an_unchanged_set_once(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    host.commands.clear()
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild="always"))
    assert kind == "exit", result
    assert result["changed"] is True and result["initramfs_rebuilt"] is True
    assert result["initramfs_pending"] is False
    assert host.commands == [[UPDATE_INITRAMFS, "-u", "-k", "all"]]
    # In check mode the same call says it would rebuild, and runs nothing.
    host.commands.clear()
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild="always"), check=True)
    assert result["changed"] is True and result["initramfs_rebuilt"] is True and host.commands == []


def test_rebuild_changed_is_idempotent(monkeypatch, host):
    run(monkeypatch, dict(VFIO_ARGS, rebuild="changed"))
    host.commands.clear()
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild="changed"))
    assert kind == "exit" and result["changed"] is False and host.commands == []


# --------------------------------------------------------------------------- a run cut short before its rebuild


def pending_record(host):
    text = host.text(PENDING_FILE)
    return None if text is None else json.loads(text)


def test_the_rebuild_is_recorded_as_due_while_it_runs_and_cleared_after(monkeypatch, host):
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "exit", result
    # While the generator ran, the record said which set it was building for.
    during = json.loads(host.seen[PENDING_FILE])
    assert during["changed"] == ["gpuops-vfio"] and during["since"].endswith("Z")
    assert pending_record(host) is None
    assert result["rebuild_reason"] == "files of set gpuops-vfio changed"


def test_a_run_cut_short_before_its_rebuild_finished_is_finished_by_the_next(monkeypatch, host):
    # The first run wrote the files and died in update-initramfs (power loss): files and record on disk.
    run(monkeypatch, VFIO_ARGS)
    host.tree.write(PENDING_FILE, '{"changed": ["gpuops-vfio"], "since": "2026-11-24T09:30:00Z"}\n')
    host.commands.clear()
    kind, result = run(monkeypatch, VFIO_ARGS, check=True)
    assert kind == "exit", result
    assert result["changed"] is True and result["initramfs_rebuilt"] is True and result["reboot_required"] is True
    assert result["rebuild_reason"] == "an earlier run changed gpuops-vfio and did not finish (since 2026-11-24T09:30:00Z)"
    assert host.commands == [] and pending_record(host) is not None
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "exit", result
    assert result["initramfs_rebuilt"] is True and not any(f["changed"] for f in result["files"])
    assert host.commands == [[UPDATE_INITRAMFS, "-u", "-k", "all"]]
    assert pending_record(host) is None
    host.commands.clear()
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert result["changed"] is False and result["rebuild_reason"] == "" and host.commands == []


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", '{"changed": "x", "since": 5}'])
def test_a_record_cut_short_itself_still_means_due(monkeypatch, host, text):
    run(monkeypatch, VFIO_ARGS)
    host.tree.write(PENDING_FILE, text)
    host.commands.clear()
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "exit", result
    assert result["initramfs_rebuilt"] is True
    assert result["rebuild_reason"] == "an earlier run changed boot files and did not finish"
    assert pending_record(host) is None


def test_a_failed_rebuild_leaves_the_due_record_as_it_found_it(monkeypatch, host):
    run(monkeypatch, VFIO_ARGS)
    host.tree.write(PENDING_FILE, '{"changed": ["gpuops-nouveau"], "since": "2026-11-24T09:30:00Z"}\n')
    host.results = [(1, "", "mkinitramfs: failed")]
    kind, result = run(monkeypatch, dict(VFIO_ARGS, load=["vfio"]))
    assert kind == "fail", result
    assert "the module files were put back as they were" in result["msg"]
    assert json.loads(host.seen[PENDING_FILE])["changed"] == ["gpuops-nouveau", "gpuops-vfio"]
    assert pending_record(host) == {"changed": ["gpuops-nouveau"], "since": "2026-11-24T09:30:00Z"}
    assert host.text(LOAD) == LIST_TEXT


def test_a_failed_first_rebuild_leaves_no_record(monkeypatch, host):
    host.results = [(1, "", "mkinitramfs: failed")]
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "fail", result
    assert pending_record(host) is None and host.files() == dict.fromkeys(ALL_FILES)
    assert not os.path.exists(host.tree.path("/var"))


def test_never_leaves_the_rebuild_due_and_the_next_changed_call_does_it(monkeypatch, host):
    kind, result = run(monkeypatch, {"name": "gpuops-nouveau", "blacklist": ["nouveau"], "rebuild": "never"})
    assert kind == "exit", result
    assert result["initramfs_pending"] is True and result["initramfs_rebuilt"] is False and host.commands == []
    assert pending_record(host)["changed"] == ["gpuops-nouveau"]
    # Another set with nothing to change picks the due rebuild up.
    run(monkeypatch, VFIO_ARGS)
    host.commands.clear()
    kind, result = run(monkeypatch, {"name": "gpuops-nouveau", "blacklist": ["nouveau"], "rebuild": "never"})
    assert result["initramfs_pending"] is False and result["changed"] is False


def test_no_generator_keeps_the_record_and_says_the_rebuild_is_due(monkeypatch, host):
    host.tree.write(PENDING_FILE, '{"changed": ["gpuops-vfio"]}\n')
    kind, result = run(monkeypatch, dict(VFIO_ARGS, initramfs_tool="none"))
    assert kind == "exit", result
    assert result["initramfs_rebuilt"] is False and result["initramfs_pending"] is True and host.commands == []
    assert pending_record(host)["changed"] == ["gpuops-vfio"]


# --------------------------------------------------------------------------- rebuild_kernels: one rebuild per kernel

RUNNING = "6.1.0-18-amd64"
NEWER = "6.1.0-20-amd64"
T_BEFORE = 1_600_000_000  # long before any file of the set was written


def install_kernel(host, version, image="initrd.img-%s", built=None):
    """A kernel: modules directory, vmlinuz and (unless ``image`` is None) an initramfs, built at ``built`` (now)."""
    host.tree.mkdir("/lib/modules/%s/kernel" % version)
    host.tree.write("/boot/vmlinuz-%s" % version, "kernel")
    if image:
        host.tree.write("/boot/" + image % version, "image")
        if built is not None:
            os.utime(host.tree.path("/boot/" + image % version), (built, built))


def generator(host):
    """What update-initramfs and dracut leave: a new image for the kernel(s) they build (and the call recorded)."""
    def effect(args):
        if "--regenerate-all" in args or args[-2:] == ["-k", "all"]:
            names = os.listdir(host.tree.path("/boot"))
            for name in names:
                if name.startswith(("initrd.img-", "initramfs-")):
                    os.utime(host.tree.path("/boot/" + name))
            return
        version = args[-1]
        name = "initramfs-%s.img" % version if "--kver" in args else "initrd.img-%s" % version
        host.tree.write("/boot/" + name, "image")
    return effect


@pytest.fixture
def prepared(monkeypatch, host):
    """A host prepared with VFIO_ARGS and running RUNNING; NEWER installed afterwards with an image built before."""
    host.tree.write("/proc/sys/kernel/osrelease", RUNNING + "\n")
    install_kernel(host, RUNNING)
    host.effect = generator(host)
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "exit" and result["kernels_rebuilt"] == [], result
    install_kernel(host, NEWER, built=T_BEFORE)
    host.commands.clear()
    return host


def test_only_the_kernel_whose_image_predates_the_files_is_rebuilt(monkeypatch, prepared):
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True))
    assert kind == "exit", result
    assert prepared.commands == [[UPDATE_INITRAMFS, "-u", "-k", NEWER]]
    assert result["changed"] is True and result["initramfs_rebuilt"] is False
    assert not any(f["changed"] for f in result["files"])
    [item] = result["kernels_rebuilt"]
    assert item["kernel"] == NEWER and item["running"] is False
    assert item["reason"].startswith("initramfs /boot/initrd.img-%s is older than " % NEWER) and MODPROBE in item["reason"]
    # The running kernel was right: nothing asks for a reboot.
    assert result["reboot_required"] is False
    # The image is current now: the next run rebuilds nothing.
    prepared.commands.clear()
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True))
    assert result["changed"] is False and result["kernels_rebuilt"] == [] and prepared.commands == []


def test_without_the_option_the_stale_kernel_is_left_alone(monkeypatch, prepared):
    kind, result = run(monkeypatch, VFIO_ARGS)
    assert kind == "exit" and result["changed"] is False and result["kernels_rebuilt"] == []
    assert prepared.commands == []


def test_a_kernel_without_initramfs_gets_one_created(monkeypatch, prepared):
    os.unlink(prepared.tree.path("/boot/initrd.img-" + NEWER))
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True))
    assert kind == "exit", result
    assert prepared.commands == [[UPDATE_INITRAMFS, "-c", "-k", NEWER]]
    assert result["kernels_rebuilt"][0]["reason"].startswith("has no initramfs")
    assert os.path.exists(prepared.tree.path("/boot/initrd.img-" + NEWER))


def test_the_running_kernels_own_image_rebuilt_asks_for_a_reboot(monkeypatch, prepared):
    os.utime(prepared.tree.path("/boot/initrd.img-" + RUNNING), (T_BEFORE, T_BEFORE))
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True))
    assert kind == "exit", result
    assert prepared.commands == [[UPDATE_INITRAMFS, "-u", "-k", RUNNING], [UPDATE_INITRAMFS, "-u", "-k", NEWER]]
    assert [(k["kernel"], k["running"]) for k in result["kernels_rebuilt"]] == [(RUNNING, True), (NEWER, False)]
    assert result["reboot_required"] is True


def test_check_mode_and_diff_say_which_kernels_and_run_nothing(monkeypatch, prepared):
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True), check=True, diff=True)
    assert kind == "exit", result
    assert prepared.commands == [] and result["changed"] is True
    assert [k["kernel"] for k in result["kernels_rebuilt"]] == [NEWER]
    assert result["kernels_rebuilt"][0]["command"] == [UPDATE_INITRAMFS, "-u", "-k", NEWER]
    [diff] = result["diff"]
    assert diff["before_header"] == "initramfs of kernel %s" % NEWER
    assert diff["before"].startswith("initramfs /boot/initrd.img-%s is older than" % NEWER)
    assert diff["after"] == "rebuilt: %s -u -k %s\n" % (UPDATE_INITRAMFS, NEWER)
    assert os.stat(prepared.tree.path("/boot/initrd.img-" + NEWER)).st_mtime == T_BEFORE


def test_dracut_rebuilds_one_kernel_with_kver(monkeypatch, prepared):
    os.unlink(prepared.tree.path("/boot/initrd.img-" + NEWER))
    install_kernel(prepared, NEWER, image="initramfs-%s.img", built=T_BEFORE)
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True, initramfs_tool="dracut"))
    assert kind == "exit", result
    # The set moves its initramfs list to dracut.conf.d: --regenerate-all builds every kernel, none is done twice.
    assert prepared.commands == [[DRACUT, "-f", "--regenerate-all"]]
    prepared.commands.clear()
    os.utime(prepared.tree.path("/boot/initramfs-%s.img" % NEWER), (T_BEFORE, T_BEFORE))
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True, initramfs_tool="dracut"))
    assert kind == "exit", result
    assert prepared.commands == [[DRACUT, "-f", "--kver", NEWER]]
    assert result["reboot_required"] is False


def test_a_set_rebuilt_for_all_leaves_only_the_missing_images(monkeypatch, prepared):
    # The files change: update-initramfs -u -k all updates every existing image but creates none.
    install_kernel(prepared, "6.1.0-21-amd64", image=None)
    changed = dict(VFIO_ARGS, options={"nouveau": "modeset=0"}, rebuild_kernels=True)
    kind, result = run(monkeypatch, changed)
    assert kind == "exit", result
    assert prepared.commands == [[UPDATE_INITRAMFS, "-u", "-k", "all"], [UPDATE_INITRAMFS, "-c", "-k", "6.1.0-21-amd64"]]
    assert [k["kernel"] for k in result["kernels_rebuilt"]] == ["6.1.0-21-amd64"]


def test_rebuild_never_rebuilds_no_kernel(monkeypatch, prepared):
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True, rebuild="never"))
    assert kind == "exit" and result["kernels_rebuilt"] == [] and prepared.commands == []


def test_no_generator_rebuilds_no_kernel(monkeypatch, prepared):
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True, initramfs_tool="none"))
    assert kind == "exit" and result["kernels_rebuilt"] == [] and prepared.commands == []


def test_a_failed_kernel_rebuild_names_the_command_and_the_kernels_done(monkeypatch, prepared):
    os.utime(prepared.tree.path("/boot/initrd.img-" + RUNNING), (T_BEFORE, T_BEFORE))
    prepared.results = [(0, "", ""), (1, "", "mkinitramfs: failed to determine device for /\n")]
    before = prepared.files()
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True))
    assert kind == "fail", result
    assert result["msg"] == ("%s -u -k %s failed (rc=1): mkinitramfs: failed to determine device for /; the initramfs "
                             "of kernel %s is as it was (rebuilt before it: %s)" % (UPDATE_INITRAMFS, NEWER, NEWER, RUNNING))
    assert prepared.files() == before


def test_a_kernel_removed_while_it_is_rebuilt_is_skipped(monkeypatch, prepared):
    third = "6.1.0-21-amd64"
    install_kernel(prepared, third, built=T_BEFORE)

    def removed(args):
        if args[-1] == NEWER:   # the package manager removes NEWER while its image is built
            os.unlink(prepared.tree.path("/boot/vmlinuz-" + NEWER))
            prepared.results.insert(0, (1, "", "update-initramfs: %s has no modules\n" % NEWER))
        else:
            generator(prepared)(args)

    prepared.effect = removed
    kind, result = run(monkeypatch, dict(VFIO_ARGS, rebuild_kernels=True))
    assert kind == "exit", result
    assert prepared.commands == [[UPDATE_INITRAMFS, "-u", "-k", NEWER], [UPDATE_INITRAMFS, "-u", "-k", third]]
    assert any("kernel %s was removed" % NEWER in w for w in prepared.warnings)


KERNEL_INSTALL = "/usr/bin/kernel-install"


def esp_entry(host, version, copied=None):
    """The kernel's systemd-boot entry on the ESP (kernel-install's layout), with its copy of the initramfs."""
    host.tree.write("/boot/efi/loader/entries/debian-%s.conf" % version,
                    "title Debian\nversion %s\noptions root=LABEL=r ro\nlinux /debian/%s/linux\n"
                    "initrd /debian/%s/initrd.img-%s\n" % (version, version, version, version))
    host.tree.write("/boot/efi/debian/%s/initrd.img-%s" % (version, version), "copy")
    if copied is not None:
        os.utime(host.tree.path("/boot/efi/debian/%s/initrd.img-%s" % (version, version)), (copied, copied))


def copies_again(host, dracut_effect):
    """dracut as generator() has it; kernel-install add copies /boot's image to the ESP, as Debian's 85-initrd does."""
    def effect(args):
        if args[0] == KERNEL_INSTALL:
            version = args[2]
            host.tree.write("/boot/efi/debian/%s/initrd.img-%s" % (version, version), "copy")
            return
        dracut_effect(args)
    return effect


def test_dracut_on_systemd_boot_copies_every_rebuilt_image_to_the_esp(monkeypatch, prepared):
    """dracut does not refresh the copies systemd-boot boots; kernel-install add does, after the set's rebuild."""
    prepared.bins["kernel-install"] = KERNEL_INSTALL
    esp_entry(prepared, RUNNING)
    esp_entry(prepared, NEWER)
    prepared.effect = copies_again(prepared, generator(prepared))
    args = dict(VFIO_ARGS, options={"nouveau": "modeset=0"}, initramfs_tool="dracut")
    kind, result = run(monkeypatch, args)
    assert kind == "exit", result
    assert prepared.commands == [[DRACUT, "-f", "--regenerate-all"]] + [
        [KERNEL_INSTALL, "add", v, prepared.tree.path("/boot/vmlinuz-%s" % v)] for v in (RUNNING, NEWER)]
    assert result["esp_copies"] == [RUNNING, NEWER]


def test_an_esp_copy_older_than_the_files_is_rebuilt_and_copied_alone(monkeypatch, prepared):
    """/boot's images are right, but the copy systemd-boot boots for NEWER predates the files (a run of dracut
    alone, by hand or by an older release of this collection)."""
    prepared.bins["kernel-install"] = KERNEL_INSTALL
    esp_entry(prepared, RUNNING)
    esp_entry(prepared, NEWER)
    prepared.effect = copies_again(prepared, generator(prepared))
    args = dict(VFIO_ARGS, rebuild_kernels=True, initramfs_tool="dracut")
    kind, result = run(monkeypatch, args)
    assert kind == "exit" and result["esp_copies"] == [RUNNING, NEWER], result
    prepared.commands.clear()
    copy = prepared.tree.path("/boot/efi/debian/%s/initrd.img-%s" % (NEWER, NEWER))
    os.utime(copy, (T_BEFORE, T_BEFORE))
    kind, result = run(monkeypatch, args)
    assert kind == "exit", result
    assert prepared.commands == [[DRACUT, "-f", "--kver", NEWER],
                                 [KERNEL_INSTALL, "add", NEWER, prepared.tree.path("/boot/vmlinuz-%s" % NEWER)]]
    assert result["esp_copies"] == [NEWER] and result["reboot_required"] is False
    assert "boots /boot/efi/debian/%s/initrd.img-%s, older than" % (NEWER, NEWER) in result["kernels_rebuilt"][0]["reason"]
    prepared.commands.clear()
    kind, result = run(monkeypatch, args)
    assert result["changed"] is False and prepared.commands == []


def test_a_failed_copy_to_the_esp_is_named(monkeypatch, prepared):
    prepared.bins["kernel-install"] = KERNEL_INSTALL
    esp_entry(prepared, RUNNING)
    prepared.results[:] = [(0, "", ""), (1, "", "kernel-install: No space left on device")]
    kind, result = run(monkeypatch, dict(VFIO_ARGS, options={"nouveau": "modeset=0"}, initramfs_tool="dracut"))
    assert kind == "fail", result
    assert "No space left on device" in result["msg"] and "not yet on the ESP" in result["msg"]
    assert "Traceback" not in result["msg"]
