"""The chart side of issue 43, against the real charts in ../shared/upstream (skipped without them):

- 3: values the GPU Operator chart passes through Helm's ``default`` (maxUnavailable 0 would become "25%"): 0 is given
  as "0%", which the chart renders as given; a value with no other spelling (nlsEnabled false) is refused;
- 4: the GPU Operator chart's ComputeDomain CRDs, which the DRA driver chart carries too (a newer copy), are left to
  the DRA driver's release;
- 5: the chart's CRDs are compared with the cluster's whatever the order of the chart versions;
- 6: the user's chart values against the chart's values.yaml: a typo is named with its full path and the nearest key.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import os
import subprocess

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.chart_values_as_given import chart_values_as_given
from ansible_collections.gpuops.sandbox.plugins.filter.chart_values_problems import chart_values_problems
from ansible_collections.gpuops.sandbox.plugins.filter.crd_apply_plan import crd_apply_plan
from ansible_collections.gpuops.sandbox.plugins.filter.helm_release_crds import helm_release_crds
from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted
from ansible_collections.gpuops.sandbox.tests.unit.upstream_charts import NEW_CHART, NEW_DRA, OLD_CHART, OLD_DRA, helm_binary

pytestmark = pytest.mark.skipif(not all(os.path.isdir(c) for c in (NEW_CHART, OLD_CHART, NEW_DRA, OLD_DRA)),
                                reason="the upstream charts are not beside this checkout (../shared/upstream)")
CD = "computedomains.resource.nvidia.com"
CLIQUES = "computedomaincliques.resource.nvidia.com"


def read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def chart_yaml(chart):
    return yaml.safe_load(read(os.path.join(chart, "Chart.yaml")))


def crd(chart, name):
    return yaml.safe_load(read(os.path.join(chart, "crds", "resource.nvidia.com_%s.yaml" % name)))


def render(chart, values):
    helm = helm_binary()
    if not helm:
        pytest.skip("no helm binary (make kube-binaries builds one)")
    proc = subprocess.run([helm, "template", "gpu-operator", chart, "--namespace", "gpu-operator", "--kube-version",
                           "1.35.0", "--values", "-"], input=json.dumps(values), capture_output=True, text=True,
                          check=True, timeout=120)
    return proc.stdout


def policy_spec(text):
    return next(d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind") == "ClusterPolicy")["spec"]


def operator_values(**inputs):
    """The release values of role gpu_operator for ``inputs``, templated as Ansible templates the role's files."""
    found = dict(trusted(load("roles/gpu_operator/defaults/main.yml")), groups={"gpu_nodes": []}, hostvars={})
    found.update(inputs)
    found.update(trusted(load("roles/gpu_operator/vars/main.yml")))
    return templar(found).template(trusted("{{ __gpu_operator_release_values }}"))


# ---------------------------------------------------------------------------------------------
# 3: values the chart passes through Helm's default
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("chart", [NEW_CHART, OLD_CHART], ids=["chart", "v25.10.1"])
def test_the_chart_turns_max_unavailable_0_into_25_percent_and_keeps_0_percent(chart):
    """What the fix rests on: the real charts render 0 as "25%" and "0%" as given."""
    assert policy_spec(render(chart, {"driver": {"upgradePolicy": {"maxUnavailable": 0}}}))["driver"][
        "upgradePolicy"]["maxUnavailable"] == "25%"
    assert policy_spec(render(chart, {"driver": {"upgradePolicy": {"maxUnavailable": "0%"}}}))["driver"][
        "upgradePolicy"]["maxUnavailable"] == "0%"


@pytest.mark.parametrize("given", [0, "0"])
def test_max_unavailable_0_reaches_the_cluster_policy_as_0_percent(given):
    values = operator_values(gpuops_driver_upgrade_policy={"maxUnavailable": given, "drain": {"enable": True}})
    assert values["driver"]["upgradePolicy"] == {"maxUnavailable": "0%", "drain": {"enable": True}}
    assert policy_spec(render(NEW_CHART, values))["driver"]["upgradePolicy"]["maxUnavailable"] == "0%"
    # Given through the user's own values too.
    values = operator_values(gpu_operator_values={"driver": {"upgradePolicy": {"maxUnavailable": given}}})
    assert values["driver"]["upgradePolicy"]["maxUnavailable"] == "0%"


