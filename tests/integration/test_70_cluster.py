"""The cluster half (playbooks/cluster.yml, validate.yml) against the cluster lab's real kube-apiserver.

Helm is the real helm binary, installing the project's own stand-in charts (tests/fixtures/charts,
which record the values they receive in a ConfigMap) from a Helm repository served on loopback, so
kubernetes.core.helm_repository and kubernetes.core.helm run for real. The GPU hosts are inventory
entries carrying the facts gpu_facts would return for an A10 (the lab VMs are not contacted): their
Kubernetes nodes are the lab Nodes the kube_api fixture creates.

Bad input (unknown workload type, a vGPU config name the configuration lacks, no KubeVirt CR, an
unreachable or unauthorised API server, a conflicting permittedHostDevices entry) must each fail with
a clear message and change nothing: every test reads the cluster back before and after.
"""

import base64
import functools
import http.server
import json
import os
import re
import subprocess
import threading

import pytest
import yaml

from conftest import (
    TOP,
    UPSTREAM,
    VENV_PYTHON,
    VGPU_CONFIG,
    gpu_host_vars,
    helm_home_env,
    in_values,
    kget,
    kubectl,
    run,
    value_paths,
    wait_established,
    write_inventory,
)


NODES = {"lab-container": "container", "lab-passthrough": "vm-passthrough", "lab-vgpu": "vm-vgpu"}
WL, VG = "nvidia.com/gpu.workload.config", "nvidia.com/vgpu.config"
VGPU_MANAGER_VALUES = {"vgpuManager": {"enabled": True, "repository": "registry.example/nvidia", "image": "vgpu-manager",
                                       "version": "550.90.05", "imagePullSecrets": ["vgpu-manager-registry"]}}
VM_CRD = os.path.join(TOP, "tests", "fixtures", "kubevirt-vm-crd.yaml")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def snapshot(api):
    """What the cluster half may change: node labels and taints, the KubeVirt CR, Helm releases."""
    nodes = dict((n, kget(api, "node", n)) for n in NODES)
    kubevirt = kget(api, "kubevirt", "kubevirt", "-n", "kubevirt")
    releases = kubectl(api, "get", "secrets", "-A", "-l", "owner=helm", "-o", "name").stdout.split()
    return {"nodes": dict((n, (o["metadata"].get("labels"), o["spec"].get("taints"))) for n, o in nodes.items()),
            "kubevirt": (kubevirt["metadata"]["resourceVersion"], kubevirt["spec"]),
            "releases": sorted(releases)}


def received_values(api, release, namespace):
    cm = kget(api, "configmap", "%s-received-values" % release, "-n", namespace)
    return json.loads(base64.b64decode(cm["data"]["values.json.b64"]))


def secrets_of(kubeconfig_path):
    """Token and key material in a kubeconfig: none of it may appear in any output."""
    with open(kubeconfig_path) as handle:
        config = yaml.safe_load(handle)
    found = []
    for user in config.get("users") or []:
        for key in ("token", "client-key-data", "client-certificate-data", "password"):
            value = (user.get("user") or {}).get(key)
            if value:
                found.append(value)
    return found


@pytest.fixture(scope="module")
def helm_repo(kube_api, tmp_path_factory):
    """The stand-in charts, packaged and indexed, served by http.server on 127.0.0.1."""
    helm = os.path.join(kube_api["bin_dir"], "helm")
    root = tmp_path_factory.mktemp("helm")
    repo = root / "repo"
    repo.mkdir()
    env = helm_home_env(root)
    for chart in ("gpu-operator", "dra-driver-nvidia-gpu"):
        subprocess.run([helm, "package", os.path.join(TOP, "tests", "fixtures", "charts", chart), "-d", str(repo)],
                       check=True, env=env, capture_output=True, timeout=120)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(repo))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    url = "http://127.0.0.1:%d" % server.server_address[1]
    subprocess.run([helm, "repo", "index", str(repo), "--url", url], check=True, env=env, capture_output=True, timeout=120)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"url": url, "helm": helm, "env": env}
    server.shutdown()
    server.server_close()


