"""Host preparation on a prepared lab host that drifted: the record of the last ready run no longer matches,
every module runs and repairs the host, and the next run takes the fast path again.

It runs on lab-passthrough in the background (conftest.passthrough_host_steps), right after the switch scenario and
the refused switch of test_85: its two plays overlap the rest of the lab's work and the controller's tests. The main job
itself (site.yml, no-op on the prepared hosts) runs once, through ansible-runner as AWX runs it, in test_95.
"""

import re

import pytest

from conftest import AUDIO_RULE

# The deep slice that proves this module's claims (tests/integration/tiers.py).
pytestmark = pytest.mark.slice("repairs")

FAST = "TASK [gpuops.sandbox.host_prepare : Keep the host as recorded"
BIND = "TASK [gpuops.sandbox.host_prepare : Bind the GPUs"


def ran(out, task):
    """True when the task ran (ok or changed) rather than being skipped or never reached."""
    return bool(re.search(r"%s[^\n]*\n(?:ok|changed): " % re.escape(task), out))


def changes(out):
    recap = re.search(r"^lab-passthrough\s+:.*changed=(\d+)", out, re.M)
    assert recap, out[-3000:]
    return int(recap.group(1))


def test_a_drifted_host_is_repaired_then_skipped_again(lab_work):
    # A GPU taken off vfio-pci and a persistence rule deleted behind the collection's back (conftest.drift, on
    # lab-passthrough after the switch scenario and the refused switch): the record of the last ready run no longer
    # matches, so every module runs and puts both back.
    steps = lab_work.passthrough_checks.get()
    assert steps is not None, "the plays on lab-passthrough follow the switch scenario, which failed"
    seen = steps.results()["drift"]
    assert "error" not in seen, seen["error"]
    out = seen["repair_out"]
    assert seen["repair_rc"] == 0, out[-6000:]
    assert changes(out) >= 1 and ran(out, BIND) and not ran(out, FAST), out[-6000:]
    state = seen["state"]
    assert state.split()[0].endswith("/vfio-pci") and AUDIO_RULE in state, state
    # Now the host matches its new record: the next run calls gpu_facts only and changes nothing.
    out = seen["again_out"]
    assert seen["again_rc"] == 0, out[-6000:]
    assert changes(out) == 0 and ran(out, FAST) and not ran(out, BIND), out[-6000:]
