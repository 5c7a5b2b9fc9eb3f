"""The real GPU Operator reconciling in the cluster lab (lab/operatorlab.py), after the cluster half.

The cluster half (playbooks/cluster.yml) installs the real GPU Operator and DRA driver charts from
../shared/upstream/ on the session's API server; then the operator's controller, built from its source
beside them, runs out of cluster against that server. It labels the nodes (nvidia.com/gpu.deploy.*) and
renders its operand DaemonSets as it would in a cluster. What is checked, per lab host (one of each
workload type, the GPU facts made up as in test_70/test_72; lab-dra the DRA host, a fixture Node like the others):
- the operator's deploy labels on each node, exactly: its own `true` for the workload type, and on the
  DRA node the collection's `false` for the operands a DRA node must not run, kept by the operator;
- which lab nodes each operand DaemonSet selects (node selector and node affinity), and its image: the
  ClusterPolicy's for that operand, the vGPU Manager's with the nodes' OS tag appended, its pull secret,
  the vGPU Device Manager's ConfigMap;
- a second run of the cluster half changes nothing and leaves every label the operator set;
- playbooks/validate.yml finds the labels it waits for on the real operator's nodes;
- a node switched to another workload type gets its new operands from the operator, the old ones go.

There is no kubelet and no DaemonSet controller: no operand pod ever runs. The DaemonSets' status stays
empty, which the operator reads as nothing unavailable, so the ClusterPolicy reports ready: that shows the
collection's wait on it works against the real status, not that the operands would run. What the pods would
write (nvidia.com/vgpu.config.state) is written by hand where a check needs it. The ClusterPolicy CRD is the
chart's for the module (the session's fixtures give the project's stand-in). The module leaves the server
as it found it: the operator stopped, releases uninstalled, the objects the operator created and the CRDs
the charts added deleted, the stand-in CRD, nodes and the KubeVirt CR restored.
"""

import json
import os
import sys
import time

import pytest
import yaml

from chart_cluster import POLICY_CRD, crd_names, put_back_crd, take_cluster_policy
from conftest import (TOP, UPSTREAM, UPSTREAM_CHARTS, VENV_PYTHON, VGPU_CONFIG, chart_path_vars, delete_crds, flat,
                      gpu_host_vars, helm, helm_home_env, kfind, kget, kubectl, recaps, restore_cluster_policy, run,
                      timed_playbook, write_inventory)

CHARTS = UPSTREAM_CHARTS
OPERATOR_SOURCE = os.path.join(UPSTREAM, "gpu-operator", "source")
HAVE_UPSTREAM = all(os.path.isdir(p) for p in list(CHARTS.values()) + [OPERATOR_SOURCE])
OPERATORLAB = [sys.executable, os.path.join(TOP, "lab", "operatorlab.py")]

NODES = {"lab-container": "container", "lab-passthrough": "vm-passthrough", "lab-vgpu": "vm-vgpu", "lab-dra": "dra"}
DRA_NODE = "lab-dra"
NAMESPACE = "gpu-operator"
RELEASES = (("gpu-operator", NAMESPACE), ("dra-driver-nvidia-gpu", "dra-driver-nvidia-gpu"))
DEPLOY = "nvidia.com/gpu.deploy."
WL, VG = "nvidia.com/gpu.workload.config", "nvidia.com/vgpu.config"

VGPU_CONFIGMAP = "gpuops-vgpu-devices-config"
PULL_SECRET = ("vgpu-manager-registry", "registry.example", "robot", "not-a-real-password-75")

# The operator's deploy labels per workload type (controllers/state_manager.go, gpuStateLabels; sandbox mode
# kubevirt), and the operands the collection turns off on a DRA node (whose workload label is container).
OPERATOR_LABELS = {
    "container": ("driver", "gpu-feature-discovery", "container-toolkit", "device-plugin", "dcgm", "dcgm-exporter",
                  "node-status-exporter", "operator-validator", "client"),
    "vm-passthrough": ("sandbox-device-plugin", "sandbox-validator", "vfio-manager", "kata-manager", "cc-manager",
                       "client"),
    "vm-vgpu": ("sandbox-device-plugin", "vgpu-manager", "vgpu-device-manager", "sandbox-validator", "cc-manager",
                "client"),
}
DRA_OFF = ("device-plugin", "operator-validator", "gpu-feature-discovery", "dcgm", "dcgm-exporter")

