# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU sharing settings of container nodes (issue 27) on the facts of real layouts: the H200 host of FACTS.md, and
A100, A30 and L40S GPUs as gpu_facts reports them; the collection's MIG table against the GPU Operator's own default
mig-parted configuration (../shared/upstream beside the checkout)."""

from __future__ import annotations

import os

import pytest
import yaml

from ansible_collections.gpuops.sandbox.plugins.filter.gpu_hosts import gpu_hosts
from ansible_collections.gpuops.sandbox.plugins.filter.gpu_sharing_problems import sharing_problems
from ansible_collections.gpuops.sandbox.plugins.module_utils import _sharing

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MIG_CONFIGMAP = os.path.join(os.path.dirname(TOP), "shared", "upstream", "gpu-operator", "source", "assets",
                             "state-mig-manager", "0400_configmap.yaml")


def gpu(address, device, name, driver="nvidia", subsystem="10de:18bf"):
    return {"address": address, "vendor": "10de", "device": device, "class": "030200", "device_name": name,
            "subsystem_vendor": subsystem.split(":")[0], "subsystem_device": subsystem.split(":")[1],
            "driver": driver, "is_bridge": False}


# The real H200 host: one GPU at 0000:00:06.0, 10de:2335 subsystem 10de:18bf, on nvidia, no IOMMU.
H200 = gpu("0000:00:06.0", "2335", "GH100 [H200 SXM 141GB]")
A100_80 = gpu("0000:17:00.0", "20b5", "GA100 [A100 PCIe 80GB]")
A100_40 = gpu("0000:31:00.0", "20b0", "GA100 [A100 SXM4 40GB]")
A30 = gpu("0000:4b:00.0", "20b7", "GA100GL [A30 PCIe]")
L40S = gpu("0000:ca:00.0", "26b9", "AD102GL [L40S]")


OFF = {"all-disabled": [{"devices": "all", "mig-enabled": False}]}


def host(name, gpus, wtype="container", **variables):
    return dict({"inventory_hostname": name, "gpuops_workload_type": wtype, "gpu_facts_gpus": gpus}, **variables)


def test_seven_1g_18gb_instances_fit_an_h200_and_eight_do_not():
    assert sharing_problems([host("h200", [H200], gpuops_mig_config="all-1g.18gb")]) == []
    mine = {"eight": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 8}}]}
    problems = sharing_problems([host("h200", [H200], gpuops_mig_config="eight")], mig_configs=dict(OFF, **mine))
    assert problems == ["host h200: node h200 GPU 0 (10de:2335, GH100 [H200 SXM 141GB] at 0000:00:06.0), a H200-141GB, "
                        "fits at most 7 instances of 1g.18gb, not 8"]


def test_a_profile_the_gpu_does_not_have_is_refused_with_what_would_fit():
    mine = {"a100-sizes": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]}
    [problem] = sharing_problems([host("h200", [H200], gpuops_mig_config="a100-sizes")], mig_configs=dict(OFF, **mine))
    assert "a H200-141GB, has no MIG profile 1g.10gb; its profiles: 1g.18gb (up to 7), 1g.18gb+me (up to 1), " \
           "1g.35gb (up to 4), 2g.35gb (up to 3), 3g.71gb (up to 2), 4g.71gb (up to 1), 7g.141gb (up to 1)" in problem


def test_instances_that_fit_one_by_one_but_not_together_are_refused():
    """Two 3g.71gb take all eight memory slices of an H200: a 1g.18gb beside them does not fit."""
    mine = {"too-much": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.71gb": 2, "1g.18gb": 1}}],
            "fits": [{"devices": "all", "mig-enabled": True, "mig-devices": {"4g.71gb": 1, "3g.71gb": 1}}]}
    [problem] = sharing_problems([host("h200", [H200], gpuops_mig_config="too-much")], mig_configs=dict(OFF, **mine),
                                 mig_strategy="mixed")
    assert problem.endswith("has 7 compute and 8 memory slices; 3g.71gb x2, 1g.18gb x1 needs 7 and 9, which do not fit")
    assert sharing_problems([host("h200", [H200], gpuops_mig_config="fits")], mig_configs=dict(OFF, **mine), mig_strategy="mixed") == []


def test_the_single_strategy_takes_one_mig_type_per_node():
    [problem] = sharing_problems([host("h200", [H200], gpuops_mig_config="all-balanced")])
    assert "creates 1g.18gb, 2g.35gb, 3g.71gb, but the single MIG strategy exposes one MIG device type per node" in problem
    assert sharing_problems([host("h200", [H200], gpuops_mig_config="all-balanced")], mig_strategy="mixed") == []


def test_default_configs_follow_each_gpu_model():
    """all-1g.10gb is seven instances on an A100-80GB and four on an A100-40GB (the operator's device filters)."""
    both = host("a100s", [A100_80, A100_40], gpuops_mig_config="all-1g.10gb")
    assert sharing_problems([both]) == []
    assert _sharing.default_mig_configs(_sharing.MIG_GPUS)["all-1g.10gb"]["10de:20b0"] == {"1g.10gb": 4}
    # A30: four compute slices; its balanced split has no 3g.
    assert _sharing.default_mig_configs(_sharing.MIG_GPUS)["all-balanced"]["10de:20b7"] == {"1g.6gb": 2, "2g.12gb": 1}
    [problem] = sharing_problems([host("a30", [A30], gpuops_mig_config="all-1g.18gb")])
    assert "MIG config all-1g.18gb is for GH200 144G HBM3e, H200-141GB only" in problem


def test_a_gpu_without_mig_is_refused_and_can_be_described():
    [problem] = sharing_problems([host("l40s", [L40S], gpuops_mig_config="all-enabled")])
    assert "GPU 0 (10de:26b9, AD102GL [L40S] at 0000:ca:00.0) has no MIG" in problem
    assert "time-slicing or MPS" in problem and "gpuops_mig_profiles" not in problem
    assert sharing_problems([host("l40s", [L40S], gpuops_mig_config="all-disabled")]) == []
    own = {"10de:26b9": {"model": "imaginary L40S", "compute": 2, "memory": 2,
                         "profiles": {"1g.24gb": {"max": 2, "compute": 1, "memory": 1}}}}
    mine = {"halves": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.24gb": 2}}]}
    assert sharing_problems([host("l40s", [L40S], gpuops_mig_config="halves")], mig_configs=dict(OFF, **mine), mig_profiles=own) == []
    bad = sharing_problems([], mig_profiles={"26b9x": {}, "26b9": {"model": "x", "compute": 0, "memory": 2,
                                                                   "profiles": {"big": {}}}})
    assert bad[0].startswith("gpuops_mig_profiles['26b9x']: the key must be a PCI ID such as 10de:2335")
    assert "compute must be a whole number from 1 to 64 (got 0)" in bad[1]
    assert "profile 'big' must be named like 1g.18gb" in bad[2]


def test_user_configs_by_device_index_and_filter():
    mine = {"split": [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
                      {"devices": [1], "mig-enabled": False}],
            "filtered": [{"device-filter": "0x233510DE", "devices": "all", "mig-enabled": True,
                          "mig-devices": {"1g.18gb": 7}}]}
    assert sharing_problems([host("two", [A100_80, L40S], gpuops_mig_config="split")], mig_configs=dict(OFF, **mine)) == []
    [problem] = sharing_problems([host("a100", [A100_80], gpuops_mig_config="filtered")], mig_configs=dict(OFF, **mine))
    assert problem.endswith("no entry of MIG config filtered applies to it (devices and device-filter)")
    [problem] = sharing_problems([host("a100", [A100_80], gpuops_mig_config="nope")], mig_configs=dict(OFF, **mine))
    assert problem == "host a100: node a100: MIG config 'nope' is not in gpuops_mig_configs (it has: all-disabled, filtered, split)"

    [problem] = sharing_problems([host("a100", [A100_80])], mig_configs=mine)
    assert problem.startswith("gpuops_mig_configs has no all-disabled config: the MIG Manager applies it")


@pytest.mark.parametrize("configs,expected", [
    ("text", "gpuops_mig_configs must be a mapping of config names"),
    ({"x": []}, "gpuops_mig_configs['x'] must be a non-empty list of entries"),
    ({"x": [{"devices": "some", "mig-enabled": True}]}, "devices must be all or a list of GPU indexes, not 'some'"),
    ({"x": [{"devices": "all", "mig-enabled": "yes"}]}, "mig-enabled must be true or false"),
    ({"x": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": -1}}]}, "the count of 1g.18gb must be a whole number, not -1"),
    ({"x": [{"devices": "all", "mig-enabled": True, "mig-devices": {"huge": 1}}]}, "'huge' is not a MIG profile name"),
    ({"x": [{"devices": "all", "mig-enabled": True, "gpus": 1}]}, "has gpus; accepted: devices, device-filter, mig-enabled, mig-devices"),
])
def test_malformed_mig_configs_are_named(configs, expected):
    problems = sharing_problems([host("h200", [H200], gpuops_mig_config="x")], mig_configs=configs)
    assert problems, configs
    assert any(expected in p for p in problems), problems


def test_mig_and_plugin_configs_are_for_container_nodes_with_facts():
    [problem] = sharing_problems([host("vm", [H200], "vm-passthrough", gpuops_mig_config="all-1g.18gb")])
    assert problem == "host vm: gpuops_mig_config is for container nodes, where the GPU Operator's MIG Manager and " \
                      "device plugin run; this host is a vm-passthrough node"
    [problem] = sharing_problems([host("nofacts", [], gpuops_mig_config="all-1g.18gb")])
    assert "its facts found no GPU" in problem
    [problem] = sharing_problems([host("x", [H200])], mig_strategy="both")
    assert problem == "gpuops_mig_strategy is 'both'; accepted: single, mixed"


TIME_SLICED = {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": False, "resources": [
    {"name": "nvidia.com/gpu", "replicas": 4}]}}}
MPS = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}