def test_other_values_are_left_as_they_are():
    values = {"driver": {"upgradePolicy": {"maxUnavailable": 2, "autoUpgrade": False}}, "x": [0]}
    assert chart_values_as_given(values, "gpu-operator") == values
    assert chart_values_as_given({"driver": {"upgradePolicy": {"maxUnavailable": 0}}}, "dra-driver-nvidia-gpu") == {
        "driver": {"upgradePolicy": {"maxUnavailable": 0}}}
    before = {"driver": {"upgradePolicy": {"maxUnavailable": 0}}}
    chart_values_as_given(before, "gpu-operator")
    assert before == {"driver": {"upgradePolicy": {"maxUnavailable": 0}}}
    with pytest.raises(AnsibleFilterError, match="as a mapping"):
        chart_values_as_given([0], "gpu-operator")


def test_a_value_the_chart_replaces_with_no_other_spelling_is_refused():
    values_yaml = read(os.path.join(NEW_CHART, "values.yaml"))
    chart = chart_yaml(NEW_CHART)
    problems = chart_values_problems({"driver": {"licensingConfig": {"nlsEnabled": False}}}, values_yaml, chart=chart,
                                     where="gpu_operator_values")
    assert len(problems) == 1
    assert problems[0].startswith("gpu_operator_values.driver.licensingConfig.nlsEnabled is false, which the "
                                  "gpu-operator chart replaces with its default true"), problems
    problems = chart_values_problems({"driver": {"upgradePolicy": {"maxUnavailable": ""}}}, values_yaml, chart=chart,
                                     where="gpu_operator_values")
    assert len(problems) == 1 and 'maxUnavailable is "", which the gpu-operator chart replaces with its default "25%"' \
        in problems[0], problems
    # 0 has a spelling the chart keeps: no problem.
    assert chart_values_problems({"driver": {"upgradePolicy": {"maxUnavailable": 0}}}, values_yaml, chart=chart) == []


# ---------------------------------------------------------------------------------------------
# 6: the user's keys against the chart's values.yaml
# ---------------------------------------------------------------------------------------------

def test_the_typos_of_the_issue_are_named_with_the_nearest_key():
    problems = chart_values_problems({"sandboxWorkloads": {"enable": True}}, read(os.path.join(NEW_CHART, "values.yaml")),
                                     chart=chart_yaml(NEW_CHART), where="gpu_operator_values")
    assert problems == ["gpu_operator_values.sandboxWorkloads.enable is not a value of the chart (did you mean "
                        "sandboxWorkloads.enabled?)"]
    problems = chart_values_problems({"gpuResourcesEnabledOveride": True}, read(os.path.join(NEW_DRA, "values.yaml")),
                                     chart=chart_yaml(NEW_DRA), where="dra_driver_values")
    assert problems == ["dra_driver_values.gpuResourcesEnabledOveride is not a value of the chart (did you mean "
                        "gpuResourcesEnabledOverride?)"]


def test_what_the_role_sets_and_the_readme_suggests_is_known():
    values_yaml = read(os.path.join(NEW_CHART, "values.yaml"))
    values = operator_values(gpuops_driver_upgrade_policy={"maxUnavailable": "50%"}, gpuops_driver_version="1",
                             gpuops_mig_strategy="mixed", gpu_operator_vgpu_config_default="x")
    assert chart_values_problems(values, values_yaml, chart=chart_yaml(NEW_CHART)) == []
    # The role's own sandboxWorkloads.mode is new in the newer chart (v25.10.1 ignores it): only the user's own
    # values are checked, so the role goes on installing v25.10.1.
    assert chart_values_problems(values, read(os.path.join(OLD_CHART, "values.yaml")), chart=chart_yaml(OLD_CHART)) == [
        "values.sandboxWorkloads.mode is not a value of the chart (the chart has defaultWorkload, enabled)"]
    assert chart_values_problems({"nfd": {"enabled": False}}, values_yaml, chart=chart_yaml(NEW_CHART)) == []
    dra = templar(dict(trusted(load("roles/dra_driver/defaults/main.yml")),
                       **trusted(load("roles/dra_driver/vars/main.yml")))).template(
        trusted("{{ __dra_driver_release_values }}"))
    for chart in (NEW_DRA, OLD_DRA):
        assert chart_values_problems(dra, read(os.path.join(chart, "values.yaml")), chart=chart_yaml(chart)) == []


