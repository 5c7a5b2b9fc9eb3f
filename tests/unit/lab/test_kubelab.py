"""Unit tests of the cluster lab tool's pure parts: go.mod, cache checks, arguments, kubeconfigs, nodes."""

import base64
import hashlib
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
import time

import pytest
import yaml

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# The modules of lab/kubelab.py besides the script itself.
KUBELAB_MODULES = ("kubecommon", "kubebuild", "kubeserver", "kubefixtures")

UPSTREAM_GOMOD = """module k8s.io/kubernetes

go 1.25.0

require (
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/kubectl => ./staging/src/k8s.io/kubectl
\tgithub.com/example/fork => github.com/example/other v1.2.3
)

replace k8s.io/kms v0.0.0 => ./staging/src/k8s.io/kms
"""


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def kubelab(tmp_path, monkeypatch):
    """A fresh copy of lab/kubelab.py whose cache and state live under tmp_path."""
    monkeypatch.setenv("GPUOPS_KUBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUOPS_KUBE_STATE", str(tmp_path / "state"))
    # kubelab.py imports its parts beside it (lab/kubebuild.py, ...), which read the environment when they are
    # first imported: each test gets fresh copies of them too. A test replaces a function or setting in the
    # module whose code looks it up (kubelab.kubeserver, kubelab.kubebuild).
    for name in KUBELAB_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return load("kubelab_under_test", os.path.join(TOP, "lab", "kubelab.py"))


@pytest.fixture
def nodes():
    return load("nodes_under_test", os.path.join(TOP, "tests", "fixtures", "nodes.py"))


def test_env_overrides_the_cache_and_state(kubelab, tmp_path):
    assert kubelab.CACHE == str(tmp_path / "cache")
    assert kubelab.STATE == str(tmp_path / "state")
    assert kubelab.bin_dir() == str(tmp_path / "cache" / ("bin-" + kubelab.KUBE_VERSION))


def test_staging_version(kubelab):
    assert kubelab.staging_version("v1.35.4") == "v0.35.4"
    assert kubelab.staging_version("v1.34.10") == "v0.34.10"
    for bad in ("1.35.4", "v2.0.0", "v1.35", "v1.35.4-rc.1"):
        with pytest.raises(kubelab.KubeLabError):
            kubelab.staging_version(bad)


def test_staging_modules_reads_only_self_replacements_into_staging(kubelab):
    assert kubelab.staging_modules(UPSTREAM_GOMOD) == [
        "k8s.io/api", "k8s.io/client-go", "k8s.io/kms", "k8s.io/kubectl"]
    assert kubelab.go_directive(UPSTREAM_GOMOD) == "1.25.0"
    assert kubelab.go_directive("module x\n") is None


def test_render_gomod_pins_every_staging_module(kubelab):
    text = kubelab.render_gomod("v1.35.4", ["k8s.io/api", "k8s.io/apiextensions-apiserver"], "1.25.0")
    assert "\nrequire k8s.io/kubernetes v1.35.4\n" in text
    assert "\ngo 1.25.0\n" in text
    replaced = [line.split() for line in text.splitlines() if "=>" in line]
    assert replaced == [["k8s.io/api", "=>", "k8s.io/api", "v0.35.4"],
                        ["k8s.io/apiextensions-apiserver", "=>", "k8s.io/apiextensions-apiserver", "v0.35.4"]]


def test_ldflags_strip_and_stamp_the_release(kubelab):
    flags = kubelab.k8s_ldflags("v1.35.4")
    assert flags.startswith("-s -w ")
    assert "-X k8s.io/component-base/version.gitVersion=v1.35.4" in flags
    assert "-X k8s.io/client-go/pkg/version.gitMinor=35" in flags
    assert "-X helm.sh/helm/v3/internal/version.version=v3.22.0" in kubelab.helm_ldflags("v3.22.0")


def test_version_ok(kubelab):
    assert kubelab.version_ok("kube-apiserver", "Kubernetes v1.35.4\n", "v1.35.4")
    assert not kubelab.version_ok("kube-apiserver", "Kubernetes v1.35.40\n", "v1.35.4")
    assert not kubelab.version_ok("kube-apiserver", "Kubernetes v0.0.0-master+$Format:%H$\n", "v1.35.4")
    assert kubelab.version_ok("kubectl", "Client Version: v1.35.4\nKustomize Version: v5.7.1\n", "v1.35.4")
    assert kubelab.version_ok("helm", "v3.22.0\n", "v3.22.0")
    assert kubelab.version_ok("helm", "v3.22.0+gabcdef\n", "v3.22.0")
    assert not kubelab.version_ok("helm", "v3.21.0\n", "v3.22.0")


