"""The cluster half (playbooks/cluster.yml) with the real upstream charts, against the cluster lab's API server.

The GPU Operator and DRA driver charts are the real ones from ../shared/upstream/ beside the checkout (see
its README), installed by path with the real helm. A clone without that folder runs the same plays with the
project's stand-in charts (tests/fixtures/charts) and skips only the checks of what the real charts render.
The lab's API server has no kubelet and no controllers: nothing the charts install ever runs, so nothing may
wait for readiness.

What is checked:
- a play with a vm-passthrough, a vm-vgpu and a dra host installs both charts; the objects the real charts
  render carry what the collection set (ClusterPolicy, DeviceClasses, the kubelet plugin's node selector)
  and every value the collection sets exists in the real chart's values.yaml;
- the next run changes nothing (PLAY RECAP changed=0 on every host), the ResourceClaimTemplate included;
- a changed template (count 2) is reported in check mode without changing anything, then replaced (deleted
  and created again) by a real run, which says so; a claim made from the old template is untouched;
- values a chart refuses stop the play in its preflight with the chart's own message, before anything
  changes (node labels, KubeVirt CR, Helm releases, claim templates read back before and after).

The module leaves the server as it found it: releases uninstalled, claim templates and the CRDs the charts
added deleted, node labels and the KubeVirt CR restored (the namespaces stay: without the lab's missing
namespace controller a deleted namespace would hang in Terminating).
"""

import json
import os
import sys

import pytest
import yaml

from conftest import (
    TOP,
    UPSTREAM,
    UPSTREAM_CHARTS,
    VENV_PYTHON,
    VGPU_MANAGER,
    chart_path_vars,
    delete_crds,
    flat,
    gpu_host_vars,
    helm,
    helm_home_env,
    in_values,
    kfind,
    kget,
    kubectl,
    recaps,
    restore_cluster_policy,
    timed_playbook,
    value_paths,
    write_inventory,
)


REAL_CHARTS = UPSTREAM_CHARTS
STAND_IN_CHARTS = {name: os.path.join(TOP, "tests", "fixtures", "charts", name) for name in REAL_CHARTS}
HAVE_UPSTREAM = all(os.path.isdir(path) for path in REAL_CHARTS.values())
CHARTS = REAL_CHARTS if HAVE_UPSTREAM else STAND_IN_CHARTS

NODES = {"lab-container": "dra", "lab-passthrough": "vm-passthrough", "lab-vgpu": "vm-vgpu", "lab-dra": "container"}
# GPU sharing on the container node (issue 27), with the facts of the real H200 host (FACTS.md): the MIG config and
# the device plugin's time-slicing config reach the real chart, its ConfigMaps and the ClusterPolicy the real CRD
# stores, with the driver's upgrade policy.
H200 = {"address": "0000:00:06.0", "vendor": "10de", "device": "2335", "class": "030200",
        "subsystem_vendor": "10de", "subsystem_device": "18bf", "driver": "nvidia", "is_bridge": False,
        "device_name": "GH100 [H200 SXM 141GB]"}
MIG_CONFIGS = {"all-disabled": [{"devices": "all", "mig-enabled": False}],
               "h200-three-2g": [{"device-filter": ["0x233510DE"], "devices": "all", "mig-enabled": True,
                                  "mig-devices": {"2g.35gb": 3}}]}
PLUGIN_CONFIGS = {"four-way": {"version": "v1", "sharing": {"timeSlicing": {"resources": [
    {"name": "nvidia.com/gpu", "replicas": 4}]}}}}
UPGRADE_POLICY = {"maxUnavailable": "50%", "drain": {"enable": True, "timeoutSeconds": 600}}
SHARING_VARS = {"gpuops_mig_configs": MIG_CONFIGS, "gpuops_device_plugin_configs": PLUGIN_CONFIGS,
                "gpuops_driver_upgrade_policy": UPGRADE_POLICY, "gpuops_driver_version": "580.95.05"}
