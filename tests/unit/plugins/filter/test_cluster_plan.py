# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""cluster_plan and plan_table's cluster section: what the cluster half would change, from the gpu_hosts entries of
an inventory like the lab's, against nothing (the cluster not read) and against Node objects and a KubeVirt CR as
the API server returns them. The rules are the modules' own (plan_node, plan_kubevirt): a plan that says "nothing"
must mean those modules would send nothing."""

from __future__ import annotations

import json
import os
import sys

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.cluster_plan import cluster_plan
from ansible_collections.gpuops.sandbox.plugins.filter.gpu_hosts import gpu_hosts
from ansible_collections.gpuops.sandbox.plugins.filter.plan_table import plan_table
from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import (
    OWNED_ANNOTATION,
    OWNED_LABELS_ANNOTATION,
    plan_kubevirt,
    plan_node,
)

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
sys.path.insert(0, os.path.join(TOP, "tests", "fixtures"))
import nodes as fixture_nodes  # noqa: E402  pylint: disable=wrong-import-position

PLUGIN_PCI_IDS = os.path.join(os.path.dirname(TOP), "shared", "upstream", "kubevirt-gpu-device-plugin", "pci.ids")
A10 = {"address": "0000:65:00.0", "vendor": "10de", "device": "2236", "driver": "vfio-pci"}
CONFIG = {"version": "v1", "vgpu-configs": {"A10-4Q": [{"devices": "all", "vgpu-devices": {"A10-4Q": 6}}]}}
A10_4Q = {"name": "0000:65:00.0", "types": [{"id": "nvidia-558", "name": "NVIDIA A10-4Q", "available": 6}]}
KUBEVIRT = {"namespace": "kubevirt", "pci_vendor_ids": ["10de"], "version": "v1.8.2", "feature_gates": [],
            "disable_mdev_configuration": True, "resource_names": {}, "plugin_pci_ids": "", "prune": True}
OPERATOR = {"name": "gpu-operator", "namespace": "gpu-operator", "chart": "nvidia/gpu-operator", "version": "v25.10.1",
            "values": {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "container"},
                       "vgpuManager": {"repository": "registry.example/nvidia"}}}


def entries():
    """The nodes of a three-type fleet as role cluster_nodes would label them (typed by variable and by group)."""
    return gpu_hosts([
        {"inventory_hostname": "gpu-c", "group_names": ["gpu_nodes", "container"], "gpu_facts_gpus": [A10]},
        {"inventory_hostname": "gpu-p", "gpuops_workload_type": "vm-passthrough", "gpu_facts_gpus": [A10]},
        {"inventory_hostname": "gpu-v", "gpuops_workload_type": "vm-vgpu", "gpuops_vgpu_config_name": "A10-4Q",
         "gpu_facts_gpus": [dict(A10, driver="nvidia")], "gpu_facts_mdev_parents": [A10_4Q]},
    ], CONFIG)


def converged_cluster(nodes):
    """The nodes and the KubeVirt CR as node_labels and kubevirt_host_devices leave them: each patch the modules'
    planning functions give, applied."""
    live = {}
    for entry in nodes:
        node = fixture_nodes.gpu_node(entry["name"])
        patch = plan_node(node, entry["labels"], entry["taints"], ("nvidia.com/",), entry["release_to"])[0]
        meta = node["metadata"]
        for key, value in ((patch or {}).get("metadata") or {}).get("labels", {}).items():
            if value is None:
                meta["labels"].pop(key, None)
            else:
                meta["labels"][key] = value
        meta.setdefault("annotations", {}).update(((patch or {}).get("metadata") or {}).get("annotations") or {})
        live[entry["name"]] = node
    cr = {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
          "metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "7"},
          "spec": {"configuration": {}}, "status": {"observedKubeVirtVersion": "v1.8.2"}}
    hosts = [{k: e[k] for k in ("name", "workload_type", "gpus", "mdev_parents", "vgpu_type_names")} for e in nodes]
    patch = plan_kubevirt(cr, hosts)["patch"]
    cr["metadata"]["annotations"] = patch["metadata"]["annotations"]
    cr["spec"]["configuration"].update(patch["spec"]["configuration"])
    return live, cr


def test_without_the_cluster_the_plan_says_what_would_be_set():
    plan = cluster_plan(entries(), [OPERATOR], KUBEVIRT)
    assert plan["read"] is False and plan["empty"] is False and plan["refusals"] == []
    details = [c["detail"] for c in plan["changes"]]
    assert "label gpu-c: nvidia.com/gpu.workload.config=container, nvidia.com/vgpu.config not set" in details
    assert "label gpu-v: nvidia.com/gpu.workload.config=vm-vgpu, nvidia.com/vgpu.config=A10-4Q" in details
    assert "install or upgrade the Helm release gpu-operator/gpu-operator from nvidia/gpu-operator v25.10.1 " \
           "(2 top-level values)" in details
    # The passthrough GPU under the sandbox device plugin's name for an A10, the vGPU type by its mdev name.
    assert "permit 10DE:2236 as nvidia.com/GA102GL_A10 in the KubeVirt CR" in details
    assert "permit NVIDIA A10-4Q as nvidia.com/NVIDIA_A10-4Q in the KubeVirt CR" in details
    assert plan["kubevirt"]["feature_gates"] == ["GPU", "HostDevices"]
    assert [n["name"] for n in plan["nodes"]] == ["gpu-c", "gpu-p", "gpu-v"]
    assert plan["nodes"][0]["labels_removed"] == ["nvidia.com/vgpu.config"]


@pytest.mark.skipif(not os.path.exists(PLUGIN_PCI_IDS), reason="../shared/upstream is absent: no plugin pci.ids")
def test_the_plugins_own_pci_ids_names_the_entries():
    """Given the sandbox device plugin's pci.ids (the real one), the entry is named from it, as the plugin does."""
    plan = cluster_plan(entries(), [], dict(KUBEVIRT, plugin_pci_ids=PLUGIN_PCI_IDS))
    assert {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/GA102GL_A10",
            "externalResourceProvider": True} in plan["kubevirt"]["pciHostDevices"]