def test_free_form_maps_are_not_checked_below():
    values_yaml = read(os.path.join(NEW_CHART, "values.yaml"))
    chart = chart_yaml(NEW_CHART)
    loaded = yaml.safe_load(values_yaml)
    # Known free-form maps of the real chart: a node selector, tolerations, labels, annotations, resources, env.
    free = {"operator": {"nodeSelector": {"any/key": "x"}, "annotations": {"a/b": "c"},
                         "resources": {"limits": {"cpu": "1"}}},
            "daemonsets": {"labels": {"team": "gpu"}, "tolerations": [{"key": "k"}]},
            "driver": {"env": [{"name": "A", "value": "1"}]},
            # A subchart's values are the subchart's own; global is Helm's.
            "node-feature-discovery": {"worker": {"anythingTheSubchartHas": 1}}, "global": {"x": 1}}
    assert chart_values_problems(free, values_yaml, chart=chart) == []
    # A map whose default is empty takes any key.
    assert loaded["devicePlugin"]["config"]["data"] == {}
    assert chart_values_problems({"devicePlugin": {"config": {"data": {"my-config": "..."}}},
                                  "dcgmExporter": {"serviceMonitor": {"additionalLabels": {"release": "x"}}}},
                                 values_yaml, chart=chart) == []
    # Below a known map, an unknown key is named at its full path; the opt-out takes a dotted path.
    typo = {"operator": {"upgradeCRDD": True}}
    assert chart_values_problems(typo, values_yaml, chart=chart, where="v") == [
        "v.operator.upgradeCRDD is not a value of the chart (did you mean operator.upgradeCRD?)"]
    assert chart_values_problems(typo, values_yaml, chart=chart, free_form=["operator"]) == []
    assert chart_values_problems(typo, values_yaml, chart=chart, free_form=["operator.upgradeCRDD"]) == []
    # Nothing near: the keys there are listed.
    far = chart_values_problems({"zzqqxx": 1}, values_yaml, chart=chart)
    assert len(far) == 1 and "values.zzqqxx is not a value of the chart (the chart has " in far[0]


def test_bad_input_is_an_error_not_a_traceback():
    with pytest.raises(AnsibleFilterError, match="must be a mapping of chart values"):
        chart_values_problems(["x"], "{}")
    with pytest.raises(AnsibleFilterError, match="not valid YAML"):
        chart_values_problems({}, "a: [")
    with pytest.raises(AnsibleFilterError, match="free_form must be a list"):
        chart_values_problems({}, "{}", free_form="operator")


# ---------------------------------------------------------------------------------------------
# 4 and 5: the chart's CRDs against the cluster's, and the CRDs of other releases
# ---------------------------------------------------------------------------------------------

def stored(doc):
    """A CRD as the API server returns it: its defaults added, status and metadata filled in."""
    found = copy.deepcopy(doc)
    found["spec"].setdefault("conversion", {"strategy": "None"})
    for version in found["spec"]["versions"]:
        version.setdefault("served", True)
    found["metadata"].update(resourceVersion="12", uid="u", generation=1)
    found["status"] = {"storedVersions": [v["name"] for v in found["spec"]["versions"] if v.get("storage")]}
    return found


def release_secret(namespace, name, chart):
    """A Helm release Secret as Helm writes it, for the chart directory ``chart``."""
    files = []
    for entry in sorted(os.listdir(os.path.join(chart, "crds"))):
        with open(os.path.join(chart, "crds", entry), "rb") as handle:
            files.append({"name": "crds/" + entry, "data": base64.b64encode(handle.read()).decode()})
    files.append({"name": "README.md", "data": base64.b64encode(b"x").decode()})
    record = {"name": name, "namespace": namespace, "version": 1, "config": {"password": "not-returned"},
              "chart": {"metadata": chart_yaml(chart), "files": files, "templates": []}}
    inner = base64.b64encode(gzip.compress(json.dumps(record).encode())).decode()
    return {"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
            "metadata": {"name": "sh.helm.release.v1.%s.v1" % name, "namespace": namespace,
                         "labels": {"owner": "helm", "name": name, "status": "deployed"}},
            "data": {"release": base64.b64encode(inner.encode()).decode()}}


