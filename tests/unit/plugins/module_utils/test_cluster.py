# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The KubeVirt planning rules of _cluster: resource names, vendor-specific vGPU, mdev handling, advertised names."""

from __future__ import annotations

import os
import re

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import (
    PlanError,
    advertised_names,
    desired_host_devices,
    dra_node_problems,
    helm_foreign_objects,
    DRA_DISABLED_OPERANDS,
    operator_os_tag,
    plan_kubevirt,
    release_labels,
    vgpu_manager_os_problems,
)

# What gpu_facts reports on a host with Debian 12's pci.ids: its sandbox_resource_name facts are wrong
# (the plugin names GPUs from its own pci.ids), so the cluster side must not use them.
H100 = {"address": "0000:18:00.0", "vendor": "10de", "device": "2330", "is_vf": False,
        "sandbox_resource_name": "nvidia.com/GH100H100_SXM5_80GB", "mdev_types": [], "vgpu": None}
L40S = {"address": "0000:ca:00.0", "vendor": "10de", "device": "26b9", "is_vf": False,
        "sandbox_resource_name": "nvidia.com/26b9", "mdev_types": [], "vgpu": None}
L40S_TYPES = [{"id": 1155, "name": "NVIDIA L40S-8Q"}, {"id": 1156, "name": "NVIDIA L40S-12Q"}]


def l40s_vgpu_host(current_types, wanted=None, pf_lists=True):
    """An L40S with vendor-specific vGPU: the PF lists the types, VFs list what they can still create."""
    gpus = [dict(L40S, driver="nvidia", vgpu={"creatable_types": L40S_TYPES if pf_lists else [], "current_type": None},
                 sriov_totalvfs=32, sriov_numvfs=len(current_types))]
    for index, current in enumerate(current_types):
        gpus.append({"address": "0000:ca:00.%d" % (index + 4), "vendor": "10de", "device": "26b9", "is_vf": True,
                     "physfn": "0000:ca:00.0", "driver": "nvidia", "mdev_types": [],
                     "vgpu": {"creatable_types": [] if current else L40S_TYPES, "current_type": current}})
    return {"name": "ada", "workload_type": "vm-vgpu", "gpus": gpus, "vgpu_type_names": wanted}


