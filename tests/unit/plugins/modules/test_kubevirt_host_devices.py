# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import json

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import OWNED_ANNOTATION, workload_labels, PlanError
from ansible_collections.gpuops.sandbox.plugins.modules import kubevirt_host_devices as khd
from ansible_collections.gpuops.sandbox.tests.unit.plugins.fake_kube import FakeKube
from ansible_collections.gpuops.sandbox.tests.unit.plugins.modules.module_harness import call

A10 = {"address": "0000:65:00.0", "vendor": "10de", "device": "2236", "is_vf": False,
       "sandbox_resource_name": "nvidia.com/GA102GL_A10", "mdev_types": []}
A10_VGPU = dict(A10, mdev_types=[
    {"id": "nvidia-593", "name": "NVIDIA A10-4Q", "resource_name": "nvidia.com/NVIDIA_A10-4Q"},
    {"id": "nvidia-594", "name": "NVIDIA A10-8Q", "resource_name": "nvidia.com/NVIDIA_A10-8Q"}])
HOSTS = [
    {"name": "c", "workload_type": "container", "gpus": [A10]},
    {"name": "p", "workload_type": "vm-passthrough", "gpus": [A10, dict(A10, address="0000:66:00.0")]},
    {"name": "v", "workload_type": "vm-vgpu", "gpus": [A10_VGPU], "vgpu_type_names": ["A10-4Q"]},
]
PCI = {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/GA102GL_A10", "externalResourceProvider": True}
MDEV = {"mdevNameSelector": "NVIDIA A10-4Q", "resourceName": "nvidia.com/NVIDIA_A10-4Q", "externalResourceProvider": True}
USER = {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/XL710", "externalResourceProvider": False}


def kubevirt(phd=None, gates=None, version="v1.6.0", disabled=None):
    dev = {}
    if gates is not None:
        dev["featureGates"] = gates
    if disabled is not None:
        dev["disabledFeatureGates"] = disabled
    conf = {"developerConfiguration": dev}
    if phd is not None:
        conf["permittedHostDevices"] = phd
    return {"metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "5"},
            "spec": {"configuration": conf}, "status": {"observedKubeVirtVersion": version}}


def invoke(monkeypatch, fake, hosts=None, **extra):
    args = dict(hosts=HOSTS if hosts is None else hosts, **extra)
    return call(monkeypatch, lambda: khd.run_module(khd.build_module(), api_factory=lambda p: fake), args)


def test_generates_merges_and_keeps_user_entries(monkeypatch):
    fake = FakeKube(kubevirts=[kubevirt({"pciHostDevices": [USER]}, gates=["Snapshot"])])
    kind, result = invoke(monkeypatch, fake, _ansible_diff=True)
    assert kind == "exit" and result["changed"]
    conf = fake.kubevirts[0]["spec"]["configuration"]
    assert conf["permittedHostDevices"] == {"pciHostDevices": [USER, PCI], "mediatedDevices": [MDEV]}
    assert conf["developerConfiguration"]["featureGates"] == ["Snapshot", "GPU", "HostDevices", "DisableMDEVConfiguration"]
    assert result["diff"]["before"]["permittedHostDevices"]["pciHostDevices"] == [USER]
    owned = json.loads(fake.kubevirts[0]["metadata"]["annotations"][OWNED_ANNOTATION])
    assert owned == {"pciHostDevices": [["10DE:2236", "nvidia.com/GA102GL_A10"]],
                     "mediatedDevices": [["NVIDIA A10-4Q", "nvidia.com/NVIDIA_A10-4Q"]]}
    # Idempotent: a second run changes nothing and sends no patch.
    fake.patches = []
    kind, result = invoke(monkeypatch, fake)
    assert kind == "exit" and not result["changed"] and fake.patches == []


def test_check_mode_changes_nothing(monkeypatch):
    fake = FakeKube(kubevirts=[kubevirt()])
    kind, result = invoke(monkeypatch, fake, _ansible_check_mode=True)
    assert kind == "exit" and result["changed"] and result["permitted_host_devices"]["pciHostDevices"] == [PCI]
    assert fake.patches == []


def test_prune_removes_only_own_stale_entries(monkeypatch):
    fake = FakeKube(kubevirts=[kubevirt({"pciHostDevices": [USER]})])
    assert invoke(monkeypatch, fake)[0] == "exit"
    # The passthrough host goes away: its entry (ours) goes, the user's stays.
    kind, result = invoke(monkeypatch, fake, hosts=[HOSTS[2]])
    assert kind == "exit" and result["removed"] == [PCI]
    assert fake.kubevirts[0]["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"] == [USER]


def test_user_entry_equal_to_generated_is_kept_not_owned(monkeypatch):
    fake = FakeKube(kubevirts=[kubevirt({"pciHostDevices": [dict(PCI, pciVendorSelector="10de:2236")]})])
    kind, result = invoke(monkeypatch, fake, hosts=[HOSTS[1]])
    assert kind == "exit" and result["added"] == []
    # And it survives the host going away (it is the user's).
    kind, result = invoke(monkeypatch, fake, hosts=[HOSTS[0]])
    assert fake.kubevirts[0]["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"][0]["resourceName"] == PCI["resourceName"]


@pytest.mark.parametrize("entry, needle", [
    (dict(PCI, pciVendorSelector="10DE:2237"), "has resourceName nvidia.com/GA102GL_A10 with pciVendorSelector 10DE:2237"),
    (dict(PCI, resourceName="nvidia.com/MY_A10"), "advertises it as nvidia.com/GA102GL_A10"),
    (dict(PCI, externalResourceProvider=False), "externalResourceProvider False"),
])
def test_conflicting_entry_fails_and_changes_nothing(monkeypatch, entry, needle):
    fake = FakeKube(kubevirts=[kubevirt({"pciHostDevices": [entry]})])
    kind, result = invoke(monkeypatch, fake)
    assert kind == "fail" and needle in result["msg"] and "nothing was changed" in result["msg"]
    assert fake.patches == []


def test_disabled_gate_is_a_conflict(monkeypatch):
    fake = FakeKube(kubevirts=[kubevirt(disabled=["HostDevices"])])
    kind, result = invoke(monkeypatch, fake)
    assert kind == "fail" and "HostDevices is listed in" in result["msg"] and fake.patches == []


@pytest.mark.parametrize("version, gates", [
    ("v1.8.2", ["GPU", "HostDevices", "GPUsWithDRA"]),
    ("v1.9.0", ["GPU", "HostDevices"]),
])
def test_dra_gate_by_version(monkeypatch, version, gates):
    fake = FakeKube(kubevirts=[kubevirt(version=version)])
    kind, result = invoke(monkeypatch, fake, hosts=[{"name": "d", "workload_type": "dra"}])
    assert kind == "exit" and result["feature_gates"] == gates


@pytest.mark.parametrize("version, given, needle", [
    ("v1.7.1", None, "KubeVirt v1.7.1 cannot attach GPUs through DRA"),
    ("", None, "give kubevirt_version"),
])
def test_dra_gate_errors(monkeypatch, version, given, needle):
    fake = FakeKube(kubevirts=[kubevirt(version=version)])
    kind, result = invoke(monkeypatch, fake, hosts=[{"name": "d", "workload_type": "dra"}], kubevirt_version=given)
    assert kind == "fail" and needle in result["msg"] and fake.patches == []


def test_given_version_wins(monkeypatch):
    fake = FakeKube(kubevirts=[kubevirt(version="")])
    kind, result = invoke(monkeypatch, fake, hosts=[{"name": "d", "workload_type": "dra"}], kubevirt_version="1.8.0")
    assert kind == "exit" and "GPUsWithDRA" in result["feature_gates"]


def test_kubevirt_not_installed(monkeypatch):
    kind, result = invoke(monkeypatch, FakeKube(kubevirts=None))
    assert kind == "fail" and "KubeVirt is not installed" in result["msg"]
    kind, result = invoke(monkeypatch, FakeKube(kubevirts=[]))
    assert kind == "fail" and "no KubeVirt CR in namespace kubevirt" in result["msg"]


def test_unknown_workload_type_is_rejected_by_the_spec(monkeypatch):
    kind, result = invoke(monkeypatch, FakeKube(kubevirts=[kubevirt()]), hosts=[{"name": "x", "workload_type": "vm"}])
    assert kind == "fail" and "workload_type" in result["msg"] and "vm" in result["msg"]


def test_mdev_parents_and_bare_device_ids(monkeypatch):
    hosts = [{"name": "lab", "workload_type": "vm-vgpu",
              "mdev_parents": [{"name": "mtty", "types": [{"name": "Single port serial"}, {"name": "Dual port serial"}]}],
              "vgpu_type_names": ["Single port serial"]},
             {"name": "p", "workload_type": "vm-passthrough",
              "gpus": [{"vendor": "1234", "device": "11e8", "sandbox_resource_name": None}]}]
    fake = FakeKube(kubevirts=[kubevirt()])
    kind, result = invoke(monkeypatch, fake, hosts=hosts, pci_vendor_ids=["1234"])
    assert kind == "exit"
    assert result["permitted_host_devices"] == {
        "pciHostDevices": [{"pciVendorSelector": "1234:11E8", "resourceName": "nvidia.com/11e8", "externalResourceProvider": True}],
        "mediatedDevices": [{"mdevNameSelector": "Single port serial", "resourceName": "nvidia.com/Single_port_serial",
                             "externalResourceProvider": True}]}


def test_host_without_devices_warns(monkeypatch):
    fake = FakeKube(kubevirts=[kubevirt()])
    kind, result = invoke(monkeypatch, fake, hosts=[{"name": "p", "workload_type": "vm-passthrough", "gpus": []}])
    assert kind == "exit" and "host p (vm-passthrough) has no GPU" in result["notes"][0]


def test_workload_labels():
    assert workload_labels("vm-vgpu", "A10-4Q", ["A10-4Q"])["nvidia.com/vgpu.config"] == "A10-4Q"
    labels = workload_labels("dra")
    assert labels["nvidia.com/gpu.workload.config"] == "container"
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "false"
    assert workload_labels("vm-passthrough")["nvidia.com/vgpu.config"] is None
    with pytest.raises(PlanError, match="'A10-5Q' is not in"):
        workload_labels("vm-vgpu", "A10-5Q", ["A10-4Q"])
    with pytest.raises(PlanError, match="'gpu' is not one of"):
        workload_labels("gpu")


def test_advertised_names_are_reported_and_used_when_asked(monkeypatch, capsys):
    hosts = [{"name": "p", "workload_type": "vm-passthrough", "gpus": [A10]}]
    advertising = {"metadata": {"name": "p"}, "status": {"allocatable": {"nvidia.com/GA102GL_A10_24GB": "2"}}}
    fake = FakeKube(nodes=[advertising], kubevirts=[kubevirt()])
    kind, result = invoke(monkeypatch, fake, hosts=hosts)
    assert kind == "exit" and result["advertised"]["checked_nodes"] == ["p"]
    assert result["advertised"]["unadvertised"] == [PCI] and result["advertised"]["renamed"] == {}
    assert "names a resource no node advertises" in capsys.readouterr().err
    kind, result = invoke(monkeypatch, fake, hosts=hosts, use_advertised_names=True)
    assert kind == "exit" and result["advertised"]["renamed"] == {"nvidia.com/GA102GL_A10": "nvidia.com/GA102GL_A10_24GB"}
    assert result["advertised"]["unadvertised"] == []
    assert fake.kubevirts[0]["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"] == [
        dict(PCI, resourceName="nvidia.com/GA102GL_A10_24GB")]
    # The name the node advertises is kept on the next run, which changes nothing.
    fake.patches = []
    kind, result = invoke(monkeypatch, fake, hosts=hosts, use_advertised_names=True)
    assert kind == "exit" and not result["changed"] and fake.patches == []


def test_plugin_pci_ids_names_from_the_users_file(monkeypatch, tmp_path):
    ids = tmp_path / "pci.ids"
    ids.write_bytes(b"10de  NVIDIA Corporation\n\t2236  GA102GL [A10 new name]\n")
    fake = FakeKube(kubevirts=[kubevirt()])
    kind, result = invoke(monkeypatch, fake, hosts=[HOSTS[1]], plugin_pci_ids=str(ids))
    assert kind == "exit"
    assert result["permitted_host_devices"]["pciHostDevices"][0]["resourceName"] == "nvidia.com/GA102GL_A10_NEW_NAME"
    kind, result = invoke(monkeypatch, fake, hosts=[HOSTS[1]], plugin_pci_ids=str(tmp_path / "missing"))
    assert kind == "fail" and "cannot read plugin_pci_ids" in result["msg"] and "missing" in result["msg"]
