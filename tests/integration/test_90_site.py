"""The main job, playbooks/site.yml, on the lab after the host scenarios left every host prepared.

It must find nothing to do on the hosts (no change, no reboot) and report every host ready, whichever way
the hosts were prepared before (molecule scenarios through prepare_hosts.yml, the switch playbook).
"""

import re

from conftest import run


def test_site_is_a_noop_on_prepared_hosts(running_lab):
    proc = run(["ansible-playbook", "playbooks/site.yml", "-i", "inventories/lab/"], timeout=2400)
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:]
    recap = out[out.index("PLAY RECAP"):]
    for host in running_lab:
        line = re.search(r"^%s\s+:(.*)$" % re.escape(host), recap, re.M)
        assert line, "no PLAY RECAP line for %s" % host
        assert "failed=0" in line.group(1) and "unreachable=0" in line.group(1)
        assert "changed=0" in line.group(1), line.group(0)
        # The readiness table has the host, its type from the inventory groups, and READY yes.
        assert re.search(r"%s\s+(container|vm-passthrough|vm-vgpu)\s+yes\b" % re.escape(host), out), out[-4000:]
    assert not re.search(r"TASK \[[^\]]*Reboot once[^\]]*\][^\n]*\n(?:(?![^\n]*TASK \[)[^\n]*\n)*?[^\n]*changed: ", out)
