"""Saved boots (lab/labstate.py and their use in lab/labhost.py and lab/gpulab.py): which hosts start from one,
what makes two hosts' boots interchangeable, the SR-IOV controller held back and hot-plugged, what a restored
guest is told on its rescue port, and the cold boot a broken saved boot falls back to."""

import json
import os
import socket
import threading
import time

import pytest

from test_gpulab import gpulab  # noqa: F401  pylint: disable=unused-import
from test_layout import TODAY, layout

HELD = TODAY[:10] + TODAY[12:]


def test_the_sriov_controller_alone_is_held_back():
    held = layout.qemu_args(None, "s1", hold_sriov=True)
    assert held == HELD
    assert "nvme-subsys,id=subsys0" in held and not any(arg.startswith("nvme,") for arg in held)
    spec, address = layout.sriov_hotplug(None, "s1")
    # What the cold boot has on its command line, hot-plugged at the address a cold boot gives it.
    assert spec == TODAY[11] and address == "0000:01:00.0"


def test_a_sriov_function_behind_a_switch_is_hot_plugged_on_the_downstream_port():
    shaped = [{"slot": "03", "behind": "switch", "functions": ["gpu"]},
              {"slot": "09", "behind": "switch", "functions": ["sriov"]}]
    spec, address = layout.sriov_hotplug(shaped, "s1")
    assert spec.startswith("nvme,bus=dn4,addr=00.0,serial=s1,")
    assert address == layout.guest_addresses(shaped)["sriov"][0] == "0000:06:00.0"
    assert [a for a in layout.qemu_args(shaped, "s1") if a.startswith("nvme,")] == [spec]


@pytest.mark.parametrize("shaped", [
    [{"slot": "03", "functions": ["gpu", "sriov"]}],
    [{"slot": "04", "functions": ["sriov"]}],
    [{"slot": "04", "behind": "root-port", "functions": ["sriov", "gpu"]}],
])
def test_a_sriov_function_that_shares_its_slot_or_sits_on_the_root_bus_is_not_hot_plugged(shaped):
    assert layout.sriov_hotplug(shaped, "s1") is None


def test_a_layout_without_sriov_has_nothing_to_hot_plug():
    assert layout.sriov_hotplug([{"slot": "03", "functions": ["gpu", "audio", "usb"]}], "s1") is None


def test_a_shape_key_changes_with_everything_that_makes_a_boot_different(gpulab):  # noqa: F811
    labstate = gpulab.labhost.labstate
    base = labstate.shape_key("img1", "tcg", HELD, version="QEMU 7.2")
    assert base == labstate.shape_key("img1", "tcg", list(HELD), version="QEMU 7.2")
    others = {labstate.shape_key("img2", "tcg", HELD, version="QEMU 7.2"),
              labstate.shape_key("img1", "kvm", HELD, version="QEMU 7.2"),
              labstate.shape_key("img1", "tcg", HELD + ["-device", "intel-iommu"], version="QEMU 7.2"),
              labstate.shape_key("img1", "tcg", HELD, version="QEMU 8.2")}
    assert base not in others and len(others) == 4


def hosts(gpulab, text):  # noqa: F811
    with open(gpulab.INVENTORY_HOSTS, "w") as handle:
        handle.write("all:\n  children:\n    lab:\n      hosts:\n" + text)


def pristine_vm(gpulab, name, monkeypatch, pristine=True):  # noqa: F811
    monkeypatch.setattr(gpulab.labhost, "run", lambda *args, **kwargs: None)
    vm = gpulab.Vm(name)
    os.makedirs(vm.dir)
    vm.save_meta(image_id="abc", pristine=pristine)
    return vm


def make_saved(saved, state=b"state", disk=b"disk"):
    os.makedirs(saved.dir, exist_ok=True)
    for path, data in ((saved.state, state), (saved.disk, disk)):
        with open(path, "wb") as handle:
            handle.write(data)
    with open(saved.meta_path, "w") as handle:
        json.dump({"key": saved.key, "image_id": "abc", "state_bytes": len(state), "disk_bytes": len(disk)}, handle)


