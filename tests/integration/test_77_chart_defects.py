"""The chart side of issue 43 (defects 3 to 6) through playbooks/cluster.yml, on the session's API server with the real
charts from ../shared/upstream.

In order, on one GPU Operator release and one DRA driver release of the module's own:
- typos in the user's chart values (gpu_operator_values sandboxWorkloads.enable, dra_driver_values
  gpuResourcesEnabledOveride) stop the run in its preflight naming the key and the nearest one the chart has, with
  nothing changed (releases, CRDs, node labels);
- the GPU Operator v25.10.1 chart installed with the driver upgrade policy's maxUnavailable 0: the ClusterPolicy
  stores "0%" (the chart's template turns 0 into "25%");
- the DRA driver 0.5.0-dev installed beside it: its ComputeDomain CRDs (which the v25.10.1 operator chart lacks);
- the GPU Operator's repository chart (v1.0.0-devel, below v25.10.1) with gpu_operator_allow_downgrade=true: its CRDs
  are compared with the cluster's and applied where they differ (the ClusterPolicy CRD: spec.sandboxWorkloads.mode is
  stored), the ClusterPolicy is read back, and the ComputeDomain CRDs, which the DRA driver's release carries too,
  are left to it (said so by name): a ComputeDomain without numNodes, valid for the DRA driver's schema, is still
  accepted.

No operator, no kubelet. The module puts back the ClusterPolicy CRD and ClusterPolicy it found, uninstalls its
releases, deletes the CRDs it added and restores the node labels (namespaces stay: the lab has no namespace controller).
"""

import json
import os
import sys
import time

import pytest
import yaml

from chart_cluster import POLICY_CRD, TakenCluster, crd_names, said
from conftest import (UPSTREAM, VENV_PYTHON, gpu_host_vars, helm, helm_home_env, kget, kubectl, timed_playbook,
                      write_inventory)

OLD_CHART = os.path.join(UPSTREAM, "gpu-operator-v25.10.1", "chart")
NEW_CHART = os.path.join(UPSTREAM, "gpu-operator", "chart")
NEW_DRA = os.path.join(UPSTREAM, "dra-driver-nvidia-gpu", "chart")
NAMESPACE, RELEASE = "gpuops-defects-77", "gpu-operator-77"
DRA_NAMESPACE, DRA_RELEASE = "gpuops-dra-77", "dra-driver-77"
CD_CRD = "computedomains.resource.nvidia.com"
LABELLED = ("lab-container", "lab-dra")

pytestmark = [pytest.mark.slice("cluster"),
              pytest.mark.skipif(not all(os.path.isdir(c) for c in (OLD_CHART, NEW_CHART, NEW_DRA)),
                                 reason="the upstream charts are not beside this checkout (../shared/upstream)")]


def report(what, seconds):
    print("test_77 timing: %s %.1f s" % (what, seconds), file=sys.stderr)


def inventory(lab, name, extra=None, operator=True):
    api = lab["api"]
    helm_bin = os.path.join(api["bin_dir"], "helm")
    all_vars = {"gpuops_kubeconfig": api["kubeconfig"], "gpuops_kubevirt_enabled": False,
                "gpuops_driver_upgrade_policy": {"maxUnavailable": 0, "drain": {"enable": True}},
                "gpu_operator_chart_repo_url": "", "gpu_operator_chart_ref": OLD_CHART, "gpu_operator_helm_binary": helm_bin,
                "gpu_operator_namespace": NAMESPACE, "gpu_operator_release_name": RELEASE,
                "gpu_operator_default_workload": "vm-passthrough",
                "dra_driver_chart_repo_url": "", "dra_driver_chart_ref": NEW_DRA, "dra_driver_helm_binary": helm_bin,
                "dra_driver_namespace": DRA_NAMESPACE, "dra_driver_release_name": DRA_RELEASE,
                "dra_driver_claim_templates": [], "ansible_python_interpreter": VENV_PYTHON}
    if not operator:
        all_vars["gpuops_gpu_operator_enabled"] = False
    all_vars.update(extra or {})
    nodes = {"lab-container": "container"} if operator else {"lab-dra": "dra"}
    return write_inventory(lab["tmp"], name, all_vars, gpu_host_vars(nodes), VENV_PYTHON)


def playbook(lab, name, what, extra=None, operator=True):
    proc, seconds = timed_playbook(lab["helm_env"], inventory(lab, name, extra, operator), "cluster.yml")
    (lab["tmp"] / ("%s.log" % name)).write_text(proc.stdout)
    report(what, seconds)
    assert "Traceback" not in proc.stdout, proc.stdout[-6000:]
    return proc


def state(lab):
    """What a refused run must leave as it was: Helm's records, the CRDs and their versions, the node labels."""
    api = lab["api"]
    crds = kget(api, "crds")["items"]
    return {"releases": sorted(kubectl(api, "get", "secrets", "-A", "-l", "owner=helm", "-o", "name").stdout.split()),
            "crds": sorted((c["metadata"]["name"], c["metadata"]["resourceVersion"]) for c in crds),
            "labels": {n: kget(api, "node", n)["metadata"].get("labels") for n in LABELLED}}