SHARING_HOST = {"lab-dra": {"gpu_facts_gpus": [H200], "gpuops_mig_config": "h200-three-2g",
                            "gpuops_device_plugin_config": "four-way"}}
RELEASES = (("gpu-operator", "gpu-operator"), ("dra-driver-nvidia-gpu", "dra-driver-nvidia-gpu"))
CLAIM = {"name": "gpuops-test-vfio-gpu", "namespace": "default"}
CLAIM_MADE = "gpuops-test-claim-from-template"
RCT = "resourceclaimtemplates.v1.resource.k8s.io"
PULL_SECRET = ("vgpu-manager-registry", "registry.example", "robot", "not-a-real-password-72")
DEVICE_PLUGIN_OFF = {"nvidia.com/gpu.deploy.device-plugin": "false"}


# ---------------------------------------------------------------------------------------------
# Helpers (those test_70 and test_75 use too are in conftest)
# ---------------------------------------------------------------------------------------------

def claim_state(api):
    template = kfind(api, RCT, CLAIM["name"], "-n", CLAIM["namespace"])
    return template and (template["metadata"]["uid"], template["metadata"]["resourceVersion"])


def snapshot(api):
    """What the cluster half may change: node labels and taints, the KubeVirt CR, Helm releases, the claim template."""
    nodes = {n: kget(api, "node", n) for n in NODES}
    kubevirt = kget(api, "kubevirt", "kubevirt", "-n", "kubevirt")
    releases = kubectl(api, "get", "secrets", "-A", "-l", "owner=helm", "-o", "name").stdout.split()
    return {"nodes": {n: (o["metadata"].get("labels"), o["spec"].get("taints")) for n, o in nodes.items()},
            "kubevirt": (kubevirt["metadata"]["resourceVersion"], kubevirt["spec"]),
            "releases": sorted(releases), "claim": claim_state(api)}


def inventory(tmp_path, api, charts, name="inv", hosts=None, extra=None, claim_count=None):
    """The three GPU hosts (dra, vm-passthrough, vm-vgpu) with the facts gpu_facts would give for an A10."""
    claim = dict(CLAIM, **({"count": claim_count} if claim_count else {}))
    all_vars = chart_path_vars(api, charts, PULL_SECRET, [claim])
    all_vars.update(SHARING_VARS)
    all_vars.update(extra or {})
    return write_inventory(tmp_path, name, all_vars, gpu_host_vars(NODES, dict(SHARING_HOST, **(hosts or {}))),
                           VENV_PYTHON)


def playbook(helm_env, inv, *extra):
    """cluster.yml; returns (process, wall seconds)."""
    return timed_playbook(helm_env, inv, "cluster.yml", *extra)


def report(what, seconds):
    """Wall times go to the terminal (pytest -s) and to the test report (-rA shows them)."""
    line = "test_72 timing: %s %.1f s (%s charts)" % (what, seconds, "upstream" if HAVE_UPSTREAM else "stand-in")
    print(line, file=sys.stderr)
    return line


# ---------------------------------------------------------------------------------------------
# The module's setup and cleanup: the server is left as it was found
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def helm_env(tmp_path_factory):
    return helm_home_env(tmp_path_factory.mktemp("helm72"))


def server_state(api):
    """What the module may touch, to compare before and after it (resource versions left out)."""
    policy = kfind(api, "clusterpolicy", "cluster-policy")
    return {"crds": sorted(kubectl(api, "get", "crds", "-o", "name").stdout.split()),
            "nodes": {n: (o["metadata"].get("labels"), o["spec"].get("taints"))
                      for n, o in ((n, kget(api, "node", n)) for n in NODES)},
            "kubevirt": kget(api, "kubevirt", "kubevirt", "-n", "kubevirt")["spec"],
            "releases": sorted(kubectl(api, "get", "secrets", "-A", "-l", "owner=helm", "-o", "name").stdout.split()),
            "policy": policy and (policy["spec"], policy.get("status")),
            "claims": sorted(kubectl(api, "get", RCT + ",resourceclaims.v1.resource.k8s.io", "-A", "-o", "name").stdout.split()),
            "objects": sorted(kubectl(api, "get", "secrets,configmaps", "-n", "gpu-operator", "-o", "name",
                                      check=False).stdout.split())}


