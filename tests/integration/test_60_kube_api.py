"""The cluster lab: a real kube-apiserver and etcd on loopback, built and started by lab/kubelab.py.

The session's server (fixture `kube_api`) is checked through a real ansible-playbook run with
kubernetes.core, through kubectl, and with a client that has no RBAC rights. The lifecycle test uses a
second, private server (its own state directory) so stopping it does not disturb the session's.
"""

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import time
import urllib.error
import urllib.request

import pytest
import yaml

from conftest import TOP, gone, kubelab, kubelab_status, run


PLAYBOOK = """
- name: Read the cluster lab through kubernetes.core
  hosts: localhost
  gather_facts: false
  tasks:
    - name: The kube-system namespace
      kubernetes.core.k8s_info:
        kubeconfig: "{{ kubeconfig }}"
        kind: Namespace
        name: kube-system
      register: namespace
    - name: GPU nodes, found by their NFD label
      kubernetes.core.k8s_info:
        kubeconfig: "{{ kubeconfig }}"
        kind: Node
        label_selectors: ["feature.node.kubernetes.io/pci-10de.present=true"]
      register: nodes
    - name: The KubeVirt CR of the fixtures
      kubernetes.core.k8s_info:
        kubeconfig: "{{ kubeconfig }}"
        api_version: kubevirt.io/v1
        kind: KubeVirt
        namespace: kubevirt
        name: kubevirt
      register: kubevirt
    - name: Hand the results to the test
      ansible.builtin.copy:
        content: "{{ {'namespace': namespace.resources, 'nodes': nodes.resources,
                      'kubevirt': kubevirt.resources} | to_json }}"
        dest: "{{ result_file }}"
        mode: "0600"
"""

DRA_OBJECTS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: vfio.gpu.nvidia.com
spec:
  selectors:
    - cel:
        expression: device.driver == 'gpu.nvidia.com'
---
apiVersion: v1
kind: Namespace
metadata:
  name: dra-check
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: vfio-gpu
  namespace: dra-check
spec:
  spec:
    devices:
      requests:
        - name: gpu
          exactly:
            deviceClassName: vfio.gpu.nvidia.com
            allocationMode: ExactCount
            count: 1
      config:
        - opaque:
            driver: gpu.nvidia.com
            parameters:
              apiVersion: resource.nvidia.com/v1beta1
              kind: VfioDeviceConfig
              iommu:
                backendPolicy: LegacyOnly
                enableAPIDevice: true
