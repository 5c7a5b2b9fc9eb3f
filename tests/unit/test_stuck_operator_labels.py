"""Which paused GPU Operator deploy labels are stuck (no MIG Manager or vGPU Device Manager works on the node), and
the rights validate.yml asks for to find and repair them."""

import copy

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.stuck_operator_labels import FilterModule
from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted

stuck_operator_labels = FilterModule().filters()["stuck_operator_labels"]

MIG, VGPU = "paused-for-mig-change", "paused-for-vgpu-change"
DP, GFD = "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.gpu-feature-discovery"
SDP = "nvidia.com/gpu.deploy.sandbox-device-plugin"
MIG_STATE, VGPU_STATE = "nvidia.com/mig.config.state", "nvidia.com/vgpu.config.state"


class PatchTestFailed(Exception):
    """A JSON patch "test" operation did not hold; the API server answers such a patch with 422."""


def apply_patch(obj, ops):
    """Apply the "test" and "replace" operations of a JSON patch (RFC 6902) under /metadata/labels, as the API
    server does: all of them or none."""
    obj = copy.deepcopy(obj)
    labels = obj["metadata"]["labels"]
    for op in ops:
        prefix = "/metadata/labels/"
        assert op["path"].startswith(prefix), op
        key = op["path"][len(prefix):].replace("~1", "/").replace("~0", "~")
        if op["op"] == "test":
            if labels.get(key) != op["value"]:
                raise PatchTestFailed(op)
        elif op["op"] == "replace":
            assert key in labels, op
            labels[key] = op["value"]
        else:
            raise AssertionError("unexpected operation %r" % (op,))
    return obj


def node(name, **labels):
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def pod(name, node_name, app="nvidia-mig-manager", phase="Running", deleting=False, namespace="gpu-operator"):
    meta = {"name": name, "namespace": namespace, "labels": {"app": app}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node_name}, "status": {"phase": phase}}


def verdicts(result):
    return {key: [(e["node"], e["value"], tuple(e["labels"])) for e in entries] for key, entries in result.items()}


def test_a_paused_label_with_no_manager_pod_is_stuck_and_patched_back_to_true():
    nodes = [node("n1", **{DP: MIG, GFD: MIG, "nvidia.com/gpu.deploy.dcgm": "true", MIG_STATE: "pending"})]
    result = stuck_operator_labels(nodes, [])
    assert verdicts(result) == {"stuck": [("n1", MIG, (DP, GFD))], "working": [], "unknown": []}
    entry = result["stuck"][0]
    assert entry["manager"] == "nvidia-mig-manager" and entry["state"] == "pending" and entry["pods"] == []
    assert entry["text"] == ("n1: nvidia.com/gpu.deploy.device-plugin, nvidia.com/gpu.deploy.gpu-feature-discovery at "
                             "paused-for-mig-change (no nvidia-mig-manager pod on the node)")
    # The patch, applied to the node, gives exactly the value the managers restore and nothing else.
    patched = apply_patch(nodes[0], entry["patch"])
    assert patched["metadata"]["labels"] == {DP: "true", GFD: "true", "nvidia.com/gpu.deploy.dcgm": "true",
                                             MIG_STATE: "pending"}


def test_the_patch_refuses_a_label_that_changed_since():
    entry = stuck_operator_labels([node("n1", **{DP: MIG})], [])["stuck"][0]
    moved_on = node("n1", **{DP: "false"})
    with pytest.raises(PatchTestFailed):
        apply_patch(moved_on, entry["patch"])


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown", None])
@pytest.mark.parametrize("state", ["pending", "rebooting", None])
def test_a_manager_pod_on_the_node_in_the_middle_of_a_change_is_working(phase, state):
    labels = {DP: MIG}
    if state:
        labels[MIG_STATE] = state
    manager = pod("mig-1", "n1", phase=phase)
    if phase is None:
        del manager["status"]
    result = stuck_operator_labels([node("n1", **labels)], [manager])
    assert verdicts(result) == {"stuck": [], "working": [("n1", MIG, (DP,))], "unknown": []}
    assert result["working"][0]["pods"] == ["gpu-operator/mig-1"]
    assert "patch" not in result["working"][0]


@pytest.mark.parametrize("state", ["success", "failed"])
def test_a_manager_that_has_ended_its_change_resumes_nothing_any_more(state):
    # mig-manager started again after a crash finds its configuration applied, says success and exits without
    # putting the labels back: its pod is there, yet nothing will resume them.
    result = stuck_operator_labels([node("n1", **{DP: MIG, MIG_STATE: state})], [pod("mig-1", "n1")])
    assert verdicts(result)["stuck"] == [("n1", MIG, (DP,))]
    assert result["stuck"][0]["reason"] == ("its nvidia-mig-manager pod gpu-operator/mig-1 has ended the change "
                                            "(nvidia.com/mig.config.state=%s)" % state)


@pytest.mark.parametrize("manager", [
    pod("m", "n2"),                                      # on another node
    pod("m", "n1", app="nvidia-vgpu-device-manager"),    # the other manager
    pod("m", "n1", app="nvidia-device-plugin-daemonset"),
    pod("m", "n1", phase="Succeeded"), pod("m", "n1", phase="Failed"),
    pod("m", "n1", deleting=True),
    {"metadata": {"name": "m", "labels": {"app": "nvidia-mig-manager"}}, "spec": {}},  # not scheduled
], ids=["other-node", "other-manager", "other-app", "succeeded", "failed", "deleting", "unscheduled"])
def test_pods_that_do_not_work_on_the_node_do_not_count(manager):
    result = stuck_operator_labels([node("n1", **{DP: MIG, MIG_STATE: "pending"})], [manager])
    assert verdicts(result)["stuck"] == [("n1", MIG, (DP,))]