def test_a_pristine_host_is_saved_then_restored(gpulab, monkeypatch):  # noqa: F811
    hosts(gpulab, "        lab-a: {}\n")
    vm = pristine_vm(gpulab, "lab-a", monkeypatch)
    plan = vm.pristine_plan({"id": "abc"}, "tcg", gpulab.lab_host_settings("lab-a"))
    assert plan.mode == "save" and plan.hotplug == layout.sriov_hotplug(None, "gpulab-lab-a")
    make_saved(plan.saved)
    again = vm.pristine_plan({"id": "abc"}, "tcg", gpulab.lab_host_settings("lab-a"))
    assert again.mode == "restore" and again.saved.key == plan.saved.key


def test_hosts_of_one_shape_share_a_saved_boot_and_other_shapes_do_not(gpulab, monkeypatch):  # noqa: F811
    hosts(gpulab, "        lab-a: {}\n        lab-b: {}\n        lab-c: {gpulab_iommu: false}\n"
                  "        lab-d:\n          gpulab_layout: [{slot: '03', functions: [gpu, audio, usb]}]\n")
    keys = {name: pristine_vm(gpulab, name, monkeypatch).pristine_plan(
        {"id": "abc"}, "tcg", gpulab.lab_host_settings(name)).saved.key for name in ("lab-a", "lab-b", "lab-c", "lab-d")}
    assert keys["lab-a"] == keys["lab-b"]
    assert len({keys["lab-a"], keys["lab-c"], keys["lab-d"]}) == 3


@pytest.mark.parametrize("why, host, env, pristine", [
    ("a host that has run", "lab-a: {}", "1", False),
    ("saved boots turned off", "lab-a: {}", "0", True),
    ("no network: its boot is the test", "lab-a: {gpulab_network: false}", "1", True),
    ("an SR-IOV function that cannot be hot-plugged", "lab-a: {gpulab_layout: [{slot: '03', functions: [gpu, sriov]}]}",
     "1", True),
])
def test_these_hosts_boot_cold(gpulab, monkeypatch, why, host, env, pristine):  # noqa: F811
    monkeypatch.setenv("GPUOPS_LAB_SAVED_STATES", env)
    hosts(gpulab, "        %s\n" % host)
    vm = pristine_vm(gpulab, "lab-a", monkeypatch, pristine=pristine)
    assert vm.pristine_plan({"id": "abc"}, "tcg", gpulab.lab_host_settings("lab-a")) is None, why


def test_a_bad_setting_of_saved_boots_is_named(gpulab, monkeypatch):  # noqa: F811
    monkeypatch.setenv("GPUOPS_LAB_SAVED_STATES", "yes")
    hosts(gpulab, "        lab-a: {}\n")
    vm = pristine_vm(gpulab, "lab-a", monkeypatch)
    with pytest.raises(gpulab.LabError, match=r"GPUOPS_LAB_SAVED_STATES='yes': expected 0 .* or 1"):
        vm.pristine_plan({"id": "abc"}, "tcg", gpulab.lab_host_settings("lab-a"))


def test_a_truncated_saved_boot_is_not_used(gpulab, monkeypatch):  # noqa: F811
    hosts(gpulab, "        lab-a: {}\n")
    vm = pristine_vm(gpulab, "lab-a", monkeypatch)
    plan = vm.pristine_plan({"id": "abc"}, "tcg", gpulab.lab_host_settings("lab-a"))
    make_saved(plan.saved)
    with open(plan.saved.state, "wb") as handle:
        handle.write(b"sta")
    assert not plan.saved.ready()
    assert vm.pristine_plan({"id": "abc"}, "tcg", gpulab.lab_host_settings("lab-a")).mode == "save"


