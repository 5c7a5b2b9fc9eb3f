"""Host preparation on a prepared lab host that drifted: the record of the last ready run no longer matches,
every module runs and repairs the host, and the next run takes the fast path again.

It runs on lab-passthrough as soon as the switch scenario and test_85's runs have left that host (not after the
whole lab's work): its two plays overlap the power-loss run on lab-vgpu instead of following it. The main job
itself (site.yml, no-op on the prepared hosts) runs once, through ansible-runner as AWX runs it, in test_95.
"""

import re

from conftest import lab, run


# The lone edu device behind a root port (its own IOMMU group) and the audio function beside the first edu.
LONE_GPU = "0000:02:00.0"
AUDIO_RULE = "/etc/udev/rules.d/61-gpuops-vfio-0000:00:03.1.rules"
FAST = "TASK [gpuops.sandbox.host_prepare : Keep the host as recorded"
BIND = "TASK [gpuops.sandbox.host_prepare : Bind the GPUs"


def ran(out, task):
    """True when the task ran (ok or changed) rather than being skipped or never reached."""
    return bool(re.search(r"%s[^\n]*\n(?:ok|changed): " % re.escape(task), out))


def prepare_passthrough():
    proc = run(["ansible-playbook", "playbooks/prepare_hosts.yml", "-i", "inventories/lab/", "--limit",
                "lab-passthrough"], timeout=2400)
    assert proc.returncode == 0, proc.stdout[-6000:]
    recap = re.search(r"^lab-passthrough\s+:.*changed=(\d+)", proc.stdout, re.M)
    assert recap, proc.stdout[-3000:]
    return proc.stdout, int(recap.group(1))


def test_a_drifted_host_is_repaired_then_skipped_again(switch_run):
    assert switch_run is not None and switch_run.results()["switch"][0] == 0, "needs the switch scenario's host"
    # A GPU taken off vfio-pci and a persistence rule deleted behind the collection's back: the record of
    # the last ready run no longer matches, so every module runs and puts both back.
    lab("ssh", "lab-passthrough", "--", "echo %s > /sys/bus/pci/drivers/vfio-pci/unbind; rm -f %s"
        % (LONE_GPU, AUDIO_RULE), check=True)
    out, changed = prepare_passthrough()
    assert changed >= 1 and ran(out, BIND) and not ran(out, FAST), out[-6000:]
    state = lab("ssh", "lab-passthrough", "--", "readlink /sys/bus/pci/devices/%s/driver; ls %s" % (LONE_GPU, AUDIO_RULE),
                check=True).stdout
    assert state.split()[0].endswith("/vfio-pci") and AUDIO_RULE in state, state
    # Now the host matches its new record: the next run calls gpu_facts only and changes nothing.
    out, changed = prepare_passthrough()
    assert changed == 0 and ran(out, FAST) and not ran(out, BIND), out[-6000:]
