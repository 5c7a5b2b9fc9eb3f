"""The lab's commands against real QEMU: no-op start, stale VM recovery, a taken port, bad input."""

import json
import os
import signal
import socket
import time

from conftest import TOP, lab, lab_status, run

VICTIM = "lab-vgpu"


def test_start_of_a_running_lab_is_a_noop(running_lab):
    pids = {h: v["pid"] for h, v in lab_status().items()}
    assert all(pids[host] for host in running_lab)
    started = time.time()
    proc = lab("start", check=True)
    assert time.time() - started < 120
    for host in running_lab:
        assert "%s: already running" % host in proc.stdout
    # The spare host (gpulab_autostart: false) stays as it was: a plain start does not boot it.
    assert "lab-modules" not in running_lab and "lab-modules" not in proc.stdout
    assert {h: v["pid"] for h, v in lab_status().items()} == pids


def test_crashed_vm_is_detected_and_restarted_on_a_new_port(running_lab):
    meta = lab_status()[VICTIM]
    with open(os.path.join(TOP, ".lab", VICTIM, "qemu.pid")) as handle:
        pid = int(handle.read())
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 30
    while time.time() < deadline and os.path.exists("/proc/%d" % pid):
        time.sleep(0.5)
    assert lab_status()[VICTIM]["state"] == "stale"
    # Something else takes the VM's old SSH port meanwhile.
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", meta["ssh_port"]))
    squatter.listen(1)
    try:
        proc = lab("start", VICTIM, timeout=1800)
    finally:
        squatter.close()
    assert proc.returncode == 0, proc.stdout
    assert "%s: found stale" % VICTIM in proc.stdout
    assert "port %d is taken" % meta["ssh_port"] in proc.stdout
    after = lab_status()[VICTIM]
    assert after["state"] == "running" and after["ssh_port"] != meta["ssh_port"]
    # The inventory points at the new port, and ansible reaches the host through it.
    with open(os.path.join(TOP, "inventories", "lab", "zz-lab-connection.yml")) as handle:
        assert "ansible_port: %d" % after["ssh_port"] in handle.read()
    ping = run(["ansible", VICTIM, "-i", "inventories/lab/", "-m", "ansible.builtin.ping"], timeout=600)
    assert ping.returncode == 0 and "SUCCESS" in ping.stdout and "pong" in ping.stdout, ping.stdout


def test_unknown_host_is_a_clear_error():
    proc = lab("start", "lab-nope")
    assert proc.returncode == 1
    assert "unknown lab host(s) lab-nope; the lab has: lab-container" in proc.stdout
    assert "Traceback" not in proc.stdout


def test_missing_qemu_is_named(tmp_path):
    # A PATH with python but no QEMU: the command says what is missing and how to get it.
    proc = lab("start", env={"PATH": str(tmp_path)}, timeout=60)
    assert proc.returncode == 1
    assert "missing tools: qemu-system-x86_64" in proc.stdout
    assert "make hostdeps" in proc.stdout
    assert "Traceback" not in proc.stdout


def test_corrupt_image_cache_is_reported(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "debian12-gpulab.img").write_bytes(b"\0" * 4096)
    (cache / "debian12-gpulab.json").write_text("{not json")
    proc = lab("image", "--verify", env={"GPUOPS_LAB_CACHE": str(cache)}, timeout=60)
    assert proc.returncode == 1
    assert "cached image is corrupt: its manifest cannot be read" in proc.stdout
    manifest = json.loads((open(os.path.join(TOP, ".cache", "lab", "debian12-gpulab.json")).read()))
    (cache / "debian12-gpulab.json").write_text(json.dumps(manifest))
    proc = lab("image", "--verify", env={"GPUOPS_LAB_CACHE": str(cache)}, timeout=60)
    assert proc.returncode == 1
    assert "cached image is corrupt: size 4096, expected %d" % manifest["size"] in proc.stdout
