# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import json

import pytest
from ansible.module_utils import basic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import OWNED_ANNOTATION, workload_labels, PlanError
from ansible_collections.gpuops.sandbox.plugins.modules import kubevirt_host_devices as khd
from ansible_collections.gpuops.sandbox.tests.unit.fakes.fake_kube import (
    SECRET_SCENARIOS, FakeKube, check_clean_end, check_no_credential_shown, fuzz_args, fuzz_values)
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call

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
    return call(monkeypatch, lambda: khd.main(api_factory=lambda p: fake), args)


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


def test_advertised_names_are_reported_and_used_when_asked(monkeypatch):
    # module.warn prints only on a controller (ansible-core 2.19): record the warnings instead of reading stderr.
    warnings = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, warning, **kwargs: warnings.append(warning))
    hosts = [{"name": "p", "workload_type": "vm-passthrough", "gpus": [A10]}]
    advertising = {"metadata": {"name": "p"}, "status": {"allocatable": {"nvidia.com/GA102GL_A10_24GB": "2"}}}
    fake = FakeKube(nodes=[advertising], kubevirts=[kubevirt()])
    kind, result = invoke(monkeypatch, fake, hosts=hosts)
    assert kind == "exit" and result["advertised"]["checked_nodes"] == ["p"]
    assert result["advertised"]["unadvertised"] == [PCI] and result["advertised"]["renamed"] == {}
    assert any("names a resource no node advertises" in warning for warning in warnings)
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
    # A NUL byte in the path (issue 26): the same clear error, not "failed unexpectedly (ValueError ...)".
    fake.patches = []
    # ansible-core 2.20 and newer refuse such an invocation themselves before the module runs (logging it to syslog
    # fails on the NUL): their own clear message, and nothing changed either way.
    kind, result = invoke(monkeypatch, fake, hosts=[HOSTS[1]], plugin_pci_ids=str(ids) + "\x00")
    ours = "cannot read plugin_pci_ids" in result["msg"] and "a file name cannot hold a NUL byte" in result["msg"]
    cores = "embedded null character" in result["msg"]
    assert kind == "fail" and (ours or cores), result
    assert "unexpectedly" not in result["msg"] and "Traceback" not in result["msg"]
    assert fake.patches == []


@pytest.mark.parametrize("value", ["inf", "-inf", "Infinity", " -Infinity", float("inf"), "9" * 5000],
                         ids=lambda value: repr(value)[:12])
def test_request_timeout_not_finite_fails_naming_it(monkeypatch, value):
    """These used to end in a traceback inside ansible-core's integer check."""
    fake = FakeKube(kubevirts=[kubevirt()])
    kind, result = invoke(monkeypatch, fake, request_timeout=value)
    assert kind == "fail" and result["msg"].startswith("request_timeout=") and "nothing was changed" in result["msg"]
    assert fake.requests == 0


@pytest.mark.parametrize("value, needle", [
    (-1, "request_timeout must be 1 to 3600 seconds, got -1; nothing was changed"),
    (0, "request_timeout must be 1 to 3600 seconds, got 0; nothing was changed"),
    (3601, "request_timeout must be 1 to 3600 seconds, got 3601; nothing was changed"),
    ("1e400", "request_timeout must be 1 to 3600 seconds, got a number of 401 digits; nothing was changed"),
])
def test_request_timeout_out_of_range_fails_before_any_request(monkeypatch, value, needle):
    fake = FakeKube(kubevirts=[kubevirt()])
    kind, result = invoke(monkeypatch, fake, request_timeout=value)
    assert kind == "fail" and needle in result["msg"] and fake.requests == 0 and fake.patches == []


def _gpu(**changes):
    gpu = dict(A10)
    for key, value in changes.items():
        if value is _GONE:
            gpu.pop(key)
        else:
            gpu[key] = value
    return gpu


_GONE = object()