def inventory(tmp_path, kube_api, helm_repo, hosts=None, extra_all=None, name="inv", nodes=None):
    """An inventory of the three GPU hosts (or ``nodes``) with their facts, pointed at the cluster lab."""
    all_vars = {
        "gpuops_kubeconfig": kube_api["kubeconfig"],
        "gpuops_vgpu_device_config": VGPU_CONFIG,
        "vgpu_manager_image_helm_values": VGPU_MANAGER_VALUES,
        "gpu_operator_chart_repo_name": "gpuops-test",
        "gpu_operator_chart_repo_url": helm_repo["url"],
        "gpu_operator_helm_binary": helm_repo["helm"],
        "gpu_operator_default_workload": "vm-passthrough",
        "gpu_operator_values": {"vgpuManager": {"version": "550.90.07"}, "driver": {"enabled": False}},
        "dra_driver_chart_repo_name": "gpuops-test",
        "dra_driver_chart_repo_url": helm_repo["url"],
        "dra_driver_chart_ref": "gpuops-test/dra-driver-nvidia-gpu",
        "dra_driver_helm_binary": helm_repo["helm"],
        "ansible_python_interpreter": VENV_PYTHON,
    }
    all_vars.update(extra_all or {})
    return write_inventory(tmp_path, name, all_vars, gpu_host_vars(nodes or NODES, hosts), all_vars["ansible_python_interpreter"])


def playbook(helm_repo, inv, name="cluster.yml", *extra):
    env = dict(helm_repo["env"])
    env["ANSIBLE_CONFIG"] = os.path.join(TOP, "ansible.cfg")
    return run([os.path.join(TOP, ".venv", "bin", "ansible-playbook"), os.path.join(TOP, "playbooks", name),
                "-i", inv, "--diff"] + list(extra), timeout=900, env=env)


def recap(output, host="localhost"):
    match = re.search(r"^%s\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(host),
                      output, re.M)
    assert match, output[-3000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups())))


def assert_nothing_leaked(kube_api, output):
    for secret in secrets_of(kube_api["kubeconfig"]) + secrets_of(kube_api["kubeconfig_unauthorised"]):
        assert secret not in output


# ---------------------------------------------------------------------------------------------
# Tests, in order: the first one leaves the cluster configured; the bad-input ones start from it.
# ---------------------------------------------------------------------------------------------

