"""The main job, playbooks/site.yml, on the lab after the host scenarios left every host prepared.

It must find nothing to do on the hosts (no change, no reboot) and report every host ready, whichever way
the hosts were prepared before (molecule scenarios through prepare_hosts.yml, the switch playbook); the
cluster half then labels the lab's Node objects on the real API server.
"""

import json
import os
import re

from conftest import lab, run


def offered_vgpu_types(host):
    """The type names of the mdevs a lab host really has, as the sandbox device plugin reads them."""
    out = lab("ssh", host, "--", "for d in /sys/bus/mdev/devices/*/mdev_type; do echo \"TYPE<$(cat $d/name)>\"; done",
              check=True).stdout
    return sorted(set(re.findall(r"^TYPE<(.+)>$", out, re.M)))


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
    # The KubeVirt CR permits what the lab's hosts really offer: the passthrough stand-in GPU (1234:11e8, which
    # the sandbox device plugin would name by its bare device ID) and every vGPU type lab-vgpu has mdevs of.
    phd = json.loads(run(kubectl + ["get", "kubevirt", "kubevirt", "-n", "kubevirt", "-o",
                                    "jsonpath={.spec.configuration.permittedHostDevices}"], check=True).stdout)
    assert {"pciVendorSelector": "1234:11E8", "resourceName": "nvidia.com/11e8",
            "externalResourceProvider": True} in phd["pciHostDevices"], phd
    types = offered_vgpu_types("lab-vgpu")
    assert types, "lab-vgpu has no mdev"
    for name in types:
        entry = {"mdevNameSelector": name, "resourceName": "nvidia.com/" + re.sub(r"[\t\n\f\r ]+", "_", name),
                 "externalResourceProvider": True}
        assert entry in phd.get("mediatedDevices", []), (entry, phd)
    summary = re.search(r"KubeVirt (\d+) PCI \+ (\d+) mediated entries", out)
    assert summary and int(summary.group(2)) >= len(types), out[-3000:]


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


def test_a_drifted_host_is_repaired_then_skipped_again(settled_lab):
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
