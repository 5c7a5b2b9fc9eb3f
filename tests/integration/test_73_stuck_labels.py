"""Deploy labels stuck at a paused value (playbooks/validate.yml, role cluster_validate) on the tests' real API server.

A MIG Manager or vGPU Device Manager that dies mid-change leaves a node's nvidia.com/gpu.deploy.* labels at
paused-for-mig-change / paused-for-vgpu-change. Three lab Nodes stand for the cases:

- lab-container: two labels paused for a MIG change, no manager pod: stuck;
- lab-vgpu: a label paused for a vGPU change, with a vGPU Device Manager pod bound to the node (it stays Pending,
  there is no kubelet; a Pending manager counts as at work) and the state label at pending: left to it;
- lab-passthrough: a label paused with no manager, which the test puts back to true while the play waits (as a
  manager finishing its change would): not stuck.

validate.yml, in check mode with the consent to repair, waits, then says it would set lab-container's labels back
and changes nothing. The role alone (a small playbook) then fails without the consent, naming only lab-container and
the variable that would repair it; with the consent sets lab-container's labels back to true; and its next pass
changes nothing. lab-vgpu's labels are never touched. Every label is put back at the end. The other checks of the
role are turned off (no operator runs here).
"""

import json
import os
import re
import subprocess
import time

import pytest
import yaml

from conftest import TOP, VENV_PYTHON, VGPU_CONFIG, at_lab_priority, gpu_host_vars, kget, kubectl, mitogen_env, write_inventory

# The deep slice that proves this module's claims (tests/integration/tiers.py).
pytestmark = pytest.mark.slice("cluster")

NODES = {"lab-container": "container", "lab-passthrough": "vm-passthrough", "lab-vgpu": "vm-vgpu"}
MIG, VGPU = "paused-for-mig-change", "paused-for-vgpu-change"
DEPLOY = "nvidia.com/gpu.deploy."
PAUSED = {
    "lab-container": {DEPLOY + "device-plugin": MIG, DEPLOY + "gpu-feature-discovery": MIG, DEPLOY + "dcgm": "false",
                      "nvidia.com/mig.config.state": "pending"},
    "lab-vgpu": {DEPLOY + "sandbox-device-plugin": VGPU, "nvidia.com/vgpu.config.state": "pending"},
    "lab-passthrough": {DEPLOY + "sandbox-validator": MIG},
}
MANAGER_POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "gpuops-test-vgpu-device-manager", "namespace": "default",
                 "labels": {"app": "nvidia-vgpu-device-manager", "app.kubernetes.io/part-of": "gpuops-sandbox-tests"}},
    "spec": {"nodeName": "lab-vgpu", "containers": [{"name": "manager", "image": "registry.example/vgpu-device-manager:test"}]},
}
WAIT_TASK = "Give paused labels with no manager at work time to clear"
STUCK = ("lab-container: nvidia.com/gpu.deploy.device-plugin, nvidia.com/gpu.deploy.gpu-feature-discovery at "
         "paused-for-mig-change (no nvidia-mig-manager pod on the node)")


def labels_of(api):
    return dict((n, kget(api, "node", n)["metadata"].get("labels") or {}) for n in NODES)


def set_labels(api, node, labels):
    """Give each label its value (None removes it)."""
    args = ["%s=%s" % (k, v) if v is not None else "%s-" % k for k, v in labels.items()]
    kubectl(api, "label", "node", node, "--overwrite", *args)


@pytest.fixture
def paused_nodes(kube_api):
    before = labels_of(kube_api)
    kubectl(kube_api, "create", "-f", "-", stdin=json.dumps(MANAGER_POD))
    for node, labels in PAUSED.items():
        set_labels(kube_api, node, labels)
    try:
        yield kube_api
    finally:
        kubectl(kube_api, "delete", "pod", MANAGER_POD["metadata"]["name"], "-n", "default", "--grace-period=0",
                "--force", "--ignore-not-found", check=False)
        for node, labels in PAUSED.items():
            set_labels(kube_api, node, dict((k, before[node].get(k)) for k in labels))
        assert labels_of(kube_api) == before


def env():
    """ansible-playbook's environment; the controller's modules run on mitogen as the module targets' do (a kubernetes
    client module took 1.7 s to start on its own here, 0.3-0.7 s in mitogen's warm interpreter;
    GPUOPS_TEST_MITOGEN=0 runs them plainly)."""
    full = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                PATH=os.path.dirname(VENV_PYTHON) + os.pathsep + os.environ.get("PATH", ""))
    full.update(mitogen_env("targets"))
    return full


