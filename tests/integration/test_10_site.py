"""The main job, playbooks/site.yml, on the lab: ends without failures and reports every host."""

import re

from conftest import run


def test_site_runs_clean_on_the_lab(running_lab):
    proc = run(["ansible-playbook", "playbooks/site.yml", "-i", "inventories/lab/"], timeout=2400)
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:]
    recap = out[out.index("PLAY RECAP"):]
    for host in running_lab:
        line = re.search(r"^%s\s+:(.*)$" % re.escape(host), recap, re.M)
        assert line, "no PLAY RECAP line for %s" % host
        assert "failed=0" in line.group(1) and "unreachable=0" in line.group(1)
        # The summary line names the host's workload type from the inventory groups.
        assert re.search(r"%s: (container|vm-passthrough|vm-vgpu);" % re.escape(host), out)
    # The stand-in GPUs were found through the lab's selectors (edu at 00:03.0 on every host).
    assert out.count("0000:00:03.0") >= len(running_lab)