def fake_binary(kubelab, name, output, exit_code=0):
    """A script standing for a cached binary, recorded in a manifest like a real build."""
    directory = kubelab.bin_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\necho '%s'\nexit %d\n" % (output, exit_code))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    with open(path, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    return directory, {"binaries": {name: {"version": kubelab.KUBE_VERSION, "sha256": digest}}}


def test_cached_binary_that_runs_and_matches_is_usable(kubelab):
    directory, manifest = fake_binary(kubelab, "kube-apiserver", "Kubernetes " + kubelab.KUBE_VERSION)
    assert kubelab.binary_problem(directory, manifest, "kube-apiserver") is None


def test_missing_binary_or_manifest_entry(kubelab):
    directory, manifest = fake_binary(kubelab, "kube-apiserver", "Kubernetes " + kubelab.KUBE_VERSION)
    assert kubelab.binary_problem(directory, manifest, "kubectl") == "missing"
    assert kubelab.binary_problem(directory, {}, "kube-apiserver") == "missing"
    assert kubelab.binary_problem(directory, None, "kube-apiserver") == "missing"


def test_changed_bytes_are_corrupt(kubelab):
    directory, manifest = fake_binary(kubelab, "kube-apiserver", "Kubernetes " + kubelab.KUBE_VERSION)
    with open(os.path.join(directory, "kube-apiserver"), "ab") as handle:
        handle.write(b"\0garbage")
    assert kubelab.binary_problem(directory, manifest, "kube-apiserver").startswith("corrupt: its sha256")


def test_binary_that_does_not_print_its_version_is_corrupt(kubelab):
    directory, manifest = fake_binary(kubelab, "kube-apiserver", "Kubernetes v0.0.0-master")
    assert "corrupt" in kubelab.binary_problem(directory, manifest, "kube-apiserver")
    directory, manifest = fake_binary(kubelab, "kube-apiserver", "Kubernetes " + kubelab.KUBE_VERSION, exit_code=2)
    assert "corrupt" in kubelab.binary_problem(directory, manifest, "kube-apiserver")


def test_older_pinned_version_is_outdated(kubelab):
    directory, manifest = fake_binary(kubelab, "kube-apiserver", "Kubernetes v1.30.0")
    manifest["binaries"]["kube-apiserver"]["version"] = "v1.30.0"
    assert kubelab.binary_problem(directory, manifest, "kube-apiserver").startswith("outdated")


def test_unreadable_manifest_reads_as_none(kubelab):
    os.makedirs(kubelab.bin_dir())
    with open(os.path.join(kubelab.bin_dir(), "manifest.json"), "w") as handle:
        handle.write("{not json")
    assert kubelab.read_manifest(kubelab.bin_dir()) is None


def test_parse_etcd_version(kubelab):
    assert kubelab.parse_etcd_version("etcd Version: 3.5.16\nGit SHA: x\n") == (3, 5, 16)
    assert kubelab.parse_etcd_version("etcd Version: 3.4.23\n") < kubelab.ETCD_MIN
    assert kubelab.parse_etcd_version("something else") is None


def test_subject_puts_groups_before_the_user(kubelab):
    assert kubelab.subject("gpuops-admin", ("system:masters",)) == "/O=system:masters/CN=gpuops-admin"
    assert kubelab.subject("nobody") == "/CN=nobody"
    with pytest.raises(kubelab.KubeLabError):
        kubelab.subject("a/b")


def test_server_certificate_names_loopback(kubelab):
    sans = kubelab.server_sans()
    assert "IP:127.0.0.1" in sans and "DNS:localhost" in sans and "IP:" + kubelab.SERVICE_IP in sans