def test_the_vgpu_manager_has_its_own_pods_and_state_label():
    nodes = [node("v1", **{SDP: VGPU, VGPU_STATE: "pending"}), node("v2", **{SDP: VGPU, VGPU_STATE: "pending"}),
             node("v3", **{SDP: VGPU, VGPU_STATE: "success", MIG_STATE: "pending"})]
    pods = [pod("vdm-1", "v1", app="nvidia-vgpu-device-manager"), pod("mig-2", "v2"),
            pod("vdm-3", "v3", app="nvidia-vgpu-device-manager")]
    result = stuck_operator_labels(nodes, pods)
    assert verdicts(result) == {"stuck": [("v2", VGPU, (SDP,)), ("v3", VGPU, (SDP,))],
                                "working": [("v1", VGPU, (SDP,))], "unknown": []}
    assert [e["manager"] for e in result["stuck"]] == ["nvidia-vgpu-device-manager"] * 2


def test_other_paused_values_are_unknown_and_other_labels_are_ignored():
    nodes = [node("n1", **{DP: "paused-for-driver-upgrade", GFD: MIG, "nvidia.com/gpu.deploy.dcgm": "false",
                           "nvidia.com/gpu.deploy.driver": "", "example.com/x": MIG, "nvidia.com/mig.config": "all-1g.10gb"})]
    result = stuck_operator_labels(nodes, [])
    assert verdicts(result) == {"stuck": [("n1", MIG, (GFD,))], "working": [],
                                "unknown": [("n1", "paused-for-driver-upgrade", (DP,))]}
    assert result["unknown"][0]["manager"] is None and "patch" not in result["unknown"][0]


def test_only_the_named_nodes_are_looked_at_in_name_order():
    nodes = [node("b", **{DP: MIG}), node("c", **{DP: MIG}), node("a", **{DP: MIG}), {"metadata": {"name": "d"}}]
    assert [e["node"] for e in stuck_operator_labels(nodes, [])["stuck"]] == ["a", "b", "c"]
    assert [e["node"] for e in stuck_operator_labels(nodes, [], ["c", "a", "gone"])["stuck"]] == ["a", "c"]
    assert stuck_operator_labels(nodes, [], [])["stuck"] == []


def test_label_names_are_escaped_in_the_json_pointer():
    entry = stuck_operator_labels([node("n1", **{"nvidia.com/gpu.deploy.a~b": MIG})], [])["stuck"][0]
    assert entry["patch"][1] == {"op": "replace", "path": "/metadata/labels/nvidia.com~1gpu.deploy.a~0b", "value": "true"}


@pytest.mark.parametrize("nodes, pods, names, message", [
    ("n1", [], None, "expects a list of Node objects, got str: 'n1'"),
    ([None], [], None, "Node 0 is not a Node object: None"),
    ([{"metadata": {"labels": {}}}], [], None, "Node 0 has no metadata.name"),
    ([{"metadata": "x"}], [], None, "the metadata of Node 0 is not a mapping: 'x'"),
    ([{"metadata": {"name": "n1", "labels": ["a"]}}], [], None, "the labels of Node 'n1' are not a mapping: ['a']"),
    ([], {"items": []}, None, "pods must be a list of Pod objects, got dict"),
    ([], ["p"], None, "Pod 0 is not a Pod object: 'p'"),
    ([], [{"metadata": {"name": "p"}, "spec": "x"}], None, "the spec or status of Pod 'p' is not a mapping"),
    ([], [], "n1", "names must be a list of node names or null, got 'n1'"),
    ([], [], [1], "names must be a list of node names or null, got [1]"),
])
def test_bad_input_is_named(nodes, pods, names, message):
    with pytest.raises(AnsibleFilterError) as error:
        stuck_operator_labels(nodes, pods, names)
    assert message in str(error.value)


# ---------------------------------------------------------------------------------------------
# validate.yml asks the API server, before anything, for the rights the check needs
# ---------------------------------------------------------------------------------------------

def permissions(**inputs):
    play = next(p for p in load("playbooks/validate.yml") if p["name"] == "Validate the GPU nodes in the cluster")
    access = next(t for t in play["tasks"] if "gpuops.sandbox.kube_access" in t)
    variables = dict(trusted(access.get("vars") or {}), **inputs)
    found = templar(variables).template(trusted(access["gpuops.sandbox.kube_access"]["permissions"]))
    return sorted((p["verb"], p["resource"]) for p in found)


@pytest.mark.parametrize("inputs, wanted", [
    ({}, [("get", "nodes"), ("list", "nodes"), ("list", "pods")]),
    ({"gpuops_repair_stuck_labels": True}, [("get", "nodes"), ("list", "nodes"), ("list", "pods"), ("patch", "nodes")]),
    ({"gpuops_repair_stuck_labels": True, "cluster_validate_repair_stuck_labels": False},
     [("get", "nodes"), ("list", "nodes"), ("list", "pods")]),
    ({"cluster_validate_repair_stuck_labels": "true"}, [("get", "nodes"), ("list", "nodes"), ("list", "pods"), ("patch", "nodes")]),
    ({"cluster_validate_stuck_labels": False, "gpuops_repair_stuck_labels": True}, [("get", "nodes")]),
])
def test_validate_asks_for_list_pods_and_patch_nodes_only_when_they_are_used(inputs, wanted):
    assert permissions(**inputs) == wanted
