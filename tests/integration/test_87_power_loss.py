"""A power loss in the middle of a first preparation, on the lab's real kernel, initramfs tools and reboots.

lab-vgpu, back to the pristine image, starts its preparation; while update-initramfs generates the initramfs
with the nouveau blacklist, QEMU quits (no flush, no shutdown: the power goes). The host boots again on
whatever reached its disk, and the preparation runs once more. It must take the host lock over from the run
that died with the power, see that the initramfs was due (the pending record survived), generate it, reboot
once and end ready, with nothing pending. The run happens in the background (conftest.PowerLossRun), started
with the switch scenario once the vm_vgpu scenario has left the host.
"""

import pytest

from conftest import PENDING_INITRAMFS, POWER_LOSS_HOST, reboots

# The deep slice that proves this module's claims (tests/integration/tiers.py).
pytestmark = pytest.mark.slice("repairs")


def state(text):
    """(initramfs entries of the nouveau blacklist, pending records, /proc/cmdline) from INITRAMFS_STATE."""
    lines = text.splitlines()
    return int(lines[0].strip() or 0), lines[1].split(), lines[2]


def test_a_power_loss_during_the_initramfs_generation_is_repaired_by_the_next_run(power_loss_run):
    assert power_loss_run is not None, "the power-loss run starts from the vm_vgpu scenario's host, whose scenario failed"
    seen = power_loss_run.results()
    assert "error" not in seen, seen.get("error")
    # The power went while update-initramfs ran, and the run died with it.
    assert seen.get("generating") and seen.get("still_generating"), seen.get("first_out", "")[-4000:]
    assert seen["first_rc"] != 0
    # What reached the disk: the pending record (synced before the blacklist file was written).
    _entries, pending, _cmdline = state(seen["after_power_loss"])
    assert pending == ["initramfs.json"], seen["after_power_loss"]
    # The next run finishes what the first started.
    out = seen["again_out"]
    assert seen["again_rc"] == 0, out[-10000:]
    # The lock of the run that died: taken over (its host rebooted under it), or replaced if the power loss left
    # it unreadable.
    flat = " ".join(out.split())
    assert "took over the host lock" in flat or "replaced the invalid host lock" in flat, out[-6000:]
    assert reboots(out) == 1, out[-6000:]
    assert "Traceback" not in out and "unreachable=0" in out and "failed=0" in out
    entries, pending, cmdline = state(seen["after_again"])
    assert entries == 1 and pending == [], seen["after_again"]
    assert "intel_iommu=on" in cmdline.split(), cmdline
    print("power loss on %s: whole run %.0fs; record %s" % (POWER_LOSS_HOST, seen["elapsed"], PENDING_INITRAMFS))