@pytest.mark.slice("cluster")
def test_cluster_half_labels_installs_and_permits(kube_api, helm_repo, tmp_path):
    # A user's own entry, to be kept; no gates yet (the server may be a kept one from an earlier session).
    kubectl(kube_api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=merge", "-p", json.dumps(
        {"spec": {"configuration": {"developerConfiguration": {"featureGates": []}, "permittedHostDevices": {
            "mediatedDevices": [], "pciHostDevices": [
                {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/XL710", "externalResourceProvider": False}]}}}}))
    # A stale label of an earlier vGPU life, to be removed from the passthrough node.
    kubectl(kube_api, "label", "node", "lab-passthrough", "--overwrite", "%s=A10-4Q" % VG)
    # The operator's ClusterPolicy, reporting ready (the stand-in chart does not run an operator).
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                                      "metadata": {"name": "cluster-policy", "labels": {"app.kubernetes.io/part-of": "gpuops-sandbox-tests"}},
                                      "spec": {"sandboxWorkloads": {"enabled": True}}}))
    kubectl(kube_api, "apply", "-f", str(policy))
    kubectl(kube_api, "patch", "clusterpolicy", "cluster-policy", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"state": "ready"}}))
    inv = inventory(tmp_path, kube_api, helm_repo, extra_all={"gpu_operator_wait_for_ready": True, "gpu_operator_ready_timeout": 30})
    proc = playbook(helm_repo, inv)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert recap(proc.stdout)["changed"] > 0
    assert "Wait until the GPU Operator reports its ClusterPolicy ready" in proc.stdout
    assert_nothing_leaked(kube_api, proc.stdout)

    labels = dict((n, kget(kube_api, "node", n)["metadata"]["labels"]) for n in NODES)
    for node, wtype in NODES.items():
        assert labels[node][WL] == wtype
    assert VG not in labels["lab-passthrough"] and VG not in labels["lab-container"]
    assert labels["lab-vgpu"][VG] == "A10-12Q"

    values = received_values(kube_api, "gpu-operator", "gpu-operator")
    assert values["sandboxWorkloads"] == {"enabled": True, "defaultWorkload": "vm-passthrough", "mode": "kubevirt"}
    assert values["vgpuDeviceManager"] == {"config": {"name": "gpuops-vgpu-devices-config"}}
    assert values["vgpuManager"] == dict(VGPU_MANAGER_VALUES["vgpuManager"], version="550.90.07")
    assert values["driver"] == {"enabled": False}
    config = kget(kube_api, "configmap", "gpuops-vgpu-devices-config", "-n", "gpu-operator")
    assert yaml.safe_load(config["data"]["config.yaml"]) == VGPU_CONFIG

    spec = kget(kube_api, "kubevirt", "kubevirt", "-n", "kubevirt")["spec"]["configuration"]
    assert spec["permittedHostDevices"]["pciHostDevices"] == [
        {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/XL710", "externalResourceProvider": False},
        {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/GA102GL_A10", "externalResourceProvider": True}]
    assert spec["permittedHostDevices"]["mediatedDevices"] == [
        {"mdevNameSelector": "NVIDIA A10-12Q", "resourceName": "nvidia.com/NVIDIA_A10-12Q", "externalResourceProvider": True}]
    # The fixture's KubeVirt reports v1.8.0: KubeVirt's own mdev handling goes off through the field that
    # replaces the deprecated DisableMDEVConfiguration gate.
    assert spec["developerConfiguration"]["featureGates"] == ["GPU", "HostDevices"]
    assert spec["mediatedDevicesConfiguration"]["enabled"] is False

    # Second run: nothing to change anywhere.
    before = snapshot(kube_api)
    proc = playbook(helm_repo, inv)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert recap(proc.stdout)["changed"] == 0, proc.stdout[-6000:]
    assert snapshot(kube_api) == before


def test_every_helm_value_the_collection_sets_exists_upstream(kube_api, helm_repo):
    if not os.path.isdir(UPSTREAM):
        pytest.skip("the upstream values files are not beside this checkout")

    for release, namespace, chart in (("gpu-operator", "gpu-operator", "gpu-operator"),
                                      ("dra-driver-nvidia-gpu", "dra-driver-nvidia-gpu", "dra-driver-nvidia-gpu")):
        proc = kubectl(kube_api, "get", "configmap", "%s-received-values" % release, "-n", namespace, check=False)
        if proc.returncode:
            continue  # the DRA test below installs it and calls this check again
        with open(os.path.join(UPSTREAM, chart, "values.yaml")) as handle:
            upstream = yaml.safe_load(handle)
        missing = [".".join(p) for p in value_paths(received_values(kube_api, release, namespace))
                   if not in_values(upstream, p)]
        assert missing == [], "%s values not in the upstream chart: %s" % (chart, missing)


@pytest.mark.parametrize("case", ["workload_type", "vgpu_config", "no_vgpu_config", "os_tag", "no_kubevirt", "conflict",
                                  "unreachable", "unauthorised"])
@pytest.mark.slice("cluster")
def test_bad_input_fails_clearly_and_changes_nothing(kube_api, helm_repo, tmp_path, case):
    # Each bad run would also change something if it got that far: lab-vgpu's vGPU config (its node
    # label and the KubeVirt CR's mediated devices).
    hosts = {"lab-vgpu": {"gpuops_vgpu_config_name": "A10-4Q"}}
    extra = {}
    kubeconfig = kube_api["kubeconfig"]
    if case == "workload_type":
        hosts["lab-container"] = {"gpuops_workload_type": "vm-gpu"}
        expect = "'vm-gpu' is not one of container, vm-passthrough, vm-vgpu, dra"
    elif case == "vgpu_config":
        hosts["lab-vgpu"] = {"gpuops_vgpu_config_name": "A10-5Q"}
        expect = "vGPU config 'A10-5Q' is not in the vGPU Device Manager's configuration (it has: A10-12Q, A10-4Q)"
    elif case == "no_vgpu_config":
        hosts["lab-vgpu"] = {"gpuops_vgpu_config_name": ""}
        expect = ("a vm-vgpu node needs a vGPU config name (gpuops_vgpu_config_name): without one the vGPU Device "
                  "Manager applies the config 'default', which its configuration does not have (it has: A10-12Q, A10-4Q)")
    elif case == "os_tag":
        hosts["lab-vgpu"]["gpu_facts_host"] = {"os": {"id": "ubuntu", "version_id": "22.04"}}
        extra["vgpu_manager_image_built_os_tags"] = ["ubuntu24.04"]
        expect = "host lab-vgpu (vm-vgpu) runs ubuntu22.04, but the vGPU Manager image is built for ubuntu24.04 only"
    elif case == "no_kubevirt":
        extra["kubevirt_devices_namespace"] = "no-kubevirt-here"
        expect = "there is no KubeVirt CR in namespace no-kubevirt-here: KubeVirt is not installed"
    elif case == "conflict":
        kubectl(kube_api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=json", "-p", json.dumps([
            {"op": "add", "path": "/spec/configuration/permittedHostDevices/pciHostDevices/-",
             "value": {"pciVendorSelector": "10DE:2237", "resourceName": "nvidia.com/GA102GL_A10", "externalResourceProvider": True}}]))
        expect = "has resourceName nvidia.com/GA102GL_A10 with pciVendorSelector 10DE:2237"
    elif case == "unreachable":
        with open(kube_api["kubeconfig"]) as handle:
            config = yaml.safe_load(handle)
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = "https://127.0.0.1:9"
        kubeconfig = str(tmp_path / "kubeconfig-unreachable")
        with open(kubeconfig, "w") as handle:
            yaml.safe_dump(config, handle)
        expect = "cannot reach the API server at https://127.0.0.1:9"
    else:
        kubeconfig = kube_api["kubeconfig_unauthorised"]
        expect = "may not list nodes, patch nodes"
    extra["gpuops_kubeconfig"] = kubeconfig
    before = snapshot(kube_api)
    try:
        proc = playbook(helm_repo, inventory(tmp_path, kube_api, helm_repo, hosts=hosts, extra_all=extra))
        assert proc.returncode != 0
        flat = " ".join(proc.stdout.split())
        assert expect in flat, proc.stdout[-5000:]
        assert "Traceback" not in proc.stdout
        assert_nothing_leaked(kube_api, proc.stdout)
        assert snapshot(kube_api) == before
    finally:
        if case == "conflict":
            kubectl(kube_api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=json", "-p", json.dumps([
                {"op": "remove", "path": "/spec/configuration/permittedHostDevices/pciHostDevices/2"}]))


