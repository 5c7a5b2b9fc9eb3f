# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""guest_attach_probe on fake hosts with a fake QEMU.

The fake QEMU is a real process the module runs (a script in the fake bin directory, found through
``get_bin_path``, run under the real timeout(1)), speaking on its standard input and output as QEMU does: in
paused mode (``-qmp stdio``) it prints the QMP greeting, then reads one command a line from its standard input and
answers each in order (an event, then the answers to ``qmp_capabilities``, ``query-pci`` built from its
``-device`` arguments, and ``quit``, after which it exits; without ``quit`` it stays, as a paused QEMU does); in
boot mode it writes the guest's console lines to the ``-serial file:`` path (``/dev/stdout``) and exits, as QEMU
does when the guest powers off under ``-no-reboot``. The file ``fake-qemu.json`` beside it says how it behaves
(``error``: QEMU's error text on stderr and rc 1; ``hang``: it never answers; ``no-quit``: it answers ``quit``
but stays; ``no-poweroff``: the guest prints its list but does not power off; ``panic``: the guest stops before
its list; ``sigkill``: it is killed at once, as by the OOM killer). It records its arguments, pid and standard
input, so the tests see what ran and that the process is gone afterwards. The guest's real view is the lab's part
(tests/integration/targets/guest_attach_probe).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import struct
import sys
import tempfile

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _guest_probe as gp
from ansible_collections.gpuops.sandbox.plugins.module_utils import _module
from ansible_collections.gpuops.sandbox.plugins.modules import guest_attach_probe
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.command_host import CommandHost
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import run_with_commands

UUID = "4b20d080-1b54-4048-85b3-a6a62d165c01"
RELEASE = "6.1.0-18-amd64"
QMP_STDIN = b'{"execute":"qmp_capabilities"}\n{"execute":"query-pci"}\n{"execute":"quit"}\n'