def test_kubeconfig_embeds_the_certificates(kubelab):
    doc = kubelab.kubeconfig("https://127.0.0.1:6443", b"CA", b"CERT", b"KEY", "someone")
    cluster = doc["clusters"][0]["cluster"]
    user = doc["users"][0]["user"]
    assert cluster["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"CA"
    assert base64.b64decode(user["client-certificate-data"]) == b"CERT"
    assert base64.b64decode(user["client-key-data"]) == b"KEY"
    context = doc["contexts"][0]
    assert doc["current-context"] == context["name"]
    assert context["context"] == {"cluster": doc["clusters"][0]["name"], "user": "someone"}


def test_apiserver_arguments(kubelab):
    args = kubelab.apiserver_args("/pki", 2379, 6443)
    assert "--etcd-servers=http://127.0.0.1:2379" in args
    assert "--secure-port=6443" in args and "--bind-address=127.0.0.1" in args
    assert "--authorization-mode=RBAC" in args and "--anonymous-auth=false" in args
    assert "--service-account-signing-key-file=/pki/sa.key" in args
    assert "--service-cluster-ip-range=" + kubelab.SERVICE_CIDR in args
    assert "--disable-admission-plugins=ServiceAccount" in args


def test_etcd_arguments_stay_on_loopback(kubelab):
    args = kubelab.etcd_args("/data", 1111, 2222)
    urls = [a for a in args if a.startswith("http") or "=http" in a]
    assert urls and all("127.0.0.1" in u for u in urls)
    assert args[args.index("--listen-client-urls") + 1] == "http://127.0.0.1:1111"
    assert args[args.index("--data-dir") + 1] == "/data"


def test_free_ports_are_distinct_and_free(kubelab):
    ports = kubelab.free_ports(3)
    assert len(set(ports)) == 3
    assert all(kubelab.port_free(p) for p in ports)


def test_process_alive_needs_the_marker(kubelab):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "marker-xyz"])
    try:
        # Right after Popen the child may still be in execve, with an empty command line.
        deadline = time.time() + 10
        while not kubelab.process_alive(proc.pid, "marker-xyz") and time.time() < deadline:
            time.sleep(0.05)
        assert kubelab.process_alive(proc.pid, "marker-xyz")
        assert not kubelab.process_alive(proc.pid, "another-marker")
    finally:
        proc.kill()
        proc.wait()
    assert not kubelab.process_alive(proc.pid, "marker-xyz")
    assert not kubelab.process_alive(None, "marker-xyz")


def test_server_state_without_a_record_or_with_dead_processes(kubelab):
    assert kubelab.server_state({}) == "stopped"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    meta = {"pids": {"etcd": dead.pid, "kube-apiserver": dead.pid}, "ports": {"etcd": 1}, "server": "https://x"}
    assert kubelab.server_state(meta) == "stale"


def sleeper(*args):
    """A process whose command line carries `args`, once it has started (not still in execve)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"] + list(args))
    deadline = time.time() + 10
    while time.time() < deadline:
        with open("/proc/%d/cmdline" % proc.pid, "rb") as handle:
            if args[-1].encode() in handle.read():
                break
        time.sleep(0.05)
    return proc


def test_a_state_directory_does_not_claim_the_processes_of_another_it_prefixes(kubelab, tmp_path):
    """.lab/kube is a prefix of .lab/kube-tests: a stale record of the first must never stop the second's."""
    other = sleeper("--data-dir", str(tmp_path / "state-tests" / "etcd"))
    own = sleeper("--data-dir", str(tmp_path / "state" / "etcd"))
    try:
        meta = {"pids": {"etcd": other.pid, "kube-apiserver": other.pid}, "ports": {"etcd": 1}}
        assert kubelab.server_state(meta) == "stale"
        kubelab.stop_server(meta)
        assert other.poll() is None, "stop_server killed another state directory's process"
        kubelab.stop_server({"pids": {"etcd": own.pid}})
        assert own.wait(timeout=10) is not None
        assert kubelab.process_marker() == str(tmp_path / "state") + os.sep
        assert not kubelab.process_alive(other.pid, kubelab.process_marker())
    finally:
        for proc in (other, own):
            proc.kill()
            proc.wait()


def test_wipe_state_removes_a_servers_files_and_nothing_else(kubelab, tmp_path):
    state = tmp_path / "state"
    (state / "etcd" / "member").mkdir(parents=True)
    (state / "pki").mkdir()
    (state / "pki" / "ca.key").write_text("key")
    for name in kubelab.STATE_FILES + ("server.lock", "notes.txt", "kubeconfig.tmp"):
        (state / name).write_text("x")
    kubelab.wipe_state()
    assert sorted(os.listdir(state)) == ["notes.txt", "server.lock"]
    kubelab.wipe_state()  # nothing left to remove is fine


def test_wipe_state_of_a_directory_that_does_not_exist(kubelab, tmp_path, monkeypatch):
    monkeypatch.setattr(kubelab.kubeserver, "STATE", str(tmp_path / "absent" / "state"))
    kubelab.wipe_state()
    assert not os.path.exists(tmp_path / "absent")


