"""Chart upgrades worked out before anything changes (issue 28, item 1): the release's history against the new chart's
version (semantic order, a release a stopped run left pending), the new chart's CRDs against the objects the cluster
stores (the real ClusterPolicy CRDs of the GPU Operator v25.10.1 and of the newer chart, and a made-up CRD that drops
a field), and the values the API server kept after the upgrade.

The real CRDs and charts come from ../shared/upstream beside the checkout; those tests are skipped without it."""

from __future__ import annotations

import copy
import functools
import os
import subprocess

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.chart_crds import chart_crds
from ansible_collections.gpuops.sandbox.plugins.filter.chart_upgrade_plan import chart_upgrade_plan
from ansible_collections.gpuops.sandbox.plugins.filter.crd_upgrade_problems import crd_upgrade_problems
from ansible_collections.gpuops.sandbox.plugins.filter.values_not_stored import values_not_stored
from ansible_collections.gpuops.sandbox.plugins.module_utils import _chart_upgrade
from ansible_collections.gpuops.sandbox.tests.unit.upstream_charts import NEW_CHART, NEW_DRA, OLD_CHART, OLD_DRA, helm_binary

POLICY_CRD = os.path.join("crds", "nvidia.com_clusterpolicies.yaml")
need_upstream = pytest.mark.skipif(not os.path.isdir(OLD_CHART) or not os.path.isdir(NEW_CHART),
                                   reason="the upstream charts are not beside this checkout (../shared/upstream)")
VARS = {"allow_downgrade": "gpu_operator_allow_downgrade", "pending_release": "gpu_operator_pending_release"}


LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=None)
def _load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=LOADER)  # nosec B506 - a safe loader


def load(path):
    return copy.deepcopy(_load(path))


@functools.lru_cache(maxsize=None)
def render(chart, *extra):
    helm = helm_binary()
    if not helm:
        pytest.skip("no helm binary (make kube-binaries builds one)")
    return subprocess.run([helm, "template", "gpu-operator", chart, "--namespace", "gpu-operator", "--kube-version",
                           "1.35.0"] + list(extra), capture_output=True, text=True, check=True, timeout=120).stdout


def revision(number, status, chart="gpu-operator-v25.10.1", updated="2026-11-28T10:00:00Z"):
    return {"revision": number, "updated": updated, "status": status, "chart": chart, "app_version": "x",
            "description": status}


def plan(history, version="v26.8.0", **kwargs):
    kwargs.setdefault("variables", VARS)
    return chart_upgrade_plan(history, {"name": "gpu-operator", "version": version}, "gpu-operator", "gpu-operator",
                              **kwargs)


# ---------------------------------------------------------------------------------------------
# Versions and the release's history
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("old,new,order", [
    ("v25.10.1", "v26.8.0", 1), ("v25.10.1", "25.10.1", 0), ("v25.10.1", "v1.0.0-devel", -1),
    ("0.4.1", "0.5.0-dev", 1), ("0.5.0-dev", "0.5.0", 1), ("0.5.0-alpha.2", "0.5.0-alpha.10", 1),
    ("0.5.0-alpha", "0.5.0-alpha.1", 1), ("0.5.0-alpha.beta", "0.5.0-alpha.1", -1), ("1.0.0+build.1", "1.0.0+build.2", 0),
    ("v25.3.4", "v25.10.0", 1),
])
def test_semantic_version_order(old, new, order):
    assert _chart_upgrade.compare_versions(old, new) == order


@pytest.mark.parametrize("bad", ["", "25.10", "latest", "v25.10.01", "1.2.3.4"])
def test_not_semantic_versions_are_refused(bad):
    with pytest.raises(ValueError, match="not a semantic version"):
        _chart_upgrade.semver_key(bad)


def test_chart_version_from_the_release():
    assert _chart_upgrade.chart_version("gpu-operator-v25.10.1", "gpu-operator") == "v25.10.1"
    assert _chart_upgrade.chart_version("dra-driver-nvidia-gpu-0.5.0-dev", "dra-driver-nvidia-gpu") == "0.5.0-dev"
    # The release ran a chart of another name: its version is still found.
    assert _chart_upgrade.chart_version("nvidia-gpu-operator-v25.3.0", "gpu-operator") == "v25.3.0"


@need_upstream
def test_the_repository_chart_is_lower_than_the_release_it_follows():
    """The newer chart as its repository has it says v1.0.0-devel (NVIDIA stamps the version when it packages a
    release): against an installed v25.10.1 that is a downgrade, refused unless asked for."""
    old, new = load(os.path.join(OLD_CHART, "Chart.yaml")), load(os.path.join(NEW_CHART, "Chart.yaml"))
    assert (old["version"], new["version"]) == ("v25.10.1", "v1.0.0-devel")
    found = chart_upgrade_plan([revision(1, "deployed")], new, "gpu-operator", "gpu-operator", variables=VARS)
    assert found["change"] == "downgrade" and len(found["problems"]) == 1