FAKE_QEMU = r'''#!{python}
import json, os, signal, sys, time
HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "fake-qemu.json")) as handle:
    plan = json.load(handle)
argv = sys.argv[1:]
with open(os.path.join(HERE, "qemu-argv.json"), "w") as handle:
    json.dump({{"argv": argv, "pid": os.getpid()}}, handle)
behaviour = plan.get("behaviour", "answer")


def send(message):
    # Unbuffered, as QEMU writes its character devices.
    os.write(1, (json.dumps(message) + "\r\n").encode())


paused = "-kernel" not in argv
if paused:
    if argv[argv.index("-qmp") + 1] != "stdio":
        sys.exit("fake qemu: QMP is not on stdio: %r" % argv)
    # QEMU greets before it realizes the devices.
    send({{"QMP": {{"version": {{"qemu": {{"major": 7, "minor": 2, "micro": 22}}}}, "capabilities": ["oob"]}}}})
if behaviour == "error":
    sys.stderr.write(plan["stderr"])
    sys.exit(1)
if behaviour == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
devices = []
for index, arg in enumerate(argv):
    if argv[index - 1] == "-device":
        opts = dict(part.split("=", 1) for part in arg.split(",")[1:])
        source = opts.get("host") or opts["sysfsdev"].rsplit("/", 1)[-1]
        devices.append((source, opts["id"], int(opts["addr"], 16)))
if not paused:
    initrd = argv[argv.index("-initrd") + 1]
    if plan.get("keep_initrd"):
        with open(initrd, "rb") as src, open(plan["keep_initrd"], "wb") as dst:
            dst.write(src.read())
    serial = argv[argv.index("-serial") + 1]
    if not serial.startswith("file:"):
        sys.exit("fake qemu: the serial port is not a file: %r" % serial)
    console = os.open(serial[5:], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    def out(text):
        os.write(console, text.encode())
    out("[    0.000000] Linux version 6.1.0\r\n")
    if behaviour == "panic":
        out("Kernel panic - not syncing: VFS: Unable to mount root fs\r\n")
        sys.exit(0)
    out("GPUOPS-GUEST-BEGIN\r\n")
    out("GPUOPS-PCI 0000:00:00.0 0x8086 0x29c0 0x060000 \r\n")
    for source, qdev, slot in devices:
        vendor, device, klass, ttys = plan["ids"][source]
        out("GPUOPS-PCI 0000:00:%02x.0 0x%04x 0x%04x 0x%06x %s\r\n" % (slot, vendor, device, klass, " ".join(ttys)))
    if behaviour != "hang":
        out("GPUOPS-GUEST-END\r\n")
    if behaviour in ("no-poweroff", "hang"):
        time.sleep(600)
    sys.exit(0)
if behaviour == "hang":
    time.sleep(600)
negotiated = False
for line in sys.stdin.buffer:
    with open(os.path.join(HERE, "qmp-stdin.log"), "ab") as log:
        log.write(line)
    name = json.loads(line)["execute"]
    with open(os.path.join(HERE, "qmp.log"), "a") as log:
        log.write(name + "\n")
    if not negotiated and name != "qmp_capabilities":
        send({{"error": {{"class": "CommandNotFound",
                         "desc": "Expecting capabilities negotiation with 'qmp_capabilities'"}}}})
    elif name == "qmp_capabilities":
        negotiated = True
        send({{"event": "RESUME", "timestamp": {{"seconds": 1, "microseconds": 2}}}})
        send({{"return": {{}}}})
    elif name == "query-pci" and behaviour == "qmp-error":
        send({{"error": {{"class": "GenericError", "desc": "no PCI bus"}}}})
    elif name == "query-pci":
        found = [{{"bus": 0, "slot": 0, "function": 0, "class_info": {{"class": 0x0600, "desc": "Host bridge"}},
                  "id": {{"vendor": 0x8086, "device": 0x29c0}}, "qdev_id": ""}},
                 {{"bus": 0, "slot": 0x1c, "function": 0, "class_info": {{"class": 0x0604}},
                  "id": {{"vendor": 0x1b36, "device": 0x000c}}, "qdev_id": "rp",
                  "pci_bridge": {{"bus": {{"number": 1, "secondary": 1, "subordinate": 1}},
                                 "devices": [{{"bus": 1, "slot": 0, "function": 0,
                                              "class_info": {{"class": 0x0200}},
                                              "id": {{"vendor": 0x1af4, "device": 0x1041}}, "qdev_id": "nic"}}]}}}}]
        for source, qdev, slot in devices:
            vendor, device, klass, _ttys = plan["ids"][source]
            found.append({{"bus": 0, "slot": slot, "function": 0, "class_info": {{"class": klass >> 8}},
                          "id": {{"vendor": vendor, "device": device}}, "qdev_id": qdev}})
        send({{"return": [{{"bus": 0, "devices": found}}]}})
    elif name == "quit":
        send({{"timestamp": {{"seconds": 3, "microseconds": 4}}, "event": "SHUTDOWN",
              "data": {{"guest": False, "reason": "host-qmp-quit"}}}})
        send({{"return": {{}}}})
        if behaviour == "no-quit":
            time.sleep(600)
        sys.exit(0)
# Standard input ended without quit: a paused QEMU stays.
time.sleep(600)
'''

IDS = {st.A10: [0x10DE, 0x2236, 0x030200, []], st.A10_AUDIO: [0x10DE, 0x1AEF, 0x040300, []],
       UUID: [0x4348, 0x3253, 0x070002, ["ttyS1"]]}


def elf(interpreter=False):
    """A minimal ELF64 executable header with one program header: PT_LOAD, or PT_INTERP when ``interpreter``."""
    header = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    header += struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, 0x401000, 64, 0, 0, 64, 56, 1, 64, 0, 0)
    program = struct.pack("<IIQQQQQQ", 3 if interpreter else 1, 5, 0, 0x400000, 0x400000, 0, 0, 0x1000)
    return header + program