def chart_crd(chart, name):
    with open(os.path.join(chart, "crds", name), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def lab(kube_api, tmp_path_factory):
    api = kube_api
    root = tmp_path_factory.mktemp("defects77")
    helm_env = helm_home_env(root / "helm")
    for release, namespace in ((RELEASE, NAMESPACE), (DRA_RELEASE, DRA_NAMESPACE)):
        helm(api, helm_env, "uninstall", release, "-n", namespace, "--no-hooks", check=False)
    # A cluster that ran v25.10.1: its ClusterPolicy CRD.
    taken = TakenCluster(api, LABELLED).take(os.path.join(OLD_CHART, "crds", "nvidia.com_clusterpolicies.yaml"))
    started = time.monotonic()
    try:
        yield {"api": api, "helm_env": helm_env, "tmp": root}
    finally:
        kubectl(api, "delete", "computedomains.resource.nvidia.com", "--all", "-A", "--ignore-not-found", check=False)
        for release, namespace in ((RELEASE, NAMESPACE), (DRA_RELEASE, DRA_NAMESPACE)):
            helm(api, helm_env, "uninstall", release, "-n", namespace, "--no-hooks", check=False)
        taken.put_back()
        report("module, cleanup included", time.monotonic() - started)
        assert crd_names(api) == taken.crds


def test_typos_in_chart_values_are_refused_with_nothing_changed(lab):
    before = state(lab)
    proc = playbook(lab, "typo-operator", "operator typo refused",
                    {"gpu_operator_values": {"sandboxWorkloads": {"enable": True}}})
    assert proc.returncode != 0
    text = said(proc)
    assert ("gpu_operator_values.sandboxWorkloads.enable is not a value of the chart (did you mean "
            "sandboxWorkloads.enabled?)") in text, proc.stdout[-6000:]
    assert "gpu_operator_values_free_form_keys" in text
    assert "TASK [Label and taint the GPU nodes]" not in proc.stdout
    assert state(lab) == before

    proc = playbook(lab, "typo-dra", "DRA typo refused", {"dra_driver_values": {"gpuResourcesEnabledOveride": True}},
                    operator=False)
    assert proc.returncode != 0
    assert ("dra_driver_values.gpuResourcesEnabledOveride is not a value of the chart (did you mean "
            "gpuResourcesEnabledOverride?)") in said(proc), proc.stdout[-6000:]
    assert "TASK [Label and taint the GPU nodes]" not in proc.stdout
    assert state(lab) == before


def test_max_unavailable_0_is_stored_as_0_percent(lab):
    proc = playbook(lab, "old", "install of v25.10.1 with maxUnavailable 0")
    assert proc.returncode == 0, proc.stdout[-8000:]
    policy = kget(lab["api"], "clusterpolicy", "cluster-policy")["spec"]
    assert policy["driver"]["upgradePolicy"]["maxUnavailable"] == "0%", policy["driver"]["upgradePolicy"]
    assert policy["driver"]["upgradePolicy"]["drain"]["enable"] is True
    values = json.loads(helm(lab["api"], lab["helm_env"], "get", "values", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    assert values["driver"]["upgradePolicy"]["maxUnavailable"] == "0%"
    # Read back after the install, not only after an upgrade.
    assert "ClusterPolicy/cluster-policy kept every value of chart v25.10.1" in said(proc), proc.stdout[-6000:]


def test_the_dra_driver_install_brings_its_compute_domain_crds(lab):
    proc = playbook(lab, "dra", "DRA driver 0.5.0-dev install", operator=False)
    assert proc.returncode == 0, proc.stdout[-8000:]
    stored = kget(lab["api"], "crd", CD_CRD)
    want = chart_crd(NEW_DRA, "resource.nvidia.com_computedomains.yaml")
    assert stored["spec"]["versions"][0]["schema"] == want["spec"]["versions"][0]["schema"]


def test_the_devel_chart_with_the_opt_in_applies_its_crds_and_leaves_the_dra_drivers(lab):
    api = lab["api"]
    proc = playbook(lab, "devel", "devel chart over v25.10.1 (allow_downgrade)",
                    {"gpu_operator_chart_ref": NEW_CHART, "gpu_operator_allow_downgrade": True})
    assert proc.returncode == 0, proc.stdout[-8000:]
    text = said(proc)
    assert ("Helm release %s/%s goes from chart v25.10.1 to v1.0.0-devel: the new chart's CRDs were applied first"
            % (NAMESPACE, RELEASE)) in text, proc.stdout[-6000:]
    assert ("left alone: %s, the chart of Helm release %s/%s (chart dra-driver-nvidia-gpu-0.5.0-dev) carries it too"
            % (CD_CRD, DRA_NAMESPACE, DRA_RELEASE)) in text, proc.stdout[-6000:]
    assert "ClusterPolicy/cluster-policy kept every value of chart v1.0.0-devel" in text, proc.stdout[-6000:]

    # The ClusterPolicy CRD is the chart's, and the field only it knows is stored.
    crd = kget(api, "crd", POLICY_CRD)
    new = chart_crd(NEW_CHART, "nvidia.com_clusterpolicies.yaml")
    assert crd["spec"]["versions"][0]["schema"] == new["spec"]["versions"][0]["schema"]
    policy = kget(api, "clusterpolicy", "cluster-policy")["spec"]
    assert policy["sandboxWorkloads"]["mode"] == "kubevirt"
    assert policy["driver"]["upgradePolicy"]["maxUnavailable"] == "0%"

    # The DRA driver's ComputeDomain CRD is its own still: a ComputeDomain without numNodes is accepted.
    stored = kget(api, "crd", CD_CRD)
    theirs = chart_crd(NEW_DRA, "resource.nvidia.com_computedomains.yaml")
    assert stored["spec"]["versions"][0]["schema"] == theirs["spec"]["versions"][0]["schema"]
    domain = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
              "metadata": {"name": "no-num-nodes", "namespace": "default"},
              "spec": {"channel": {"resourceClaimTemplate": {"name": "no-num-nodes-channel"}}}}
    created = kubectl(api, "create", "-f", "-", stdin=json.dumps(domain), check=False)
    assert created.returncode == 0, created.stderr
    kubectl(api, "delete", "computedomain", "no-num-nodes", "-n", "default", check=False)
