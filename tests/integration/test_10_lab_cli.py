"""The lab's commands against real QEMU: no-op start and bad input (the recovery of a crashed host on a taken
port is checked on the module targets' host, test_88)."""

import json
import os

from conftest import lab

# The spare host: the module targets' chain (conftest.ModuleTargetsRun) boots it from a fresh overlay at the
# session's start and runs `gpulab start` on it once more, recorded for the test below; that chain's power loss
# and the lab's recovery from it are checked in test_88.
SPARE = "lab-modules"


def test_start_of_a_running_host_is_a_noop(lab_work):
    assert lab_work.modules.booted.wait(2400), "%s did not boot in 40 minutes" % SPARE
    seen = lab_work.modules.lab_cli.get("start_again")
    assert seen, lab_work.modules.results(0).get("kernel_cmdline", (None, "%s did not start" % SPARE))[1]
    assert seen["rc"] == 0, seen["out"]
    assert seen["seconds"] < 120
    assert "%s: already running" % SPARE in seen["out"]
    assert seen["before"]["pid"] and seen["after"]["pid"] == seen["before"]["pid"]
    # A plain start (every host) would leave it out: it is not an autostart host.
    assert seen["after"]["autostart"] is False


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
    # The lab's real image and manifest (the machine's cache, or GPUOPS_LAB_CACHE), named by the lab itself.
    real = json.loads(lab("image", "--verify", "--json", check=True, timeout=600).stdout)
    image, manifest_file = os.path.basename(real["image"]), os.path.basename(real["manifest"])
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / image).write_bytes(b"\0" * 4096)
    (cache / manifest_file).write_text("{not json")
    proc = lab("image", "--verify", env={"GPUOPS_LAB_CACHE": str(cache)}, timeout=60)
    assert proc.returncode == 1
    assert "cached image is corrupt: its manifest cannot be read" in proc.stdout
    with open(real["manifest"], encoding="utf-8") as handle:
        manifest = json.load(handle)
    (cache / manifest_file).write_text(json.dumps(manifest))
    proc = lab("image", "--verify", env={"GPUOPS_LAB_CACHE": str(cache)}, timeout=60)
    assert proc.returncode == 1
    assert "cached image is corrupt: size 4096, expected %d" % manifest["size"] in proc.stdout
