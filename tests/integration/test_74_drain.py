"""A node whose VMs hold GPUs is not drained unless the user lets the play stop them.

The role host_reboot's reboot tasks run for real against the tests' API server, from the controller, in check
mode (the reboot itself is then not done; the VMI listing and the refusal are). VirtualMachineInstances stand on
the lab Node lab-passthrough through the project's minimal VMI CRD.
"""

import json
import os
import sys

import pytest
import yaml

from conftest import TOP, delete_crds, kubectl, run, wait_established

# The deep slice that proves this module's claims (tests/integration/tiers.py).
pytestmark = pytest.mark.slice("cluster")


VMI_CRD = os.path.join(TOP, "tests", "fixtures", "kubevirt-vmi-crd.yaml")
NODE = "lab-passthrough"
NAMESPACE = "default"


def vmi(name, node, spec, phase="Running", owner=None):
    meta = {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "gpuops-sandbox-tests"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": owner,
                                    "uid": "00000000-0000-0000-0000-000000000001"}]
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta, "spec": spec,
            "status": {"nodeName": node, "phase": phase}}


VMIS = [
    vmi("gpu-vm", NODE, {"domain": {"devices": {"gpus": [{"name": "gpu1", "deviceName": "nvidia.com/GA102GL_A10"}]}}},
        owner="gpu-vm"),
    vmi("claim-vm", NODE, {"domain": {"devices": {}}, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "vfio-gpu"}]}),
    vmi("plain-vm", NODE, {"domain": {"devices": {"disks": []}}}),
    vmi("done-vm", NODE, {"domain": {"devices": {"gpus": [{"name": "g", "deviceName": "nvidia.com/x"}]}}}, phase="Succeeded"),
    vmi("elsewhere-vm", "lab-vgpu", {"domain": {"devices": {"hostDevices": [{"name": "h", "deviceName": "nvidia.com/y"}]}}}),
]


@pytest.fixture(scope="module")
def vmis(kube_api):
    api = kube_api
    before = set(kubectl(api, "get", "crds", "-o", "name").stdout.split())
    kubectl(api, "apply", "-f", VMI_CRD)
    wait_established(api, "crd/virtualmachineinstances.kubevirt.io")
    for item in VMIS:
        status = item["status"]
        kubectl(api, "apply", "-f", "-", stdin=json.dumps(dict(item, status={})))
        kubectl(api, "patch", "vmi", item["metadata"]["name"], "-n", NAMESPACE, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": status}))
    yield api
    kubectl(api, "uncordon", NODE, check=False)
    kubectl(api, "delete", "vmi", "-n", NAMESPACE, "-l", "app.kubernetes.io/part-of=gpuops-sandbox-tests",
            "--ignore-not-found", "--wait=false", check=False)
    delete_crds(api, sorted(set(kubectl(api, "get", "crds", "-o", "name").stdout.split()) - before))


def reboot_tasks(api, tmp_path, **variables):
    """host_reboot's reboot tasks for NODE, run on the controller in check mode; (rc, output)."""
    play = [{"name": "drain check", "hosts": NODE, "gather_facts": False,
             "tasks": [{"name": "Reboot tasks",
                        "ansible.builtin.include_role": {"name": "gpuops.sandbox.host_reboot", "tasks_from": "reboot.yml"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    inventory = {"all": {"hosts": {NODE: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    extra = dict({"host_reboot_kubeconfig": api["kubeconfig"], "host_reboot_reasons": ["test"]}, **variables)
    (tmp_path / "vars.json").write_text(json.dumps(extra))
    proc = run(["ansible-playbook", "--check", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
                "-e", "@%s" % (tmp_path / "vars.json")], timeout=600, env={"ANSIBLE_NOCOLOR": "1"})
    return proc.returncode, proc.stdout


def node(api):
    return json.loads(kubectl(api, "get", "node", NODE, "-o", "json").stdout)


def test_a_node_with_gpu_vms_is_not_drained(vmis, tmp_path):
    rc, out = reboot_tasks(vmis, tmp_path)
    assert rc != 0, out[-4000:]
    assert "runs VMs that hold GPUs and cannot live-migrate: default/claim-vm, default/gpu-vm." in out, out[-4000:]
    for other in ("plain-vm", "done-vm", "elsewhere-vm"):
        assert "default/%s" % other not in out
    assert "TASK [gpuops.sandbox.host_reboot : Cordon the Kubernetes node]" not in out
    assert not node(vmis)["spec"].get("unschedulable")
    names = kubectl(vmis, "get", "vmi", "-n", NAMESPACE, "-o", "name").stdout.split()
    assert len(names) == len(VMIS)


def test_allowed_the_play_would_stop_exactly_those_vms(vmis, tmp_path):
    rc, out = reboot_tasks(vmis, tmp_path, host_reboot_stop_gpu_vms=True)
    # The play goes on to the reboot, which ansible refuses on the controller itself (local connection).
    assert rc != 0 and "would reboot the control node" in out, out[-4000:]
    stop = out[out.index("Stop the VMs with GPUs"):out.index("Cordon and drain the Kubernetes node")]
    assert "(item=default/claim-vm)" in stop and "(item=default/gpu-vm)" in stop, stop
    assert "plain-vm" not in stop and "done-vm" not in stop and "elsewhere-vm" not in stop
    # Check mode: nothing was deleted or cordoned.
    assert len(kubectl(vmis, "get", "vmi", "-n", NAMESPACE, "-o", "name").stdout.split()) == len(VMIS)
    assert not node(vmis)["spec"].get("unschedulable")