class Host(CommandHost):
    """A fake lab-like host: the GPU host's tree at the root, the fake QEMU and busybox in the bin directory."""

    def __init__(self, base):
        super().__init__(base)
        self.tree = st.build_gpu_host(self.root)
        st.remove_process(self.tree, 3456)
        self.tree.bind(st.A10, "vfio-pci")
        self.tree.bind(st.A10_AUDIO, "vfio-pci")
        self.plan = {"behaviour": "answer", "ids": IDS}
        self.script("qemu-system-x86_64", FAKE_QEMU.format(python=sys.executable))
        self.write("/boot/vmlinuz-" + RELEASE, "kernel image")
        with open(os.path.join(self.bin, "busybox"), "wb") as handle:
            handle.write(elf())

    def add_mtty_mdev(self, uuid=UUID, group=9):
        self.tree.mkdir("/sys/devices/virtual/mtty/mtty")
        self.tree.add_mdev_type("/sys/devices/virtual/mtty/mtty", "mtty-1", "Single port serial", 23)
        self.tree.add_mdev_parent("mtty", "/sys/devices/virtual/mtty/mtty")
        dev_dir = self.tree.mkdir("/sys/devices/virtual/mtty/mtty/" + uuid)
        self.tree.link(dev_dir + "/mdev_type", "/sys/devices/virtual/mtty/mtty/mdev_supported_types/mtty-1")
        self.tree.link("/sys/bus/mdev/devices/" + uuid, dev_dir)
        if group is not None:
            self.tree.mkdir("/sys/kernel/iommu_groups/%d/devices" % group)
            self.tree.link(dev_dir + "/iommu_group", "/sys/kernel/iommu_groups/%d" % group)

    def qemu_run(self):
        """The fake QEMU's arguments and pid, or None when it was never started."""
        path = os.path.join(self.bin, "qemu-argv.json")
        if not os.path.exists(path):
            return None
        with open(path) as handle:
            return json.load(handle)

    def qmp_log(self):
        """The QMP commands the fake QEMU read, by name."""
        path = os.path.join(self.bin, "qmp.log")
        return open(path).read().split() if os.path.exists(path) else []

    def qmp_stdin(self):
        """The bytes the fake QEMU read from its standard input in paused mode (None when it read none)."""
        path = os.path.join(self.bin, "qmp-stdin.log")
        return open(path, "rb").read() if os.path.exists(path) else None