def test_saved_boots_of_another_image_are_pruned(gpulab):  # noqa: F811
    labstate = gpulab.labhost.labstate
    old, kept, mine = labstate.SavedBoot("old"), labstate.SavedBoot("kept"), labstate.SavedBoot("mine")
    make_saved(old)
    with open(old.meta_path, "w") as handle:
        json.dump({"key": "old", "image_id": "zzz"}, handle)
    make_saved(kept)
    make_saved(mine)
    labstate.prune(keep="mine", image_id="abc")
    assert not os.path.exists(old.dir) and kept.ready() and mine.ready()


def guest_rescue(path, answers):
    """A restored guest's rescue port on the unix socket `path`: each connection's request line is answered
    from `answers` ({request word: reply line}); returns the requests seen."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    seen = []

    def serve():
        with server:
            for _answer in answers:
                conn = server.accept()[0]
                with conn:
                    line = conn.recv(4096).decode()
                    seen.append(line)
                    conn.sendall(("noise\r\n" + answers[line.split()[0]] + "\r\n").encode())
                    time.sleep(0.2)

    threading.Thread(target=serve, daemon=True).start()
    return seen


def test_a_restored_guest_gets_the_labs_key_and_the_time(gpulab, monkeypatch):  # noqa: F811
    vm = pristine_vm(gpulab, "lab-r", monkeypatch)
    seen = guest_rescue(vm.rescue, {"keys": "=== keys ok", "clock": "=== clock ok"})
    before = int(time.time())
    vm.tell_restored(timeout=10)
    assert seen[0] == "keys\n"
    word, seconds = seen[1].split()
    assert word == "clock" and before <= int(seconds) <= time.time() + 1


def test_a_restored_guest_that_does_not_take_the_key_is_refused(gpulab, monkeypatch):  # noqa: F811
    vm = pristine_vm(gpulab, "lab-r", monkeypatch)
    guest_rescue(vm.rescue, {"keys": "=== keys failed"})
    with pytest.raises(gpulab.SavedBootError, match="(?s)did not confirm `keys` on its rescue port: .*=== keys failed"):
        vm.tell_restored(timeout=10)


def test_the_image_answers_only_its_fixed_requests():
    """The rescue script the image carries: a clock that is not digits only is refused, no request runs as a
    command (the script read from the image recipe, its serial line swapped for a pair of pipes)."""
    import re
    import subprocess
    import tempfile

    with open(os.path.join(os.path.dirname(layout.__file__), "labimage.py")) as handle:
        recipe = handle.read()
    script = re.search(r'"/usr/local/sbin/gpulab-rescue", """(.*?)""", 0o755', recipe, re.S).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        fifo_in = os.path.join(tmp, "in")
        os.mkfifo(fifo_in)
        out = os.path.join(tmp, "out")
        body = script.replace("exec 3<>/dev/ttyS1", "exec 3<>%s" % fifo_in).replace(
            ">&3", ">>%s" % out).replace("date -u -s", "echo would-set")
        body = body.replace("/usr/local/sbin/gpulab-keys", "true")
        path = os.path.join(tmp, "rescue")
        with open(path, "w") as handle:
            handle.write(body)
        proc = subprocess.Popen(["sh", path])
        try:
            with open(fifo_in, "w") as feed:
                feed.write("clock 12;touch %s/pwned\nclock 1700000000\nkeys\n" % tmp)
                feed.flush()
                deadline = time.time() + 10
                while time.time() < deadline:
                    if os.path.exists(out) and open(out).read().count("===") >= 3:
                        break
                    time.sleep(0.1)
        finally:
            proc.kill()
            proc.wait()
        with open(out) as handle:
            said = handle.read().split("\n")
        assert said[:3] == ["=== clock refused", "=== clock ok", "=== keys ok"]
        assert not os.path.exists(os.path.join(tmp, "pwned"))