def test_a_converged_cluster_has_nothing_to_change():
    nodes = entries()
    live_nodes, cr = converged_cluster(nodes)
    deployed = {"gpu-operator": {"chart": "gpu-operator-v25.10.1", "values": json.loads(json.dumps(OPERATOR["values"]))}}
    plan = cluster_plan(nodes, [OPERATOR], KUBEVIRT, {"nodes": live_nodes, "kubevirt_cr": cr, "releases": deployed})
    assert plan["read"] is True
    assert plan["changes"] == [] and plan["refusals"] == [] and plan["empty"] is True, plan
    assert [n["changed"] for n in plan["nodes"]] == [False, False, False]
    assert plan["releases"][0]["action"] == "unchanged"
    lines = plan_table([], [], width=72, lines=True, cluster=plan)
    assert lines[-2:] == ["CLUSTER  read: what would change there", "  - nothing to change"]


def test_a_changed_cluster_names_each_change():
    nodes = entries()
    live_nodes, cr = converged_cluster(nodes)
    # gpu-p was a vm-vgpu node (its vGPU label set by this collection), the operator's values and chart moved on,
    # and a KubeVirt entry this collection added earlier is no longer offered by any host.
    meta = live_nodes["gpu-p"]["metadata"]
    meta["labels"].update({"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": "A10-8Q"})
    meta["annotations"][OWNED_LABELS_ANNOTATION] = json.dumps(
        {"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": "A10-8Q"})
    stale = {"mdevNameSelector": "NVIDIA A10-8Q", "resourceName": "nvidia.com/NVIDIA_A10-8Q",
             "externalResourceProvider": True}
    cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"].append(stale)
    owned = json.loads(cr["metadata"]["annotations"][OWNED_ANNOTATION])
    owned["mediatedDevices"].append(["NVIDIA A10-8Q", "nvidia.com/NVIDIA_A10-8Q"])
    cr["metadata"]["annotations"][OWNED_ANNOTATION] = json.dumps(owned)
    deployed = {"gpu-operator": {"chart": "gpu-operator-v25.3.0",
                                 "values": {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough"}}}}
    plan = cluster_plan(nodes, [OPERATOR], KUBEVIRT, {"nodes": live_nodes, "kubevirt_cr": cr, "releases": deployed})
    details = [c["detail"] for c in plan["changes"]]
    assert details == [
        "label gpu-p: nvidia.com/gpu.workload.config=vm-passthrough, nvidia.com/vgpu.config removed",
        "upgrade the Helm release gpu-operator/gpu-operator from gpu-operator-v25.3.0 to nvidia/gpu-operator v25.10.1",
        "remove NVIDIA A10-8Q as nvidia.com/NVIDIA_A10-8Q from the KubeVirt CR (no host offers it)",
    ], details
    assert plan["releases"][0]["values_changed"] == ["sandboxWorkloads.defaultWorkload", "vgpuManager"]
    assert plan["empty"] is False and [n["changed"] for n in plan["nodes"]] == [False, True, False]


def test_values_changed_without_a_new_chart():
    deployed = {"gpu-operator": {"chart": "gpu-operator-v25.10.1", "values": {"sandboxWorkloads": {"enabled": True}}}}
    plan = cluster_plan([], [OPERATOR], None, {"nodes": {}, "releases": deployed})
    assert [c["detail"] for c in plan["changes"]] == [
        "change the values of the Helm release gpu-operator/gpu-operator: sandboxWorkloads.defaultWorkload, vgpuManager"]
    plan = cluster_plan([], [OPERATOR], None, {"nodes": {}, "releases": {}})
    assert [c["detail"] for c in plan["changes"]] == [
        "install the Helm release gpu-operator/gpu-operator from nvidia/gpu-operator v25.10.1"]


def test_what_would_stop_the_cluster_half_is_a_refusal():
    nodes = entries()
    live_nodes, cr = converged_cluster(nodes)
    del live_nodes["gpu-v"]
    plan = cluster_plan(nodes, [], KUBEVIRT, {"nodes": live_nodes, "kubevirt_cr": {}, "releases": {}})
    assert [r["check"] for r in plan["refusals"]] == ["node gpu-v", "KubeVirt CR"]
    assert "the cluster has no node gpu-v" in plan["refusals"][0]["problem"]
    assert "no KubeVirt CR in namespace kubevirt" in plan["refusals"][1]["problem"]
    # A CR that disables a gate the hosts need: plan_kubevirt's conflict, as a refusal naming it.
    cr["spec"]["configuration"]["developerConfiguration"] = {"disabledFeatureGates": ["HostDevices"]}
    plan = cluster_plan(nodes, [], KUBEVIRT, {"nodes": converged_cluster(nodes)[0], "kubevirt_cr": cr})
    assert plan["refusals"][0]["check"] == "KubeVirt CR" and "HostDevices" in plan["refusals"][0]["problem"]
    lines = plan_table([], [], width=72, lines=True, cluster=plan)
    assert any(line.startswith("  - REFUSED KubeVirt CR:") for line in lines), lines


def test_secrets_in_values_are_hidden():
    release = dict(OPERATOR, values={"driver": {"licensingConfig": {"nlsEnabled": True, "clientConfigToken": "s3cr3t"}},
                                     "ngc": {"apiKey": "k3y", "password": ""}, "vgpuManager": {"repository": "r"}})
    plan = cluster_plan([], [release])
    shown = plan["releases"][0]["values"]
    assert "s3cr3t" not in json.dumps(plan) and "k3y" not in json.dumps(plan)
    assert shown["driver"]["licensingConfig"] == {"nlsEnabled": True, "clientConfigToken": "********"}
    assert shown["ngc"] == {"apiKey": "********", "password": ""} and shown["vgpuManager"] == {"repository": "r"}


@pytest.mark.parametrize("args, message", [
    (({"name": "n"},), "nodes must be a list"),
    (([{"name": "n"}],), "a node of the cluster plan has no workload_type"),
    (([], [{"name": "r"}]), "a Helm release of the cluster plan has no namespace"),
    (([], [], "kubevirt"), "kubevirt settings must be a mapping or null, got 'kubevirt'"),
    (([], [], None, ["nodes"]), "the cluster's state must be a mapping"),
    (([], [], {"plugin_pci_ids": "/nonexistent/pci.ids"}), "/nonexistent/pci.ids"),
])
def test_bad_input_names_the_value(args, message):
    with pytest.raises(AnsibleFilterError, match="cluster_plan: .*" + message.replace("(", r"\(")):
        cluster_plan(*args)


def test_hosts_without_facts_refuse_the_cluster_plan():
    """cluster.yml needs every node's facts (the releases' values are the whole fleet's): a host plan.yml could not
    read makes the cluster plan a refusal naming it, not a plan that quietly leaves it out."""
    plan = cluster_plan(entries()[:1], [OPERATOR], None, unread=["gpu-p", "gpu-v"])
    assert plan["refusals"][0]["check"] == "facts" and "gpu-p, gpu-v" in plan["refusals"][0]["problem"]
    lines = plan_table([], [], width=72, lines=True, cluster=plan)
    cluster = lines[lines.index("CLUSTER  not read (no gpuops_kubeconfig): what it would set"):]
    assert cluster[1].startswith("  - REFUSED facts: the facts of gpu-p, gpu-v were not read"), lines