def test_passthrough_names_come_from_the_plugins_pci_ids_not_the_hosts():
    pci = desired_host_devices([{"name": "p", "workload_type": "vm-passthrough", "gpus": [H100, L40S]}])[0]
    assert pci == [
        {"pciVendorSelector": "10DE:2330", "resourceName": "nvidia.com/GH100_H100_SXM5_80GB", "externalResourceProvider": True},
        {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/AD102GL_L40S", "externalResourceProvider": True}]


def test_user_names_override_the_table():
    hosts = [{"name": "p", "workload_type": "vm-passthrough", "gpus": [H100, L40S]}]
    pci = desired_host_devices(hosts, resource_names={"10de:2330": "nvidia.com/H100", "26B9": "nvidia.com/L40S"})[0]
    assert [e["resourceName"] for e in pci] == ["nvidia.com/H100", "nvidia.com/L40S"]
    with pytest.raises(PlanError) as err:
        desired_host_devices(hosts, resource_names={"10de:23": "nvidia.com/H100"})
    assert "10de:23" in err.value.msg


def test_vendor_specific_vgpu_vfs_become_pci_entries():
    pci, mdev, _dra, needs_vgpu, notes = desired_host_devices([l40s_vgpu_host([1155, 1155, 0])])
    assert needs_vgpu and mdev == [] and notes == []
    # Configured VFs (their type resolved through the card's catalog, here the PF's) give one entry per profile.
    assert pci == [{"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S-8Q",
                    "externalResourceProvider": True}]


def test_vendor_specific_vgpu_wanted_types_before_the_vfs_are_configured():
    pci = desired_host_devices([l40s_vgpu_host([0, 0], wanted=["L40S-12Q"])])[0]
    assert [e["resourceName"] for e in pci] == ["nvidia.com/NVIDIA_L40S-12Q"]
    # A configured VF of another profile than the wanted one gives nothing.
    pci, _m, _d, _v, notes = desired_host_devices([l40s_vgpu_host([1155], wanted=["L40S-12Q"])])
    assert pci == [] and "offers no vGPU type" in notes[0]


def test_vendor_specific_vgpu_type_no_function_lists_is_left_out_with_a_note():
    pci, _m, _d, _v, notes = desired_host_devices([l40s_vgpu_host([1199], pf_lists=False)])
    assert pci == [] and "VF 0000:ca:00.4 has vGPU type 1199, which no function of its GPU lists" in notes[0]


def test_mdev_types_are_selected_by_id_name_or_short_name():
    parent = {"name": "mtty", "types": [
        {"id": "mtty-1", "name": "Single port serial", "resource_name": "nvidia.com/Single_port_serial"},
        {"id": "mtty-2", "name": "Dual port serial", "resource_name": "nvidia.com/Dual_port_serial"}]}
    for wanted, expected in ((["mtty-1"], ["Single port serial"]), (["Dual port serial"], ["Dual port serial"]),
                             (None, ["Dual port serial", "Single port serial"])):
        mdev = desired_host_devices([{"name": "v", "workload_type": "vm-vgpu", "mdev_parents": [parent],
                                      "vgpu_type_names": wanted}])[1]
        assert [e["mdevNameSelector"] for e in mdev] == expected


def cr(version, mdev_conf=None, gates=None):
    conf = {"developerConfiguration": {"featureGates": gates or []}}
    if mdev_conf is not None:
        conf["mediatedDevicesConfiguration"] = mdev_conf
    return {"metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "3"},
            "spec": {"configuration": conf}, "status": {"observedKubeVirtVersion": version}}


VGPU_HOST = {"name": "v", "workload_type": "vm-vgpu", "mdev_parents": [
    {"name": "mtty", "types": [{"id": "mtty-1", "name": "Single port serial"}]}]}


@pytest.mark.parametrize("version, gate, field", [
    ("v1.7.2", True, None),
    ("", True, None),
    ("v1.8.0", False, False),
    ("v1.9.1", False, False),
])
def test_kubevirt_mdev_handling_off_by_field_from_1_8_else_by_gate(version, gate, field):
    plan = plan_kubevirt(cr(version), [VGPU_HOST])
    conf = plan["patch"]["spec"]["configuration"]
    assert ("DisableMDEVConfiguration" in conf["developerConfiguration"]["featureGates"]) is gate
    assert (conf.get("mediatedDevicesConfiguration") or {}).get("enabled") is field


def test_kubevirt_mdev_field_keeps_the_users_value_and_other_keys():
    plan = plan_kubevirt(cr("v1.8.1", {"enabled": True, "mediatedDeviceTypes": ["nvidia-1"]}), [VGPU_HOST])
    assert "mediatedDevicesConfiguration" not in plan["patch"]["spec"]["configuration"]
    assert any("mediatedDevicesConfiguration.enabled is true" in n for n in plan["notes"])
    # Already false: nothing to change for it, and a second plan on the patched CR is empty.
    plan = plan_kubevirt(cr("v1.8.1", {"enabled": False}), [VGPU_HOST])
    assert "mediatedDevicesConfiguration" not in plan["patch"]["spec"]["configuration"]
    # Not asked for: the field stays unset.
    plan = plan_kubevirt(cr("v1.8.1"), [VGPU_HOST], disable_mdev_configuration=False)
    assert "mediatedDevicesConfiguration" not in plan["patch"]["spec"]["configuration"]


def node(name, allocatable):
    return {"metadata": {"name": name}, "status": {"allocatable": dict(allocatable, cpu="8")}}


def test_advertised_names_before_the_plugin_runs_judge_nothing():
    hosts = [{"name": "p", "workload_type": "vm-passthrough", "gpus": [H100]}]
    entries = desired_host_devices(hosts)[0]
    report = advertised_names(hosts, [node("p", {"nvidia.com/gpu": "1"})], entries)
    assert report["checked_nodes"] == [] and report["unadvertised"] == [] and report["renames"] == {}


def test_advertised_names_report_and_pair_a_differing_name():
    hosts = [{"name": "p", "workload_type": "vm-passthrough", "gpus": [H100]},
             {"name": "q", "workload_type": "vm-passthrough", "gpus": [L40S]}]
    entries = desired_host_devices(hosts)[0]
    nodes = [node("p", {"nvidia.com/GH100_H100_SXM5_80GB_NEWER": "8"}), node("q", {"nvidia.com/AD102GL_L40S": "4"})]
    report = advertised_names(hosts, nodes, entries)
    assert report["checked_nodes"] == ["p", "q"]
    assert [e["resourceName"] for e in report["unadvertised"]] == ["nvidia.com/GH100_H100_SXM5_80GB"]
    assert report["unpermitted"] == [{"node": "p", "resourceName": "nvidia.com/GH100_H100_SXM5_80GB_NEWER"}]
    assert report["renames"] == {"nvidia.com/GH100_H100_SXM5_80GB": "nvidia.com/GH100_H100_SXM5_80GB_NEWER"}


def test_advertised_names_ambiguous_pairs_are_not_renamed():
    hosts = [{"name": "p", "workload_type": "vm-passthrough", "gpus": [H100]},
             {"name": "r", "workload_type": "vm-passthrough", "gpus": [dict(H100, address="0000:19:00.0")]}]
    entries = desired_host_devices(hosts)[0]
    nodes = [node("p", {"nvidia.com/A": "8"}), node("r", {"nvidia.com/B": "8"})]
    report = advertised_names(hosts, nodes, entries)
    assert report["renames"] == {} and "not renamed" in report["notes"][0]


def test_operator_os_tag_as_the_operator_builds_it():
    assert operator_os_tag("ubuntu", "22.04") == "ubuntu22.04"
    assert operator_os_tag("rhel", "9.4") == "rhel9" and operator_os_tag("rocky", "8.10") == "rocky8"
    assert operator_os_tag("debian", "12") == "debian12" and operator_os_tag(None, "12") is None


def test_vgpu_manager_image_must_fit_the_vgpu_nodes_os():
    entries = [{"host": "v1", "workload_type": "vm-vgpu", "os_tag": "ubuntu22.04"},
               {"host": "c1", "workload_type": "container", "os_tag": "ubuntu22.04"}]
    assert vgpu_manager_os_problems(entries, ["ubuntu22.04"]) == []
    assert vgpu_manager_os_problems(entries, []) == []
    problems = vgpu_manager_os_problems(entries, ["ubuntu24.04"])
    assert len(problems) == 1 and "host v1 (vm-vgpu) runs ubuntu22.04" in problems[0] and "ubuntu24.04 only" in problems[0]
    mixed = entries + [{"host": "c2", "workload_type": "container", "os_tag": "rhel9"}]
    problems = vgpu_manager_os_problems(mixed, ["ubuntu22.04"])
    assert len(problems) == 1 and "several OSes (rhel9: c2, ubuntu22.04: c1, v1)" in problems[0]
    # No vm-vgpu host, or no facts: nothing to judge.
    assert vgpu_manager_os_problems(entries[1:] + mixed[2:], ["ubuntu24.04"]) == []
    assert vgpu_manager_os_problems([{"host": "v1", "workload_type": "vm-vgpu", "os_tag": None}], ["x"]) == []


# ---------------------------------------------------------------------------------------------
# Objects a chart would create that exist outside its Helm release
# ---------------------------------------------------------------------------------------------

def _helm_marks(release="dra", namespace="dra-ns", managed_by="Helm"):
    return {"labels": {"app.kubernetes.io/managed-by": managed_by},
            "annotations": {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace}}


RENDERED = [None, "text", {"kind": "DeviceClass", "metadata": {"name": "vfio.gpu.nvidia.com"}},
            {"kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"}},
            {"kind": "ServiceAccount", "metadata": {"name": "sa", "namespace": "dra-ns"}}]


@pytest.mark.parametrize("metadata,foreign", [
    ({}, ["DeviceClass/vfio.gpu.nvidia.com"]),
    (_helm_marks(), []),
    (_helm_marks(release="other"), ["DeviceClass/vfio.gpu.nvidia.com"]),
    (_helm_marks(namespace="other-ns"), ["DeviceClass/vfio.gpu.nvidia.com"]),
    (_helm_marks(managed_by="kubectl"), ["DeviceClass/vfio.gpu.nvidia.com"]),
    ({"labels": None, "annotations": None}, ["DeviceClass/vfio.gpu.nvidia.com"]),
], ids=["hand-made", "this-release", "other-release", "other-namespace", "not-helm", "null-metadata"])
def test_helm_foreign_objects_judges_the_ownership_marks(metadata, foreign):
    existing = [{"kind": "DeviceClass", "metadata": dict(metadata, name="vfio.gpu.nvidia.com")}]
    assert helm_foreign_objects(existing, RENDERED, "dra", "dra-ns") == foreign


def test_helm_foreign_objects_ignores_objects_the_chart_does_not_render():
    existing = [{"kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"}},
                {"kind": "ServiceAccount", "metadata": {"name": "sa", "namespace": "elsewhere"}},
                {"kind": "ServiceAccount", "metadata": {"name": "sa", "namespace": "dra-ns"}},
                {"kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"}}, "junk"]
    assert helm_foreign_objects(existing, RENDERED, "dra", "dra-ns") == [
        "DeviceClass/gpu.nvidia.com", "ServiceAccount/dra-ns/sa"]
    assert helm_foreign_objects(existing, [], "dra", "dra-ns") == []
    assert helm_foreign_objects(None, None, "dra", "dra-ns") == []


