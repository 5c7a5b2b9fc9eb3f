# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The GPU facts an inventory gives for a host the collection does not read (issue 43): what gpu_facts returns on the
fake hosts passes unchanged; the shapes a user writes by hand are named with the host, the key, the value and what
is accepted; a device ID written as a number of four digits is the ID it spells."""

from __future__ import annotations

import pytest
import yaml

from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
from ansible_collections.gpuops.sandbox.plugins.module_utils._inventory_facts import check_facts
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.host_vars import HostVars
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call_main

H200 = {"address": "0000:00:06.0", "vendor": "10de", "device": "2335", "class": "030200", "driver": "nvidia",
        "device_name": "GH100 [H200 SXM 141GB]"}


def inventory(text):
    """Host variables as YAML reads them from an inventory."""
    return HostVars(yaml.safe_load(text))


@pytest.mark.parametrize("build, args", [(st.build_gpu_host, {}), (st.build_gpu_host, {"include_all": True}),
                                         (st.build_lab_host, {"include_all": True})])
def test_what_gpu_facts_returns_passes_unchanged(monkeypatch, tmp_path, build, args):
    tree = build(tmp_path)
    kind, result = call_main(monkeypatch, gpu_facts, tree.root, args)
    assert kind == "exit", result
    found = result["ansible_facts"]
    assert found["gpu_facts_gpus"], "the fake host has GPUs"
    facts, problems = check_facts("gpu-a", HostVars(found), require_gpus=True)
    assert problems == []
    assert facts == {key: found[key] for key in ("gpu_facts_gpus", "gpu_facts_host", "gpu_facts_mdev_parents")}


def test_a_device_id_written_as_a_number_is_the_id_it_spells():
    facts, problems = check_facts("gpu-a10", inventory("""
        gpu_facts_gpus:
          - {address: "0000:65:00.0", vendor: 8086, device: 2236, subsystem_vendor: 10de, subsystem_device: 1482}
        """))
    assert problems == []
    gpu = facts["gpu_facts_gpus"][0]
    assert (gpu["vendor"], gpu["device"], gpu["subsystem_vendor"], gpu["subsystem_device"]) == ("8086", "2236", "10de", "1482")
    assert type(gpu["device"]) is str  # pylint: disable=unidiomatic-typecheck


@pytest.mark.parametrize("text, problem", [
    # YAML 1.1 reads 0233 as octal (155) and 0x2335 as hexadecimal (9013 would be a plausible ID: see the module)
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: 0233}]',
     'host h: gpu_facts_gpus[0].device is 155; accepted: the PCI device ID as 4 hex digits in quotes, such as "2335" '
     '(YAML reads an unquoted 0233 or 0x2335 as another number)'),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: 12345}]',
     "host h: gpu_facts_gpus[0].device is 12345; accepted: the PCI device ID as 4 hex digits"),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: true}]',
     "host h: gpu_facts_gpus[0].device is true; accepted: the PCI device ID as 4 hex digits"),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: "23356"}]',
     'host h: gpu_facts_gpus[0].device is "23356"; accepted: the PCI device ID as 4 hex digits'),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de"}]',
     'host h: gpu_facts_gpus[0] ({"address": "0000:00:06.0", "vendor": "10de"}) has no device (the PCI device ID as 4 '
     'hex digits in quotes, such as "2335"'),
    ('gpu_facts_gpus: [{vendor: "10de", device: null}]',
     'host h: gpu_facts_gpus[0] ({"device": null, "vendor": "10de"}) has no address (a PCI address as text, '
     'domain:bus:slot.function such as "0000:65:00.0") and no device (the PCI device ID'),
    ('gpu_facts_gpus: [{address: "00:06.0", vendor: "10de", device: "2335"}]',
     'host h: gpu_facts_gpus[0].address is "00:06.0"; accepted: a PCI address as text, domain:bus:slot.function such '
     'as "0000:65:00.0"'),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: "2335", device_name: 4090}]',
     'host h: gpu_facts_gpus[0].device_name is 4090; accepted: text, in quotes for one that looks like a number '
     '("4090") or null'),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: "2335", class: 030200}]',
     'host h: gpu_facts_gpus[0].class is 12416; accepted: the PCI class code as 6 hex digits in quotes, such as '
     '"030200" (YAML reads an unquoted 030200 as an octal number) or null'),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: "2335", is_vf: "no"}]',
     'host h: gpu_facts_gpus[0].is_vf is "no"; accepted: true or false'),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: "2335", mdev_types: [{id: nvidia-1, name: [x]}]}]',
     'host h: gpu_facts_gpus[0].mdev_types[0].name is ["x"]; accepted: text or null'),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: "2335", virtfns: "0000:00:06.4"}]',
     'host h: gpu_facts_gpus[0].virtfns is "0000:00:06.4"; accepted: a list of PCI addresses'),
    ('gpu_facts_gpus: [{address: "0000:00:06.0", vendor: "10de", device: "2335", vgpu: {creatable_types: 3}}]',
     "host h: gpu_facts_gpus[0].vgpu.creatable_types is 3; accepted: a list of vGPU types"),
    ('gpu_facts_gpus: "0000:00:06.0"',
     'host h: gpu_facts_gpus is "0000:00:06.0"; accepted: a list of mappings as gpu_facts returns them, each with at '
     'least address, vendor and device'),
    ('gpu_facts_gpus: {address: "0000:00:06.0"}',
     'host h: gpu_facts_gpus is {"address": "0000:00:06.0"}; accepted: a list of mappings'),
    ('gpu_facts_gpus: ["0000:00:06.0"]',
     'host h: gpu_facts_gpus[0] is "0000:00:06.0"; accepted: a mapping with address, vendor and device'),
    ("gpu_facts_host: {nvidia_driver: host}",
     'host h: gpu_facts_host.nvidia_driver is "host"; accepted: a mapping with loaded, version, host_module and source '
     "or null"),
    ("gpu_facts_host: {nvidia_driver: {source: host, version: 550.54}}",
     'host h: gpu_facts_host.nvidia_driver.version is 550.54; accepted: text such as "580.159.04" (quote it: YAML reads '
     "an unquoted 535.10 as a number and drops its trailing zero) or null"),
    ("gpu_facts_host: {nvidia_driver: {source: distro}}",
     'host h: gpu_facts_host.nvidia_driver.source is "distro"; accepted: one of host, operator, other or null'),
    ("gpu_facts_host: {os: {id: ubuntu, version_id: 20.10}}",
     'host h: gpu_facts_host.os.version_id is 20.1; accepted: text such as "22.04"'),
    ("gpu_facts_host: host",
     'host h: gpu_facts_host is "host"; accepted: a mapping as gpu_facts returns it (os, nvidia_driver, ...) or null'),
    ("gpu_facts_host: [1]",
     "host h: gpu_facts_host is [1]; accepted: a mapping as gpu_facts returns it"),
    ("gpu_facts_mdev_parents: [{types: []}]",
     'host h: gpu_facts_mdev_parents[0] ({"types": []}) has no name (text)'),
    ("gpu_facts_mdev_parents: [{name: mtty, types: {id: mtty-1}}]",
     'host h: gpu_facts_mdev_parents[0].types is {"id": "mtty-1"}; accepted: a list of mediated device types'),
])
def test_each_bad_shape_is_named(text, problem):
    _facts, problems = check_facts("h", inventory(text))
    assert len(problems) == 1, problems
    assert problems[0].startswith(problem), problems[0]
    assert len(problems[0]) < 400


def test_an_int_version_is_text_and_the_os_versions_too():
    facts, problems = check_facts("h", inventory("""
        gpu_facts_host:
          nvidia_driver: {loaded: true, version: 550, host_module: null, source: host}
          os: {id: debian, version_id: 12, major: 12}
        """))
    assert problems == []
    assert facts["gpu_facts_host"]["nvidia_driver"]["version"] == "550"
    assert facts["gpu_facts_host"]["os"] == {"id": "debian", "version_id": "12", "major": "12"}


def test_every_bad_value_of_a_host_is_named_at_once():
    _facts, problems = check_facts("gpu-b", inventory("""
        gpu_facts_gpus:
          - {address: "0000:00:06.0", vendor: "10de", device: 0233, device_name: 7}
          - {address: "0000:00:07.0", vendor: "10de"}
        gpu_facts_host: {nvidia_driver: host}
        """))
    assert [p.split(";")[0] for p in problems] == [
        "host gpu-b: gpu_facts_gpus[0].device is 155",
        "host gpu-b: gpu_facts_gpus[0].device_name is 7",
        'host gpu-b: gpu_facts_gpus[1] ({"address": "0000:00:07.0", "vendor": "10de"}) has no device (the PCI device '
        'ID as 4 hex digits in quotes, such as "2335" (YAML reads an unquoted 0233 or 0x2335 as another number))',
        'host gpu-b: gpu_facts_host.nvidia_driver is "host"']


def test_missing_facts_and_what_is_kept():
    assert check_facts("h", HostVars({}), require_gpus=True)[1] == [
        "host h: gpu_facts_gpus is not given; accepted: a list of mappings as gpu_facts returns them, each with at "
        "least address, vendor and device"]
    assert check_facts("h", HostVars({"gpu_facts_gpus": None}), require_gpus=True)[1][0].startswith(
        "host h: gpu_facts_gpus is null; accepted")
    assert check_facts("h", HostVars({})) == ({}, [])
    assert check_facts("h", HostVars({"gpu_facts_gpus": None, "gpu_facts_host": None})) == (
        {"gpu_facts_gpus": [], "gpu_facts_host": None}, [])
    # Keys gpu_facts does not return are the inventory's own: kept as they are.
    facts, problems = check_facts("h", HostVars({"gpu_facts_gpus": [dict(H200, rack="r7", slot=3)]}))
    assert problems == [] and facts["gpu_facts_gpus"] == [dict(H200, rack="r7", slot=3)]
    assert check_facts("h", "gpu_facts_gpus") == ({}, ['host h: its host variables are "gpu_facts_gpus", not a mapping'])
