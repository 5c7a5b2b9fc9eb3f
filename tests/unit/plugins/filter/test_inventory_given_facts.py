# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The cluster filters on host variables as a play hands them (issue 43): a Mapping that is not a dict (ansible-core
2.19's HostVarsVars), GPU facts an inventory gives in shapes gpu_facts never returns, config names given as lists,
and a MIG config asked of a GPU without MIG."""

from __future__ import annotations

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.gpu_hosts import gpu_hosts
from ansible_collections.gpuops.sandbox.plugins.filter.gpu_sharing_problems import sharing_problems
from ansible_collections.gpuops.sandbox.plugins.filter.inventory_gpu_facts import inventory_gpu_facts
from ansible_collections.gpuops.sandbox.tests.unit.fakes.host_vars import HostVars

H200 = {"address": "0000:00:06.0", "vendor": "10de", "device": "2335", "class": "030200", "driver": "nvidia",
        "device_name": "GH100 [H200 SXM 141GB]"}
L40S = {"address": "0000:ca:00.0", "vendor": "10de", "device": "26b9", "class": "030200", "driver": "nvidia",
        "device_name": "AD102GL [L40S]"}
RTX_PRO_6000 = {"address": "0000:81:00.0", "vendor": "10de", "device": "2bb5", "class": "030200", "driver": "nvidia",
                "device_name": "GB202GL [RTX PRO 6000 Blackwell Server Edition]"}
OFF = {"all-disabled": [{"devices": "all", "mig-enabled": False}]}
EIGHT = {"eight": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 8}}]}
TIME_SLICED = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}


def host(name, gpus, wtype="container", **variables):
    """A host's variables as the play hands them: a Mapping, not a dict."""
    return HostVars(dict({"inventory_hostname": name, "gpuops_workload_type": wtype, "gpu_facts_gpus": gpus}, **variables))


def from_yaml(name, text, **variables):
    """A host whose variables are the inventory YAML ``text`` (numbers where a user left out the quotes)."""
    return HostVars(dict(yaml.safe_load(text), inventory_hostname=name, **variables))


# ---------------------------------------------------------------------------------------------
# Host variables that are a Mapping (defect 2)
# ---------------------------------------------------------------------------------------------

def test_a_host_given_as_a_mapping_is_checked():
    assert not isinstance(host("h200", [H200]), dict)
    [problem] = sharing_problems([host("h200", [H200], gpuops_mig_config="eight")], mig_configs=dict(OFF, **EIGHT))
    assert problem == ("host h200: node h200 GPU 0 (10de:2335, GH100 [H200 SXM 141GB] at 0000:00:06.0), a H200-141GB, "
                       "fits at most 7 instances of 1g.18gb, not 8")
    [problem] = sharing_problems([host("vm", [H200], "vm-passthrough", gpuops_device_plugin_config="ts")])
    assert problem.startswith("host vm: gpuops_device_plugin_config is for container nodes")
    [entry] = gpu_hosts([host("h200", [H200], gpuops_mig_config="all-1g.18gb")])
    assert entry["labels"]["nvidia.com/mig.config"] == "all-1g.18gb"


# ---------------------------------------------------------------------------------------------
# GPU facts of another shape than gpu_facts returns (defect 7)
# ---------------------------------------------------------------------------------------------

def test_a_device_id_written_as_a_number_is_the_id():
    a10 = from_yaml("a10", """
        gpu_facts_gpus: [{address: "0000:65:00.0", vendor: "10de", device: 2236, class: "030200", driver: vfio-pci}]
        """, gpuops_workload_type="vm-passthrough")
    [entry] = gpu_hosts([a10])
    assert entry["gpus"][0]["device"] == "2236"
    assert entry["resources"] == ["nvidia.com/GA102GL_A10"]
    h200 = from_yaml("h200", """
        gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: 2335, device_name: "GH100 [H200 SXM 141GB]"}]
        """, gpuops_mig_config="eight", group_names=["gpu_nodes", "container"])
    [problem] = sharing_problems([h200], mig_configs=dict(OFF, **EIGHT))
    assert "a H200-141GB, fits at most 7 instances of 1g.18gb, not 8" in problem


BAD = [
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", class: "030200"}]',
     'host bad: gpu_facts_gpus[0] ({"address": "0000:00:06.0", "class": "030200", "vendor": "10de"}) has no device '
     '(the PCI device ID as 4 hex digits in quotes, such as "2335"'),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: "2335", device_name: 4090}]',
     "host bad: gpu_facts_gpus[0].device_name is 4090; accepted: text"),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: "2335"}]\ngpu_facts_host: {nvidia_driver: host}',
     'host bad: gpu_facts_host.nvidia_driver is "host"; accepted: a mapping with loaded, version, host_module and source'),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: "2335"}]\n'
     "gpu_facts_host: {nvidia_driver: {source: host, version: 550.54}}",
     'host bad: gpu_facts_host.nvidia_driver.version is 550.54; accepted: text such as "580.159.04"'),
]