@pytest.fixture
def tmpdir_for_guests(monkeypatch):
    """A temporary directory of its own for the module's private directories, checked empty after each run."""
    base = tempfile.mkdtemp(prefix="gp-", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", base)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def host(tmp_path, tmpdir_for_guests):  # pylint: disable=unused-argument
    return Host(tmp_path)


def run(host, params, check=False):
    """Run the module on ``host``; a test that sets no timeout gets 30 seconds, so a fake QEMU left waiting by a
    broken module fails the test in that time rather than the default 300 seconds."""
    with open(os.path.join(host.bin, "fake-qemu.json"), "w") as handle:
        json.dump(host.plan, handle)
    params = dict(params)
    params.setdefault("timeout", 30)
    guest_attach_probe.RELEASE = RELEASE
    try:
        return run_with_commands(guest_attach_probe, host, params, check=check)
    finally:
        guest_attach_probe.RELEASE = None


def assert_gone(host):
    """The fake QEMU the module started has ended and been reaped, and the private directory is gone."""
    started = host.qemu_run()
    if started is not None:
        with pytest.raises(OSError) as caught:
            os.kill(started["pid"], 0)
        assert caught.value.errno == errno.ESRCH
    assert os.listdir(tempfile.tempdir) == []


def test_a_paused_guest_gets_the_gpu_and_its_audio_function(host):
    before = host.tree.snapshot()
    result = run(host, {"devices": [st.A10, "65:00.1"]})
    assert "failed" not in result, result.get("msg")
    assert result["changed"] is False and result["all_ok"] is True
    assert host.tree.snapshot() == before
    gpu, audio = result["devices"]
    assert (gpu["name"], gpu["type"], gpu["driver"], gpu["group"], gpu["seen"]) == (st.A10, "pci", "vfio-pci", 12, True)
    assert gpu["guest"] == {"address": "0000:00:08.0", "vendor_id": "10de", "device_id": "2236", "class": "0302"}
    assert audio["name"] == st.A10_AUDIO and audio["guest"]["address"] == "0000:00:09.0"
    assert audio["guest"]["class"] == "0403" and audio["problem_kind"] is None
    # QEMU as a VMM runs it: paused, nothing but the devices, QMP on its standard input and output; then quit.
    argv = host.qemu_run()["argv"]
    assert result["qemu_command"][1:] == argv
    assert result["qemu_command"][0] == os.path.join(host.bin, "qemu-system-x86_64")
    for flag in ("-S", "-nodefaults", "-no-user-config"):
        assert flag in argv
    assert argv[argv.index("-qmp") + 1] == "stdio"
    assert argv[argv.index("-display") + 1] == "none" and argv[argv.index("-accel") + 1] == "tcg"
    assert "vfio-pci,host=0000:65:00.0,id=gpuops0,bus=pcie.0,addr=0x08" in argv
    assert "vfio-pci,host=0000:65:00.1,id=gpuops1,bus=pcie.0,addr=0x09" in argv
    assert host.qmp_log() == ["qmp_capabilities", "query-pci", "quit"]
    assert (result["mode"], result["accel"], result["memory_mb"], result["qemu_end"]) == ("paused", "tcg", 64, "quit")
    assert result["qemu_rc"] == 0 and result["qemu_error"] is None and result["started"] is True
    assert result["seconds"] >= 0 and "qemu_pid" not in result and result["warnings"] == []
    # Every function the guest has, the bridges' buses walked too.
    assert {"address": "0000:01:00.0", "vendor_id": "1af4", "device_id": "1041", "class": "0200"} in \
        result["guest_functions"]
    assert "skipped" not in result and result["console_tail"] is None
    assert_gone(host)


def test_a_mediated_device_goes_by_its_sysfs_path(host):
    host.add_mtty_mdev()
    result = run(host, {"mdevs": [UUID.upper()]})
    assert "failed" not in result, result.get("msg")
    [mdev] = result["devices"]
    assert (mdev["name"], mdev["type"], mdev["parent"], mdev["mdev_type"], mdev["group"]) == \
        (UUID, "mdev", "mtty", "mtty-1", 9)
    assert mdev["guest"] == {"address": "0000:00:08.0", "vendor_id": "4348", "device_id": "3253", "class": "0700"}
    assert "vfio-pci,sysfsdev=/sys/bus/mdev/devices/%s,id=gpuops0,bus=pcie.0,addr=0x08" % UUID in \
        host.qemu_run()["argv"]
    assert_gone(host)


def test_a_busy_device_is_refused_naming_its_holder_and_qemu_never_starts(host):
    host.tree.add_process(3456, "qemu-kvm", {20: "/dev/vfio/vfio", 21: "/dev/vfio/12"})
    host.tree.write("/proc/3456/cmdline", "/usr/bin/qemu-system-x86_64\0-name\0guest=vm1\0")
    result = run(host, {"devices": [st.A10, st.A10_AUDIO]})
    assert result["failed"] is True
    assert ("0000:65:00.0 (busy): 0000:65:00.0 is in use: pid 3456 (/usr/bin/qemu-system-x86_64 -name guest=vm1) "
            "holds /dev/vfio/12; it was not passed to QEMU") in result["msg"]
    assert "(QEMU was not started)" in result["msg"]
    assert host.qemu_run() is None and result["started"] is False
    assert result["devices"][0]["holders"][0]["pid"] == 3456
    assert_gone(host)


def test_without_fail_on_problem_the_free_devices_still_go_to_the_guest(host):
    host.add_mtty_mdev()
    host.tree.add_process(4567, "holder", {3: "/dev/vfio/12"})
    result = run(host, {"devices": [st.A10], "mdevs": [UUID], "fail_on_problem": False})
    assert "failed" not in result, result.get("msg")
    gpu, mdev = result["devices"]
    assert gpu["problem_kind"] == "busy" and gpu["seen"] is False and gpu["guest"] is None
    assert mdev["seen"] is True and mdev["guest"]["address"] == "0000:00:09.0"
    argv = host.qemu_run()["argv"]
    assert not any("host=%s" % st.A10 in arg for arg in argv)
    assert result["all_ok"] is False
    assert_gone(host)


def test_a_function_on_a_host_driver_is_refused_naming_the_driver(host):
    result = run(host, {"devices": [st.A100]})
    assert result["failed"] is True
    assert ("0000:b1:00.0 (10de:20b5) is on nvidia, not on a VFIO driver (vfio-pci or a vendor *_vfio_pci driver)"
            in result["msg"])
    assert result["devices"][0]["problem_kind"] == "wrong-driver"
    assert host.qemu_run() is None


def test_a_variant_driver_is_a_vfio_driver(host):
    host.tree.bind(st.A10, "nvgrace_gpu_vfio_pci")
    result = run(host, {"devices": [st.A10]})
    assert "failed" not in result, result.get("msg")
    assert result["devices"][0]["driver"] == "nvgrace_gpu_vfio_pci" and result["all_ok"]


def test_qemus_own_error_text_is_reported_for_the_device_it_names(host):
    line = ("qemu-system-x86_64: -device vfio-pci,host=0000:65:00.1,id=gpuops1,bus=pcie.0,addr=0x09: vfio "
            "0000:65:00.1: group 12 is not viable\nPlease ensure all devices within the iommu_group are bound to "
            "their vfio bus driver.\n")
    host.plan.update(behaviour="error", stderr=line)
    result = run(host, {"devices": [st.A10, st.A10_AUDIO]})
    assert result["failed"] is True
    assert "group 12 is not viable" in result["msg"]
    gpu, audio = result["devices"]
    assert audio["problem_kind"] == "qemu" and audio["problem"].endswith("0000:65:00.1: group 12 is not viable")
    assert gpu["problem_kind"] == "qemu" and gpu["problem"].startswith("QEMU exited (rc 1) before the guest ran")
    assert result["qemu_error"] == line.strip() and result["qemu_rc"] == 1 and result["qemu_end"] == "exited"
    assert_gone(host)


@pytest.mark.parametrize("mode, what", [("paused", "answer over QMP"), ("boot", "print its device list")])
def test_a_guest_that_never_answers_is_stopped_at_the_timeout(host, mode, what):
    # The fake sleeps for 10 minutes; timeout(1) ends it after 1 second.
    host.plan["behaviour"] = "hang"
    result = run(host, {"devices": [st.A10], "mode": mode, "timeout": 1})
    assert result["failed"] is True
    assert result["devices"][0]["problem_kind"] == "timeout"
    assert result["devices"][0]["problem"] == ("the guest did not %s within 1 seconds (timeout); QEMU was stopped "
                                               "then" % what)
    assert result["msg"] == "the guest did not get 1 of 1 device(s): %s (timeout): %s" % (
        st.A10, result["devices"][0]["problem"])
    assert result["qemu_end"] == "killed" and result["qemu_rc"] == _module.TIMEOUT_RC
    assert result["qemu_output"].endswith("did not finish within 1 seconds (timeout)")
    assert result["guest_functions"] == [] and result["qemu_error"] is None
    assert 1 <= result["seconds"] < 10
    assert_gone(host)


@pytest.mark.parametrize("mode, behaviour, end, what", [
    ("paused", "no-quit", "quit", "answered over QMP"),
    ("boot", "no-poweroff", "poweroff", "printed its device list"),
])
def test_qemu_that_does_not_exit_after_the_guests_report_is_stopped_at_the_timeout(host, mode, behaviour, end, what):
    # The stand-in QEMU must report before the limit: 1 second was too short for its Python to start on a machine
    # busy with the integration tier (2026-11-29), so the limit here is 8 seconds (the test waits for all of it).
    host.plan["behaviour"] = behaviour
    result = run(host, {"devices": [st.A10], "mode": mode, "timeout": 8})
    assert "failed" not in result, result.get("msg")
    assert result["all_ok"] and result["devices"][0]["seen"] and result["qemu_end"] == "killed" != end
    assert result["qemu_rc"] == _module.TIMEOUT_RC
    assert result["warnings"] == ["the guest %s, but QEMU did not exit afterwards; timeout(1) stopped it at the "
                                  "time limit (timeout=8)" % what]
    assert_gone(host)


def test_qemu_killed_before_the_time_limit_is_an_exit_not_a_timeout(host):
    # SIGKILL from elsewhere (the OOM killer) gives the exit status of timeout(1)'s own SIGKILL.
    host.plan["behaviour"] = "sigkill"
    result = run(host, {"devices": [st.A10], "fail_on_problem": False})
    assert "failed" not in result, result.get("msg")
    assert result["qemu_rc"] in _module.TIMED_OUT_RCS and result["seconds"] < 10
    assert result["qemu_end"] == "exited" and result["qemu_error"]
    assert result["devices"][0]["problem_kind"] == "qemu"
    assert result["devices"][0]["problem"].startswith("QEMU exited (rc %s) before the guest ran" % result["qemu_rc"])
    assert_gone(host)


def test_the_paused_guest_gets_its_qmp_session_on_stdin(host):
    result = run(host, {"devices": [st.A10]})
    assert "failed" not in result, result.get("msg")
    assert host.qmp_stdin() == QMP_STDIN
    # Nothing else uses QEMU's standard input or output: no serial port, monitor or other character device.
    argv = host.qemu_run()["argv"]
    assert [arg for arg in argv if "stdio" in arg or "/dev/std" in arg] == ["stdio"]
    for flag in ("-serial", "-monitor", "-chardev", "-mon"):
        assert flag not in argv
    assert not any(arg.startswith("unix:") for arg in argv)


def test_a_booted_guest_gets_no_stdin_and_its_console_is_stdout(host):
    result = run(host, {"devices": [st.A10], "mode": "boot"})
    assert "failed" not in result, result.get("msg")
    argv = host.qemu_run()["argv"]
    assert argv[argv.index("-serial") + 1] == "file:/dev/stdout" and argv.count("-serial") == 1
    assert "-qmp" not in argv and "stdio" not in argv and host.qmp_stdin() is None
    assert result["console_tail"].startswith("[    0.000000] Linux version") and result["qemu_output"] == ""


def test_without_timeout_on_the_host_nothing_starts(host):
    os.unlink(os.path.join(host.bin, "timeout"))
    result = run(host, {"devices": [st.A10]})
    assert result["failed"] is True
    assert result["msg"] == ("timeout (coreutils) is not on PATH; it ends QEMU at the time limit (timeout); install "
                             "coreutils; nothing was started")
    assert host.qemu_run() is None
    assert_gone(host)


def test_a_qmp_error_is_a_message(host):
    host.plan["behaviour"] = "qmp-error"
    result = run(host, {"devices": [st.A10]})
    assert result["failed"] is True
    assert result["msg"] == "QEMU refused the QMP command query-pci: no PCI bus"
    assert_gone(host)


@pytest.mark.parametrize("mode, reader", [("paused", "flatten_query_pci"), ("boot", "parse_console")])
def test_a_bug_after_qemu_ran_is_a_message_and_the_directory_is_removed(host, monkeypatch, mode, reader):
    def broken(_answer):
        raise KeyError("bus")
    monkeypatch.setattr(gp, reader, broken)
    result = run(host, {"devices": [st.A10], "mode": mode})
    assert result["failed"] is True and "failed unexpectedly (KeyError" in result["msg"]
    assert "Traceback" not in result["msg"]
    assert host.qemu_run() is not None
    assert_gone(host)


def cpio_members(data):
    members = {}
    offset = 0
    while True:
        assert data[offset:offset + 6] == b"070701"
        fields = [int(data[offset + 6 + 8 * i: offset + 14 + 8 * i], 16) for i in range(13)]
        namesize, filesize = fields[11], fields[6]
        name = data[offset + 110: offset + 110 + namesize - 1].decode()
        offset += 110 + namesize
        offset += -offset % 4
        body = data[offset: offset + filesize]
        offset += filesize
        offset += -offset % 4
        if name == "TRAILER!!!":
            return members
        members[name] = (fields[1], body, fields[9], fields[10])


def test_a_booted_guest_lists_the_devices_and_the_mtty_ports(host, tmp_path):
    host.add_mtty_mdev()
    kept = str(tmp_path / "initrd.kept")
    host.plan["keep_initrd"] = kept
    result = run(host, {"devices": [st.A10], "mdevs": [UUID], "mode": "boot"})
    assert "failed" not in result, result.get("msg")
    gpu, mdev = result["devices"]
    assert gpu["guest"] == {"address": "0000:00:08.0", "vendor_id": "10de", "device_id": "2236", "class": "0302",
                            "ttys": []}
    assert mdev["guest"]["ttys"] == ["ttyS1"] and mdev["guest"]["vendor_id"] == "4348"
    assert result["qemu_end"] == "poweroff" and result["memory_mb"] == 256
    assert "GPUOPS-GUEST-END" in result["console_tail"]
    argv = host.qemu_run()["argv"]
    assert argv[argv.index("-kernel") + 1] == host.path("/boot/vmlinuz-" + RELEASE)
    assert "-S" not in argv and "-no-reboot" in argv and "-qmp" not in argv
    assert "rdinit=/init" in argv[argv.index("-append") + 1]
    # The initramfs: the static busybox, a console node and an /init that prints the list.
    members = cpio_members(open(kept, "rb").read())
    assert members["bin/busybox"][1] == elf()
    assert stat.S_ISCHR(members["dev/console"][0]) and members["dev/console"][2:] == (5, 1)
    assert members["init"][0] & 0o111 and members["init"][1].startswith(b"#!/bin/busybox sh\n")
    assert b"GPUOPS-PCI" in members["init"][1] and b"poweroff -f" in members["init"][1]
    assert_gone(host)


def test_a_guest_that_stops_before_its_list_shows_its_console(host):
    host.plan["behaviour"] = "panic"
    result = run(host, {"devices": [st.A10], "mode": "boot", "fail_on_problem": False})
    assert "failed" not in result, result.get("msg")
    [gpu] = result["devices"]
    assert gpu["problem_kind"] == "not-seen" and "stopped before it printed" in gpu["problem"]
    assert "Kernel panic" in result["console_tail"] and result["qemu_error"] is None
    assert_gone(host)


def test_a_dynamic_busybox_is_refused(host):
    with open(os.path.join(host.bin, "busybox"), "wb") as handle:
        handle.write(elf(interpreter=True))
    result = run(host, {"devices": [st.A10], "mode": "boot"})
    assert result["failed"] is True
    assert "busybox is dynamically linked" in result["msg"] and "busybox-static" in result["msg"]
    assert host.qemu_run() is None
    assert_gone(host)


def test_check_mode_runs_the_same_probe_and_changes_nothing(host):
    before = host.tree.snapshot()
    result = run(host, {"devices": [st.A10]}, check=True)
    assert "failed" not in result and result["changed"] is False and result["all_ok"]
    assert host.tree.snapshot() == before


@pytest.mark.parametrize("params, fragments", [
    ({}, ["nothing to pass through: give devices"]),
    ({"devices": [], "mdevs": []}, ["nothing to pass through"]),
    ({"devices": ["0000:zz:00.0"]}, ["devices: PCI address '0000:zz:00.0' is not valid; expected DDDD:BB:SS.F"]),
    ({"devices": ["0000:99:00.0"]}, ["devices: PCI device 0000:99:00.0 does not exist on this host"]),
    ({"devices": [st.A10, "65:00.0"]}, ["devices lists 0000:65:00.0 twice"]),
    ({"mdevs": ["not-a-uuid"]}, ["mdevs: UUID 'not-a-uuid' is not valid"]),
    ({"mdevs": [UUID]}, ["mdevs: mediated device %s does not exist on this host" % UUID, "existing ones: none"]),
    ({"devices": [st.A10], "memory_mb": 8}, ["memory_mb must be 32 to 65536 MiB, got 8; nothing was started"]),
    ({"devices": [st.A10], "timeout": 0}, ["timeout must be a positive number of seconds, got 0"]),
    ({"devices": [st.A10], "timeout": 3601}, ["timeout must be 1 to 3600 seconds, got 3601"]),
    ({"devices": [st.A10], "timeout": "inf"}, ["timeout='inf'"]),
    ({"devices": [st.A10], "kernel": "/boot/vmlinuz"}, ["kernel=/boot/vmlinuz is used only with mode=boot"]),
    ({"devices": [st.A10], "mode": "boot", "kernel": "vmlinuz"}, ["kernel 'vmlinuz' is not an absolute path"]),
    ({"devices": [st.A10], "mode": "boot", "kernel": "/boot/none"}, ["no kernel image at /boot/none"]),
    ({"devices": [st.A10], "mode": "boot", "initrd": "/boot/none"}, ["initrd /boot/none is not a file"]),
    ({"devices": [st.A10], "qemu": "/nonexistent/qemu"}, ["qemu /nonexistent/qemu is not an executable file"]),
    ({"devices": [st.A10], "qemu": "qemu-kvm"}, ["qemu qemu-kvm was not found on PATH"]),
    ({"devices": [st.A10], "accel": "kvm"}, ["accel=kvm, but /dev/kvm cannot be opened", "accel=tcg"]),
    ({"devices": [st.A10], "mode": "sideways"}, ["mode", "sideways", "paused, boot"]),
    ({"devices": ["0000:00:%02x.0" % n for n in range(17)]}, ["17 devices given; one guest takes at most 16"]),
])
def test_bad_inputs_are_messages_and_nothing_starts(host, params, fragments):
    result = run(host, params)
    assert result["failed"] is True
    for fragment in fragments:
        assert fragment in result["msg"]
    assert "Traceback" not in result["msg"] and "unexpectedly" not in result["msg"]
    assert host.qemu_run() is None
    assert_gone(host)


def test_no_qemu_on_the_host_says_what_to_install(host):
    os.unlink(os.path.join(host.bin, "qemu-system-x86_64"))
    result = run(host, {"devices": [st.A10]})
    assert result["failed"] is True
    assert result["msg"].startswith("no QEMU on this host: neither qemu-system-x86_64 on PATH nor "
                                    "/usr/libexec/qemu-kvm; install it")


def test_qemu_kvm_of_rhel_is_the_fallback(host):
    libexec = host.path("/usr/libexec")
    os.makedirs(libexec)
    os.rename(os.path.join(host.bin, "qemu-system-x86_64"), os.path.join(libexec, "qemu-kvm"))
    with open(os.path.join(libexec, "fake-qemu.json"), "w") as handle:   # the fake reads its plan beside itself
        json.dump(host.plan, handle)
    result = run(host, {"devices": [st.A10]})
    assert "failed" not in result, result.get("msg")
    assert result["qemu"] == os.path.join(libexec, "qemu-kvm") and result["all_ok"]


def test_kvm_is_used_only_when_it_creates_a_vm(tmp_path):
    reason = "/dev/kvm cannot be opened (No such file or directory): software emulation"
    assert gp.choose_accel("auto", str(tmp_path)) == ("tcg", reason)
    os.makedirs(str(tmp_path / "dev"))
    (tmp_path / "dev" / "kvm").write_text("")
    accel, reason = gp.choose_accel("auto", str(tmp_path))
    assert accel == "tcg" and reason.startswith("/dev/kvm does not create a VM")
    assert gp.choose_accel("tcg", str(tmp_path)) == ("tcg", "asked for (accel=tcg)")


def test_query_pci_is_flattened_through_bridges():
    answer = [{"bus": 0, "devices": [
        {"bus": 0, "slot": 3, "function": 1, "class_info": {"class": 0x0403}, "id": {"vendor": 0x8086, "device": 0x293E},
         "qdev_id": "gpuops1"},
        {"bus": 0, "slot": 4, "function": 0, "class_info": {"class": 0x0604}, "id": {"vendor": 0x1B36, "device": 0xC},
         "pci_bridge": {"bus": {"secondary": 2}, "devices": [
             {"bus": 2, "slot": 0, "function": 0, "class_info": {"class": 0x00FF}, "id": {"vendor": 0x1234,
                                                                                          "device": 0x11E8}}]}}]}]
    assert gp.flatten_query_pci(answer) == [
        {"address": "0000:00:03.1", "vendor_id": "8086", "device_id": "293e", "class": "0403", "qdev_id": "gpuops1"},
        {"address": "0000:00:04.0", "vendor_id": "1b36", "device_id": "000c", "class": "0604", "qdev_id": None},
        {"address": "0000:02:00.0", "vendor_id": "1234", "device_id": "11e8", "class": "00ff", "qdev_id": None}]
    assert gp.flatten_query_pci(None) == [] and gp.flatten_query_pci([{"devices": ["junk"]}]) == []


def test_console_lines_are_read_through_noise():
    text = ("[    1.0] random: crng init done\r\nGPUOPS-GUEST-BEGIN\r\n"
            "GPUOPS-PCI 0000:00:08.0 0x4348 0x3253 0x070002 ttyS1 ttyS2\r\n[    2.0] GPUOPS-PCI junk\r\n")
    functions, complete = gp.parse_console(text)
    assert functions == [{"address": "0000:00:08.0", "vendor_id": "4348", "device_id": "3253", "class": "0700",
                          "ttys": ["ttyS1", "ttyS2"]}]
    assert complete is False
    assert gp.parse_console(text + "GPUOPS-GUEST-END\r\n")[1] is True


def test_elf_checks(tmp_path):
    path = str(tmp_path / "exe")
    for data, dynamic in ((elf(), False), (elf(interpreter=True), True)):
        with open(path, "wb") as handle:
            handle.write(data)
        assert gp.elf_interpreter(path) is dynamic
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n" * 10)
    with pytest.raises(gp.GuestError, match="is not an ELF executable"):
        gp.elf_interpreter(path)