def test_fresh_start_stops_the_recorded_server_and_starts_from_an_empty_state(kubelab, tmp_path, monkeypatch):
    calls = []
    recorded = {"pids": {"etcd": 1, "kube-apiserver": 2}, "server": "https://127.0.0.1:1", "ports": {"etcd": 1},
                "versions": {"kubernetes": kubelab.KUBE_VERSION}}
    state = tmp_path / "state"
    (state / "etcd").mkdir(parents=True)
    (state / "server.json").write_text(json.dumps(recorded))
    (state / "kubeconfig-unauthorised").write_text("x")
    monkeypatch.setattr(kubelab.kubeserver, "ensure_binaries", lambda: {"kubernetes": kubelab.KUBE_VERSION})
    monkeypatch.setattr(kubelab.kubeserver, "etcd_version", lambda: "3.5.16")
    monkeypatch.setattr(kubelab.kubeserver, "server_state", lambda meta: "running")
    monkeypatch.setattr(kubelab.kubeserver, "stop_server", lambda meta: calls.append(("stop", meta)))

    def start(manifest, etcd_ver):
        calls.append(("start", sorted(os.listdir(state))))
        return {"server": "https://127.0.0.1:2"}

    monkeypatch.setattr(kubelab.kubeserver, "start_server", start)
    # Without --fresh a running server is reused, as `make kube` and `make site` want.
    assert kubelab.ensure_server() == (recorded, False) and calls == []
    meta, fresh = kubelab.ensure_server(fresh=True)
    assert fresh and meta == {"server": "https://127.0.0.1:2"}
    assert calls == [("stop", recorded), ("start", ["server.lock"])]
    # The wipe removed the record (the real start_server writes a new one): nothing to stop this time.
    calls.clear()
    kubelab.ensure_server(fresh=True)
    assert calls == [("start", ["server.lock"])]


def test_a_live_server_that_fails_one_health_check_is_still_running(kubelab, monkeypatch):
    answers = [False, True]
    monkeypatch.setattr(kubelab.kubeserver, "process_alive", lambda pid, marker: True)
    monkeypatch.setattr(kubelab.kubeserver, "etcd_healthy", lambda port: answers.pop(0) if answers else False)
    monkeypatch.setattr(kubelab.kubeserver, "readyz", lambda server: True)
    monkeypatch.setattr(kubelab.kubeserver.time, "sleep", lambda seconds: None)
    meta = {"pids": {"etcd": 1, "kube-apiserver": 2}, "ports": {"etcd": 1}, "server": "https://x"}
    assert kubelab.server_state(meta) == "running"
    # One that keeps failing is stale.
    assert kubelab.server_state(meta) == "stale"


def test_object_paths(kubelab):
    assert kubelab.object_path({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}, "status") \
        == "/api/v1/nodes/n1/status"
    assert kubelab.object_path({"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                                "metadata": {"name": "kubevirt", "namespace": "kubevirt"}}) \
        == "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt"
    assert kubelab.object_path({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                                "metadata": {"name": "a.b"}}) \
        == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/a.b"


def test_fixture_documents_load(kubelab):
    crds = kubelab.load_documents(os.path.join(TOP, "tests", "fixtures", "crds"))
    assert {"kubevirts.kubevirt.io", "clusterpolicies.nvidia.com"} <= {c["metadata"]["name"] for c in crds}
    objects = kubelab.load_documents(os.path.join(TOP, "tests", "fixtures", "objects"))
    kinds = [o["kind"] for o in objects]
    assert kinds.index("Namespace") < kinds.index("KubeVirt")
    assert kubelab.load_documents("/nonexistent") == []


def test_commands_that_need_a_server_fail_cleanly(kubelab, capsys):
    assert kubelab.main(["fixtures"]) == 1
    err = capsys.readouterr().err
    assert "not running" in err and "Traceback" not in err
    assert kubelab.main(["stop"]) == 0
    assert kubelab.main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["state"] == "stopped" and status["pids"] == {}


def test_start_without_go_says_so(kubelab, monkeypatch, capsys):
    monkeypatch.setattr(kubelab.kubebuild, "GO", "no-such-go-binary")
    assert kubelab.main(["build"]) == 1
    err = capsys.readouterr().err
    assert "no-such-go-binary is not installed" in err and "Traceback" not in err


def test_lab_nodes_follow_the_inventory(nodes, tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"children": {
        "container": {"hosts": {"a": None}},
        "vm_passthrough": {"hosts": {"b": None, "c": {"gpuops_workload_type": "vm-vgpu"}}},
        "vm_vgpu": {"hosts": {"d": None}}}}}}}))
    assert nodes.lab_hosts(str(inventory)) == [("a", "container"), ("b", "vm-passthrough"),
                                               ("c", "vm-vgpu"), ("d", "vm-vgpu")]
    made = nodes.lab_nodes(str(inventory), gpus=2)
    assert [n["metadata"]["name"] for n in made] == ["a", "b", "c", "d"]
    assert made[1]["status"]["allocatable"]["nvidia.com/GA102GL_A10"] == "2"
    assert made[3]["status"]["allocatable"]["nvidia.com/NVIDIA_A10-12Q"] == "8"