def test_no_release_is_an_install():
    found = plan([])
    assert (found["change"], found["problems"], found["rollback"]) == ("install", [], False)


def test_an_upgrade_a_same_version_and_the_installed_version():
    history = [revision(1, "superseded", "gpu-operator-v25.3.0"), revision(2, "deployed")]
    found = plan(history)
    assert (found["change"], found["installed_version"], found["target_version"], found["revision"]) == \
        ("upgrade", "v25.10.1", "v26.8.0", 2)
    assert found["problems"] == []
    assert plan(history, version="v25.10.1")["change"] == "same"


def test_a_downgrade_is_refused_unless_allowed():
    history = [revision(1, "deployed")]
    found = plan(history, version="v1.0.0-devel")
    assert found["change"] == "downgrade"
    assert found["problems"] == [
        "Chart gpu-operator v1.0.0-devel is older than v25.10.1, which release gpu-operator/gpu-operator runs: that is a "
        "downgrade. Set gpu_operator_allow_downgrade=true to downgrade on purpose (the chart's CRDs are then applied where "
        "they differ from the cluster's, after checking the stored objects keep every field)"]
    assert plan(history, version="v1.0.0-devel", allow_downgrade=True)["problems"] == []


def test_versions_that_cannot_be_ordered_are_refused_unless_allowed():
    found = plan([revision(1, "deployed", "gpu-operator-main")])
    assert found["change"] == "unknown"
    assert "Cannot tell whether chart gpu-operator v26.8.0 is newer than main, which release" in found["problems"][0]
    assert "gpu_operator_allow_downgrade=true" in found["problems"][0]
    assert plan([revision(1, "deployed", "gpu-operator-main")], allow_downgrade=True)["problems"] == []


@pytest.mark.parametrize("status", ["pending-upgrade", "pending-rollback"])
def test_a_pending_release_fails_by_default_naming_the_fix(status):
    history = [revision(1, "superseded"), revision(2, "deployed"), revision(3, status, "gpu-operator-v26.8.0")]
    found = plan(history, helm="/opt/helm")
    assert (found["pending"], found["rollback"], found["rollback_revision"], found["status"]) == (True, False, 2, status)
    # The installed version is the deployed revision's, not the pending one's.
    assert (found["change"], found["installed_version"]) == ("upgrade", "v25.10.1")
    assert len(found["problems"]) == 1
    text = found["problems"][0]
    assert text.startswith("Helm release gpu-operator/gpu-operator is %s (revision 3, since 2026-11-28T10:00:00Z)" % status)
    assert "another operation (install/upgrade/rollback) is in progress" in text
    assert "set gpu_operator_pending_release=rollback to roll it back to revision 2" in text
    assert "/opt/helm rollback gpu-operator 2 --namespace gpu-operator" in text


def test_a_pending_release_is_rolled_back_when_asked():
    history = [revision(1, "deployed"), revision(2, "pending-upgrade", "gpu-operator-v26.8.0")]
    found = plan(history, version="v26.8.0", pending_action="rollback")
    assert (found["rollback"], found["rollback_revision"], found["problems"], found["change"]) == \
        (True, 1, [], "upgrade")


def test_a_pending_install_cannot_be_rolled_back():
    found = plan([revision(1, "pending-install")], pending_action="rollback")
    assert found["rollback"] is False
    assert "It has no deployed revision to roll back to" in found["problems"][0]
    assert "helm uninstall gpu-operator --namespace gpu-operator --no-hooks" in found["problems"][0]


def test_a_failed_upgrade_is_not_pending():
    found = plan([revision(1, "superseded"), revision(2, "failed", "gpu-operator-v26.8.0")], version="v26.8.0")
    # No deployed revision: the latest one's chart is what the release runs.
    assert (found["pending"], found["change"], found["problems"]) == (False, "same", [])


def test_bad_filter_input_is_an_error_not_a_traceback():
    with pytest.raises(AnsibleFilterError, match="takes the list helm history"):
        chart_upgrade_plan("not a list", {}, "r", "n")
    with pytest.raises(AnsibleFilterError, match="chart must be the chart's Chart.yaml"):
        chart_upgrade_plan([], "v1", "r", "n")
    with pytest.raises(AnsibleFilterError, match="pending_action 'later' is not one of fail, rollback"):
        chart_upgrade_plan([], {}, "r", "n", pending_action="later")
    with pytest.raises(AnsibleFilterError, match="objects must be a list"):
        crd_upgrade_problems([], [], None)
    with pytest.raises(AnsibleFilterError, match="stored must be a list"):
        values_not_stored([], [1])
    with pytest.raises(AnsibleFilterError, match="takes the text"):
        chart_crds(None)


