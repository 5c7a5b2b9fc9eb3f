"""The lab's commands against real QEMU: no-op start, a host that never answers, and bad input (the recovery of a
crashed host on a taken port is checked on the module targets' host, test_88).

The two that need booted hosts read what the lab work recorded in the background (conftest.LabWork): they come
after the controller's own tests, which start at once instead of waiting for the lab's boot."""

import json
import os
import re

import pytest

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


@pytest.mark.slice("repairs")
def test_a_host_that_boots_and_never_answers_is_reported_and_restarted_once(lab_work):
    """A host without a NIC (gpulab_network: false) in a lab of its own, beside the real lab, which it must not
    touch (conftest.NoNetworkRun, in the background once the lab's boot has ended): it reaches its login prompt and
    SSH never answers. The lab reads the real guest's rescue report without SSH, starts the host again once, and
    fails with the report."""
    seen = lab_work.nonet.results()
    assert "error" not in seen, seen["error"]
    out = seen["out"]
    assert seen["rc"] == 1, out
    assert "Traceback" not in out
    assert re.search(r"lab-nonet: booted \(its login prompt has been on the console for \d+s\) but SSH on "
                     r"127\.0\.0\.1:\d+ does not answer; what the guest says on its rescue port", out), out
    assert "lab-nonet: restarting it once (a cold start, same port)" in out
    assert "after a cold restart too; what the guest says on its rescue port" in out
    # The real guest's reports (one before the restart, one after), read on its second serial port: no NIC, so
    # no link but the loopback and nothing on the network.
    with open(os.path.join(seen["state"], "lab-nonet", "rescue.log"), encoding="utf-8") as handle:
        reports = handle.read().split("=== gpulab-rescue: ")[1:]
    assert len(reports) == 2, reports
    for report in reports:
        assert "--- ip addr" in report and "--- systemctl status ssh systemd-networkd" in report
        assert "1: lo:" in report and "2: " not in report.split("--- ip addr", 1)[1].split("---", 1)[0]
    # The real lab's state and inventory are not the test's.
    assert "lab-nonet" not in seen["real_status"]
    assert os.path.isdir(os.path.join(seen["state"], "lab-nonet"))


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