@pytest.mark.parametrize("gpus, mdev_parents, needle", [
    ([_gpu(device=_GONE)], [], "hosts[0] (p) gpus[0] has no device"),
    ([A10, _gpu(vendor=_GONE)], [], "hosts[0] (p) gpus[1] has no vendor"),
    ([_gpu(device=2236)], [], "hosts[0] (p) gpus[0].device is 2236, not 4 hex digits"),
    ([_gpu(vendor=["10de"])], [], "hosts[0] (p) gpus[0].vendor is ['10de'], not 4 hex digits"),
    ([_gpu(device="22")], [], "hosts[0] (p) gpus[0].device is '22', not 4 hex digits"),
    ([_gpu(is_vf="no")], [], "hosts[0] (p) gpus[0].is_vf is 'no', not a boolean"),
    ([_gpu(physfn=["0000:65:00.0"])], [], "hosts[0] (p) gpus[0].physfn is ['0000:65:00.0'], not a string"),
    ([_gpu(mdev_types="NVIDIA A10-4Q")], [], "hosts[0] (p) gpus[0].mdev_types is 'NVIDIA A10-4Q', not a list"),
    ([_gpu(mdev_types=["NVIDIA A10-4Q"])], [], "hosts[0] (p) gpus[0].mdev_types[0] is 'NVIDIA A10-4Q', not a mapping"),
    ([_gpu(mdev_types=[{"name": {"x": 1}}])], [], "hosts[0] (p) gpus[0].mdev_types[0].name is {'x': 1}, not a string"),
    ([_gpu(vgpu=[])], [], "hosts[0] (p) gpus[0].vgpu is [], not a mapping"),
    ([_gpu(vgpu={"current_type": [1]})], [], "hosts[0] (p) gpus[0].vgpu.current_type is [1], not an integer"),
    ([_gpu(vgpu={"creatable_types": [{"id": True, "name": "x"}]})], [],
     "hosts[0] (p) gpus[0].vgpu.creatable_types[0].id is True, not a string or an integer"),
    ([], [{"name": "mtty", "types": "Single port serial"}], "hosts[0] (p) mdev_parents[0].types is 'Single port serial', not a list"),
    ([], [{"name": "mtty", "types": [{"name": 5}]}], "hosts[0] (p) mdev_parents[0].types[0].name is 5, not a string"),
])
def test_gpu_entries_it_cannot_read_fail_naming_the_entry(monkeypatch, gpus, mdev_parents, needle):
    """An entry without device used to end in KeyError, a non-string value in AttributeError."""
    fake = FakeKube(kubevirts=[kubevirt()])
    hosts = [{"name": "p", "workload_type": "vm-passthrough", "gpus": gpus, "mdev_parents": mdev_parents}]
    kind, result = invoke(monkeypatch, fake, hosts=hosts)
    assert kind == "fail" and needle in result["msg"] and "nothing was changed" in result["msg"]
    assert "gpuops.sandbox.gpu_facts" in result["msg"]
    assert fake.requests == 0 and fake.patches == []


def test_every_bad_entry_is_named_at_once(monkeypatch):
    hosts = [{"name": "p", "workload_type": "vm-passthrough", "gpus": [A10, _gpu(device=_GONE)]},
             {"name": "v", "workload_type": "vm-vgpu", "gpus": [_gpu(vendor=None, mdev_types=[{"name": 1}])]}]
    kind, result = invoke(monkeypatch, FakeKube(kubevirts=[kubevirt()]), hosts=hosts)
    assert kind == "fail"
    for needle in ("hosts[0] (p) gpus[1] has no device", "hosts[1] (v) gpus[0] has no vendor",
                   "hosts[1] (v) gpus[0].mdev_types[0].name is 1, not a string"):
        assert needle in result["msg"]


@pytest.mark.parametrize("ids, needle", [
    (["10de", "nvidia"], "pci_vendor_ids: 'nvidia' is not a PCI vendor ID"),
    (["0x10de"], "pci_vendor_ids: '0x10de' is not a PCI vendor ID"),
])
def test_bad_vendor_ids_fail_before_any_request(monkeypatch, ids, needle):
    fake = FakeKube(kubevirts=[kubevirt()])
    kind, result = invoke(monkeypatch, fake, pci_vendor_ids=ids)
    assert kind == "fail" and needle in result["msg"] and fake.requests == 0