@pytest.mark.slice("cluster")
def test_dra_host_gets_driver_claims_gate_and_no_device_plugin(kube_api, helm_repo, tmp_path):
    hosts = {"lab-container": {"gpuops_workload_type": "dra"}}
    proc = playbook(helm_repo, inventory(tmp_path, kube_api, helm_repo, hosts=hosts,
                                         extra_all={"dra_driver_driver_install": "host",
                                                    "dra_driver_claim_templates": [{"name": "vfio-gpu", "namespace": "default"}]}))
    assert proc.returncode == 0, proc.stdout[-6000:]
    labels = kget(kube_api, "node", "lab-container")["metadata"]["labels"]
    assert labels[WL] == "container"
    # The operands a DRA node must not run are off; the sandbox ones are not the container workload's, so the
    # operator never deploys them there (and deletes any deploy label of them): the collection sets none.
    for operand in ("device-plugin", "operator-validator", "gpu-feature-discovery", "dcgm", "dcgm-exporter"):
        assert labels["nvidia.com/gpu.deploy.%s" % operand] == "false", operand
    assert "nvidia.com/gpu.deploy.vfio-manager" not in labels and "nvidia.com/gpu.deploy.sandbox-device-plugin" not in labels
    values = received_values(kube_api, "dra-driver-nvidia-gpu", "dra-driver-nvidia-gpu")
    assert values["nvidiaDriverRoot"] == "/"
    assert values["featureGates"] == {"PassthroughSupport": True, "DeviceMetadata": True}
    assert values["resources"] == {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}}
    assert values["kubeletPlugin"] == {"nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "false"}}
    template = kget(kube_api, "resourceclaimtemplates.v1.resource.k8s.io", "vfio-gpu", "-n", "default")
    devices = template["spec"]["spec"]["devices"]
    assert devices["requests"] == [{"name": "gpu", "exactly": {"allocationMode": "ExactCount", "count": 1,
                                                               "deviceClassName": "vfio.gpu.nvidia.com"}}]
    assert devices["config"][0]["opaque"]["parameters"] == {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig",
        "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": True}}
    gates = kget(kube_api, "kubevirt", "kubevirt", "-n", "kubevirt")["spec"]["configuration"]["developerConfiguration"]["featureGates"]
    assert "GPUsWithDRA" in gates  # the fixture's KubeVirt reports v1.8.0
    test_every_helm_value_the_collection_sets_exists_upstream(kube_api, helm_repo)

    # Second run with the DRA host: the unchanged ResourceClaimTemplate (its spec is immutable) and everything
    # else are left as they are.
    before = snapshot(kube_api)
    proc = playbook(helm_repo, inventory(tmp_path, kube_api, helm_repo, hosts=hosts, name="inv-again",
                                         extra_all={"dra_driver_driver_install": "host",
                                                    "dra_driver_claim_templates": [{"name": "vfio-gpu", "namespace": "default"}]}))
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert recap(proc.stdout)["changed"] == 0, proc.stdout[-6000:]
    assert snapshot(kube_api) == before

    # Back to container: the collection's `false` deploy labels become the GPU Operator's `true` (the operator
    # does not relabel a node whose workload label stays container) and are no longer the collection's.
    proc = playbook(helm_repo, inventory(tmp_path, kube_api, helm_repo, name="inv-back"))
    assert proc.returncode == 0, proc.stdout[-6000:]
    node = kget(kube_api, "node", "lab-container")
    labels = node["metadata"]["labels"]
    assert labels[WL] == "container"
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/gpu.deploy.")} == {
        "nvidia.com/gpu.deploy.%s" % o: "true"
        for o in ("device-plugin", "operator-validator", "gpu-feature-discovery", "dcgm", "dcgm-exporter")}
    assert json.loads(node["metadata"]["annotations"]["gpuops.sandbox/labels"]) == {WL: "container"}