# ---------------------------------------------------------------------------------------------
# Released deploy labels against the GPU Operator's own container labels
# ---------------------------------------------------------------------------------------------

OPERATOR_STATE_MANAGER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.realpath(__file__))))))), "shared", "upstream", "gpu-operator", "source", "controllers",
    "state_manager.go")


def _operator_container_labels(text):
    """gpuStateLabels[gpuWorkloadConfigContainer] of the operator's state_manager.go, constants resolved."""
    constants = dict(re.findall(r'^\s*(\w+)\s*=\s*"([^"]+)"', text, re.M))
    block = re.search(r"gpuWorkloadConfigContainer:\s*\{(.*?)\}", text, re.S).group(1)
    labels = {}
    for key, value in re.findall(r'^\s*("[^"]+"|\w+)\s*:\s*"([^"]*)"', block, re.M):
        labels[key.strip('"') if key.startswith('"') else constants[key]] = value
    return labels


def test_release_labels_hand_over_only_on_container_nodes():
    assert release_labels("container") == dict(("nvidia.com/gpu.deploy.%s" % o, "true") for o in DRA_DISABLED_OPERANDS)
    for wtype in ("vm-passthrough", "vm-vgpu", "dra"):
        assert release_labels(wtype) == {}


def test_release_labels_are_what_the_operator_gives_a_container_node():
    if not os.path.isfile(OPERATOR_STATE_MANAGER):
        pytest.skip("../shared/upstream (the GPU Operator's source) is absent")
    with open(OPERATOR_STATE_MANAGER, encoding="utf-8") as handle:
        container = _operator_container_labels(handle.read())
    assert "nvidia.com/gpu.deploy.device-plugin" in container and "nvidia.com/gpu.deploy.driver" in container
    for key, value in release_labels("container").items():
        assert container.get(key) == value, (key, container)