@pytest.mark.parametrize("text, problem", BAD)
def test_bad_facts_are_named_by_the_sharing_check(text, problem):
    problems = sharing_problems([from_yaml("bad", text, gpuops_mig_config="all-1g.18gb"), host("good", [H200])])
    assert len(problems) == 1 and problems[0].startswith(problem), problems


@pytest.mark.parametrize("text, problem", BAD)
def test_bad_facts_are_named_by_the_labels(text, problem):
    with pytest.raises(AnsibleFilterError) as caught:
        gpu_hosts([host("good", [H200]), from_yaml("bad", text)])
    assert str(caught.value).startswith(problem)


@pytest.mark.parametrize("text, problem", BAD)
def test_bad_facts_are_named_where_they_enter(text, problem):
    result = inventory_gpu_facts(from_yaml("bad", text), "bad")
    assert len(result["problems"]) == 1 and result["problems"][0].startswith(problem)


def test_the_entry_check_returns_the_facts_in_gpu_facts_shape():
    result = inventory_gpu_facts(from_yaml("a10", """
        gpu_facts_gpus: [{address: "0000:65:00.0", vendor: "10de", device: 2236}]
        gpu_facts_host: {nvidia_driver: {source: host, version: "550.54.15"}}
        """), "a10")
    assert result == {"problems": [], "facts": {
        "gpu_facts_gpus": [{"address": "0000:65:00.0", "vendor": "10de", "device": "2236"}],
        "gpu_facts_host": {"nvidia_driver": {"source": "host", "version": "550.54.15"}}}}
    assert inventory_gpu_facts(HostVars({}), "none")["problems"] == [
        "host none: gpu_facts_gpus is not given; accepted: a list of mappings as gpu_facts returns them, each with at "
        "least address, vendor and device"]
    assert inventory_gpu_facts(HostVars({}), "none", require_gpus=False) == {"problems": [], "facts": {}}
    with pytest.raises(AnsibleFilterError, match="require_gpus must be a boolean"):
        inventory_gpu_facts(HostVars({}), "none", require_gpus="maybe")


# ---------------------------------------------------------------------------------------------
# Config names given as lists (defect 8)
# ---------------------------------------------------------------------------------------------

def test_a_device_plugin_config_given_as_a_list_is_named():
    configs = {"ts-4": TIME_SLICED}
    [problem] = sharing_problems([host("l40s", [L40S], gpuops_device_plugin_config=["ts-4"])], plugin_configs=configs)
    assert problem == ('host l40s: gpuops_device_plugin_config is ["ts-4"], which is not the name of one of '
                       "gpuops_device_plugin_configs; accepted: one of their names as a string (it has: ts-4)")
    [problem] = sharing_problems([], plugin_configs=configs, plugin_config_default=["ts-4"])
    assert problem == ('gpuops_device_plugin_config_default is ["ts-4"], which is not the name of one of '
                       "gpuops_device_plugin_configs; accepted: one of their names as a string (it has: ts-4)")
    [problem] = sharing_problems([], plugin_config_default={"ts-4": None})
    assert problem.startswith('gpuops_device_plugin_config_default is {"ts-4": null}, which is not the name')
    assert problem.endswith("(it has: none)")


def test_a_mig_config_given_as_a_list_is_named():
    [problem] = sharing_problems([host("h200", [H200], gpuops_mig_config=["all-1g.18gb"])])
    assert problem == ('host h200: gpuops_mig_config is ["all-1g.18gb"], which is not the name of a MIG config; '
                       "accepted: the name of one, as a string")


# ---------------------------------------------------------------------------------------------
# A MIG config on a GPU without MIG (defect 11)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mig_configs, config", [(None, "all-1g.18gb"), (None, "all-enabled"),
                                                 (dict(OFF, **EIGHT), "eight")])
def test_a_gpu_without_mig_is_refused_with_what_to_do_instead(mig_configs, config):
    [problem] = sharing_problems([host("l40s", [L40S], gpuops_mig_config=config)], mig_configs=mig_configs)
    assert problem.startswith("host l40s: node l40s GPU 0 (10de:26b9, AD102GL [L40S] at 0000:ca:00.0) has no MIG")
    assert "give node l40s no gpuops_mig_config (or all-disabled)" in problem
    assert "time-slicing or MPS (gpuops_device_plugin_config)" in problem
    assert "gpuops_mig_profiles" not in problem


def test_a_mig_gpu_the_table_does_not_describe_can_be_described():
    [problem] = sharing_problems([host("pro", [RTX_PRO_6000], gpuops_mig_config="all-enabled")])
    assert "is a MIG GPU whose profiles the collection does not know" in problem
    assert problem.endswith("describe it in gpuops_mig_profiles")