# The operand DaemonSets and the ClusterPolicy spec entry whose image each runs.
OPERAND_SPEC = {
    "nvidia-driver-daemonset": "driver",
    "nvidia-container-toolkit-daemonset": "toolkit",
    "nvidia-device-plugin-daemonset": "devicePlugin",
    "nvidia-device-plugin-mps-control-daemon": "devicePlugin",
    "nvidia-operator-validator": "validator",
    "gpu-feature-discovery": "gfd",
    "nvidia-dcgm": "dcgm",
    "nvidia-dcgm-exporter": "dcgmExporter",
    "nvidia-mig-manager": "migManager",
    "nvidia-node-status-exporter": "nodeStatusExporter",
    "nvidia-vfio-manager": "vfioManager",
    "nvidia-sandbox-device-plugin-daemonset": "sandboxDevicePlugin",
    "nvidia-sandbox-validator": "validator",
    "nvidia-vgpu-manager-daemonset": "vgpuManager",
    "nvidia-vgpu-device-manager": "vgpuDeviceManager",
    "nvidia-kata-manager": "kataManager",
    "nvidia-cc-manager": "ccManager",
}
# Objects the operator renders from its assets (ownerReferences: the ClusterPolicy); deleted at the end, as
# the garbage collector the lab does not run would.
OPERATOR_KINDS = ("daemonsets.apps", "deployments.apps", "serviceaccounts", "configmaps", "services", "roles",
                  "rolebindings", "clusterroles", "clusterrolebindings", "runtimeclasses.node.k8s.io")

pytestmark = pytest.mark.skipif(
    not HAVE_UPSTREAM, reason="the GPU Operator's source and the real charts are not beside this checkout "
                              "(../shared/upstream)")


# ---------------------------------------------------------------------------------------------
# Helpers (those test_70 and test_72 use too are in conftest)
# ---------------------------------------------------------------------------------------------

def operatorlab(lab, *args, timeout=600, check=True):
    return run(OPERATORLAB + list(args), timeout=timeout, check=check, env=lab["operator_env"])


def report(what, seconds):
    """Wall times go to the terminal (pytest -s) and to the test report (-rA shows them)."""
    print("test_75 timing: %s %.1f s" % (what, seconds), file=sys.stderr)


# GPU sharing (issue 27) from the first install on: lab-container is the H200 host of FACTS.md, asking for seven MIG
# instances and four-way time-slicing. (A later change of chart values would be a Helm upgrade, whose pre-upgrade
# hook Job never completes without a kubelet; labels can change at any time.)
H200_GPUS = [{"address": "0000:00:06.0", "vendor": "10de", "device": "2335", "class": "030200", "driver": "nvidia",
              "is_bridge": False}]
HOST_DRIVER = {"nvidia_driver": {"loaded": True, "version": "580.159.04", "host_module": "updates/dkms/nvidia.ko.zst",
                                 "source": "host"}}
SHARING = {"gpuops_mig_configs": {"all-disabled": [{"devices": "all", "mig-enabled": False}],
                                  "h200-seven": [{"devices": "all", "mig-enabled": True,
                                                  "mig-devices": {"1g.18gb": 7}}]},
           "gpuops_device_plugin_configs": {"four-way": {"sharing": {"timeSlicing": {"resources": [
               {"name": "nvidia.com/gpu", "replicas": 4}]}}}}}
SHARING_HOSTS = {"lab-container": {"gpu_facts_gpus": H200_GPUS, "gpuops_mig_config": "h200-seven",
                                   "gpuops_device_plugin_config": "four-way"}}


def inventory(tmp_path, api, name="inv", hosts=None, extra=None):
    """The four GPU hosts with the facts gpu_facts would give for an A10 (lab-container an H200 with GPU sharing),
    pointed at the real charts; ``hosts`` adds to a host's variables."""
    all_vars = chart_path_vars(api, CHARTS, PULL_SECRET, [])
    all_vars.update(SHARING)
    all_vars.update(extra or {})
    merged = {h: dict(SHARING_HOSTS.get(h, {}), **v) for h, v in (hosts or {}).items()}
    merged.update({h: v for h, v in SHARING_HOSTS.items() if h not in merged})
    return write_inventory(tmp_path, name, all_vars, gpu_host_vars(NODES, merged), VENV_PYTHON)


def playbook(lab, inv, name="cluster.yml", *extra):
    """A playbook; returns (process, wall seconds)."""
    return timed_playbook(lab["helm_env"], inv, name, *extra)