# ---------------------------------------------------------------------------------------------
# DRA nodes against what the DRA driver published
# ---------------------------------------------------------------------------------------------

def _slice(node, devices, driver="gpu.nvidia.com"):
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}


DRA_ENTRIES = [{"name": "n1", "workload_type": "dra"}, {"name": "n2", "workload_type": "dra"},
               {"name": "n3", "workload_type": "vm-passthrough"}]
VFIO_CLASS = [{"metadata": {"name": "vfio.gpu.nvidia.com"}}]


def test_dra_node_problems_name_what_each_dra_node_lacks():
    slices = [_slice("n1", [{"name": "gpu-0", "attributes": {"type": {"string": "vfio"}}}]),
              _slice("n2", [{"name": "gpu-0-mig", "attributes": {"gpu.nvidia.com/type": {"string": "mig"}}}, {"name": "x"}]),
              _slice("n2", [{"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}}], driver="other.example.com"),
              _slice("n3", [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}])]
    problems = dra_node_problems(DRA_ENTRIES, slices, VFIO_CLASS)
    assert problems == {"n1": [], "n2": ["a gpu.nvidia.com device of type vfio or gpu in its ResourceSlices (they offer mig)"]}


def test_dra_node_problems_without_driver_or_classes():
    assert dra_node_problems(DRA_ENTRIES[:1], [], []) == {
        "n1": ["DeviceClass vfio.gpu.nvidia.com", "a ResourceSlice of gpu.nvidia.com with devices"]}
    assert dra_node_problems(DRA_ENTRIES[:1], [_slice("n1", [])], VFIO_CLASS) == {
        "n1": ["a ResourceSlice of gpu.nvidia.com with devices"]}
    assert dra_node_problems(DRA_ENTRIES[:1], [_slice("n1", [{"name": "d"}])], VFIO_CLASS) == {
        "n1": ["a gpu.nvidia.com device of type vfio or gpu in its ResourceSlices (they offer devices without a type)"]}
    # Any device type will do when none is asked for; no DRA node, nothing to say.
    assert dra_node_problems(DRA_ENTRIES[:1], [_slice("n1", [{"name": "d"}])], VFIO_CLASS, device_types=()) == {"n1": []}
    assert dra_node_problems(DRA_ENTRIES[2:], [], []) == {}
    assert dra_node_problems(None, None, None) == {}
