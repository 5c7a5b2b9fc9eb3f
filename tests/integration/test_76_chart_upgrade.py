"""Chart upgrades through the collection (issue 28, item 1), on the session's API server with the real GPU Operator charts.

The GPU Operator v25.10.1 chart (../shared/upstream/gpu-operator-v25.10.1/chart) is installed through
playbooks/cluster.yml, over its own ClusterPolicy CRD, as on a cluster that ran that release; then the run is pointed at
the newer chart (../shared/upstream/gpu-operator/chart). What is checked:
- the newer chart, stamped with a release version (v26.8.0-dev, as NVIDIA's packaging stamps its releases; a copy
  under the test's temporary directory: the repository's Chart.yaml says v1.0.0-devel, which is lower than v25.10.1
  and would be refused as a downgrade, see tests/unit/test_chart_upgrade.py), is an upgrade: the new chart's CRDs are
  applied first (the stored ClusterPolicy CRD has the new schema, applied by the collection's field manager, the new
  CRDs are there), the release is upgraded with the chart's CRD upgrade hook off (no hook Job), and the stored
  ClusterPolicy holds every value Helm sent, among them spec.sandboxWorkloads.mode, which only the new schema knows
  (the old one would prune it);
- going back to v25.10.1 is refused as a downgrade with nothing changed;
- a Helm upgrade killed while it waits for the chart's own CRD upgrade hook (a Job that never completes here) leaves
  the release pending-upgrade: the next run stops before any change naming the fix, and with
  gpu_operator_pending_release=rollback rolls it back to the last deployed revision and says so.

No GPU Operator process runs (the real operator runs only in test_75), nor any kubelet: the hook Job never starts.
The release has a namespace and name of its own. The ClusterPolicy CRD and the ClusterPolicy named cluster-policy are
cluster-wide and shared with test_70/72/75: the module takes the chart's CRD for its time and puts back the CRD and
the ClusterPolicy it found, deletes the CRDs the charts added and the hook's leftovers, and restores the node labels
(the namespace stays: the lab has no namespace controller to finish deleting it).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from chart_cluster import POLICY_CRD, TakenCluster, crd_names, said
from conftest import (UPSTREAM, VENV_PYTHON, gpu_host_vars, helm, helm_home_env, kfind, kget, kubectl, recaps,
                      timed_playbook, value_paths, write_inventory)

OLD_CHART = os.path.join(UPSTREAM, "gpu-operator-v25.10.1", "chart")
OLD_DRA = os.path.join(UPSTREAM, "dra-driver-nvidia-gpu-v0.4.1", "chart")
NEW_DRA = os.path.join(UPSTREAM, "dra-driver-nvidia-gpu", "chart")
DRA_NAMESPACE, DRA_RELEASE = "gpuops-dra-upgrade-76", "dra-driver-76"
DRA_CRDS = ("computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com")
NEW_CHART = os.path.join(UPSTREAM, "gpu-operator", "chart")
NAMESPACE, RELEASE = "gpuops-upgrade-76", "gpu-operator-76"
NEW_VERSION = "v26.8.0-dev"
NODES = {"lab-container": "container"}
LABELLED = ("lab-container", "lab-dra")
HOOK_OBJECTS = (("job", "gpu-operator-upgrade-crd", NAMESPACE), ("serviceaccount", "gpu-operator-upgrade-crd-hook-sa", NAMESPACE),
                ("clusterrole", "gpu-operator-upgrade-crd-hook-role", None),
                ("clusterrolebinding", "gpu-operator-upgrade-crd-hook-binding", None))
UPGRADE_POLICY = {"maxUnavailable": "50%", "drain": {"enable": True, "timeoutSeconds": 600}}

# The deep slice that proves this module's claims (tests/integration/tiers.py), and what it needs.
pytestmark = [pytest.mark.slice("cluster"),
              pytest.mark.skipif(not (os.path.isdir(OLD_CHART) and os.path.isdir(NEW_CHART)),
                                 reason="the upstream GPU Operator charts are not beside this checkout (../shared/upstream)")]


def report(what, seconds):
    print("test_76 timing: %s %.1f s" % (what, seconds), file=sys.stderr)


def history(lab):
    proc = helm(lab["api"], lab["helm_env"], "history", RELEASE, "-n", NAMESPACE, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else []


def state(lab):
    """What a refused run must leave as it was: the release's revisions, the CRD, the ClusterPolicy, the node's labels."""
    api = lab["api"]
    crd = kget(api, "crd", POLICY_CRD)
    policy = kfind(api, "clusterpolicy", "cluster-policy")
    return {"history": [(r["revision"], r["status"], r["chart"]) for r in history(lab)],
            "secrets": sorted(kubectl(api, "get", "secrets", "-n", NAMESPACE, "-l", "owner=helm", "-o", "name").stdout.split()),
            "crd": crd["metadata"]["resourceVersion"],
            "policy": policy and policy["metadata"]["resourceVersion"],
            "labels": {n: kget(api, "node", n)["metadata"].get("labels") for n in LABELLED}}


def inventory(lab, chart, name, extra=None):
    api = lab["api"]
    all_vars = {"gpuops_kubeconfig": api["kubeconfig"], "gpuops_kubevirt_enabled": False,
                "gpuops_driver_upgrade_policy": UPGRADE_POLICY,
                "gpu_operator_chart_repo_url": "", "gpu_operator_chart_ref": chart,
                "gpu_operator_helm_binary": os.path.join(api["bin_dir"], "helm"),
                "gpu_operator_namespace": NAMESPACE, "gpu_operator_release_name": RELEASE,
                "gpu_operator_default_workload": "vm-passthrough", "ansible_python_interpreter": VENV_PYTHON}
    all_vars.update(extra or {})
    nodes = {"lab-dra": "dra"} if all_vars.get("gpuops_gpu_operator_enabled") is False else NODES
    return write_inventory(lab["tmp"], name, all_vars, gpu_host_vars(nodes), VENV_PYTHON)


def playbook(lab, chart, name, what, extra=None):
    """cluster.yml on an inventory pointed at ``chart``; its output is kept beside the inventory (<name>.log)."""
    proc, seconds = timed_playbook(lab["helm_env"], inventory(lab, chart, name, extra), "cluster.yml")
    (lab["tmp"] / ("%s.log" % name)).write_text(proc.stdout)
    report(what, seconds)
    assert "Traceback" not in proc.stdout, proc.stdout[-6000:]
    return proc


@pytest.fixture(scope="module")
def lab(kube_api, tmp_path_factory):
    api = kube_api
    root = tmp_path_factory.mktemp("upgrade76")
    helm_env = helm_home_env(root / "helm")
    # The newer chart with a release's version, as NVIDIA's packaging stamps it (the repository says v1.0.0-devel).
    stamped = str(root / "gpu-operator")
    shutil.copytree(NEW_CHART, stamped)
    chart_yaml = os.path.join(stamped, "Chart.yaml")
    with open(chart_yaml, encoding="utf-8") as handle:
        meta = yaml.safe_load(handle)
    meta.update(version=NEW_VERSION, appVersion=NEW_VERSION)
    with open(chart_yaml, "w", encoding="utf-8") as handle:
        yaml.safe_dump(meta, handle)

    helm(api, helm_env, "uninstall", RELEASE, "-n", NAMESPACE, "--no-hooks", check=False)
    # A cluster that ran v25.10.1: its ClusterPolicy CRD (Helm keeps a CRD that is there, the session's stand-in).
    taken = TakenCluster(api, LABELLED).take(os.path.join(OLD_CHART, "crds", "nvidia.com_clusterpolicies.yaml"))
    started = time.monotonic()
    try:
        yield {"api": api, "helm_env": helm_env, "tmp": root, "stamped": stamped}
    finally:
        helm(api, helm_env, "uninstall", RELEASE, "-n", NAMESPACE, "--no-hooks", check=False)
        helm(api, helm_env, "uninstall", DRA_RELEASE, "-n", DRA_NAMESPACE, "--no-hooks", check=False)
        for kind, name, namespace in HOOK_OBJECTS:
            kubectl(api, "delete", kind, name, *(["-n", namespace] if namespace else []), "--ignore-not-found",
                    "--wait=false", check=False)
        taken.put_back()
        report("module, cleanup included", time.monotonic() - started)
        # What the module found is back.
        assert crd_names(api) == taken.crds
        now = kfind(api, "crd", POLICY_CRD)
        assert (now and now["spec"]["versions"]) == (taken.found_crd and taken.found_crd["spec"]["versions"])
        assert taken.node_labels() == {n: o["metadata"].get("labels") for n, o in taken.nodes.items()}


def test_upgrade_applies_the_new_crds_first_and_keeps_every_value(lab):
    api = lab["api"]
    proc = playbook(lab, OLD_CHART, "old", "install of v25.10.1")
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert [(r["revision"], r["status"], r["chart"]) for r in history(lab)] == [(1, "deployed", "gpu-operator-v25.10.1")]
    stored = kget(api, "clusterpolicy", "cluster-policy")["spec"]
    # The old chart has no sandbox mode, and its CRD no such field.
    assert "mode" not in stored["sandboxWorkloads"]
    old_schema = kget(api, "crd", POLICY_CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "mode" not in old_schema["properties"]["spec"]["properties"]["sandboxWorkloads"]["properties"]

    # Stamped v26.8.0-dev: an upgrade.
    proc = playbook(lab, lab["stamped"], "new", "upgrade to %s" % NEW_VERSION)
    assert proc.returncode == 0, proc.stdout[-8000:]
    text = said(proc)
    assert ("Helm release %s/%s goes from chart v25.10.1 to %s: the new chart's CRDs were applied first"
            % (NAMESPACE, RELEASE, NEW_VERSION)) in text, proc.stdout[-6000:]
    assert "operator.upgradeCRD=false" in text
    assert "ClusterPolicy/cluster-policy kept every value of chart %s" % NEW_VERSION in text, proc.stdout[-6000:]
    assert [(r["revision"], r["status"], r["chart"]) for r in history(lab)] == [
        (1, "superseded", "gpu-operator-v25.10.1"), (2, "deployed", "gpu-operator-%s" % NEW_VERSION)]

    # The CRD is the new chart's, applied by the collection's field manager; the CRDs new in this chart are there.
    crd = kget(api, "crd", POLICY_CRD, "--show-managed-fields")
    with open(os.path.join(NEW_CHART, "crds", "nvidia.com_clusterpolicies.yaml"), encoding="utf-8") as handle:
        new_crd = yaml.safe_load(handle)
    assert crd["spec"]["versions"][0]["schema"] == new_crd["spec"]["versions"][0]["schema"]
    assert "gpuops-sandbox" in [m["manager"] for m in crd["metadata"]["managedFields"] if m["operation"] == "Apply"]
    assert kfind(api, "crd", "gpuclusters.nvidia.com") is not None
    # The chart's hook did not run: the collection applied the CRDs.
    values = json.loads(helm(api, lab["helm_env"], "get", "values", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    assert values["operator"] == {"upgradeCRD": False}
    assert kfind(api, "job", "gpu-operator-upgrade-crd", "-n", NAMESPACE) is None

    # Every value of the ClusterPolicy Helm sent is stored, the one only the new schema knows among them.
    manifest = helm(api, lab["helm_env"], "get", "manifest", RELEASE, "-n", NAMESPACE).stdout
    sent = next(d for d in yaml.safe_load_all(manifest) if isinstance(d, dict) and d.get("kind") == "ClusterPolicy")
    stored = kget(api, "clusterpolicy", "cluster-policy")["spec"]
    assert stored["sandboxWorkloads"] == {"enabled": True, "defaultWorkload": "vm-passthrough", "mode": "kubevirt"}
    assert stored["driver"]["upgradePolicy"]["maxUnavailable"] == "50%"
    missing = []
    for path in value_paths(sent["spec"]):
        want, have = sent["spec"], stored
        for key in path:
            want, have = want[key], (have.get(key, KeyError) if isinstance(have, dict) else KeyError)
        if want is not None and have != want:
            missing.append(".".join(path))
    assert missing == [], missing


def test_a_downgrade_is_refused_and_nothing_changes(lab):
    before = state(lab)
    assert before["history"][-1] == (2, "deployed", "gpu-operator-%s" % NEW_VERSION)
    proc = playbook(lab, OLD_CHART, "downgrade", "refused downgrade")
    assert proc.returncode != 0
    assert ("Chart gpu-operator v25.10.1 is older than %s, which release %s/%s runs: that is a downgrade."
            % (NEW_VERSION, NAMESPACE, RELEASE)) in said(proc), proc.stdout[-6000:]
    assert "Nothing was changed." in said(proc)
    assert "TASK [Label and taint the GPU nodes]" not in proc.stdout
    assert state(lab) == before


def test_a_release_left_pending_by_a_killed_run_is_rolled_back_when_asked(lab):
    api = lab["api"]
    # An upgrade that runs the chart's own CRD hook: the Job never completes without a kubelet, so helm waits on it
    # with the release pending-upgrade; it is killed there, as a run stopped mid-upgrade.
    started = subprocess.Popen(  # pylint: disable=consider-using-with
        [os.path.join(api["bin_dir"], "helm"), "--kubeconfig", api["kubeconfig"], "upgrade", RELEASE, lab["stamped"],
         "-n", NAMESPACE, "--reuse-values", "--set", "operator.upgradeCRD=true"],
        env=lab["helm_env"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (history(lab) and history(lab)[-1]["status"] == "pending-upgrade"):
            time.sleep(0.5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and kfind(api, "job", "gpu-operator-upgrade-crd", "-n", NAMESPACE) is None:
            time.sleep(0.5)
        assert started.poll() is None, "helm upgrade ended on its own (rc %s)" % started.returncode
    finally:
        started.send_signal(signal.SIGKILL)
        started.wait(timeout=30)
    assert history(lab)[-1]["revision"] == 3 and history(lab)[-1]["status"] == "pending-upgrade", history(lab)

    # By default the run stops before any change, naming the state and the fix.
    before = state(lab)
    proc = playbook(lab, lab["stamped"], "pending", "refused pending release")
    assert proc.returncode != 0
    text = said(proc)
    assert "Helm release %s/%s is pending-upgrade (revision 3, since" % (NAMESPACE, RELEASE) in text, proc.stdout[-6000:]
    assert "another operation (install/upgrade/rollback) is in progress" in text
    assert "set gpu_operator_pending_release=rollback to roll it back to revision 2" in text
    assert "rollback %s 2 --namespace %s" % (RELEASE, NAMESPACE) in text
    assert "TASK [Label and taint the GPU nodes]" not in proc.stdout
    assert state(lab) == before

    # Asked to, the run rolls it back to revision 2 and says so; the release is then what the run wants.
    proc = playbook(lab, lab["stamped"], "rollback", "rollback of the pending release",
                    extra={"gpu_operator_pending_release": "rollback"})
    assert proc.returncode == 0, proc.stdout[-8000:]
    text = said(proc)
    assert ("Helm release %s/%s was pending-upgrade (revision 3, left by a run that was stopped): it was rolled back to "
            "revision 2 (chart %s)" % (NAMESPACE, RELEASE, NEW_VERSION)) in text, proc.stdout[-6000:]
    revisions = history(lab)
    assert (revisions[-1]["revision"], revisions[-1]["status"], revisions[-1]["chart"]) == \
        (4, "deployed", "gpu-operator-%s" % NEW_VERSION), revisions
    # Helm keeps the killed run's revision in the history as it was; the release's state is its latest revision's.
    assert [r["revision"] for r in revisions if r["status"].startswith("pending")] in ([], [3]), revisions
    values = json.loads(helm(api, lab["helm_env"], "get", "values", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    assert values["operator"] == {"upgradeCRD": False}
    assert recaps(proc.stdout)["localhost"]["failed"] == 0


def test_the_dra_driver_upgrade_applies_its_crds_first(lab):
    """The DRA driver 0.4.1 installed through cluster.yml (GPU Operator off), then moved to 0.5.0-dev. The cluster holds
    the GPU Operator chart's older ComputeDomain CRD (the operator's upgrade above applied it: no DRA driver release
    carried it then), which Helm's install would keep: the install applies the DRA driver chart's own with the
    collection's field manager first, and says so (issue 43, defect 5: CRDs are compared on every run, not only on an
    upgrade). The upgrade then finds them up to date (the same schemas in these two versions) and applies none."""
    if not (os.path.isdir(OLD_DRA) and os.path.isdir(NEW_DRA)):
        pytest.skip("the upstream DRA driver charts are not beside this checkout")
    api = lab["api"]
    dra = {"gpuops_gpu_operator_enabled": False, "dra_driver_chart_repo_url": "", "dra_driver_namespace": DRA_NAMESPACE,
           "dra_driver_release_name": DRA_RELEASE, "dra_driver_claim_templates": [],
           "dra_driver_helm_binary": os.path.join(api["bin_dir"], "helm")}
    proc = playbook(lab, OLD_CHART, "dra-old", "DRA driver 0.4.1 install", dict(dra, dra_driver_chart_ref=OLD_DRA))
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert ("Helm release %s/%s is installed from chart 0.4.1: the new chart's CRDs were applied first "
            "(computedomains.resource.nvidia.com)" % (DRA_NAMESPACE, DRA_RELEASE)) in said(proc), proc.stdout[-6000:]
    proc = playbook(lab, OLD_CHART, "dra-new", "DRA driver upgrade to 0.5.0-dev", dict(dra, dra_driver_chart_ref=NEW_DRA))
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert "TASK [gpuops.sandbox.dra_driver : Say which CRDs were applied and which were left alone]" in proc.stdout
    assert "goes from chart 0.4.1 to 0.5.0-dev" not in said(proc), proc.stdout[-6000:]
    found = json.loads(helm(api, lab["helm_env"], "history", DRA_RELEASE, "-n", DRA_NAMESPACE, "-o", "json").stdout)
    assert [(r["revision"], r["status"], r["chart"]) for r in found] == [
        (1, "superseded", "dra-driver-nvidia-gpu-0.4.1"), (2, "deployed", "dra-driver-nvidia-gpu-0.5.0-dev")]
    for name in DRA_CRDS:
        crd = kget(api, "crd", name, "--show-managed-fields")
        assert "gpuops-sandbox" in [m["manager"] for m in crd["metadata"]["managedFields"] if m["operation"] == "Apply"]
        path = os.path.join(NEW_DRA, "crds", "resource.nvidia.com_%s.yaml" % name.split(".", maxsplit=1)[0])
        with open(path, encoding="utf-8") as handle:
            assert crd["spec"]["versions"][0]["schema"] == yaml.safe_load(handle)["spec"]["versions"][0]["schema"]