def wait_for(what, check, timeout=180, delay=2):
    """Poll `check()` (returns (done, detail)) until done; fail saying what was last seen."""
    deadline = time.monotonic() + timeout
    while True:
        done, detail = check()
        if done:
            return detail
        if time.monotonic() > deadline:
            raise AssertionError("%s: not after %ss; last seen: %s" % (what, timeout, detail))
        time.sleep(delay)


def node_labels(api):
    items = kget(api, "nodes")["items"]
    return {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in items if n["metadata"]["name"] in NODES}


def deploy_labels(labels):
    return {k[len(DEPLOY):]: v for k, v in labels.items() if k.startswith(DEPLOY)}


def expected_deploy_labels(wtype):
    """The deploy labels a node of `wtype` carries once the operator has labelled it."""
    if wtype == "dra":
        return dict((o, "false" if o in DRA_OFF else "true") for o in OPERATOR_LABELS["container"])
    return dict((o, "true") for o in OPERATOR_LABELS[wtype])


def operator_done(api):
    """(the operator has labelled every node: each has a value for every deploy label of the workload type the
    operator reads from its workload label, whatever the collection set, {node: deploy labels})."""
    labels = node_labels(api)
    seen = {n: deploy_labels(lab) for n, lab in labels.items()}
    done = all(lab.get(WL) in OPERATOR_LABELS and all(seen[n].get(o) for o in OPERATOR_LABELS[lab[WL]])
               for n, lab in labels.items())
    return done and set(seen) == set(NODES), seen


def labelled(api, types):
    """(every node shows the deploy labels of its type, {node: deploy labels})."""
    seen = {n: deploy_labels(labels) for n, labels in node_labels(api).items()}
    return all(seen.get(n) == expected_deploy_labels(t) for n, t in types.items()), seen


def selects(pod_spec, labels):
    """Whether a pod template's nodeSelector and required node affinity admit a node with `labels`."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []

    def matches(expr):
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            return labels.get(key) in values
        if op == "NotIn":
            return labels.get(key) not in values
        if op == "Exists":
            return key in labels
        if op == "DoesNotExist":
            return key not in labels
        number = labels.get(key)
        if op in ("Gt", "Lt") and number is not None and number.isdigit():
            return int(number) > int(values[0]) if op == "Gt" else int(number) < int(values[0])
        return False

    return not terms or any(all(matches(e) for e in t.get("matchExpressions") or []) for t in terms)


def operand_daemonsets(api):
    return {d["metadata"]["name"]: d for d in kget(api, "daemonsets", "-n", NAMESPACE)["items"]
            if any(r.get("kind") == "ClusterPolicy" for r in d["metadata"].get("ownerReferences") or [])}


def placement(api):
    """{operand DaemonSet: sorted lab nodes it selects}."""
    labels = node_labels(api)
    return {name: sorted(n for n, lab in labels.items() if selects(ds["spec"]["template"]["spec"], lab))
            for name, ds in operand_daemonsets(api).items()}


def expected_placement(types, present):
    """Which nodes each operand DaemonSet (of those `present`) must select, from the nodes' workload types."""
    def having(*operands):
        return sorted(n for n, t in types.items()
                      if all(expected_deploy_labels(t).get(o) == "true" for o in operands))

    wanted = {"nvidia-driver-daemonset": having("driver"), "nvidia-container-toolkit-daemonset": having("container-toolkit"),
              "nvidia-device-plugin-daemonset": having("device-plugin"),
              "nvidia-device-plugin-mps-control-daemon": [],  # no lab node is nvidia.com/mps.capable
              "nvidia-operator-validator": having("operator-validator"),
              "gpu-feature-discovery": having("gpu-feature-discovery"), "nvidia-dcgm": having("dcgm"),
              "nvidia-dcgm-exporter": having("dcgm-exporter"), "nvidia-node-status-exporter": having("node-status-exporter"),
              "nvidia-mig-manager": [],  # an A10 is not MIG-capable: no node gets mig-manager
              "nvidia-vfio-manager": having("vfio-manager"),
              "nvidia-sandbox-device-plugin-daemonset": having("sandbox-device-plugin"),
              "nvidia-sandbox-validator": having("sandbox-validator"),
              "nvidia-vgpu-manager-daemonset": having("vgpu-manager"),
              "nvidia-vgpu-device-manager": having("vgpu-device-manager"),
              "nvidia-kata-manager": having("kata-manager"), "nvidia-cc-manager": having("cc-manager")}
    return {name: wanted.get(name, "unexpected DaemonSet") for name in present}