def test_the_real_lab_inventory_gives_one_node_per_workload_type(nodes):
    assert nodes.lab_hosts() == [("lab-container", "container"), ("lab-h200", "container"),
                                 ("lab-passthrough", "vm-passthrough"), ("lab-vgpu", "vm-vgpu"), ("lab-dra", "dra")]


def test_a_node_without_a_lab_vm_carries_what_gpu_feature_discovery_would_find(nodes):
    """lab-h200 (gpuops_host_managed: false) stands for a real H200 host: the operator decides MIG capability from
    nvidia.com/mig.capable, which GFD sets on a real node."""
    made = {n["metadata"]["name"]: n for n in nodes.lab_nodes()}
    assert made["lab-h200"]["metadata"]["labels"]["nvidia.com/mig.capable"] == "true"
    assert made["lab-h200"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert "nvidia.com/mig.capable" not in made["lab-container"]["metadata"]["labels"]


def test_the_dra_host_gets_the_slice_its_driver_would_publish(nodes):
    slices = nodes.lab_dra_slices()
    assert [s["spec"]["nodeName"] for s in slices] == ["lab-dra"]
    spec = slices[0]["spec"]
    assert spec["driver"] == "gpu.nvidia.com" and spec["pool"] == {"name": "lab-dra", "generation": 1,
                                                                   "resourceSliceCount": 1}
    kinds = {(d["attributes"]["type"]["string"], d["attributes"]["pcieBusID"]["string"]) for d in spec["devices"]}
    # Each stand-in GPU once for containers and once for VMs (the chart's gpu and vfio DeviceClasses), at the
    # addresses of lab-dra's own layout: one GPU in slot 03 of the root bus, one behind the PCIe switch.
    assert kinds == {("gpu", "0000:00:03.0"), ("vfio", "0000:00:03.0"), ("gpu", "0000:03:00.0"), ("vfio", "0000:03:00.0")}
    assert len({d["name"] for d in spec["devices"]}) == 4
    # Version attributes as the API server accepts them: semver 2.0.0, no leading zeros (it refused 580.65.06).
    semver = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")
    versions = [a["version"] for d in spec["devices"] for a in d["attributes"].values() if "version" in a]
    assert versions and all(semver.fullmatch(v) for v in versions), versions
    # A DRA node advertises no extended resource: its GPUs are in the slice.
    node = nodes.gpu_node("lab-dra", "dra")
    assert not [r for r in node["status"]["allocatable"] if r.startswith("nvidia.com/")]


def test_gpu_node_labels_and_status(nodes):
    node = nodes.gpu_node("gpu-1", "container", gpus=4)
    labels = node["metadata"]["labels"]
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["kubernetes.io/hostname"] == "gpu-1"
    assert nodes.WORKLOAD_LABEL not in labels
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["status"]["conditions"][0]["type"] == "Ready"
    labelled = nodes.gpu_node("gpu-2", "vm-passthrough", workload_label=True, resources={"x.io/y": "1"})
    assert labelled["metadata"]["labels"][nodes.WORKLOAD_LABEL] == "vm-passthrough"
    assert labelled["status"]["allocatable"]["x.io/y"] == "1"
    with pytest.raises(ValueError):
        nodes.gpu_node("gpu-3", "vm-gpu")


def test_many_nodes_are_numbered(nodes):
    made = nodes.many_nodes(3, prefix="b-")
    assert [n["metadata"]["name"] for n in made] == ["b-0000", "b-0001", "b-0002"]


def test_etcd_older_than_the_minimum_is_refused(kubelab, tmp_path, monkeypatch):
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\necho 'etcd Version: 3.4.23'\necho 'Git SHA: Not provided'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(kubelab.kubeserver, "ETCD", str(fake))
    with pytest.raises(kubelab.KubeLabError, match="3.4.23 is too old"):
        kubelab.etcd_version()
    fake.write_text("#!/bin/sh\necho 'etcd Version: 3.5.16'\n")
    assert kubelab.etcd_version() == "3.5.16"
    monkeypatch.setattr(kubelab.kubeserver, "ETCD", str(tmp_path / "missing-etcd"))
    with pytest.raises(kubelab.KubeLabError, match="make hostdeps"):
        kubelab.etcd_version()