"""


def kubectl(api, *args, kubeconfig=None, **kwargs):
    cmd = [os.path.join(api["bin_dir"], "kubectl"), "--kubeconfig", kubeconfig or api["kubeconfig"]]
    return run(cmd + list(args), timeout=120, **kwargs)


def kubectl_json(api, *args):
    return json.loads(kubectl(api, *args, "-o", "json", check=True).stdout)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_k8s_info_reads_the_server_with_the_admin_kubeconfig(kube_api, tmp_path):
    playbook = write(tmp_path, "read.yml", PLAYBOOK)
    result_file = str(tmp_path / "result.json")
    proc = run(["ansible-playbook", "-i", "localhost,", "-c", "local", playbook,
                "-e", "kubeconfig=%s" % kube_api["kubeconfig"], "-e", "result_file=%s" % result_file,
                "-e", "ansible_python_interpreter=%s" % os.path.join(TOP, ".venv", "bin", "python")],
               timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    with open(result_file) as handle:
        result = json.load(handle)
    assert [ns["metadata"]["name"] for ns in result["namespace"]] == ["kube-system"]
    assert sorted(n["metadata"]["name"] for n in result["nodes"]) == ["lab-container", "lab-dra", "lab-h200", "lab-passthrough", "lab-vgpu"]
    by_name = {n["metadata"]["name"]: n for n in result["nodes"]}
    # The status went through the status subresource, so the API server kept it.
    assert by_name["lab-container"]["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert by_name["lab-passthrough"]["status"]["allocatable"]["nvidia.com/GA102GL_A10"] == "2"
    assert "nvidia.com/gpu.workload.config" not in by_name["lab-vgpu"]["metadata"]["labels"]
    assert result["kubevirt"][0]["status"]["observedKubeVirtVersion"].startswith("v1.")


def test_resource_api_v1_is_served(kube_api, tmp_path):
    names = kubectl(kube_api, "api-resources", "--api-group=resource.k8s.io", "-o", "name", check=True).stdout.split()
    for resource in ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"):
        assert "%s.resource.k8s.io" % resource in names
    versions = kubectl(kube_api, "api-versions", check=True).stdout.split()
    assert "resource.k8s.io/v1" in versions
    objects = write(tmp_path, "dra.yaml", DRA_OBJECTS)
    kubectl(kube_api, "apply", "-f", objects, check=True)
    try:
        check_dra_objects(kube_api, tmp_path)
    finally:
        # The server is shared with the later cluster tests: the DRA driver chart creates a DeviceClass of
        # the same name and Helm refuses one it does not own. The namespace stays (no namespace controller).
        kubectl(kube_api, "delete", "resourceclaimtemplates.v1.resource.k8s.io", "vfio-gpu", "-n", "dra-check",
                "--ignore-not-found", check=True)
        kubectl(kube_api, "delete", "deviceclass", "vfio.gpu.nvidia.com", "--ignore-not-found", check=True)
    assert kubectl(kube_api, "get", "deviceclass", "vfio.gpu.nvidia.com", "--ignore-not-found",
                   check=True).stdout.strip() == ""


def check_dra_objects(kube_api, tmp_path):
    template = kubectl_json(kube_api, "get", "resourceclaimtemplates.v1.resource.k8s.io", "-n", "dra-check",
                            "vfio-gpu")
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert request["exactly"]["deviceClassName"] == "vfio.gpu.nvidia.com"
    assert kubectl_json(kube_api, "get", "deviceclass", "vfio.gpu.nvidia.com")["kind"] == "DeviceClass"
    # Validation is real: a request with neither `exactly` nor `firstAvailable` is refused.
    bad = DRA_OBJECTS.replace("name: vfio-gpu", "name: broken").replace(
        "          exactly:\n            deviceClassName: vfio.gpu.nvidia.com\n"
        "            allocationMode: ExactCount\n            count: 1\n", "")
    proc = kubectl(kube_api, "apply", "-f", write(tmp_path, "bad.yaml", bad))
    assert proc.returncode != 0 and "is invalid" in proc.stdout and "exactly one of" in proc.stdout, proc.stdout


def test_fixture_crds_are_established_and_enforce_their_schema(kube_api, tmp_path):
    for name in ("kubevirts.kubevirt.io", "clusterpolicies.nvidia.com"):
        crd = kubectl_json(kube_api, "get", "crd", name)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True", conditions
        assert conditions.get("NamesAccepted") == "True", conditions
    assert kubectl_json(kube_api, "get", "crd", "clusterpolicies.nvidia.com")["spec"]["scope"] == "Cluster"
    policy = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "schema-check"},
              "spec": {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-gpu"}}}
    proc = kubectl(kube_api, "apply", "-f", write(tmp_path, "policy.yaml", yaml.safe_dump(policy)))
    assert proc.returncode != 0 and "defaultWorkload" in proc.stdout, proc.stdout
    patch = {"spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": [
        {"pciVendorSelector": "10DE:2236", "externalResourceProvider": True}]}}}}
    proc = kubectl(kube_api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=merge",
                   "-p", json.dumps(patch))
    assert proc.returncode != 0 and "resourceName" in proc.stdout, proc.stdout
    patch["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"][0]["resourceName"] = \
        "nvidia.com/GA102GL_A10"
    kubectl(kube_api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=merge", "-p", json.dumps(patch),
            "--dry-run=server", check=True)


def test_the_unauthorised_kubeconfig_is_forbidden(kube_api):
    other = kube_api["kubeconfig_unauthorised"]
    proc = kubectl(kube_api, "get", "namespaces", kubeconfig=other)
    assert proc.returncode != 0
    assert "Forbidden" in proc.stdout and "gpuops-unauthorised" in proc.stdout, proc.stdout
    proc = kubectl(kube_api, "get", "--raw", "/api/v1/nodes", kubeconfig=other)
    assert proc.returncode != 0 and "Forbidden" in proc.stdout, proc.stdout
    # The same request with the admin kubeconfig works, so it is RBAC, not the connection.
    assert kubectl(kube_api, "get", "--raw", "/api/v1/nodes", check=True).returncode == 0
    assert kubectl(kube_api, "auth", "can-i", "list", "pods", "-n", "default", kubeconfig=other).stdout.strip() == "no"
    assert kubectl(kube_api, "auth", "can-i", "list", "pods", "-n", "default").stdout.strip() == "yes"


def test_the_unauthorised_client_gets_http_403(kube_api, tmp_path):
    """The API answers 403 (authenticated, not authorised), not 401, to the no-rights client certificate."""
    with open(kube_api["kubeconfig_unauthorised"]) as handle:
        config = yaml.safe_load(handle)
    files = {}
    for key, data in (("ca", config["clusters"][0]["cluster"]["certificate-authority-data"]),
                      ("cert", config["users"][0]["user"]["client-certificate-data"]),
                      ("key", config["users"][0]["user"]["client-key-data"])):
        files[key] = tmp_path / key
        files[key].write_bytes(base64.b64decode(data))
    context = ssl.create_default_context(cafile=str(files["ca"]))
    context.load_cert_chain(str(files["cert"]), str(files["key"]))
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(kube_api["server"] + "/api/v1/namespaces", context=context, timeout=30)
    assert caught.value.code == 403
    body = json.loads(caught.value.read())
    assert body["reason"] == "Forbidden" and 'User "gpuops-unauthorised"' in body["message"]
    # Discovery stays open to every authenticated user, as on a real cluster.
    with urllib.request.urlopen(kube_api["server"] + "/version", context=context, timeout=30) as resp:
        assert json.loads(resp.read())["gitVersion"] == kube_api["versions"]["kubernetes"]


def squat(port, timeout=30):
    """Listen on `port` (retrying while the dead server's socket is torn down); return the socket."""
    deadline = time.time() + timeout
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
            return sock
        except OSError:
            sock.close()
            if time.time() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def private_kube(tmp_path):
    """A second cluster lab with its own state directory; always stopped afterwards."""
    env = {"GPUOPS_KUBE_STATE": str(tmp_path / "kube")}
    yield env
    kubelab("stop", env=env, timeout=120)


def test_start_reuses_restarts_stale_and_stop_leaves_no_process(kube_api, private_kube):
    env = private_kube
    started = time.time()
    proc = kubelab("start", env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout
    first = kubelab_status(env)
    assert first["state"] == "running" and "ready at" in proc.stdout
    assert first["server"] != kube_api["server"]
    assert time.time() - started < 300

    proc = kubelab("start", env=env, timeout=600)
    assert proc.returncode == 0 and "reused" in proc.stdout, proc.stdout
    assert kubelab_status(env)["pids"] == first["pids"]

    # The API server dies and something else takes its port: the next start notices and restarts.
    os.kill(first["pids"]["kube-apiserver"], signal.SIGKILL)
    deadline = time.time() + 30
    while not gone(first["pids"]["kube-apiserver"]) and time.time() < deadline:
        time.sleep(0.2)
    squatter = squat(first["ports"]["kube-apiserver"])
    try:
        assert kubelab_status(env)["state"] == "stale"
        proc = kubelab("start", env=env, timeout=600)
        assert proc.returncode == 0 and "restarting" in proc.stdout, proc.stdout
        second = kubelab_status(env)
        assert second["state"] == "running"
        assert second["ports"]["kube-apiserver"] != first["ports"]["kube-apiserver"]
        assert gone(first["pids"]["etcd"]), "the old etcd was left running"
    finally:
        squatter.close()

    proc = kubelab("stop", env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout
    for name, pid in second["pids"].items():
        assert gone(pid), "%s (pid %s) still runs after stop" % (name, pid)
    status = kubelab_status(env)
    assert status["state"] == "stopped" and status["pids"] == {}
    assert not os.path.exists(status["kubeconfig"])
    # The session's server was not touched.
    assert kubelab_status()["state"] == "running"


# The lab's own repair of its binary cache rebuilds helm with Go (271 s of the full run on 2026-12-02, with the
# lab's work beside it): a claim about the lab, not the collection, so it runs in the cluster slice.
@pytest.mark.slice("cluster")
def test_a_corrupt_cached_binary_is_rebuilt(kube_api, tmp_path):
    """A copy of the binary cache with a damaged helm: `build` rebuilds that one binary, keeps the others."""
    cache = tmp_path / "cache"
    bin_dir = cache / os.path.basename(kube_api["bin_dir"])
    shutil.copytree(kube_api["bin_dir"], str(bin_dir))
    with open(bin_dir / "helm", "ab") as handle:
        handle.write(b"\0not a binary any more")
    before = json.loads((bin_dir / "manifest.json").read_text())
    proc = kubelab("build", env={"GPUOPS_KUBE_CACHE": str(cache)}, timeout=1800)
    assert proc.returncode == 0, proc.stdout
    assert "cached helm is corrupt" in proc.stdout and "building helm" in proc.stdout
    assert "building kube-apiserver" not in proc.stdout
    after = json.loads((bin_dir / "manifest.json").read_text())
    assert after["binaries"]["kube-apiserver"] == before["binaries"]["kube-apiserver"]
    assert hashlib.sha256((bin_dir / "helm").read_bytes()).hexdigest() == after["binaries"]["helm"]["sha256"]
    version = run([str(bin_dir / "helm"), "version", "--short"], check=True).stdout
    assert version.startswith(after["helm"])


def test_fixtures_again_keep_what_the_collection_configured(kube_api):
    """`kubelab fixtures` (run by every `make site`) creates the KubeVirt CR but never resets one that exists."""
    before = kubectl_json(kube_api, "get", "kubevirt", "kubevirt", "-n", "kubevirt")
    patch = {"spec": {"configuration": {"developerConfiguration": {"featureGates": ["GPU", "HostDevices"]},
                                        "permittedHostDevices": {"pciHostDevices": [
                                            {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/GA102GL_A10",
                                             "externalResourceProvider": True}]}}}}
    kubectl(kube_api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=merge", "-p", json.dumps(patch),
            check=True)
    try:
        kubectl(kube_api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"observedKubeVirtVersion": "v0.0.1"}}), check=True)
        configured = kubectl_json(kube_api, "get", "kubevirt", "kubevirt", "-n", "kubevirt")
        proc = kubelab("fixtures", timeout=600)
        assert proc.returncode == 0, proc.stdout
        after = kubectl_json(kube_api, "get", "kubevirt", "kubevirt", "-n", "kubevirt")
        assert after["spec"] == configured["spec"]
        assert after["spec"]["configuration"]["developerConfiguration"]["featureGates"] == ["GPU", "HostDevices"]
        # The status (what KubeVirt's operator would report) is the fixture's again.
        assert after["status"]["observedKubeVirtVersion"] == before["status"]["observedKubeVirtVersion"]
    finally:
        kubectl(kube_api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=json", "-p", json.dumps(
            [{"op": "replace", "path": "/spec", "value": before["spec"]}]), check=True)
        kubectl(kube_api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": before["status"]}), check=True)