def image_of(spec):
    return "%s/%s:%s" % (spec["repository"], spec["image"], spec["version"])


def main_container(ds):
    return ds["spec"]["template"]["spec"]["containers"][0]


def os_tag(labels):
    return labels["feature.node.kubernetes.io/system-os_release.ID"] + labels["feature.node.kubernetes.io/system-os_release.VERSION_ID"]


# ---------------------------------------------------------------------------------------------
# The module's setup and cleanup: the server is left as it was found
# ---------------------------------------------------------------------------------------------

def operator_objects(api):
    """[(kind.group, namespace or None, name)] of what carries an ownerReference to a ClusterPolicy."""
    found = []
    for item in kget(api, ",".join(OPERATOR_KINDS), "-A")["items"]:
        if any(r.get("kind") == "ClusterPolicy" for r in item["metadata"].get("ownerReferences") or []):
            group = item["apiVersion"].split("/")[0] if "/" in item["apiVersion"] else ""
            kind = item["kind"].lower() + ("." + group if group else "")
            found.append((kind, item["metadata"].get("namespace"), item["metadata"]["name"]))
    return found


@pytest.fixture(scope="module")
def lab(kube_api, tmp_path_factory):
    """The charts installed by the cluster half, then the real operator started against the session's server."""
    api = kube_api
    root = tmp_path_factory.mktemp("operator75")
    helm_env = helm_home_env(root)
    operator_env = {"GPUOPS_OPERATOR_STATE": os.path.join(api["state_dir"], "operator"),
                    "GPUOPS_OPERATOR_SOURCE": OPERATOR_SOURCE, "GPUOPS_OPERATOR_CHART": CHARTS["gpu-operator"]}
    lab_ = {"api": api, "helm_env": helm_env, "operator_env": operator_env, "root": root, "timings": {}}
    # The operator binary: cached in .cache/operator (`make operator-binary`), built here when missing.
    started = time.monotonic()
    operatorlab(lab_, "build", timeout=3600, check=True)
    lab_["timings"]["build"] = time.monotonic() - started

    # Releases of the same names from earlier modules (stand-in charts) and test_70's own ClusterPolicy would
    # be taken over by the real charts: start without them, put the ClusterPolicy back at the end.
    for release, namespace in RELEASES:
        helm(api, helm_env, "uninstall", release, "-n", namespace, "--no-hooks", check=False)
    policy, crds = take_cluster_policy(api)
    # The session's fixtures give the project's stand-in ClusterPolicy CRD, which helm keeps (it never
    # replaces a CRD): the operator gets the chart's, with its schema and defaults, for this module.
    stand_in_crd = kfind(api, "crd", POLICY_CRD)
    if stand_in_crd:
        kubectl(api, "replace", "-f", os.path.join(CHARTS["gpu-operator"], "crds", "nvidia.com_clusterpolicies.yaml"))
    nodes = {n: kget(api, "node", n) for n in NODES}
    kubevirt = kget(api, "kubevirt", "kubevirt", "-n", "kubevirt")
    objects = [("secret", PULL_SECRET[0], NAMESPACE), ("configmap", VGPU_CONFIGMAP, NAMESPACE)]
    absent = [o for o in objects if kfind(api, o[0], o[1], "-n", o[2]) is None]
    namespace = kfind(api, "namespace", NAMESPACE)
    try:
        yield lab_
    finally:
        operatorlab(lab_, "stop", timeout=120, check=False)
        for release, namespace_ in RELEASES:
            helm(api, helm_env, "uninstall", release, "-n", namespace_, "--no-hooks", check=False)
        by_namespace = {}
        for kind, namespace_, name in operator_objects(api):
            by_namespace.setdefault(namespace_, []).append("%s/%s" % (kind, name))
        for namespace_, names in by_namespace.items():
            kubectl(api, "delete", *names, *(["-n", namespace_] if namespace_ else []), "--ignore-not-found",
                    "--wait=false", check=False)
        for name in kubectl(api, "get", "clusterpolicies", "-o", "name", check=False).stdout.split():
            kubectl(api, "patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
            kubectl(api, "delete", name, "--ignore-not-found", check=False)
        for kind, name, namespace_ in absent:
            kubectl(api, "delete", kind, name, "-n", namespace_, "--ignore-not-found", check=False)
        if stand_in_crd:
            put_back_crd(api, stand_in_crd)
        for name, node in nodes.items():
            now = kget(api, "node", name)
            meta = {}
            for key in ("labels", "annotations"):
                restored = dict((k, None) for k in now["metadata"].get(key) or {})
                restored.update(node["metadata"].get(key) or {})
                meta[key] = restored
            kubectl(api, "patch", "node", name, "--type=merge", "-p", json.dumps(
                {"metadata": meta, "spec": {"taints": node["spec"].get("taints")}}), check=False)
        kubectl(api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=json",
                "-p", json.dumps([{"op": "replace", "path": "/spec", "value": kubevirt["spec"]}]), check=False)
        if namespace:
            labels = dict((k, None) for k in kget(api, "namespace", NAMESPACE)["metadata"].get("labels") or {})
            labels.update(namespace["metadata"].get("labels") or {})
            kubectl(api, "patch", "namespace", NAMESPACE, "--type=merge", "-p",
                    json.dumps({"metadata": {"labels": labels}}), check=False)
        if policy:
            restore_cluster_policy(api, policy)
        # Last, so that a CRD the server is slow to let go of leaves everything else restored.
        delete_crds(api, sorted(crd_names(api) - crds))
        for what, seconds in lab_["timings"].items():
            report(what, seconds)


@pytest.fixture(scope="module")
def reconciled(lab, tmp_path_factory):
    """The cluster half's first run, then the operator started; waits until it has labelled every node."""
    api = lab["api"]
    inv = inventory(tmp_path_factory.mktemp("inv75"), api)
    proc, seconds = playbook(lab, inv)
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert PULL_SECRET[3] not in proc.stdout
    lab["timings"]["cluster half, first run"] = seconds
    started = time.monotonic()
    operatorlab(lab, "start", "--kubeconfig", api["kubeconfig"], "--namespace", NAMESPACE, "--restart",
                timeout=300, check=True)
    lab["timings"]["operator start"] = time.monotonic() - started
    status = json.loads(operatorlab(lab, "status", "--json", check=True).stdout)
    assert status["state"] == "running", status
    lab["operator"] = status
    try:
        wait_for("the operator labels every node", lambda: operator_done(api), timeout=300)
        lab["timings"]["operator start until every node is labelled"] = time.monotonic() - started
        want = {"nvidia-vgpu-manager-daemonset", "nvidia-vfio-manager", "nvidia-sandbox-device-plugin-daemonset",
                "nvidia-device-plugin-daemonset"}
        wait_for("the operator renders its operand DaemonSets",
                 lambda: (want <= set(operand_daemonsets(api)), sorted(operand_daemonsets(api))), timeout=300)
        lab["timings"]["operator start until the DaemonSets exist"] = time.monotonic() - started
        wait_for("the operator reports its ClusterPolicy", lambda: (
            (kget(api, "clusterpolicy", "cluster-policy").get("status") or {}).get("state") == "ready",
            kget(api, "clusterpolicy", "cluster-policy").get("status")), timeout=300)
        lab["timings"]["operator start until the ClusterPolicy is ready"] = time.monotonic() - started
    except AssertionError as exc:
        raise AssertionError("%s\noperator log (%s):\n%s" % (exc, status["log"], tail(status["log"])))
    lab["inventory"] = inv
    return lab


def tail(path, lines=40):
    try:
        with open(path, errors="replace") as handle:
            return "\n".join(handle.read().splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------------------------------------
# Tests, in order: each starts from what the one before left
# ---------------------------------------------------------------------------------------------

def test_operator_runs_out_of_cluster_with_the_charts_environment(reconciled):
    status = reconciled["operator"]
    assert status["server"] == reconciled["api"]["server"] and status["namespace"] == NAMESPACE
    assert status["env_from"] == "deployment %s/gpu-operator" % NAMESPACE
    assert status["env"]["VALIDATOR_IMAGE"] and status["env"]["DRIVER_MANAGER_IMAGE"]
    with open(status["log"], errors="replace") as handle:
        text = handle.read()
    assert "Kubernetes version detected" in text, text[-3000:]
    assert "Using container runtime: containerd" in text, text[-3000:]
    assert "failed to retrieve GPU node OS info" not in text, text[-3000:]
    # Every GPU Node on the server counts, lab-h200 (a node without a lab VM, outside this module's inventory) too.
    gpu_nodes = [n for n in kget(reconciled["api"], "nodes")["items"]
                 if (n["metadata"].get("labels") or {}).get("feature.node.kubernetes.io/pci-10de.present") == "true"]
    assert len(gpu_nodes) >= len(NODES)
    assert '"msg":"Number of nodes with GPU label","NodeCount":%d' % len(gpu_nodes) in text, text[-3000:]
    # The machine's /opt did not get the operator's layout: only the operator's own namespace has it.
    assert not os.path.exists("/opt/gpu-operator/state-driver")


def test_operator_labels_every_node_for_its_workload_type(reconciled):
    _done, seen = labelled(reconciled["api"], NODES)
    assert seen == {n: expected_deploy_labels(t) for n, t in NODES.items()}
    labels = node_labels(reconciled["api"])
    assert {n: labels[n].get(WL) for n in NODES} == {
        "lab-container": "container", "lab-passthrough": "vm-passthrough", "lab-vgpu": "vm-vgpu", "lab-dra": "container"}
    assert labels["lab-vgpu"][VG] == "A10-12Q"


def test_operand_daemonsets_select_the_right_nodes_with_the_right_images(reconciled):
    api = reconciled["api"]
    sets = operand_daemonsets(api)
    where = placement(api)
    assert where == expected_placement(NODES, where), where
    for name in ("nvidia-vfio-manager", "nvidia-sandbox-device-plugin-daemonset", "nvidia-sandbox-validator",
                 "nvidia-vgpu-manager-daemonset", "nvidia-vgpu-device-manager", "nvidia-device-plugin-daemonset",
                 "nvidia-container-toolkit-daemonset"):
        assert name in sets, sorted(sets)
    # The operator labels the VM nodes cc-manager=true, but with ccManager off (the collection's default, unlike
    # the chart's) it renders no CC manager that would switch their GPUs into CC mode.
    assert "nvidia-cc-manager" not in sets, sorted(sets)
    # Each operand runs the image the ClusterPolicy (the chart with the collection's values) names.
    policy = kget(api, "clusterpolicy", "cluster-policy")["spec"]
    labels = node_labels(api)
    vgpu_tag = os_tag(labels["lab-vgpu"])
    for name, ds in sets.items():
        spec = policy[OPERAND_SPEC[name]]
        image = main_container(ds)["image"]
        if name in ("nvidia-vgpu-manager-daemonset", "nvidia-driver-daemonset"):
            # The operator appends the GPU nodes' OS (<ID><VERSION_ID> of NFD's labels) to the tag.
            assert image == "%s-%s" % (image_of(spec), vgpu_tag), (name, image)
        else:
            assert image == image_of(spec), (name, image)
    vgpu = sets["nvidia-vgpu-manager-daemonset"]["spec"]["template"]["spec"]
    assert main_container(sets["nvidia-vgpu-manager-daemonset"])["image"] == \
        "registry.example/nvidia/vgpu-manager:550.90.05-%s" % vgpu_tag
    assert {"name": PULL_SECRET[0]} in vgpu.get("imagePullSecrets", [])
    assert kfind(api, "secret", PULL_SECRET[0], "-n", NAMESPACE)["type"] == "kubernetes.io/dockerconfigjson"
    manager = sets["nvidia-vgpu-device-manager"]["spec"]["template"]["spec"]
    config = [v for v in manager["volumes"] if v["name"] == "vgpu-config"][0]
    assert config["configMap"]["name"] == VGPU_CONFIGMAP
    stored = kget(api, "configmap", VGPU_CONFIGMAP, "-n", NAMESPACE)
    assert yaml.safe_load(stored["data"]["config.yaml"]) == VGPU_CONFIG
    # No operand selects the DRA node but the driver and the container toolkit.
    assert sorted(n for n, nodes in where.items() if DRA_NODE in nodes) == \
        ["nvidia-container-toolkit-daemonset", "nvidia-driver-daemonset"]


def test_second_run_keeps_what_the_operator_set(reconciled, tmp_path):
    """Every re-run of site.yml runs the cluster half again: it must not take the operator's labels away."""
    api = reconciled["api"]
    before_labels = node_labels(api)
    before_placement = placement(api)
    # This time the play also waits for the ClusterPolicy the real operator reports on.
    inv = inventory(tmp_path, api, name="inv-again", extra={"gpu_operator_wait_for_ready": True,
                                                            "gpu_operator_ready_timeout": 60})
    proc, seconds = playbook(reconciled, inv)
    reconciled["timings"]["cluster half, second run"] = seconds
    assert proc.returncode == 0, proc.stdout[-8000:]
    after = node_labels(api)
    lost = {n: sorted(k for k in deploy_labels(before_labels[n]) if deploy_labels(after[n]).get(k) != deploy_labels(before_labels[n])[k])
            for n in NODES}
    assert lost == {n: [] for n in NODES}, "the second run removed or changed the operator's labels: %s" % lost
    assert placement(api) == before_placement
    assert "Wait until the GPU Operator reports its ClusterPolicy ready" in proc.stdout
    assert all(r["changed"] == 0 for r in recaps(proc.stdout).values()), proc.stdout[-8000:]
    # The operator, still watching, has nothing to put back either.
    time.sleep(5)
    assert labelled(api, NODES)[0], labelled(api, NODES)[1]


def test_validate_finds_the_labels_the_real_operator_sets(reconciled):
    """validate.yml waits for deploy labels of each workload type: the real operator's must satisfy it. The vGPU
    Device Manager's state label comes from its pod, which never runs here: it is written by hand. No DRA
    driver runs either, so the wait for its ResourceSlices is off here (test_70 checks that wait).
    lab-container stands for an H200 with a MIG config: validate.yml also waits for the MIG Manager, which the
    operator deploys only where GPU Feature Discovery found a MIG-capable GPU. Its nvidia.com/mig.capable label and
    the MIG Manager's state label (from pods that never run here) are written by hand; the operator's deploy label
    for the MIG Manager is the operator's own."""
    api = reconciled["api"]
    kubectl(api, "label", "node", "lab-vgpu", "--overwrite", "nvidia.com/vgpu.config.state=success")
    kubectl(api, "label", "node", "lab-container", "--overwrite", "nvidia.com/mig.capable=true",
            "nvidia.com/mig.config.state=success")
    try:
        wait_for("the operator deploys the MIG Manager on lab-container", lambda: (
            node_labels(api)["lab-container"].get(DEPLOY + "mig-manager") == "true",
            deploy_labels(node_labels(api)["lab-container"])), timeout=120)
        proc, _seconds = playbook(reconciled, reconciled["inventory"], "validate.yml",
                                  "-e", "cluster_validate_retries=2", "-e", "cluster_validate_delay=1",
                                  "-e", "cluster_validate_dra_slices=false")
        assert proc.returncode == 0, proc.stdout[-8000:]
        for node, wtype in NODES.items():
            assert "Node %s (%s) is ready." % (node, wtype) in flat(proc.stdout), proc.stdout[-6000:]
    finally:
        kubectl(api, "label", "node", "lab-vgpu", "nvidia.com/vgpu.config.state-")
        # The operator never takes its MIG Manager label off a container node (it only adds it where a MIG-capable
        # GPU is): it goes with the MIG capability, in one change, so the operator has nothing to add it back for.
        kubectl(api, "label", "node", "lab-container", "nvidia.com/mig.capable-", "nvidia.com/mig.config.state-",
                DEPLOY + "mig-manager-")


def test_switching_a_node_type_moves_its_operands(reconciled, tmp_path):
    """lab-passthrough becomes a container node: the collection changes its workload label, the operator its
    deploy labels; the passthrough operands leave it and the container ones select it."""
    api = reconciled["api"]
    types = dict(NODES, **{"lab-passthrough": "container"})
    inv = inventory(tmp_path, api, name="inv-switched", hosts={"lab-passthrough": {"gpuops_workload_type": "container"}})
    proc, _seconds = playbook(reconciled, inv)
    assert proc.returncode == 0, proc.stdout[-8000:]
    started = time.monotonic()
    seen = wait_for("the operator relabels the switched node", lambda: labelled(api, types), timeout=180)
    report("switch: operator relabelled the node after", time.monotonic() - started)
    assert seen["lab-passthrough"] == expected_deploy_labels("container")
    where = placement(api)
    assert where == expected_placement(types, where), where
    assert "lab-passthrough" in where["nvidia-device-plugin-daemonset"]
    assert "lab-passthrough" not in where["nvidia-vfio-manager"]
    assert where["nvidia-sandbox-device-plugin-daemonset"] == ["lab-vgpu"]


def test_a_dra_node_turned_container_gets_the_container_operands(reconciled, tmp_path):
    """lab-dra becomes a container node. Its workload label stays container, so the operator sees no change to
    act on: it does not watch deploy labels, and would put back none the collection removed (its own `false`
    ones). The collection hands them over as `true`; the node ends up with the container operands (device
    plugin, validator, GFD, DCGM), and the run after that changes nothing."""
    api = reconciled["api"]
    types = dict(NODES, **{"lab-passthrough": "container", "lab-dra": "container"})
    hosts = {"lab-passthrough": {"gpuops_workload_type": "container"}, "lab-dra": {"gpuops_workload_type": "container"}}
    proc, _seconds = playbook(reconciled, inventory(tmp_path, api, name="inv-dra-container", hosts=hosts))
    assert proc.returncode == 0, proc.stdout[-8000:]
    seen = wait_for("the operator gives the former DRA node the container operands", lambda: labelled(api, types),
                    timeout=60)
    assert seen["lab-dra"] == expected_deploy_labels("container")
    where = placement(api)
    assert "lab-dra" in where["nvidia-device-plugin-daemonset"] and "lab-dra" in where["nvidia-operator-validator"]
    owned = json.loads(kget(api, "node", "lab-dra")["metadata"]["annotations"]["gpuops.sandbox/labels"])
    assert not [k for k in owned if k.startswith("nvidia.com/gpu.deploy.")], owned
    # The labels are the operator's now: the next run changes nothing.
    proc, _seconds = playbook(reconciled, inventory(tmp_path, api, name="inv-dra-container-again", hosts=hosts))
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert all(r["changed"] == 0 for r in recaps(proc.stdout).values()), proc.stdout[-8000:]
    assert labelled(api, types)[1]["lab-dra"] == expected_deploy_labels("container")


def volume_configmaps(daemonset):
    return sorted(v["configMap"]["name"] for v in daemonset["spec"]["template"]["spec"].get("volumes") or []
                  if v.get("configMap"))


def test_sharing_and_a_pre_installed_driver_reach_the_operators_operands(reconciled, tmp_path):
    """lab-container, an H200 asking for seven MIG instances and four-way time-slicing, turns out to have its driver
    installed on the host. The real operator wires what the chart and the labels ask: the device plugin DaemonSet
    has the config-manager and the collection's ConfigMap, the MIG Manager's DaemonSet mounts the collection's
    mig-parted configuration, and the driver DaemonSet no longer selects the node, whose deploy.driver label is the
    collection's false (kept by the operator)."""
    api = reconciled["api"]
    hosts = {"lab-passthrough": {"gpuops_workload_type": "container"}, "lab-dra": {"gpuops_workload_type": "container"},
             "lab-container": {"gpu_facts_host": HOST_DRIVER}}
    proc, _seconds = playbook(reconciled, inventory(tmp_path, api, name="inv-sharing", hosts=hosts))
    assert proc.returncode == 0, proc.stdout[-8000:]
    labels = node_labels(api)["lab-container"]
    assert (labels.get("nvidia.com/mig.config"), labels.get("nvidia.com/device-plugin.config"),
            labels.get(DEPLOY + "driver")) == ("h200-seven", "four-way", "false")

    def wired():
        sets = operand_daemonsets(api)
        plugin, mig = sets.get("nvidia-device-plugin-daemonset"), sets.get("nvidia-mig-manager")
        seen = {"plugin": plugin and (volume_configmaps(plugin),
                                      [c["name"] for c in plugin["spec"]["template"]["spec"]["containers"]]),
                "mig": mig and volume_configmaps(mig)}
        done = bool(plugin and mig and "gpuops-device-plugin-config" in seen["plugin"][0]
                    and "config-manager" in seen["plugin"][1] and "gpuops-mig-parted-config" in seen["mig"])
        return done, seen

    wait_for("the operator wires the collection's ConfigMaps into its operands", wired, timeout=180)
    where = placement(api)
    assert "lab-container" not in where["nvidia-driver-daemonset"], where
    assert sorted(where["nvidia-driver-daemonset"]) == ["lab-dra", "lab-passthrough"], where
    assert "lab-container" in where["nvidia-device-plugin-daemonset"], where
    policy = kget(api, "clusterpolicy", "cluster-policy")["spec"]
    assert policy["devicePlugin"]["config"]["name"] == "gpuops-device-plugin-config"
    assert policy["driver"]["enabled"] is True  # not every container node has a driver of its own