def test_bad_resource_names_fail_before_any_request(monkeypatch):
    fake = FakeKube(kubevirts=[kubevirt()])
    kind, result = invoke(monkeypatch, fake, resource_names={"10de:22": "nvidia.com/X"})
    assert kind == "fail" and "resource name override key '10de:22' is not valid" in result["msg"] and fake.requests == 0


@pytest.mark.parametrize("scenario", sorted(SECRET_SCENARIOS))
def test_no_failure_shows_a_credential(monkeypatch, tmp_path, scenario):
    """Through the real client, every way a kubeconfig's credential can meet a failure: the secret is nowhere."""
    check_no_credential_shown(tmp_path, scenario, lambda path: call(monkeypatch, khd.main, dict(
        kubeconfig=path, request_timeout=5, hosts=HOSTS)))


_KEYS = ["vendor", "device", "is_vf", "physfn", "address", "mdev_types", "vgpu", "creatable_types", "current_type",
         "id", "name", "resource_name", "types"]
_VF = dict(A10, address="0000:65:00.4", device="2237", is_vf=True, physfn="0000:65:00.0", mdev_types=[],
           vgpu={"creatable_types": [{"id": 1155, "name": "NVIDIA L40S-1B"}], "current_type": 1155})
_GPU = fuzz_args(hs.sampled_from([A10, A10_VGPU, _VF]), dict((key, fuzz_values(_KEYS)) for key in _KEYS), 1)
_HOST = fuzz_args(hs.sampled_from(HOSTS + [{"name": "d", "workload_type": "dra"}]), {
    "name": fuzz_values(), "workload_type": hs.one_of(hs.sampled_from(["container", "vm-passthrough", "vm-vgpu", "dra"]), fuzz_values()),
    "gpus": hs.one_of(hs.lists(_GPU, max_size=3), fuzz_values(_KEYS)),
    "mdev_parents": hs.one_of(hs.lists(hs.fixed_dictionaries({"types": fuzz_values(_KEYS)}), max_size=2), fuzz_values(_KEYS)),
    "vgpu_type_names": fuzz_values(), "bogus": fuzz_values()}, 2)
_ARGS = fuzz_args(hs.fixed_dictionaries({"hosts": hs.lists(hs.sampled_from(HOSTS), min_size=1, max_size=3)}), {
    "hosts": hs.one_of(hs.lists(_HOST, max_size=3), fuzz_values(_KEYS)),
    "namespace": hs.one_of(hs.sampled_from(["", "kubevirt", "other"]), fuzz_values()), "name": fuzz_values(),
    "pci_vendor_ids": fuzz_values(), "kubevirt_version": hs.one_of(hs.sampled_from(["v1.8.2", "1.9", "x"]), fuzz_values()),
    "disable_mdev_configuration": fuzz_values(), "feature_gates": fuzz_values(), "prune": fuzz_values(),
    "resource_names": fuzz_values(["10de:2236", "2236"]), "check_advertised": fuzz_values(),
    "use_advertised_names": fuzz_values(), "plugin_pci_ids": hs.sampled_from(["/nonexistent/gpuops/pci.ids"]),
    "request_timeout": fuzz_values(), "context": fuzz_values(), "bogus": fuzz_values()})


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=_ARGS, check=hs.booleans(), version=hs.sampled_from(["v1.6.0", "v1.8.2", "", "garbage"]))
def test_fuzz_arguments_end_cleanly(monkeypatch, args, check, version):
    advertising = {"metadata": {"name": "p"}, "status": {"allocatable": {"nvidia.com/GA102GL_A10_24GB": "2"}}}
    fake = FakeKube(nodes=[advertising], kubevirts=[kubevirt({"pciHostDevices": [USER]}, version=version)])
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, warning, **kwargs: None)
    kind, result = call(monkeypatch, lambda: khd.main(api_factory=lambda p: fake), dict(args, _ansible_check_mode=check))
    check_clean_end(kind, result)
    if kind == "fail" or check:
        assert fake.patches == []