@pytest.mark.slice("cluster")
def test_validate_waits_for_labels_and_resources_then_tries_a_vm(kube_api, helm_repo, tmp_path):
    inv = inventory(tmp_path, kube_api, helm_repo, extra_all={"cluster_validate_retries": 1, "cluster_validate_delay": 1})
    # The operator has not labelled anything yet: validation fails naming what is missing.
    proc = playbook(helm_repo, inv, "validate.yml")
    assert proc.returncode != 0
    flat = " ".join(proc.stdout.split())
    assert "Node lab-passthrough (vm-passthrough) still lacks after 1 attempts: nvidia.com/gpu.deploy.vfio-manager=true" in flat, flat[-4000:]

    operands = {"lab-container": ["driver", "container-toolkit", "device-plugin"],
                "lab-passthrough": ["vfio-manager", "sandbox-device-plugin"],
                "lab-vgpu": ["vgpu-manager", "vgpu-device-manager", "sandbox-device-plugin"]}
    for node, names in operands.items():
        labels = ["nvidia.com/gpu.deploy.%s=true" % n for n in names]
        if node == "lab-vgpu":
            labels.append("nvidia.com/vgpu.config.state=success")
        kubectl(kube_api, "label", "node", node, "--overwrite", *labels)
    kubectl(kube_api, "apply", "-f", VM_CRD)
    wait_established(kube_api, "crd/virtualmachines.kubevirt.io")
    proc = playbook(helm_repo, inv, "validate.yml", "-e", "gpuops_validate_test_vm=true",
                    "-e", "cluster_validate_vm_running=false")
    try:
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert "Create the test VM with a GPU" in proc.stdout and "Delete the test VM" in proc.stdout
        assert kubectl(kube_api, "get", "virtualmachine", "gpuops-gpu-test", "-n", "default", check=False).returncode != 0
    finally:
        for node, names in operands.items():
            kubectl(kube_api, "label", "node", node, *["nvidia.com/gpu.deploy.%s-" % n for n in names],
                    *(["nvidia.com/vgpu.config.state-"] if node == "lab-vgpu" else []))