def test_time_slicing_and_mps_configs():
    configs = {"l40s-4": TIME_SLICED, "mps-3": MPS}
    hosts = [host("l40s", [L40S], gpuops_device_plugin_config="l40s-4"), host("h200", [H200], gpuops_device_plugin_config="mps-3")]
    assert sharing_problems(hosts, plugin_configs=configs, plugin_config_default="l40s-4") == []
    [problem] = sharing_problems([host("l40s", [L40S], gpuops_device_plugin_config="l40s-8")], plugin_configs=configs)
    assert problem == "host l40s: gpuops_device_plugin_config is 'l40s-8', which gpuops_device_plugin_configs does not " \
                      "have (it has: l40s-4, mps-3)"
    [problem] = sharing_problems([], plugin_configs=configs, plugin_config_default="other")
    assert problem.startswith("gpuops_device_plugin_config_default is 'other'")


@pytest.mark.parametrize("config,expected", [
    ({"version": "v2"}, "version must be v1, not 'v2'"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}}},
     "replicas must be a whole number from 2 to 1024 (sharing by one is no sharing), not 1"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": True}]}}}, "not True"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "amd.com/gpu", "replicas": 2}]}}},
     "name 'amd.com/gpu' is not a resource the device plugin shares"),
    ({"sharing": {"mps": {"resources": [{"name": "nvidia.com/mig-1g.18gb", "replicas": 2}]}}},
     "shares only full GPUs (nvidia.com/gpu) through MPS, not nvidia.com/mig-1g.18gb"),
    ({"sharing": {"mps": {"failRequestsGreaterThanOne": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
     "sharing.mps has failRequestsGreaterThanOne; accepted: renameByDefault, resources"),
    ({"sharing": {"timeSlicing": {}, "mps": {}}}, "sharing must hold exactly one of timeSlicing and mps"),
    ({"sharing": {"timeSlicing": {"resources": []}}}, "resources must be a non-empty list of {name, replicas}"),
    ({"sharing": {"timeSlicing": {"renameByDefault": "no", "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
     "renameByDefault must be true or false, not 'no'"),
])
def test_malformed_plugin_configs_are_named(config, expected):
    problems = sharing_problems([], plugin_configs={"bad": config})
    assert any(p.startswith("gpuops_device_plugin_configs['bad']") and expected in p for p in problems), problems


@pytest.mark.parametrize("policy,expected", [
    ({"autoUpgrade": "yes"}, "gpuops_driver_upgrade_policy.autoUpgrade must be true or false, not 'yes'"),
    ({"maxUnavailable": "120%"}, "maxUnavailable must be a count (0 or more) or a percentage from 0% to 100%, not '120%'"),
    ({"maxUnavailable": -1}, "not -1"),
    ({"maxParallelUpgrades": 1.5}, "maxParallelUpgrades must be a whole number, 0 or more, not 1.5"),
    ({"drain": {"enable": True, "timeoutSeconds": 0}}, "drain.timeoutSeconds must be seconds from 1 to 86400, not 0"),
    ({"gpuPodDeletion": {"timeoutSeconds": -5}}, "gpuPodDeletion.timeoutSeconds must be seconds from 1 to 86400"),
    ({"drain": {"enabled": True}}, "drain has enabled; accepted: deleteEmptyDir, enable, force, podSelector, timeoutSeconds"),
    ({"maxSurge": 1}, "has maxSurge; accepted: autoUpgrade, drain, gpuPodDeletion, maxParallelUpgrades, maxUnavailable"),
])
def test_bad_upgrade_policies_are_named(policy, expected):
    problems = sharing_problems([], upgrade_policy=policy)
    assert any(expected in p for p in problems), problems


def test_good_upgrade_policies():
    policy = {"autoUpgrade": True, "maxParallelUpgrades": 0, "maxUnavailable": "25%",
              "waitForCompletion": {"timeoutSeconds": 0, "podSelector": "app=training"},
              "gpuPodDeletion": {"force": False, "timeoutSeconds": 300, "deleteEmptyDir": False},
              "drain": {"enable": True, "force": False, "podSelector": "", "timeoutSeconds": 300, "deleteEmptyDir": True}}
    assert sharing_problems([], upgrade_policy=policy) == []
    assert sharing_problems([], upgrade_policy={"maxUnavailable": 2}) == []


def test_labels_and_their_release():
    [entry] = gpu_hosts([host("h200", [H200], gpuops_mig_config="all-1g.18gb", gpuops_device_plugin_config="ts")])
    assert entry["labels"]["nvidia.com/mig.config"] == "all-1g.18gb"
    assert entry["labels"]["nvidia.com/device-plugin.config"] == "ts"
    assert (entry["mig_config"], entry["device_plugin_config"]) == ("all-1g.18gb", "ts")
    # A MIG config the collection set and no longer wants goes back to the MIG Manager's all-disabled.
    [entry] = gpu_hosts([host("h200", [H200])])
    assert "nvidia.com/mig.config" not in entry["labels"]
    assert entry["release_to"]["nvidia.com/mig.config"] == "all-disabled"
    [entry] = gpu_hosts([host("vm", [H200], "vm-passthrough")])
    assert "nvidia.com/mig.config" not in entry["release_to"]


@pytest.fixture(scope="module")
def upstream_configs():
    if not os.path.exists(MIG_CONFIGMAP):
        pytest.skip("no ../shared/upstream beside the checkout: the comparison with the operator's configuration is skipped")
    with open(MIG_CONFIGMAP, encoding="utf-8") as handle:
        configmap = yaml.safe_load(handle)
    return yaml.safe_load(configmap["data"]["config.yaml"])["mig-configs"]


# GPUs of the operator's configuration the collection's table leaves to gpuops_mig_profiles.
NOT_IN_TABLE = set(_sharing.MIG_UNDESCRIBED)


def test_the_table_agrees_with_the_operators_default_configuration(upstream_configs):
    """Every entry the operator filters by device fits the collection's table for that device; every unfiltered
    single-profile config has the table's instance count for each model that has the profile; every profile of
    the table has the operator's all-<profile> config, and the operator's all-balanced is the table's."""
    table = _sharing.MIG_GPUS
    checked = 0
    for name, entries in upstream_configs.items():
        for entry in entries:
            devices = entry.get("mig-devices") or {}
            ids = _sharing._filter_ids(entry)  # pylint: disable=protected-access
            if ids:
                for pci_id in ids:
                    if pci_id in NOT_IN_TABLE:
                        continue
                    assert pci_id in table, (name, pci_id)
                    assert _sharing.check_profiles(table[pci_id], devices, pci_id) == [], (name, pci_id)
                    checked += 1
            elif len(devices) == 1:
                [(profile, count)] = devices.items()
                for pci_id, model in table.items():
                    if profile in model["profiles"]:
                        assert model["profiles"][profile]["max"] == count, (name, pci_id)
                        checked += 1
    for pci_id, model in table.items():
        for profile in model["profiles"]:
            assert _sharing._config_key(profile) in upstream_configs, (pci_id, profile)  # pylint: disable=protected-access
    balanced = _sharing.default_mig_configs(table)["all-balanced"]
    for entry in upstream_configs["all-balanced"]:
        for pci_id in _sharing._filter_ids(entry):  # pylint: disable=protected-access
            if pci_id not in NOT_IN_TABLE:
                assert balanced[pci_id] == entry["mig-devices"], pci_id
    assert checked > 100
    # The GPUs the operator's configuration filters on are the table's and those it leaves undescribed: any other
    # GPU has no MIG as far as the two know, which is what a MIG config asked of it is told.
    filtered = {pci_id for entries in upstream_configs.values() for entry in entries
                for pci_id in _sharing._filter_ids(entry) or []}  # pylint: disable=protected-access
    assert filtered == set(table) | NOT_IN_TABLE


def test_a_driver_installed_on_the_host_keeps_the_operators_driver_off_the_node():
    """The H200 host's driver 580.159.04 came with the distribution: its node gets nvidia.com/gpu.deploy.driver=false
    (container and dra nodes); released, the label goes back to the operator's true."""
    facts = {"nvidia_driver": {"loaded": True, "version": "580.159.04", "host_module": "updates/dkms/nvidia.ko.zst",
                               "source": "host"}}
    [entry] = gpu_hosts([host("h200", [H200], gpu_facts_host=facts)])
    assert entry["labels"]["nvidia.com/gpu.deploy.driver"] == "false" and entry["driver_source"] == "host"
    assert entry["release_to"]["nvidia.com/gpu.deploy.driver"] == "true"
    [entry] = gpu_hosts([host("h200", [H200], "dra", gpu_facts_host=facts)])
    assert entry["labels"]["nvidia.com/gpu.deploy.driver"] == "false"
    operator = {"nvidia_driver": dict(facts["nvidia_driver"], host_module=None, source="operator")}
    [entry] = gpu_hosts([host("h200", [H200], gpu_facts_host=operator)])
    assert "nvidia.com/gpu.deploy.driver" not in entry["labels"] and entry["driver_source"] == "operator"
    [entry] = gpu_hosts([host("vm", [H200], "vm-passthrough", gpu_facts_host=facts)])
    assert "nvidia.com/gpu.deploy.driver" not in entry["labels"]
    assert "nvidia.com/gpu.deploy.driver" not in entry["release_to"]