# ---------------------------------------------------------------------------------------------
# The chart's CRDs
# ---------------------------------------------------------------------------------------------

@need_upstream
def test_the_crds_of_the_charts_crds_directories_only():
    names = [c["metadata"]["name"] for c in chart_crds(render(NEW_CHART, "--include-crds"))]
    # The chart's own crds/ and its NFD subchart's file of three CRDs (printed after one Source line).
    assert names == ["clusterpolicies.nvidia.com", "gpuclusters.nvidia.com", "nvidiadrivers.nvidia.com",
                     "computedomaincliques.resource.nvidia.com", "computedomains.resource.nvidia.com",
                     "nodefeatures.nfd.k8s-sigs.io", "nodefeaturegroups.nfd.k8s-sigs.io", "nodefeaturerules.nfd.k8s-sigs.io"]
    assert chart_crds(render(NEW_CHART, "--include-crds"))[0] == load(os.path.join(NEW_CHART, POLICY_CRD))
    # The subchart's CRDs come only with the subchart.
    names = [c["metadata"]["name"] for c in chart_crds(render(NEW_CHART, "--include-crds", "--set", "nfd.enabled=false"))]
    assert not [n for n in names if "nfd" in n]
    # Without --include-crds, nothing.
    assert chart_crds(render(NEW_CHART)) == []