def dra_slice(devices):
    """A ResourceSlice as the DRA driver publishes one per node: its driver, a pool named after the node, the
    node's name, and devices whose `type` attribute is what the chart's DeviceClasses select on."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "lab-container-gpu.nvidia.com"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "lab-container",
                     "pool": {"name": "lab-container", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": name, "attributes": {
                         "type": {"string": kind}, "productName": {"string": "NVIDIA A10"},
                         "pcieBusID": {"string": "0000:65:00.0"}, "driverVersion": {"version": "580.65.6"}}}
                         for name, kind in devices]}}


@pytest.mark.slice("cluster")
def test_validate_waits_for_the_dra_drivers_slices_then_tries_a_vm_with_a_claim(kube_api, helm_repo, tmp_path):
    hosts = {"lab-container": {"gpuops_workload_type": "dra"}}
    inv = inventory(tmp_path, kube_api, helm_repo, hosts=hosts, extra_all={
        "cluster_validate_retries": 1, "cluster_validate_delay": 1, "cluster_validate_allocatable": False,
        "cluster_validate_operator_labels": False})
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vfio.gpu.nvidia.com"},
                    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                                  "device.attributes['gpu.nvidia.com'].type == 'vfio'"}}]}}

    def validate(*extra):
        proc = playbook(helm_repo, inv, "validate.yml", *extra)
        return proc, " ".join(proc.stdout.split())

    try:
        # No driver yet: neither its DeviceClass nor a slice.
        proc, flat = validate()
        assert proc.returncode != 0
        assert ("Node lab-container (dra) still lacks after 1 attempts: DeviceClass vfio.gpu.nvidia.com, "
                "a ResourceSlice of gpu.nvidia.com with devices.") in flat, flat[-4000:]
        assert "Traceback" not in proc.stdout
        kubectl(kube_api, "create", "-f", "-", stdin=json.dumps(device_class))
        # A slice with only MIG devices offers nothing a VM or a container of this node type asks for.
        kubectl(kube_api, "create", "-f", "-", stdin=json.dumps(dra_slice([("gpu-0-mig-1", "mig")])))
        proc, flat = validate()
        assert proc.returncode != 0
        assert ("Node lab-container (dra) still lacks after 1 attempts: a gpu.nvidia.com device of type vfio or gpu "
                "in its ResourceSlices (they offer mig).") in flat, flat[-4000:]
        kubectl(kube_api, "replace", "-f", "-", stdin=json.dumps(dra_slice([("gpu-0", "gpu"), ("gpu-0-vfio", "vfio")])))
        kubectl(kube_api, "apply", "-f", VM_CRD)
        wait_established(kube_api, "crd/virtualmachines.kubevirt.io")
        proc, flat = validate("-e", "gpuops_validate_test_vm=true", "-e", "cluster_validate_vm_running=false",
                              "-e", "cluster_validate_vm_keep=true", "-e", "cluster_validate_vm_node=lab-container")
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert "Node lab-container (dra) is ready." in flat, flat[-4000:]
        # The VM asks for its GPU through a claim from the template, by claim and request name.
        vm = kget(kube_api, "virtualmachine", "gpuops-gpu-test", "-n", "default")["spec"]["template"]["spec"]
        assert vm["resourceClaims"] == [{"name": "gpu-claim", "resourceClaimTemplateName": "vfio-gpu"}]
        assert vm["domain"]["devices"]["gpus"] == [{"name": "gpu1", "claimName": "gpu-claim", "requestName": "gpu"}]
        assert vm["nodeSelector"] == {"kubernetes.io/hostname": "lab-container"}
    finally:
        kubectl(kube_api, "delete", "virtualmachine", "gpuops-gpu-test", "-n", "default", "--ignore-not-found",
                check=False)
        kubectl(kube_api, "delete", "resourceslices.v1.resource.k8s.io", "lab-container-gpu.nvidia.com",
                "--ignore-not-found", check=False)
        kubectl(kube_api, "delete", "deviceclasses.v1.resource.k8s.io", "vfio.gpu.nvidia.com", "--ignore-not-found",
                check=False)


@pytest.mark.slice("cluster")
def test_rerun_keeps_the_operators_deploy_labels(kube_api, helm_repo, tmp_path):
    """The GPU Operator labels each node with its operands (deploy.<operand>=true) and does not put a label
    back once it is gone: a re-run of the cluster half must leave them all as they are."""
    operator_labels = {"lab-container": ["driver", "container-toolkit", "device-plugin", "operator-validator"],
                       "lab-passthrough": ["vfio-manager", "sandbox-device-plugin", "sandbox-validator"],
                       "lab-vgpu": ["vgpu-manager", "vgpu-device-manager", "sandbox-device-plugin", "sandbox-validator"]}
    inv = inventory(tmp_path, kube_api, helm_repo)
    proc = playbook(helm_repo, inv)
    assert proc.returncode == 0, proc.stdout[-6000:]
    for node, operands in operator_labels.items():
        kubectl(kube_api, "label", "node", node, "--overwrite", *["nvidia.com/gpu.deploy.%s=true" % o for o in operands])
    try:
        proc = playbook(helm_repo, inv)
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert recap(proc.stdout)["changed"] == 0, proc.stdout[-6000:]
        for node, operands in operator_labels.items():
            labels = kget(kube_api, "node", node)["metadata"]["labels"]
            for operand in operands:
                assert labels.get("nvidia.com/gpu.deploy.%s" % operand) == "true", (node, operand)
    finally:
        for node, operands in operator_labels.items():
            kubectl(kube_api, "label", "node", node, *["nvidia.com/gpu.deploy.%s-" % o for o in operands])


@pytest.mark.slice("cluster")
def test_entries_are_checked_against_what_the_nodes_advertise(kube_api, helm_repo, tmp_path):
    """Once the sandbox device plugin runs, a name no node advertises is reported, and replaced when asked."""
    later = "nvidia.com/GA102GL_A10_LATER"
    allocatable = kget(kube_api, "node", "lab-passthrough")["status"]["allocatable"]

    def advertise(patch):
        kubectl(kube_api, "patch", "node", "lab-passthrough", "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"allocatable": patch}}))

    def pci_entries():
        spec = kget(kube_api, "kubevirt", "kubevirt", "-n", "kubevirt")["spec"]["configuration"]
        return [e["resourceName"] for e in spec["permittedHostDevices"]["pciHostDevices"]]

    advertise({"nvidia.com/GA102GL_A10": None, later: "1"})
    try:
        proc = playbook(helm_repo, inventory(tmp_path, kube_api, helm_repo))
        assert proc.returncode == 0, proc.stdout[-6000:]
        flat = " ".join(proc.stdout.split())
        assert '"resourceName": "nvidia.com/GA102GL_A10"} names a resource no node advertises' in flat, flat[-4000:]
        assert "node lab-passthrough advertises %s, which no permittedHostDevices entry permits" % later in flat
        assert "nvidia.com/GA102GL_A10" in pci_entries() and later not in pci_entries()

        inv = inventory(tmp_path, kube_api, helm_repo, name="inv-advertised",
                        extra_all={"kubevirt_devices_use_advertised_names": True})
        proc = playbook(helm_repo, inv)
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert later in pci_entries() and "nvidia.com/GA102GL_A10" not in pci_entries()
        assert "names a resource no node advertises" not in " ".join(proc.stdout.split())
        proc = playbook(helm_repo, inv)
        assert proc.returncode == 0 and recap(proc.stdout)["changed"] == 0, proc.stdout[-6000:]
    finally:
        advertise({later: None, "nvidia.com/GA102GL_A10": allocatable.get("nvidia.com/GA102GL_A10", "1")})
        proc = playbook(helm_repo, inventory(tmp_path, kube_api, helm_repo, name="inv-restored"))
        assert proc.returncode == 0, proc.stdout[-6000:]
    assert "nvidia.com/GA102GL_A10" in pci_entries() and later not in pci_entries()


@pytest.mark.slice("cluster")
def test_skipped_without_kubeconfig(kube_api, helm_repo, tmp_path):
    before = snapshot(kube_api)
    proc = playbook(helm_repo, inventory(tmp_path, kube_api, helm_repo, extra_all={"gpuops_kubeconfig": ""}))
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "gpuops_kubeconfig is not set: the cluster half" in " ".join(proc.stdout.split())
    assert snapshot(kube_api) == before


@pytest.mark.slice("cluster")
def test_a_node_joins_with_limit_then_leaves_and_nothing_else_changes(kube_api, helm_repo, tmp_path):
    """A node joins (lab-h200, a vm-passthrough host with an L40S, typed by its inventory group only and prepared by
    another tool) and the cluster half runs for it alone (cluster.yml on its own, --limit lab-h200,localhost): it is
    labelled as its group says (the one rule preflight uses, not a container default) and its GPU permitted in the
    KubeVirt CR; no other node's labels,
    no other KubeVirt entry and no Helm release change, although the other hosts have no facts in such a run. The
    same run again changes nothing. Then playbooks/remove_nodes.yml takes it out again: cordoned, the collection's
    labels released and the GPU Operator's operands off, its KubeVirt entry gone, a user's label kept, and the
    cluster as it was before the join everywhere else; a second removal run changes nothing."""
    l40s = {"address": "0000:41:00.0", "vendor": "10de", "device": "26b9", "class": "030200", "driver": "vfio-pci",
            "is_vf": False, "mdev_types": [], "vgpu": None}
    joined = dict(NODES, **{"lab-h200": "vm-passthrough"})
    host_vars = gpu_host_vars(joined, {"lab-h200": {"gpu_facts_gpus": [l40s], "gpuops_host_managed": False}})
    del host_vars["lab-h200"]["gpuops_workload_type"]  # its group, vm_passthrough, types it
    for host in NODES:  # the hosts outside the limit: no facts in this run
        del host_vars[host]["gpu_facts_gpus"]
    all_vars = {"gpuops_kubeconfig": kube_api["kubeconfig"], "gpuops_vgpu_device_config": VGPU_CONFIG,
                "ansible_python_interpreter": VENV_PYTHON}
    inv = write_inventory(tmp_path, "joined", all_vars, host_vars, VENV_PYTHON, groups={"vm_passthrough": ["lab-h200"]})
    kubevirt_before = kget(kube_api, "kubevirt", "kubevirt", "-n", "kubevirt")
    before = snapshot(kube_api)
    try:
        proc = playbook(helm_repo, inv, "cluster.yml", "--limit", "lab-h200,localhost")
        assert proc.returncode == 0, proc.stdout[-6000:]
        flat = " ".join(proc.stdout.split())
        assert "the cluster half labels lab-h200 and adds their KubeVirt entries; the other 3 GPU nodes" in flat, flat[-3000:]
        after = snapshot(kube_api)
        assert after["nodes"] == before["nodes"] and after["releases"] == before["releases"]
        assert kget(kube_api, "node", "lab-h200")["metadata"]["labels"][WL] == "vm-passthrough"
        old = before["kubevirt"][1]["configuration"]["permittedHostDevices"]
        new = after["kubevirt"][1]["configuration"]["permittedHostDevices"]
        assert [e for e in new["pciHostDevices"] if e not in old["pciHostDevices"]] == [
            {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/AD102GL_L40S", "externalResourceProvider": True}]
        assert [e for e in old["pciHostDevices"] if e not in new["pciHostDevices"]] == []
        assert new["mediatedDevices"] == old["mediatedDevices"]
        assert "GPU Operator left as it is (--limit)" in flat
        proc = playbook(helm_repo, inv, "cluster.yml", "--limit", "lab-h200,localhost")
        assert proc.returncode == 0 and recap(proc.stdout)["changed"] == 0, proc.stdout[-6000:]
        # Without localhost in the limit nothing runs on the cluster, and the run says how to include it.
        proc = playbook(helm_repo, inv, "cluster.yml", "--limit", "lab-h200")
        assert proc.returncode == 0, proc.stdout[-4000:]
        flat = " ".join(proc.stdout.split())
        assert "leaves out localhost" in flat and "--limit lab-h200,localhost" in flat, proc.stdout[-3000:]

        # The node leaves. Its host is another tool's here (the removal never connects to it); the whole inventory
        # is read, as in a real removal.
        kubectl(kube_api, "label", "node", "lab-h200", "example.com/rack=r7")
        leaving = inventory(tmp_path, kube_api, helm_repo, nodes=joined, name="inv-leaving",
                            hosts={"lab-h200": {"gpu_facts_gpus": [l40s], "gpuops_host_managed": False}})
        # A name not in the inventory and a --limit are refused before anything changes.
        proc = playbook(helm_repo, leaving, "remove_nodes.yml", "--limit", "localhost", "-e", "gpuops_remove_nodes=lab-h999")
        flat = " ".join(proc.stdout.split())
        assert proc.returncode != 0 and "lab-h999: not a host of group gpu_nodes" in flat, proc.stdout[-3000:]
        assert "--limit localhost: run without --limit" in flat and "Traceback" not in proc.stdout
        joined_state = snapshot(kube_api)
        assert joined_state == after and not kget(kube_api, "node", "lab-h200")["spec"].get("unschedulable")

        proc = playbook(helm_repo, leaving, "remove_nodes.yml", "-e", "gpuops_remove_nodes=lab-h200")
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert "Taken out: lab-h200 (1 with a Node, cordoned, labels released, operands off: 1 changed)" in \
            " ".join(proc.stdout.split()), proc.stdout[-3000:]
        assert_nothing_leaked(kube_api, proc.stdout)
        node = kget(kube_api, "node", "lab-h200")
        assert node["spec"].get("unschedulable") is True
        labels = node["metadata"]["labels"]
        assert WL not in labels and labels["nvidia.com/gpu.deploy.operands"] == "false"
        assert labels["example.com/rack"] == "r7"
        removed = snapshot(kube_api)
        assert removed["nodes"] == before["nodes"] and removed["releases"] == before["releases"]
        assert removed["kubevirt"][1] == before["kubevirt"][1]
        proc = playbook(helm_repo, leaving, "remove_nodes.yml", "-e", "gpuops_remove_nodes=lab-h200")
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert recap(proc.stdout)["changed"] == 0 and recap(proc.stdout, "lab-h200")["changed"] == 0, proc.stdout[-6000:]
        assert snapshot(kube_api) == removed
    finally:
        kubectl(kube_api, "uncordon", "lab-h200", check=False)
        kubectl(kube_api, "label", "node", "lab-h200", WL + "-", "nvidia.com/gpu.deploy.operands-", "example.com/rack-",
                check=False)
        kubectl(kube_api, "annotate", "node", "lab-h200", "gpuops.sandbox/labels-", check=False)
        meta = kubevirt_before["metadata"].get("annotations") or {}
        now = (kget(kube_api, "kubevirt", "kubevirt", "-n", "kubevirt")["metadata"].get("annotations") or {})
        kubectl(kube_api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=merge", "-p", json.dumps(
            {"metadata": {"annotations": dict({k: None for k in now if k not in meta}, **meta)},
             "spec": {"configuration": {"permittedHostDevices":
                                        kubevirt_before["spec"]["configuration"]["permittedHostDevices"]}}}))
    assert snapshot(kube_api)["kubevirt"][1] == before["kubevirt"][1]


@pytest.fixture(scope="module", autouse=True)
def _cleanup(kube_api):
    yield
    # The ClusterPolicy the first test made (the stand-in chart has none): the later modules install the real
    # chart on the same server, and Helm refuses a ClusterPolicy it does not own.
    kubectl(kube_api, "delete", "clusterpolicy", "-l", "app.kubernetes.io/part-of=gpuops-sandbox-tests", check=False)
    for release, namespace in (("gpu-operator", "gpu-operator"), ("dra-driver-nvidia-gpu", "dra-driver-nvidia-gpu")):
        subprocess.run([os.path.join(kube_api["bin_dir"], "helm"), "--kubeconfig", kube_api["kubeconfig"],
                        "uninstall", release, "-n", namespace], capture_output=True, timeout=120, check=False)