def playbook(tmp_path, path, inv, *extra, while_waiting=None):
    """Run the playbook ``path``; call ``while_waiting`` once the play has started the wait for paused labels to
    clear. Returns (rc, output)."""
    log = tmp_path / ("run-%d.log" % time.monotonic_ns())
    cmd = [os.path.join(TOP, ".venv", "bin", "ansible-playbook"), str(path), "-i", inv] + list(extra)
    with open(log, "w+", encoding="utf-8") as out:
        proc = subprocess.Popen(at_lab_priority(cmd), cwd=TOP, env=env(), stdout=out,  # pylint: disable=consider-using-with
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 300
        while while_waiting and proc.poll() is None and time.monotonic() < deadline:
            if WAIT_TASK in log.read_text(encoding="utf-8"):
                while_waiting()
                break
            time.sleep(0.2)
        rc = proc.wait(timeout=max(1, deadline - time.monotonic()))
    text = log.read_text(encoding="utf-8")
    assert "Traceback" not in text, text[-4000:]
    return rc, text


def role_runs(tmp_path, inv, steps):
    """One ansible-playbook run of the role cluster_validate, imported once per step ((name, consent to repair)),
    with no wait; a step without the consent runs in a block whose rescue prints "REFUSED: <the role's message>".
    Returns {step name: that step's output, white space folded}."""
    tasks = []
    for name, consent in steps:
        tasks.append({"name": "Step %s" % name, "ansible.builtin.debug": {"msg": name}})
        role = {"name": "Validate (%s)" % name, "ansible.builtin.import_role": {"name": "gpuops.sandbox.cluster_validate"},
                "vars": {"gpuops_repair_stuck_labels": consent, "cluster_validate_stuck_labels_wait": 0}}
        tasks.append(role if consent else {
            "name": "Validate without consent (%s)" % name, "block": [role],
            "rescue": [{"name": "Say why", "ansible.builtin.debug": {"msg": "REFUSED: {{ ansible_failed_result.msg }}"}}]})
    path = tmp_path / ("role-%d.yml" % time.monotonic_ns())
    path.write_text(yaml.safe_dump([{"name": "The role alone", "hosts": "localhost", "connection": "local",
                                     "gather_facts": False, "tasks": tasks}]))
    rc, text = playbook(tmp_path, path, inv)
    assert rc == 0, text[-4000:]
    parts = re.split(r"^TASK \[Step (\S+)\]", text, flags=re.M)
    return dict((name, " ".join(body.split())) for name, body in zip(parts[1::2], parts[2::2]))


def changed(flat):
    """How many tasks or loop items reported a change."""
    return len(re.findall(r"changed: \[localhost\]", flat))


def test_stuck_labels_are_named_then_repaired_only_with_consent(paused_nodes, tmp_path):
    api = paused_nodes
    inv = write_inventory(tmp_path, "inv", {
        "gpuops_kubeconfig": api["kubeconfig"], "gpuops_vgpu_device_config": VGPU_CONFIG,
        "ansible_python_interpreter": VENV_PYTHON,
        # Only the stuck-label check: no operator labels the nodes here.
        "cluster_validate_operator_labels": False, "cluster_validate_allocatable": False,
        "cluster_validate_retries": 1, "cluster_validate_delay": 1,
        # Room for the test to put lab-passthrough back during the wait, even on a busy machine.
        "cluster_validate_stuck_labels_wait": 4, "cluster_validate_stuck_labels_delay": 2,
    }, gpu_host_vars(NODES), VENV_PYTHON)
    paused = labels_of(api)

    # validate.yml in check mode, with the consent: lab-passthrough's pause ends during the wait, lab-vgpu's
    # manager is at work, lab-container is stuck: it says what it would set back and changes nothing.
    rc, text = playbook(tmp_path, os.path.join(TOP, "playbooks", "validate.yml"), inv, "--check",
                        "-e", "gpuops_repair_stuck_labels=true",
                        while_waiting=lambda: set_labels(api, "lab-passthrough", {DEPLOY + "sandbox-validator": "true"}))
    flat = " ".join(text.split())
    assert rc == 0, flat[-4000:]
    assert "FAILED - RETRYING: [localhost]: %s" % WAIT_TASK in flat  # it did wait
    assert "would set back to true: " + STUCK in flat, flat[-4000:]
    assert "lab-passthrough: " not in flat
    assert ("lab-vgpu: nvidia.com/gpu.deploy.sandbox-device-plugin at paused-for-vgpu-change (nvidia-vgpu-device-manager "
            "pod default/gpuops-test-vgpu-device-manager is at work, nvidia.com/vgpu.config.state=pending)") in flat
    assert changed(flat) == 1
    paused["lab-passthrough"][DEPLOY + "sandbox-validator"] = "true"
    assert labels_of(api) == paused

    # The role alone (validate.yml's other plays cost a run 5-10 s more here). Without the consent it fails naming
    # lab-container and the variable, and changes nothing (the next step still finds the labels to set back); with
    # it, lab-container's two labels become true (one patch) and nothing else changes; the role's next pass
    # (imported again in the same play, reading nodes and pods afresh) has nothing left to do.
    out = role_runs(tmp_path, inv, [("refuse", False), ("repair", True), ("again", True)])
    assert ("REFUSED: Deploy labels stuck at a paused value with no manager working on their node, so the GPU Operator "
            "will not deploy their operands there: %s. Set cluster_validate_repair_stuck_labels=true "
            "(gpuops_repair_stuck_labels=true) to set them back to true" % STUCK) in out["refuse"], out["refuse"][-4000:]
    assert changed(out["refuse"]) == 0 and "lab-passthrough: " not in out["refuse"]
    assert "set back to true: " + STUCK in out["repair"] and "would set back" not in out["repair"], out["repair"][-4000:]
    assert changed(out["repair"]) == 1
    assert changed(out["again"]) == 0 and "set back to true" not in out["again"], out["again"][-4000:]
    paused["lab-container"].update({DEPLOY + "device-plugin": "true", DEPLOY + "gpu-feature-discovery": "true"})
    assert labels_of(api) == paused
    assert paused["lab-vgpu"][DEPLOY + "sandbox-device-plugin"] == VGPU
