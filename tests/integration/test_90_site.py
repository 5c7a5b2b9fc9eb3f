"""The main job, playbooks/site.yml, on the lab after the host scenarios left every host prepared.

It must find nothing to do on the hosts (no change, no reboot) and report every host ready, whichever way
the hosts were prepared before (molecule scenarios through prepare_hosts.yml, the switch playbook); the
cluster half then labels the lab's Node objects on the real API server.
"""

import os
import re

from conftest import run


def test_site_is_a_noop_on_prepared_hosts(settled_lab, kube_api):
    env = {"PATH": kube_api["bin_dir"] + os.pathsep + os.environ.get("PATH", "")}
    proc = run(["ansible-playbook", "playbooks/site.yml", "-i", "inventories/lab/",
                "-e", "gpuops_kubeconfig=%s" % kube_api["kubeconfig"]], timeout=2400, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:]
    recap = out[out.index("PLAY RECAP"):]
    for host in settled_lab:
        line = re.search(r"^%s\s+:(.*)$" % re.escape(host), recap, re.M)
        assert line, "no PLAY RECAP line for %s" % host
        assert "failed=0" in line.group(1) and "unreachable=0" in line.group(1)
        assert "changed=0" in line.group(1), line.group(0)
        # The readiness table has the host, its type from the inventory groups, and READY yes.
        assert re.search(r"%s\s+(container|vm-passthrough|vm-vgpu)\s+yes\b" % re.escape(host), out), out[-4000:]
    assert not re.search(r"TASK \[[^\]]*Reboot once[^\]]*\][^\n]*\n(?:(?![^\n]*TASK \[)[^\n]*\n)*?[^\n]*changed: ", out)
    # The cluster half ran against the API server: the lab's Nodes carry their workload labels.
    assert re.search(r"^localhost\s+:.*failed=0", recap, re.M), recap
    kubectl = [os.path.join(kube_api["bin_dir"], "kubectl"), "--kubeconfig", kube_api["kubeconfig"]]
    for host, wanted in (("lab-container", "container"), ("lab-passthrough", "vm-passthrough"),
                         ("lab-vgpu", "vm-vgpu")):
        label = run(kubectl + ["get", "node", host, "-o",
                               "jsonpath={.metadata.labels.nvidia\\.com/gpu\\.workload\\.config}"], check=True)
        assert label.stdout.strip() == wanted, (host, label.stdout)