def test_the_two_charts_carry_the_compute_domain_crds_and_the_operators_is_older():
    """The layout the fix is for: the same two CRDs in both charts, the ComputeDomain one differing (the DRA
    driver's makes numNodes optional)."""
    ours, theirs = crd(NEW_CHART, "computedomains"), crd(NEW_DRA, "computedomains")
    assert ours["spec"] != theirs["spec"]
    required = ours["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].get("required", [])
    assert "numNodes" in required
    assert "numNodes" not in theirs["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].get(
        "required", [])
    assert crd(NEW_CHART, "computedomaincliques")["spec"] == crd(NEW_DRA, "computedomaincliques")["spec"]


def test_the_release_records_say_which_crds_their_charts_carry():
    secrets = [release_secret("dra", "dra-driver", NEW_DRA), release_secret("gpu-operator", "gpu-operator", NEW_CHART),
               {"type": "Opaque", "data": {"release": "eA=="}}, {"type": "helm.sh/release.v1", "data": {"release": "!!"}}]
    found = helm_release_crds(secrets, exclude="gpu-operator/gpu-operator")
    assert found == [{"release": "dra/dra-driver", "chart": "dra-driver-nvidia-gpu-0.5.0-dev",
                      "crds": [CLIQUES, CD]}]
    assert "not-returned" not in json.dumps(found)
    with pytest.raises(AnsibleFilterError, match="takes a list"):
        helm_release_crds({})


def test_the_operator_leaves_the_dra_drivers_crds_to_its_release():
    new = [crd(NEW_CHART, "computedomains"), crd(NEW_CHART, "computedomaincliques")]
    cluster = [stored(crd(NEW_DRA, "computedomains")), stored(crd(NEW_DRA, "computedomaincliques"))]
    # Without knowing the other release, the differing ComputeDomain CRD would be applied (the defect).
    plan = crd_apply_plan(new, cluster)
    assert [c["metadata"]["name"] for c in plan["apply"]] == [CD] and plan["differ"] == [CD]
    others = helm_release_crds([release_secret("dra", "dra-driver", NEW_DRA)])
    plan = crd_apply_plan(new, cluster, others=others)
    assert plan["apply"] == []
    assert plan["left"] == [
        {"name": CD, "reason": "the chart of Helm release dra/dra-driver (chart dra-driver-nvidia-gpu-0.5.0-dev) "
                               "carries it too, and its copy is on the cluster: left to that release"},
        {"name": CLIQUES, "reason": "up to date"}]


def test_the_chart_crds_are_compared_whatever_the_version_order():
    """The repository's chart (v1.0.0-devel, below v25.10.1) over the v25.10.1 CRDs: the ClusterPolicy CRD differs and
    is applied, a CRD the cluster lacks is applied, one it holds as the chart has it is left."""
    policy_new = yaml.safe_load(read(os.path.join(NEW_CHART, "crds", "nvidia.com_clusterpolicies.yaml")))
    policy_old = yaml.safe_load(read(os.path.join(OLD_CHART, "crds", "nvidia.com_clusterpolicies.yaml")))
    drivers = yaml.safe_load(read(os.path.join(NEW_CHART, "crds", "nvidia.com_nvidiadrivers.yaml")))
    cliques = crd(NEW_CHART, "computedomaincliques")
    plan = crd_apply_plan([policy_new, drivers, cliques], [stored(policy_old), stored(cliques)])
    assert [c["metadata"]["name"] for c in plan["apply"]] == ["clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com"]
    assert plan["left"] == [{"name": CLIQUES, "reason": "up to date"}]
    assert plan["differ"] == ["clusterpolicies.nvidia.com"]
    # The same CRDs stored: nothing to apply.
    assert crd_apply_plan([policy_new], [stored(policy_new)])["apply"] == []


def test_the_roles_compare_crds_on_every_run_and_read_back_after_every_install():
    """The CRD check is not limited to an upgrade (it was: a chart whose version sorts below the release's installed
    without its CRDs and without a read back)."""
    for role in ("gpu_operator", "dra_driver"):
        checks = load("roles/%s/tasks/upgrade_checks.yml" % role)
        block = next(t for t in checks if "block" in t)
        assert block["when"] == "%s_manage_crds | bool" % role, block["when"]
        verify = next(t for t in load("roles/%s/tasks/main.yml" % role) if t.get("ansible.builtin.import_tasks")
                      == "upgrade_verify.yml")
        assert not any("upgrade" in str(w) and "change" in str(w) for w in verify["when"])
        noted = next(t for t in checks if t.get("name") == "Note the chart's CRDs and the objects the chart makes of them")
        assert "when" not in noted