@pytest.fixture(scope="module")
def lab(kube_api, helm_env):
    api = kube_api
    # Releases of the same names left by an earlier session (the stand-in charts) would be upgraded to the
    # real charts, whose pre-upgrade hook Job never completes without a kubelet: start without them.
    for release, namespace in RELEASES:
        helm(api, helm_env, "uninstall", release, "-n", namespace, "--no-hooks", check=False)
    found = server_state(api)
    crds = set(found["crds"])
    nodes = {n: kget(api, "node", n) for n in NODES}
    kubevirt = kget(api, "kubevirt", "kubevirt", "-n", "kubevirt")
    # test_70 leaves a ClusterPolicy of its own named like the chart's: helm would refuse to take it over.
    policy = kfind(api, "clusterpolicy", "cluster-policy")
    if policy:
        kubectl(api, "delete", "clusterpolicy", "cluster-policy", "--wait=true")
    objects = [("secret", PULL_SECRET[0], "gpu-operator"), ("configmap", "gpuops-vgpu-devices-config", "gpu-operator")]
    absent = [o for o in objects if kfind(api, o[0], o[1], "-n", o[2]) is None]
    yield api
    for release, namespace in RELEASES:
        helm(api, helm_env, "uninstall", release, "-n", namespace, "--no-hooks", check=False)
    kubectl(api, "delete", RCT, CLAIM["name"], "-n", CLAIM["namespace"], "--ignore-not-found", check=False)
    kubectl(api, "delete", "resourceclaims.v1.resource.k8s.io", CLAIM_MADE, "-n", CLAIM["namespace"],
            "--ignore-not-found", check=False)
    for kind, name, namespace in absent:
        kubectl(api, "delete", kind, name, "-n", namespace, "--ignore-not-found", check=False)
    delete_crds(api, sorted(set(kubectl(api, "get", "crds", "-o", "name").stdout.split()) - crds))
    if policy:
        restore_cluster_policy(api, policy)
    for name, node in nodes.items():
        now = kget(api, "node", name)
        labels = dict((k, None) for k in now["metadata"].get("labels") or {})
        labels.update(node["metadata"].get("labels") or {})
        kubectl(api, "patch", "node", name, "--type=merge", "-p", json.dumps(
            {"metadata": {"labels": labels}, "spec": {"taints": node["spec"].get("taints")}}), check=False)
    kubectl(api, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=json",
            "-p", json.dumps([{"op": "replace", "path": "/spec", "value": kubevirt["spec"]}]), check=False)
    assert server_state(api) == found


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

