"""The lab's commands against real QEMU: no-op start, stale VM recovery, a taken port, bad input."""

import json
import os
import signal
import socket
import time

import pytest

from conftest import FRESH_PIDS, TOP, lab, lab_status, run

# The spare host: booted here from a fresh overlay, it is where the module targets run next (conftest
# ModuleTargetsRun takes it as it is, with no second boot), while the GPU hosts' scenarios already run.
VICTIM = "lab-modules"


@pytest.fixture(scope="module")
def spare_host():
    lab("reset", "--no-start", VICTIM, check=True)
    proc = lab("start", VICTIM, timeout=1800)
    assert proc.returncode == 0, proc.stdout
    return VICTIM


def test_start_of_a_running_host_is_a_noop(spare_host):
    pid = lab_status()[spare_host]["pid"]
    assert pid
    started = time.time()
    proc = lab("start", spare_host, check=True)
    assert time.time() - started < 120
    assert "%s: already running" % spare_host in proc.stdout
    assert lab_status()[spare_host]["pid"] == pid
    # A plain start (every host) would leave it out: it is not an autostart host.
    assert lab_status()[spare_host]["autostart"] is False


def test_crashed_vm_is_detected_and_restarted_on_a_new_port(spare_host):
    meta = lab_status()[spare_host]
    with open(os.path.join(TOP, ".lab", spare_host, "qemu.pid")) as handle:
        pid = int(handle.read())
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 30
    while time.time() < deadline and os.path.exists("/proc/%d" % pid):
        time.sleep(0.5)
    assert lab_status()[spare_host]["state"] == "stale"
    # Something else takes the VM's old SSH port meanwhile.
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", meta["ssh_port"]))
    squatter.listen(1)
    try:
        proc = lab("start", spare_host, timeout=1800)
    finally:
        squatter.close()
    assert proc.returncode == 0, proc.stdout
    assert "%s: found stale" % spare_host in proc.stdout
    assert "port %d is taken" % meta["ssh_port"] in proc.stdout
    after = lab_status()[spare_host]
    assert after["state"] == "running" and after["ssh_port"] != meta["ssh_port"]
    # The inventory points at the new port, and ansible reaches the host through it.
    with open(os.path.join(TOP, "inventories", "lab", "zz-lab-connection.yml")) as handle:
        assert "ansible_port: %d" % after["ssh_port"] in handle.read()
    ping = run(["ansible", spare_host, "-i", "inventories/lab/", "-m", "ansible.builtin.ping"], timeout=600)
    assert ping.returncode == 0 and "SUCCESS" in ping.stdout and "pong" in ping.stdout, ping.stdout
    # Booted from the fresh overlay and only pinged since: the module targets take it as it is.
    FRESH_PIDS.setdefault(spare_host, set()).add(after["pid"])


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