def test_a_crd_rendered_from_a_template_is_left_to_helm():
    text = ("---\n# Source: c/templates/crd.yaml\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
            "metadata:\n  name: a.example.com\n---\n# Source: c/crds/b.yaml\n---\napiVersion: apiextensions.k8s.io/v1\n"
            "kind: CustomResourceDefinition\nmetadata:\n  name: b.example.com\n---\n# Source: c/templates/cm.yaml\n"
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n")
    assert [c["metadata"]["name"] for c in chart_crds(text)] == ["b.example.com"]


# ---------------------------------------------------------------------------------------------
# The new CRDs against the stored objects (real ClusterPolicy CRDs)
# ---------------------------------------------------------------------------------------------

def policy_of(chart, *extra):
    docs = [d for d in yaml.load_all(render(chart, *extra), Loader=LOADER) if isinstance(d, dict)]  # nosec B506
    return next(d for d in docs if d["kind"] == "ClusterPolicy")


def stored_crd(crd):
    """The CRD as the cluster holds it: with the versions objects are stored in."""
    found = copy.deepcopy(crd)
    found["status"] = {"storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]}
    return found


@need_upstream
def test_the_new_clusterpolicy_crd_keeps_every_field_the_old_chart_stored():
    old, new = load(os.path.join(OLD_CHART, POLICY_CRD)), load(os.path.join(NEW_CHART, POLICY_CRD))
    stored = policy_of(OLD_CHART, "--set", "sandboxWorkloads.enabled=true,sandboxWorkloads.defaultWorkload=vm-passthrough")
    assert crd_upgrade_problems([new], [stored_crd(old)], [stored]) == []


@need_upstream
def test_the_old_clusterpolicy_crd_prunes_what_the_new_chart_sets():
    """Why Helm's upgrade alone is not enough: the new chart's ClusterPolicy under the old CRD loses fields, among
    them the sandbox mode the collection sets."""
    old = load(os.path.join(OLD_CHART, POLICY_CRD))
    schema = _chart_upgrade._version_schema(old, "v1")
    lost = _chart_upgrade.unknown_fields({"spec": policy_of(NEW_CHART)["spec"]}, schema)
    assert "spec.sandboxWorkloads.mode" in lost
    assert "spec.kataSandboxDevicePlugin" in lost
    new_schema = _chart_upgrade._version_schema(load(os.path.join(NEW_CHART, POLICY_CRD)), "v1")
    assert _chart_upgrade.unknown_fields({"spec": policy_of(NEW_CHART)["spec"]}, new_schema) == []


@need_upstream
def test_a_crd_that_drops_a_stored_field_is_named():
    old = load(os.path.join(OLD_CHART, POLICY_CRD))
    made_up = copy.deepcopy(load(os.path.join(NEW_CHART, POLICY_CRD)))
    spec = made_up["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    del spec["sandboxWorkloads"]["properties"]["defaultWorkload"]
    del spec["driver"]["properties"]["upgradePolicy"]["properties"]["drain"]["properties"]["timeoutSeconds"]
    stored = policy_of(OLD_CHART, "--set", "sandboxWorkloads.enabled=true,sandboxWorkloads.defaultWorkload=vm-vgpu")
    problems = crd_upgrade_problems([made_up], [stored_crd(old)], [stored])
    assert problems == [
        "ClusterPolicy cluster-policy uses spec.driver.upgradePolicy.drain.timeoutSeconds, "
        "spec.sandboxWorkloads.defaultWorkload, which the new chart's CRD clusterpolicies.nvidia.com does not know: the "
        "API server would drop them"]


def test_a_stored_version_the_new_crd_drops_is_named():
    def crd(versions, stored=None):
        doc = {"metadata": {"name": "widgets.example.com"},
               "spec": {"group": "example.com", "names": {"kind": "Widget"},
                        "versions": [{"name": v, "storage": v == versions[-1], "served": True,
                                      "schema": {"openAPIV3Schema": {"type": "object"}}} for v in versions]}}
        if stored:
            doc["status"] = {"storedVersions": stored}
        return doc
    assert crd_upgrade_problems([crd(["v1"])], [crd(["v1alpha1", "v1"], stored=["v1alpha1", "v1"])], []) == [
        "CRD widgets.example.com: objects are stored as version v1alpha1, which the new chart's CRD no longer has "
        "(the API server refuses that change until they are migrated)"]


SCHEMA = {"type": "object", "properties": {
    "spec": {"type": "object", "properties": {
        "known": {"type": "string"},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "envs": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "typed": {"type": "object", "additionalProperties": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        "empty": {"type": "object"},
    }}}}


def test_what_structural_pruning_keeps_and_drops():
    obj = {"spec": {"known": "x", "free": {"any": {"deep": 1}}, "labels": {"k": "v"},
                    "envs": [{"name": "a"}, {"name": "b", "value": "c"}, {"value": "d"}],
                    "typed": {"x": {"a": 1, "b": 2}}, "empty": {"gone": True}, "unknown": {"x": 1}},
           "status": {"state": "ready"}}
    assert _chart_upgrade.unknown_fields(obj, SCHEMA) == [
        "spec.empty.gone", "spec.envs[].value", "spec.typed.x.b", "spec.unknown", "status"]


# ---------------------------------------------------------------------------------------------
# After the upgrade: what the API server kept
# ---------------------------------------------------------------------------------------------

@need_upstream
def test_the_stored_clusterpolicy_kept_every_value_or_names_what_it_lost():
    rendered = policy_of(NEW_CHART, "--set", "sandboxWorkloads.enabled=true,sandboxWorkloads.mode=kubevirt")
    # Stored under the new CRD: everything kept (metadata and status the server adds are not compared).
    kept = copy.deepcopy(rendered)
    kept["metadata"]["uid"] = "1234"
    kept["status"] = {"state": "ready"}
    assert values_not_stored([rendered], [kept]) == []
    # Stored under the old CRD: what its schema lacks is gone.
    old = _chart_upgrade._version_schema(load(os.path.join(OLD_CHART, POLICY_CRD)), "v1")
    pruned = copy.deepcopy(rendered)
    del pruned["spec"]["sandboxWorkloads"]["mode"]
    del pruned["spec"]["kataSandboxDevicePlugin"]
    lost = values_not_stored([rendered], [pruned])
    assert len(lost) == 1 and lost[0].startswith("ClusterPolicy cluster-policy: ")
    assert "spec.sandboxWorkloads.mode dropped" in lost[0] and "spec.kataSandboxDevicePlugin dropped" in lost[0]
    assert set(_chart_upgrade.unknown_fields({"spec": rendered["spec"]}, old)) >= {"spec.sandboxWorkloads.mode"}


def test_values_changed_lists_nulls_and_missing_objects():
    rendered = [{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                 "spec": {"a": 1, "b": None, "list": [{"x": 1}, {"x": 2}], "other": [1, 2]}},
                {"kind": "Widget", "metadata": {"name": "gone"}, "spec": {}}]
    stored = [{"kind": "Widget", "metadata": {"name": "w", "namespace": "ns"},
               "spec": {"a": "1", "list": [{"x": 1}, {}], "other": [1]}}]
    assert values_not_stored(rendered, stored) == [
        "Widget w: spec.a is '1' instead of 1; spec.list[1].x dropped; spec.other is [1] instead of [1, 2]",
        "Widget gone was not found on the cluster"]


@pytest.mark.skipif(not os.path.isdir(OLD_DRA) or not os.path.isdir(NEW_DRA), reason="the upstream DRA charts are not here")
def test_the_dra_driver_crds_keep_what_the_older_chart_defined():
    """The DRA driver's ComputeDomain CRDs of 0.5.0-dev against those of 0.4.1: every version stays."""
    for name in ("resource.nvidia.com_computedomains.yaml", "resource.nvidia.com_computedomaincliques.yaml"):
        old, new = load(os.path.join(OLD_DRA, "crds", name)), load(os.path.join(NEW_DRA, "crds", name))
        assert crd_upgrade_problems([new], [stored_crd(old)], []) == []
