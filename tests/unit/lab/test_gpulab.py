"""Unit tests of the lab tool's pure parts: image checks, inventory reading and writing, errors."""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# The modules of lab/gpulab.py besides the script itself.
GPULAB_MODULES = ("labconfig", "labhost", "labimage", "labnet", "labreboot", "labstate", "labuefi")


@pytest.fixture
def gpulab(tmp_path, monkeypatch):
    """A fresh copy of lab/gpulab.py whose cache, state and inventory live under tmp_path."""
    monkeypatch.setenv("GPUOPS_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUOPS_LAB_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("GPUOPS_LAB_INVENTORY", str(tmp_path / "inventory"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "inventory").mkdir()
    # gpulab.py imports its parts beside it (lab/labconfig.py, ...), which read the environment when they are
    # first imported: each test gets fresh copies of them too.
    for name in GPULAB_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    spec = importlib.util.spec_from_file_location("gpulab_under_test", os.path.join(TOP, "lab", "gpulab.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_image(gpulab, size=2 * 1024 * 1024):
    """A small disk image with a boot signature and an ext4 magic where the lab expects them."""
    data = bytearray(size)
    data[510:512] = b"\x55\xaa"
    data[gpulab.PART_OFFSET + 1080:gpulab.PART_OFFSET + 1082] = b"\x53\xef"
    with open(gpulab.image_path(), "wb") as handle:
        handle.write(bytes(data))
    manifest = {"recipe": gpulab.RECIPE_VERSION, "size": size, "id": "abc",
                "head_sha256": hashlib.sha256(bytes(data)).hexdigest(), "kernel": "6.1.0-1-amd64"}
    with open(gpulab.manifest_path(), "w") as handle:
        json.dump(manifest, handle)
    return manifest


def test_valid_image_has_no_problem(gpulab):
    make_image(gpulab)
    assert gpulab.image_problem() is None


def test_missing_image(gpulab):
    assert gpulab.image_problem() == "missing"


def test_unreadable_manifest_is_corrupt(gpulab):
    make_image(gpulab)
    with open(gpulab.manifest_path(), "w") as handle:
        handle.write("{")
    assert gpulab.image_problem().startswith("corrupt: its manifest cannot be read")


def test_truncated_image_is_corrupt(gpulab):
    manifest = make_image(gpulab)
    with open(gpulab.image_path(), "r+b") as handle:
        handle.truncate(4096)
    assert gpulab.image_problem() == "corrupt: size 4096, expected %d" % manifest["size"]


def test_flipped_bytes_are_corrupt(gpulab):
    make_image(gpulab)
    with open(gpulab.image_path(), "r+b") as handle:
        handle.seek(100)
        handle.write(b"\x01")
    assert gpulab.image_problem() == "corrupt: its first 64 MiB do not match the recorded checksum"


def test_missing_filesystem_is_corrupt(gpulab):
    make_image(gpulab)
    with open(gpulab.image_path(), "r+b") as handle:
        handle.seek(gpulab.PART_OFFSET + 1080)
        handle.write(b"\0\0")
    assert gpulab.image_problem() == "corrupt: no boot sector or no ext4 file system"


def test_older_recipe_is_outdated(gpulab):
    make_image(gpulab)
    with open(gpulab.manifest_path()) as handle:
        manifest = json.load(handle)
    manifest["recipe"] = "0"
    with open(gpulab.manifest_path(), "w") as handle:
        json.dump(manifest, handle)
    assert gpulab.image_problem().startswith("outdated: built by recipe 0")


def write_hosts(gpulab, text):
    with open(gpulab.INVENTORY_HOSTS, "w") as handle:
        handle.write(text)


@pytest.mark.parametrize("groups, unknown", [
    # The hosts come from the inventory in order.
    ("""
        container: {hosts: {b-host: null}}
        vm_vgpu: {hosts: {a-host: null, b-host: null}}
""", "c-host"),
    # A host the collection does not manage gets no VM.
    ("""
        container: {hosts: {b-host: null, elsewhere: {gpuops_host_managed: false}}}
        vm_vgpu: {hosts: {a-host: {gpuops_host_managed: true}}}
""", "elsewhere"),
], ids=["in-order", "not-managed"])
def test_the_lab_hosts_are_the_managed_gpu_nodes_in_order(gpulab, groups, unknown):
    write_hosts(gpulab, "all:\n  children:\n    gpu_nodes:\n      children:" + groups)
    assert gpulab.lab_hosts() == ["b-host", "a-host"]
    assert gpulab.select_hosts([]) == ["b-host", "a-host"]
    with pytest.raises(gpulab.LabError, match=r"unknown lab host\(s\) %s; the lab has: b-host, a-host" % unknown):
        gpulab.select_hosts([unknown])


def test_a_host_without_autostart_starts_only_when_named(gpulab):
    write_hosts(gpulab, """
all:
  children:
    gpu_nodes: {hosts: {a-host: null}}
    lab_spare: {hosts: {spare: {gpulab_autostart: false}, other: {gpulab_autostart: true}}}
""")
    assert gpulab.select_hosts([], starting=True) == ["a-host", "other"]
    assert gpulab.select_hosts([]) == ["a-host", "spare", "other"]
    assert gpulab.select_hosts(["spare"], starting=True) == ["spare"]
    assert not gpulab.autostarts("spare") and gpulab.autostarts("a-host")


def test_settings_of_a_host_listed_twice_are_merged_and_only_the_lab_ones(gpulab):
    write_hosts(gpulab, """
all:
  children:
    gpu_nodes:
      hosts: {a-host: {gpulab_autostart: false, gpuops_workload_type: container}}
      children:
        dra: {hosts: {a-host: {gpulab_layout: [{slot: 3}]}, b-host: null}}
""")
    assert gpulab.lab_host_settings("a-host") == {"gpulab_autostart": False, "gpulab_layout": [{"slot": 3}]}
    assert gpulab.lab_host_settings("b-host") == {} and gpulab.lab_host_settings("c-host") == {}


def test_the_environment_sets_a_hosts_lab_settings_over_the_inventory(gpulab, monkeypatch):
    write_hosts(gpulab, """
all:
  hosts: {a-host: {gpulab_boot: bios, gpulab_iommu: false}, b-host: null}
""")
    monkeypatch.setenv("GPUOPS_LAB_SETTINGS", json.dumps({"a-host": {"gpulab_boot": "uefi"}}))
    assert gpulab.lab_host_settings("a-host") == {"gpulab_boot": "uefi", "gpulab_iommu": False}
    assert gpulab.lab_host_settings("b-host") == {}
    # A value that is not an object of gpulab_* settings is named, with what is expected.
    for bad, named in (("{nope", "is not JSON"), ('["a-host"]', ': ["a-host"] is not an object'),
                       ('{"a-host": {"gpuops_workload_type": "container"}}', "a-host: {'gpuops_workload_type'"),
                       ('{"a-host": "uefi"}', "a-host: 'uefi'")):
        monkeypatch.setenv("GPUOPS_LAB_SETTINGS", bad)
        with pytest.raises(gpulab.LabError) as err:
            gpulab.lab_host_settings("a-host")
        assert "GPUOPS_LAB_SETTINGS" in str(err.value) and named in str(err.value), str(err.value)
        assert "expected an object of host names" in str(err.value)


def test_an_unreadable_inventory_is_named(gpulab):
    write_hosts(gpulab, "all: [unclosed\n")
    with pytest.raises(gpulab.LabError, match="cannot read the lab inventory .*hosts.yml"):
        gpulab.lab_hosts()


def test_empty_inventory_is_an_error(gpulab):
    write_hosts(gpulab, "all: {}\n")
    with pytest.raises(gpulab.LabError, match="names no hosts"):
        gpulab.lab_hosts()


def test_inventory_written_with_relative_key_and_ports(gpulab):
    write_hosts(gpulab, "all: {hosts: {one: null, two: null}}\n")
    gpulab.Vm("one").save_meta(ssh_port=40001)
    os.makedirs(gpulab.STATE, exist_ok=True)
    for suffix in ("", ".pub"):
        with open(os.path.join(gpulab.STATE, "id_ed25519" + suffix), "w") as handle:
            handle.write("key")
    gpulab.write_inventory(gpulab.lab_hosts())
    with open(gpulab.INVENTORY_CONNECTION) as handle:
        text = handle.read()
    assert text.startswith("---\n")
    assert "    one:\n      ansible_host: 127.0.0.1\n      ansible_port: 40001\n" in text
    assert "two:" not in text  # never started: no port to write
    assert 'ansible_ssh_private_key_file: "{{ inventory_dir }}/../state/id_ed25519"' in text


def test_forced_accel_must_be_known(gpulab, monkeypatch):
    monkeypatch.setenv("GPUOPS_LAB_ACCEL", "hvf")
    with pytest.raises(gpulab.LabError, match="GPUOPS_LAB_ACCEL=hvf: expected kvm or tcg"):
        gpulab.choose_accel()


def test_stand_in_devices_are_all_there(gpulab):
    args = " ".join(gpulab.stand_in_devices("s1"))
    for needle in ("edu,addr=03.0,multifunction=on", "ich9-intel-hda,addr=03.1", "sriov_max_vfs=4",
                   "pcie-root-port,id=rp2,chassis=2,addr=05.0", "edu,bus=rp2,addr=00.0", "-vga std"):
        assert needle in args


def test_a_bad_layout_names_the_inventory(gpulab):
    with pytest.raises(gpulab.LabError, match=r"lab-x: gpulab_layout\[0\]: function kind 'tpu'.*inventory"):
        gpulab.stand_in_devices("s1", [{"slot": "03", "functions": ["tpu"]}], "lab-x")


def test_main_turns_errors_into_messages(gpulab, capsys):
    write_hosts(gpulab, "all: {hosts: {one: null}}\n")
    assert gpulab.main(["status", "nope"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpulab: error: unknown lab host(s) nope")


# A child Python at a given nice value starts a process in a session of its own (as QEMU's -daemonize does),
# calls keep_priority on it and prints what it returned and the new session's autogroup line.
PRIORITY_CHILD = """
import importlib.util, os, subprocess, sys
spec = importlib.util.spec_from_file_location("gpulab_child", sys.argv[1])
gpulab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpulab)
os.nice(int(sys.argv[2]))
child = subprocess.Popen(["sleep", "60"], start_new_session=True)
try:
    kept = gpulab.keep_priority(child.pid)
    with open("/proc/%d/autogroup" % child.pid) as handle:
        print(kept, handle.read().strip())
finally:
    child.kill()
    child.wait()
"""


@pytest.mark.parametrize("increment", [4, 0])
def test_keep_priority_gives_a_new_session_the_callers_nice_value(tmp_path, increment):
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("this kernel does not group processes by session for scheduling")
    # The tests may themselves run at a lower priority (make test runs this tier at nice 10).
    nice = min(os.getpriority(os.PRIO_PROCESS, 0) + increment, 19)
    script = tmp_path / "child.py"
    script.write_text(PRIORITY_CHILD)
    proc = subprocess.run([sys.executable, str(script), os.path.join(TOP, "lab", "gpulab.py"), str(increment)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    assert words[0] == str(nice > 0), proc.stdout
    if nice > 0:
        assert words[-2:] == ["nice", str(nice)], proc.stdout
    else:
        assert words[-2:] == ["nice", "0"], proc.stdout


def test_keep_priority_without_a_process_changes_nothing(gpulab):
    assert gpulab.keep_priority(None) is False


# -- reboots: a guest's restart ends its QEMU, the follower starts the host again ------------------------------

def serve_events(path, events):
    """A stand-in for QEMU's event monitor on the unix socket `path`: the greeting, the answer to
    qmp_capabilities, then `events` (dicts), then the socket closes (QEMU gone). Returns the thread."""
    import socket
    import threading

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def serve():
        conn = server.accept()[0]
        with conn, server:
            conn.sendall(b'{"QMP": {"version": {}, "capabilities": []}}\n')
            conn.recv(4096)
            conn.sendall(b'{"return": {}}\n')
            for event in events:
                conn.sendall(json.dumps(event).encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def follower_for(gpulab, monkeypatch, events, state="stopped"):
    """follow_reboots on a host whose event monitor sends `events`; the launches it made (their keyword
    arguments) and what it returned."""
    vm = gpulab.Vm("lab-x")
    os.makedirs(vm.dir)
    vm.save_meta(ssh_port=40123, accel="tcg")
    thread = serve_events(vm.events, events)
    launches = []
    # follow_reboots (lab/labreboot.py) calls them by the names it imported.
    monkeypatch.setattr(gpulab.labreboot, "image_manifest", lambda: {"id": "abc"})
    monkeypatch.setattr(gpulab.labreboot, "ssh_key", lambda: ("key", "key.pub"))
    monkeypatch.setattr(gpulab.Vm, "state", lambda self: state)
    monkeypatch.setattr(gpulab.Vm, "launch", lambda self, *args, **kwargs: launches.append((args, kwargs)))
    reason = gpulab.follow_reboots(vm)
    thread.join(5)
    return launches, reason


def test_a_guest_reboot_starts_the_host_again_on_its_port(gpulab, monkeypatch):
    launches, reason = follower_for(gpulab, monkeypatch, [
        {"event": "RESET", "data": {"guest": True, "reason": "guest-reset"}},
        {"event": "SHUTDOWN", "data": {"guest": True, "reason": "guest-reset"}}])
    assert reason == "guest-reset"
    assert launches == [(({"id": "abc"}, "tcg", "key.pub"), {"rebooting": True})]


@pytest.mark.parametrize("events", [
    [{"event": "SHUTDOWN", "data": {"guest": True, "reason": "guest-shutdown"}}],   # powered off from inside
    [{"event": "SHUTDOWN", "data": {"guest": False, "reason": "host-qmp-quit"}}],   # gpulab stop
    [],                                                                              # killed: no event at all
])
def test_a_host_that_stopped_otherwise_stays_stopped(gpulab, monkeypatch, events):
    launches, reason = follower_for(gpulab, monkeypatch, events)
    assert launches == []
    assert reason == (events[0]["data"]["reason"] if events else None)


def test_a_host_started_meanwhile_is_not_started_twice(gpulab, monkeypatch):
    launches = follower_for(gpulab, monkeypatch, [
        {"event": "SHUTDOWN", "data": {"guest": True, "reason": "guest-reset"}}], state="running")[0]
    assert launches == []


def restarted_after_reboot(gpulab, monkeypatch, outcomes):
    """answered_or_restarted on a host whose SSH waits end as `outcomes` say, one per wait (None: SSH answered,
    else the exception raised); what it returned, the waits, the kills and the launches it made."""
    vm = gpulab.Vm("lab-z")
    os.makedirs(vm.dir, exist_ok=True)
    vm.save_meta(ssh_port=40124, accel="tcg")
    waits, kills, launches = [], [], []

    def wait(_vm, port, _timeout, answer_timeout=None, console_from=0):
        waits.append((port, answer_timeout, console_from))
        outcome = outcomes[len(waits) - 1]
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(gpulab.labreboot, "wait_ssh", wait)
    monkeypatch.setattr(gpulab.labreboot, "image_manifest", lambda: {"id": "abc"})
    monkeypatch.setattr(gpulab.labreboot, "ssh_key", lambda: ("key", "key.pub"))
    monkeypatch.setattr(gpulab.Vm, "rescue_report", lambda self: "--- networkctl\n  2 eth0 ether carrier failed")
    monkeypatch.setattr(gpulab.Vm, "kill", lambda self, *args: kills.append(self.name))
    monkeypatch.setattr(gpulab.Vm, "launch", lambda self, *args, **kwargs: launches.append((args, kwargs)))
    answered = gpulab.labreboot.answered_or_restarted(vm, 40124, "tcg", timeout=5)
    return answered, waits, kills, launches


def test_after_a_reboot_the_follower_waits_for_ssh_and_leaves_an_answering_host_alone(gpulab, monkeypatch):
    answered, waits, kills, launches = restarted_after_reboot(gpulab, monkeypatch, [None])
    assert answered and waits == [(40124, gpulab.labreboot.ANSWER_TIMEOUT, 0)] and kills == [] and launches == []


def test_a_host_that_booted_and_does_not_answer_after_a_reboot_is_restarted_once(gpulab, monkeypatch, capsys):
    answered, waits, kills, launches = restarted_after_reboot(gpulab, monkeypatch, [
        gpulab.NoAnswer("lab-z: booted (its login prompt has been on the console for 601s) but SSH does not answer"),
        None])
    assert answered and len(waits) == 2 and kills == ["lab-z"]
    assert launches == [(({"id": "abc"}, "tcg", "key.pub"), {"rebooting": True})]
    out = capsys.readouterr().out
    assert "eth0 ether carrier failed" in out and "lab-z: restarting it once (a cold start, same port)" in out
    # Once only: a second silence is reported, not restarted again.
    answered, waits, kills, launches = restarted_after_reboot(gpulab, monkeypatch, [
        gpulab.NoAnswer("no answer"), gpulab.NoAnswer("no answer again")])
    assert not answered and len(waits) == 2 and len(launches) == 1


def test_a_qemu_that_ends_while_the_follower_waits_is_left_to_the_lab(gpulab, monkeypatch):
    answered, waits, kills, launches = restarted_after_reboot(gpulab, monkeypatch, [
        gpulab.LabError("lab-z: QEMU exited while booting; last console lines:\n...")])
    assert not answered and len(waits) == 1 and kills == [] and launches == []


def test_a_host_without_an_event_monitor_is_left_alone(gpulab, monkeypatch):
    vm = gpulab.Vm("lab-y")
    monkeypatch.setattr(gpulab.Vm, "launch", lambda *args, **kwargs: pytest.fail("launched"))
    assert gpulab.follow_reboots(vm) is None


# ---------------------------------------------------------------------------------------------
# A host that booted and does not answer SSH: the rescue port's report and one cold restart
# ---------------------------------------------------------------------------------------------

def serve_rescue(path, answer):
    """A stand-in for a guest's rescue port on the unix socket `path`: reads one request line, sends `answer`
    (bytes, CR LF line ends as a serial line has them) unless it is None, then keeps the socket open a moment."""
    import socket
    import threading
    import time

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    seen = []

    def serve():
        conn = server.accept()[0]
        with conn, server:
            seen.append(conn.recv(4096))
            if answer is not None:
                conn.sendall(answer)
            time.sleep(1.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, seen


def test_the_rescue_report_is_read_without_ssh_and_kept(gpulab):
    vm = gpulab.Vm("lab-r")
    os.makedirs(vm.dir)
    report = "=== gpulab-rescue: gpulab up 512.3s\r\n--- systemctl status ssh\r\nActive: activating (start)\r\n=== end\r\n"
    thread, seen = serve_rescue(vm.rescue, ("noise from an earlier boot\r\n" + report).encode())
    text = vm.rescue_report(timeout=10)
    thread.join(5)
    assert seen == [b"report\n"]
    assert text.startswith("=== gpulab-rescue: gpulab up 512.3s")
    assert "Active: activating (start)" in text and "\r" not in text and "noise" not in text
    with open(vm.rescue_log) as handle:
        assert "Active: activating (start)" in handle.read()


def console_vm(gpulab, name, console):
    """A lab host's state directory whose console log holds ``console``."""
    vm = gpulab.Vm(name)
    os.makedirs(vm.dir)
    with open(vm.serial, "w") as handle:
        handle.write(console)
    return vm


def test_a_silent_rescue_port_is_said_so(gpulab):
    vm = gpulab.Vm("lab-s")
    os.makedirs(vm.dir)
    thread, _seen = serve_rescue(vm.rescue, None)
    text = vm.rescue_report(timeout=1)
    thread.join(5)
    assert text == "(no rescue report: the guest did not answer on its rescue port within 1s)"
    assert not os.path.exists(vm.rescue_log)
    gone = gpulab.Vm("lab-gone").rescue_report(timeout=1)
    assert gone.startswith("(no rescue report: the rescue port ") and "cannot be reached" in gone


@pytest.mark.parametrize("console, booted", [
    ("Linux version 6.1\n...\ngpulab login: ", True),
    # The prompt of the boot before a reboot does not count for the boot after it.
    ("Linux version 6.1\ngpulab login: \nreboot: Restarting system\nLinux version 6.1\n[ OK ] Started ssh", False),
    ("Linux version 6.1\n[ OK ] Reached target Basic System", False),
    ("", False),
])
def test_a_boot_is_done_when_its_own_login_prompt_is_on_the_console(gpulab, console, booted):
    vm = console_vm(gpulab, "lab-c", console)
    assert gpulab.labnet.booted_at(vm) is booted


def test_a_restart_waits_for_the_prompt_of_its_own_boot(gpulab):
    """A restart on the same port goes on in the same console file: the boot before's prompt is not this one's."""
    before = "Linux version 6.1\ngpulab login: \n"
    vm = console_vm(gpulab, "lab-c2", before + "SeaBIOS (version 1.16)\nBooting from Hard Disk...\n")
    assert gpulab.labnet.booted_at(vm) is True
    assert gpulab.labnet.booted_at(vm, console_from=len(before)) is False
    with open(vm.serial, "a") as handle:
        handle.write("Linux version 6.1\ngpulab login: ")
    assert gpulab.labnet.booted_at(vm, console_from=len(before)) is True


def test_a_booted_guest_that_does_not_answer_is_named_after_the_bound(gpulab, monkeypatch):
    vm = console_vm(gpulab, "lab-n", "Linux version 6.1\ngpulab login: ")
    monkeypatch.setattr(gpulab.Vm, "process_alive", lambda self: True)
    monkeypatch.setattr(gpulab.labnet, "ssh_answers", lambda port: False)
    monkeypatch.setattr(gpulab.labnet.time, "sleep", lambda seconds: None)
    with pytest.raises(gpulab.NoAnswer, match=r"lab-n: booted \(its login prompt has been on the console for 0s\) "
                                              r"but SSH on 127.0.0.1:40555 does not answer"):
        gpulab.wait_ssh(vm, 40555, timeout=60, answer_timeout=-1)


def silent_host(gpulab, monkeypatch, sleep=lambda seconds: None):
    """A live QEMU whose SSH never answers, on a clock that moves 30 s per reading; `sleep` stands for the wait
    between rounds."""
    clock = iter(range(0, 100000, 30))
    monkeypatch.setattr(gpulab.labnet.time, "time", lambda: next(clock))
    monkeypatch.setattr(gpulab.Vm, "process_alive", lambda self: True)
    monkeypatch.setattr(gpulab.labnet, "ssh_answers", lambda port: False)
    monkeypatch.setattr(gpulab.labnet.time, "sleep", sleep)


def test_a_boot_whose_console_went_silent_is_named_after_the_bound(gpulab, monkeypatch):
    """A boot that stopped before its login prompt (its console silent, SSH not answering) counts as not answering,
    after the silence bound, not the (shorter) answer bound: a booting guest is often quiet for seconds."""
    vm = console_vm(gpulab, "lab-q",
                    "Linux version 6.1\n[ OK ] Reached target Network.\n(2 of 3) Job ssh.service/start running")
    silent_host(gpulab, monkeypatch)
    with pytest.raises(gpulab.NoAnswer, match=r"lab-q: its console has been silent for \d+s without a login prompt and "
                                              r"SSH on 127.0.0.1:40557 does not answer \(a boot that stopped\)"):
        gpulab.wait_ssh(vm, 40557, timeout=100000, answer_timeout=5, silence_timeout=600)


def test_a_boot_that_still_prints_is_waited_for(gpulab, monkeypatch):
    """A slow boot that keeps writing to its console is not cut short: only the overall timeout ends the wait."""
    vm = gpulab.Vm("lab-p")
    os.makedirs(vm.dir)
    monkeypatch.setattr(gpulab.Vm, "rescue_report", lambda self: "(no rescue report)")

    def printing(seconds):
        with open(vm.serial, "a") as handle:
            handle.write("[ OK ] Started something.\n")
    silent_host(gpulab, monkeypatch, sleep=printing)
    with pytest.raises(gpulab.LabError) as err:
        gpulab.wait_ssh(vm, 40558, timeout=3000, answer_timeout=600)
    assert not isinstance(err.value, gpulab.NoAnswer)
    assert "lab-p: no SSH on 127.0.0.1:40558 after 3000s" in str(err.value)


def test_a_guest_that_never_answers_fails_with_its_console_and_rescue_report(gpulab, monkeypatch):
    vm = console_vm(gpulab, "lab-f", "Linux version 6.1\n[ OK ] Started ssh.service")
    monkeypatch.setattr(gpulab.Vm, "process_alive", lambda self: True)
    monkeypatch.setattr(gpulab.Vm, "rescue_report", lambda self: "=== gpulab-rescue: networkctl: degraded")
    monkeypatch.setattr(gpulab.labnet, "ssh_answers", lambda port: False)
    with pytest.raises(gpulab.LabError) as err:
        gpulab.wait_ssh(vm, 40556, timeout=0)
    assert "lab-f: no SSH on 127.0.0.1:40556 after 0s" in str(err.value)
    assert "Started ssh.service" in str(err.value) and "networkctl: degraded" in str(err.value)


def start_with(gpulab, monkeypatch, waits, state="running"):
    """cmd_start on one host whose successive SSH waits do what `waits` says ("ok", "no-answer", "fail");
    returns (exit error or None, the launches, the kills, the waits' answer_timeout arguments)."""
    import argparse

    with open(gpulab.INVENTORY_HOSTS, "w") as handle:
        handle.write("all:\n  children:\n    container:\n      hosts:\n        lab-w: {}\n")
    vm = gpulab.Vm("lab-w")
    os.makedirs(vm.dir)
    vm.save_meta(ssh_port=40600)
    launches, kills, bounds = [], [], []
    outcomes = list(waits)

    def fake_wait(vm_, port, timeout, answer_timeout=None, console_from=0):
        bounds.append(answer_timeout)
        outcome = outcomes.pop(0)
        if outcome == "no-answer":
            raise gpulab.NoAnswer("%s: booted but SSH on 127.0.0.1:%d does not answer" % (vm_.name, port))
        if outcome == "fail":
            raise gpulab.LabError("%s: no SSH" % vm_.name)

    monkeypatch.setattr(gpulab, "need_tools", lambda *names: None)
    monkeypatch.setattr(gpulab, "ensure_image", lambda: {"id": "abc"})
    monkeypatch.setattr(gpulab, "ssh_key", lambda: ("key", "key.pub"))
    monkeypatch.setattr(gpulab, "choose_accel", lambda: "tcg")
    monkeypatch.setattr(gpulab, "wait_ssh", fake_wait)
    monkeypatch.setattr(gpulab, "write_inventory", lambda hosts: None)
    monkeypatch.setattr(gpulab.Vm, "state", lambda self: state)
    monkeypatch.setattr(gpulab.Vm, "rescue_report", lambda self: "=== gpulab-rescue: ssh.service activating")
    monkeypatch.setattr(gpulab.Vm, "kill", lambda self, graceful_seconds=0: kills.append(self.name))
    monkeypatch.setattr(gpulab.Vm, "launch", lambda self, *args, **kwargs: launches.append(kwargs) or 40600)
    try:
        gpulab.cmd_start(argparse.Namespace(hosts=["lab-w"], timeout=100))
        error = None
    except gpulab.LabError as exc:
        error = str(exc)
    return error, launches, kills, bounds


def test_a_running_host_that_does_not_answer_is_restarted_once(gpulab, monkeypatch, capsys):
    error, launches, kills, bounds = start_with(gpulab, monkeypatch, ["no-answer", "ok"])
    out = capsys.readouterr()
    assert error is None
    assert kills == ["lab-w"] and launches == [{"rebooting": True}]
    # The wait after the restart has the same bound: it fails then (one restart, never a second).
    assert bounds == [gpulab.ANSWER_TIMEOUT, gpulab.ANSWER_TIMEOUT]
    said = out.out + out.err
    assert "lab-w: booted but SSH on 127.0.0.1:40600 does not answer" in said
    assert "ssh.service activating" in said and "restarting it once" in said


def test_a_host_that_does_not_answer_after_its_restart_fails(gpulab, monkeypatch):
    error, launches, kills, _bounds = start_with(gpulab, monkeypatch, ["no-answer", "fail"])
    assert error == "lab-w: no SSH"
    assert kills == ["lab-w"] and len(launches) == 1


def test_a_host_that_booted_twice_and_does_not_answer_fails_with_its_report(gpulab, monkeypatch):
    error, launches, kills, _bounds = start_with(gpulab, monkeypatch, ["no-answer", "no-answer"])
    assert error == ("lab-w: booted but SSH on 127.0.0.1:40600 does not answer, after a cold restart too; what the "
                     "guest says on its rescue port:\n=== gpulab-rescue: ssh.service activating")
    assert kills == ["lab-w"] and len(launches) == 1


def test_a_running_host_that_answers_is_left_alone(gpulab, monkeypatch):
    error, launches, kills, _bounds = start_with(gpulab, monkeypatch, ["ok"])
    assert error is None and launches == [] and kills == []


KERNEL_NAMES = ["linux-image-6.1.0-47-amd64", "linux-image-6.1.0-50-amd64", "linux-image-6.1.0-56-amd64",
                "linux-image-6.1.0-53-amd64", "linux-image-6.1.0-56-amd64-unsigned", "linux-image-6.1.0-56-cloud-amd64",
                "linux-image-6.12.107+deb12-amd64", "linux-image-amd64"]


def test_the_kernel_update_is_the_highest_abi_above_the_image_kernel(gpulab):
    assert gpulab.labimage.pick_kernel_package(KERNEL_NAMES, "6.1.0-50-amd64") == "linux-image-6.1.0-56-amd64"


def test_without_a_newer_abi_the_highest_other_one_is_taken(gpulab):
    assert gpulab.labimage.pick_kernel_package(KERNEL_NAMES, "6.1.0-56-amd64") == "linux-image-6.1.0-53-amd64"
    assert gpulab.labimage.pick_kernel_package(["linux-image-6.1.0-50-amd64"], "6.1.0-50-amd64") is None


def test_a_kernel_that_is_not_a_debian_release_is_named(gpulab):
    with pytest.raises(gpulab.LabError, match="'6.12.107-custom'"):
        gpulab.labimage.pick_kernel_package(KERNEL_NAMES, "6.12.107-custom")


def test_a_cached_kernel_package_is_used_without_the_mirror(gpulab, monkeypatch):
    kernels = os.path.join(gpulab.CACHE, "kernels")
    os.makedirs(kernels)
    for name in ("linux-image-6.1.0-50-amd64_6.1.176-1_amd64.deb", "linux-image-6.1.0-53-amd64_6.1.180-1_amd64.deb"):
        open(os.path.join(kernels, name), "wb").close()

    def no_mirror(*_args, **_kwargs):
        raise AssertionError("the mirror was asked")
    monkeypatch.setattr(gpulab.labimage.subprocess, "run", no_mirror)
    found = gpulab.labimage.kernel_package("6.1.0-50-amd64")
    assert found == {"package": "linux-image-6.1.0-53-amd64", "kernel": "6.1.0-53-amd64",
                     "deb": os.path.join(kernels, "linux-image-6.1.0-53-amd64_6.1.180-1_amd64.deb")}


@pytest.mark.parametrize("root, mounted, expected", [
    ("rw,relatime", "yes", None),
    ("ro,relatime", "yes", "the root file system is read-only"),
    ("rw,relatime", "no", "/boot/efi of /etc/fstab is not mounted"),
])
def test_a_boot_that_came_up_short_is_named_and_not_saved(gpulab, tmp_path, monkeypatch, root, mounted, expected):
    """The lab's boot check (gpulab.BOOT_CHECK) run by a real shell against findmnt and mountpoint stand-ins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "findmnt").write_text('#!/bin/sh\ncase "$*" in *--fstab*) printf "/\\n/boot/efi\\n";; '
                                     '*) echo %s;; esac\n' % root)
    (bin_dir / "mountpoint").write_text("#!/bin/sh\n[ %s = yes ]\n" % mounted)
    for name in ("findmnt", "mountpoint"):
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    monkeypatch.setattr(gpulab, "ssh_cmd", lambda port, command: ["sh", "-c", command])
    problem = gpulab.boot_problem(2222)
    if expected is None:
        assert problem is None
    else:
        assert expected in problem and "generators" in problem


def test_a_boot_check_that_cannot_run_is_a_problem_not_a_crash(gpulab, monkeypatch):
    monkeypatch.setattr(gpulab, "ssh_cmd", lambda port, command: ["sh", "-c", "echo refused >&2; exit 255"])
    assert gpulab.boot_problem(2222) == "its boot could not be checked (rc=255): refused"


def test_kernel_package_prints_only_json_on_stdout_even_when_it_downloads(gpulab, monkeypatch, capsys):
    monkeypatch.setattr(gpulab, "image_manifest", lambda: {"kernel": "6.1.0-50-amd64"})

    def downloading(_image_kernel):
        gpulab.log("downloading linux-image-6.1.0-56-amd64 (a kernel update)")
        return {"package": "linux-image-6.1.0-56-amd64", "kernel": "6.1.0-56-amd64", "deb": "/c/k.deb"}

    monkeypatch.setattr(gpulab, "kernel_package", downloading)
    gpulab.cmd_kernel_package(None)
    out, err = capsys.readouterr()
    assert json.loads(out)["kernel"] == "6.1.0-56-amd64"
    assert "downloading" in err