def test_install_noop_rerun_and_claim_template_replacement(lab, helm_env, tmp_path, record_property):
    api = lab
    inv = inventory(tmp_path, api, CHARTS)
    proc, first = playbook(helm_env, inv)
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert recaps(proc.stdout)["localhost"]["changed"] > 0
    assert PULL_SECRET[3] not in proc.stdout
    record_property("first_run_seconds", round(first, 1))
    report("first run", first)

    # The kubelet plugin's node selector picks the dra host's node, which has no device plugin.
    labels = kget(api, "node", "lab-container")["metadata"]["labels"]
    assert {k: labels.get(k) for k in DEVICE_PLUGIN_OFF} == DEVICE_PLUGIN_OFF
    # The container node's sharing choices are its labels.
    labels = kget(api, "node", "lab-dra")["metadata"]["labels"]
    assert (labels.get("nvidia.com/mig.config"), labels.get("nvidia.com/device-plugin.config")) == \
        ("h200-three-2g", "four-way")
    template = kget(api, RCT, CLAIM["name"], "-n", CLAIM["namespace"])
    assert template["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"allocationMode": "ExactCount", "count": 1, "deviceClassName": "vfio.gpu.nvidia.com"}}]
    assert template["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpuops.sandbox"

    if HAVE_UPSTREAM:
        policy = kget(api, "clusterpolicy", "cluster-policy")
        assert policy["metadata"]["annotations"]["meta.helm.sh/release-name"] == "gpu-operator"
        spec = policy["spec"]
        assert spec["sandboxWorkloads"] == {"enabled": True, "defaultWorkload": "vm-passthrough", "mode": "kubevirt"}
        # The chart's default would run the CC manager with mode "on" on every VM node; the collection does not.
        assert (spec["ccManager"]["enabled"], spec["ccManager"]["defaultMode"]) == (False, "off")
        assert {k: spec["vgpuManager"].get(k) for k in VGPU_MANAGER} == VGPU_MANAGER
        assert spec["vgpuManager"]["imagePullSecrets"] == [PULL_SECRET[0]]
        assert spec["vgpuDeviceManager"]["config"]["name"] == "gpuops-vgpu-devices-config"
        # Sharing and the driver: the API server kept every value (the real CRD's schema prunes unknown ones), and the
        # chart made the ConfigMaps the MIG Manager and the device plugin read.
        assert spec["mig"]["strategy"] == "single"
        assert spec["migManager"]["config"] == {"name": "gpuops-mig-parted-config", "default": "all-disabled"}
        mig = kget(api, "configmap", "gpuops-mig-parted-config", "-n", "gpu-operator")
        assert yaml.safe_load(mig["data"]["config.yaml"]) == {"version": "v1", "mig-configs": MIG_CONFIGS}
        assert spec["devicePlugin"]["config"] == {"name": "gpuops-device-plugin-config", "default": ""}
        plugin = kget(api, "configmap", "gpuops-device-plugin-config", "-n", "gpu-operator")
        assert {k: yaml.safe_load(v) for k, v in plugin["data"].items()} == PLUGIN_CONFIGS
        policy_kept = spec["driver"]["upgradePolicy"]
        assert (policy_kept["maxUnavailable"], policy_kept["drain"]["enable"], policy_kept["drain"]["timeoutSeconds"]) == \
            ("50%", True, 600)
        assert policy_kept["autoUpgrade"] is True and policy_kept["maxParallelUpgrades"] == 1  # the chart's defaults
        assert spec["driver"]["version"] == "580.95.05"

        classes = {c["metadata"]["name"] for c in kget(api, "deviceclasses.v1.resource.k8s.io")["items"]}
        assert {"gpu.nvidia.com", "vfio.gpu.nvidia.com"} <= classes, classes
        sets = [d for d in kget(api, "daemonsets", "-n", "dra-driver-nvidia-gpu")["items"]
                if d["metadata"]["name"].endswith("kubelet-plugin")]
        assert len(sets) == 1, [d["metadata"]["name"] for d in sets]
        pod = sets[0]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == DEVICE_PLUGIN_OFF
        env = {e["name"]: e.get("value") for c in pod["containers"] for e in c.get("env", [])}
        assert env["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"
        assert "PassthroughSupport=true" in env["FEATURE_GATES"] and "DeviceMetadata=true" in env["FEATURE_GATES"]

        # Every value the collection set (the releases' user-supplied values) exists in the real chart.
        for release, namespace in RELEASES:
            values = json.loads(helm(api, helm_env, "get", "values", release, "-n", namespace, "-o", "json").stdout)
            with open(os.path.join(UPSTREAM, release, "values.yaml"), encoding="utf-8") as handle:
                upstream = yaml.safe_load(handle)
            missing = [".".join(p) for p in value_paths(values) if not in_values(upstream, p)]
            assert missing == [], "%s values not in the upstream chart: %s" % (release, missing)

    # The next run changes nothing, the Helm releases and the claim template included.
    before = snapshot(api)
    proc, noop = playbook(helm_env, inv)
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert all(r["changed"] == 0 for r in recaps(proc.stdout).values()), proc.stdout[-8000:]
    assert snapshot(api) == before
    record_property("noop_rerun_seconds", round(noop, 1))
    report("no-op re-run", noop)

    # A claim made from the template, as the resource claim controller makes one for a Pod (a copy of the spec).
    kubectl(api, "create", "-f", "-", stdin=json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": CLAIM_MADE, "namespace": CLAIM["namespace"]}, "spec": template["spec"]["spec"]}))
    made = kget(api, "resourceclaims.v1.resource.k8s.io", CLAIM_MADE, "-n", CLAIM["namespace"])

    # Two GPUs per claim: check mode says the template would be replaced and changes nothing...
    inv2 = inventory(tmp_path, api, CHARTS, name="inv-count2", claim_count=2)
    proc = playbook(helm_env, inv2, "--check")[0]
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert recaps(proc.stdout)["localhost"]["changed"] > 0
    assert "ResourceClaimTemplate default/%s would be replaced" % CLAIM["name"] in flat(proc.stdout), proc.stdout[-6000:]
    assert snapshot(api) == before

    # ...and a real run replaces it (deleted and created again) and says so; the claim made from it is untouched.
    proc = playbook(helm_env, inv2)[0]
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert "ResourceClaimTemplate default/%s was replaced (deleted and created again)" % CLAIM["name"] in flat(proc.stdout), \
        proc.stdout[-6000:]
    assert recaps(proc.stdout)["localhost"]["changed"] > 0
    replaced = kget(api, RCT, CLAIM["name"], "-n", CLAIM["namespace"])
    assert replaced["metadata"]["uid"] != template["metadata"]["uid"]
    assert replaced["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    after = kget(api, "resourceclaims.v1.resource.k8s.io", CLAIM_MADE, "-n", CLAIM["namespace"])
    assert (after["metadata"]["uid"], after["metadata"]["resourceVersion"], after["spec"]) == \
        (made["metadata"]["uid"], made["metadata"]["resourceVersion"], made["spec"])
    assert after["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    after_snapshot = snapshot(api)
    assert after_snapshot["releases"] == before["releases"] and after_snapshot["nodes"] == before["nodes"]

    # And the run after that is a no-op again.
    proc = playbook(helm_env, inv2)[0]
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert all(r["changed"] == 0 for r in recaps(proc.stdout).values()), proc.stdout[-8000:]


REFUSALS = [
    # The real DRA chart's templates/validation.yaml, and the stand-in's copy of that rule.
    pytest.param("dra-driver-nvidia-gpu", "stand-in", {"dra_driver_values": {"gpuResourcesEnabledOverride": False}},
                 "is refused without gpuResourcesEnabledOverride=true", id="dra-stand-in"),
    pytest.param("dra-driver-nvidia-gpu", "upstream", {"dra_driver_values": {"gpuResourcesEnabledOverride": False}},
                 "this DRA driver cannot be deployed alongside the standard GPU device plugin on the same node",
                 id="dra-upstream"),
    # The real GPU Operator chart's templates/validations.yaml.
    pytest.param("gpu-operator", "upstream", {"gpu_operator_values": {"cdi": {"enabled": False, "nriPluginEnabled": True}}},
                 "the NRI Plugin cannot be enabled when CDI is disabled", id="gpu-operator-upstream"),
]


@pytest.mark.parametrize("chart,source,extra,chart_says", REFUSALS)
def test_refused_values_stop_the_play_before_anything_changes(lab, helm_env, tmp_path, chart, source, extra, chart_says):
    if source == "upstream" and not HAVE_UPSTREAM:
        pytest.skip("the upstream charts are not beside this checkout")
    api = lab
    charts = dict(CHARTS, **({chart: STAND_IN_CHARTS[chart]} if source == "stand-in" else {}))
    # Had it gone on, the run would have changed lab-vgpu's vGPU config (its node label, the KubeVirt CR)
    # and a claim template.
    inv = inventory(tmp_path, api, charts, hosts={"lab-vgpu": {"gpuops_vgpu_config_name": "A10-4Q"}}, extra=extra,
                    claim_count=3)
    before = snapshot(api)
    proc = playbook(helm_env, inv)[0]
    assert proc.returncode != 0
    text = flat(proc.stdout)
    name = "The DRA driver chart" if chart == "dra-driver-nvidia-gpu" else "The GPU Operator chart"
    assert "%s %s refuses the values the play would install it with, so nothing is changed:" % (name, charts[chart]) in text, \
        proc.stdout[-6000:]
    assert chart_says in text, proc.stdout[-6000:]
    assert "TASK [Label and taint the GPU nodes]" not in proc.stdout
    assert "Traceback" not in proc.stdout and PULL_SECRET[3] not in proc.stdout
    assert snapshot(api) == before


HAND_MADE = [
    pytest.param("dra-driver-nvidia-gpu", "DRA driver", "deviceclasses.v1.resource.k8s.io",
                 {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vfio.gpu.nvidia.com"},
                  "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}},
                 "DeviceClass/vfio.gpu.nvidia.com", id="dra-device-class"),
    # Valid under the chart's own CRD, which the install before applied (its spec requires these sections; the
    # fixtures' CRD did not, so a spec of sandboxWorkloads alone passed only when this test ran first).
    pytest.param("gpu-operator", "GPU Operator", "clusterpolicies.nvidia.com",
                 {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
                  "spec": dict({section: {} for section in ("daemonsets", "dcgm", "dcgmExporter", "devicePlugin",
                                                            "driver", "gfd", "nodeStatusExporter", "operator",
                                                            "toolkit")},
                               sandboxWorkloads={"enabled": True})},
                 "ClusterPolicy/cluster-policy", id="gpu-operator-cluster-policy"),
]


@pytest.mark.parametrize("release,what,resource,hand_made,named", HAND_MADE)
def test_an_object_made_outside_the_release_stops_the_play_before_anything_changes(
        lab, helm_env, tmp_path, release, what, resource, hand_made, named):
    """A DeviceClass made by hand (as after following the DRA guide without the chart), or a ClusterPolicy of
    another GPU Operator installation, is found in the preflight instead of failing Helm half-way."""
    if not HAVE_UPSTREAM:
        pytest.skip("only the upstream charts render these objects")
    api = lab
    helm(api, helm_env, "uninstall", release, "-n", release, "--no-hooks", check=False)
    assert kfind(api, resource, hand_made["metadata"]["name"]) is None
    kubectl(api, "create", "-f", "-", stdin=json.dumps(hand_made))
    made = kget(api, resource, hand_made["metadata"]["name"])
    try:
        inv = inventory(tmp_path, api, CHARTS, hosts={"lab-vgpu": {"gpuops_vgpu_config_name": "A10-4Q"}}, claim_count=3)
        before = snapshot(api)
        proc = playbook(helm_env, inv)[0]
        assert proc.returncode != 0
        text = flat(proc.stdout)
        assert ("%s already exists and is not part of the Helm release %s/%s, so Helm would refuse to install the %s; "
                "nothing is changed." % (named, release, release, what)) in text, proc.stdout[-6000:]
        assert "meta.helm.sh/release-name=%s" % release in text
        assert "TASK [Label and taint the GPU nodes]" not in proc.stdout
        assert "Traceback" not in proc.stdout and PULL_SECRET[3] not in proc.stdout
        assert snapshot(api) == before
        # The object itself is untouched: same uid and resource version, not taken over.
        now = kget(api, resource, hand_made["metadata"]["name"])
        assert (now["metadata"]["uid"], now["metadata"]["resourceVersion"]) == (made["metadata"]["uid"],
                                                                                made["metadata"]["resourceVersion"])
    finally:
        kubectl(api, "delete", resource, hand_made["metadata"]["name"], "--ignore-not-found", check=False)
