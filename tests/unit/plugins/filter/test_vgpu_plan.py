# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""vgpu_plan: a vGPU Device Manager configuration turned into SR-IOV counts and mdev_create calls."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.vgpu_plan import FilterModule, vgpu_plan
from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st

A10_A = "0000:17:00.0"
A10_B = "0000:65:00.0"
A100 = "0000:b1:00.0"

A10_TYPES = [{"id": "nvidia-588", "name": "NVIDIA A10-4Q"}, {"id": "nvidia-589", "name": "NVIDIA A10-8Q"},
             {"id": "nvidia-590", "name": "NVIDIA A10-12Q"}]


def gpu(address, totalvfs=None):
    return {"address": address, "sriov_totalvfs": totalvfs, "physfn": None, "is_vf": False}


def facts_two_a10():
    return {
        "gpus": [gpu(A10_A), gpu(A10_B)],
        "mdev_parents": [{"name": A10_A, "address": A10_A, "types": A10_TYPES},
                         {"name": A10_B, "address": A10_B, "types": A10_TYPES}],
        "host": {"sriov": {}},
    }


def facts_a10_and_a100():
    return {
        "gpus": [gpu(A10_A), gpu(A100, totalvfs=20)],
        "mdev_parents": [{"name": A10_A, "address": A10_A, "types": A10_TYPES}],
        "host": {"sriov": {A100: {"numvfs": 0, "totalvfs": 20}}},
    }


def config(**configs):
    return {"version": "v1", "vgpu-configs": configs}


CONFIG = config(**{
    "A10-8Q": [{"devices": "all", "vgpu-devices": {"A10-8Q": 3}}],
    "mixed": [{"devices": [0], "vgpu-devices": {"A10-4Q": 6}},
              {"devices": [1], "vgpu-devices": {"A10-12Q": 2, "A10-8Q": 0}}],
    "default": [{"devices": "all", "vgpu-devices": {}}],
})


def test_filter_is_registered():
    assert FilterModule().filters()["vgpu_plan"] is vgpu_plan


def test_all_devices_one_type():
    plan = vgpu_plan(facts_two_a10(), CONFIG, "A10-8Q")
    assert plan == {
        "sriov": {},
        "mdev": [{"parent": A10_A, "type": "nvidia-589", "count": 3, "pf": False},
                 {"parent": A10_B, "type": "nvidia-589", "count": 3, "pf": False}],
        "types": ["nvidia-589"],
    }


def test_devices_default_to_all():
    plan = vgpu_plan(facts_two_a10(), config(x=[{"vgpu-devices": {"A10-4Q": 1}}]), "x")
    assert [c["parent"] for c in plan["mdev"]] == [A10_A, A10_B]


def test_indices_pick_gpus_and_zero_counts_only_name_the_type():
    plan = vgpu_plan(facts_two_a10(), CONFIG, "mixed")
    assert plan["mdev"] == [{"parent": A10_A, "type": "nvidia-588", "count": 6, "pf": False},
                            {"parent": A10_B, "type": "nvidia-590", "count": 2, "pf": False}]
    assert plan["types"] == ["nvidia-588", "nvidia-590", "nvidia-589"]


def test_empty_vgpu_devices_gives_an_empty_plan():
    assert vgpu_plan(facts_two_a10(), CONFIG, "default") == {"sriov": {}, "mdev": [], "types": []}


def test_indices_follow_the_gpu_order_given():
    facts = facts_two_a10()
    plan = vgpu_plan(facts, config(x=[{"devices": [1, 0, 1], "vgpu-devices": {"A10-4Q": 1}}]), "x")
    assert [c["parent"] for c in plan["mdev"]] == [A10_B, A10_A, A10_B]


@pytest.mark.parametrize("spec,resolved", [
    ("nvidia-589", "nvidia-589"),          # by id
    ("NVIDIA A10-8Q", "nvidia-589"),       # by name
    ("A10-8Q", "nvidia-589"),              # by "NVIDIA " + name
    ("L40S-1Q", "NVIDIA L40S-1Q"),         # not visible: passed on with the prefix
    ("NVIDIA L40S-2B", "NVIDIA L40S-2B"),  # not visible, prefix kept once
    ("nvidia-999", "NVIDIA nvidia-999"),
])
def test_type_resolution(spec, resolved):
    plan = vgpu_plan(facts_two_a10(), config(x=[{"devices": [0], "vgpu-devices": {spec: 1}}]), "x")
    assert plan["types"] == [resolved] and plan["mdev"][0]["type"] == resolved


def test_type_resolution_uses_every_parent_and_numeric_keys():
    facts = facts_two_a10()
    facts["mdev_parents"][1]["types"] = [{"id": "mtty-1", "name": "Single port serial"}]
    facts["mdev_parents"][0]["types"] = [{"id": "42", "name": None}]
    plan = vgpu_plan(facts, config(x=[{"devices": [0], "vgpu-devices": {"Single port serial": 1, 42: 1}}]), "x")
    assert plan["types"] == ["mtty-1", "42"]


def test_same_type_in_two_entries_is_listed_once():
    cfg = config(x=[{"devices": [0], "vgpu-devices": {"A10-4Q": 1}},
                    {"devices": [1], "vgpu-devices": {"nvidia-588": 2}}])
    plan = vgpu_plan(facts_two_a10(), cfg, "x")
    assert plan["types"] == ["nvidia-588"] and [c["count"] for c in plan["mdev"]] == [1, 2]


def test_counts_given_as_text_are_accepted():
    plan = vgpu_plan(facts_two_a10(), config(x=[{"devices": ["1"], "vgpu-devices": {"A10-4Q": "4"}}]), "x")
    assert plan["mdev"] == [{"parent": A10_B, "type": "nvidia-588", "count": 4, "pf": False}]


def test_explicit_parents_override_the_gpus():
    facts = facts_a10_and_a100()
    parents = ["0000:b1:00.4", "0000:b1:00.5", "mtty"]
    plan = vgpu_plan(facts, config(x=[{"devices": [2, 0], "vgpu-devices": {"A100-4C": 1}}]), "x", parents=parents)
    assert plan["mdev"] == [{"parent": "mtty", "type": "NVIDIA A100-4C", "count": 1, "pf": False},
                            {"parent": "0000:b1:00.4", "type": "NVIDIA A100-4C", "count": 1, "pf": False}]
    # The SR-IOV GPUs still get their VFs.
    assert plan["sriov"] == {A100: 20}


def test_explicit_parent_that_is_a_pf_is_not_marked_pf():
    plan = vgpu_plan(facts_a10_and_a100(), config(x=[{"vgpu-devices": {"A100-4C": 1}}]), "x", parents=[A100])
    assert plan["mdev"] == [{"parent": A100, "type": "NVIDIA A100-4C", "count": 1, "pf": False}]


def test_sriov_gpus_get_all_their_vfs_and_pf_calls():
    plan = vgpu_plan(facts_a10_and_a100(), config(x=[{"devices": "all", "vgpu-devices": {"A10-4Q": 2}}]), "x")
    assert plan["sriov"] == {A100: 20}
    assert plan["mdev"] == [{"parent": A10_A, "type": "nvidia-588", "count": 2, "pf": False},
                            {"parent": A100, "type": "nvidia-588", "count": 2, "pf": True}]


def test_numvfs_overrides_totalvfs():
    plan = vgpu_plan(facts_a10_and_a100(), config(x=[{"devices": [1], "vgpu-devices": {"A100-4C": 4}}]), "x",
                     numvfs=4)
    assert plan["sriov"] == {A100: 4}
    assert plan["mdev"] == [{"parent": A100, "type": "NVIDIA A100-4C", "count": 4, "pf": True}]


def test_explicit_sriov_pfs():
    facts = facts_a10_and_a100()
    facts["host"]["sriov"]["0000:ca:00.0"] = {"numvfs": 0, "totalvfs": 32}
    plan = vgpu_plan(facts, config(x=[{"devices": [1], "vgpu-devices": {"A100-4C": 1}}]), "x",
                     sriov_pfs=["0000:ca:00.0"])
    assert plan["sriov"] == {"0000:ca:00.0": 32}
    # A100 is a PCI GPU but not among the PFs asked for: its entry is a plain parent.
    assert plan["mdev"][0]["pf"] is False


def test_none_arguments_are_like_defaults():
    assert vgpu_plan(facts_two_a10(), CONFIG, "A10-8Q", parents=None, sriov_pfs=None) == \
        vgpu_plan(facts_two_a10(), CONFIG, "A10-8Q")


def test_plan_from_real_gpu_facts(tmp_path):
    """The filter fed from gpu_facts on a host whose A100 has no VFs yet (the first run)."""
    tree = st.build_gpu_host(tmp_path)
    # No VFs yet: remove the VFs of both SR-IOV GPUs from the fake host.
    for pf, vfs in ((st.A100, st.A100_VFS), (st.L40S, st.L40S_VFS)):
        tree.write(tree.functions[pf] + "/sriov_numvfs", "0\n")
        for index, vf in enumerate(vfs):
            os.unlink(tree.path(tree.functions[pf] + "/virtfn%d" % index))
            for link in ("/sys/bus/pci/devices/" + vf, "/sys/class/mdev_bus/" + vf):
                if os.path.lexists(tree.path(link)):
                    os.unlink(tree.path(link))
            shutil.rmtree(tree.path(tree.functions[vf]))
    facts = gpu_facts.gather({"addresses": None, "vendors": None, "classes": None, "include_all": False}, tree.root)
    plan = vgpu_plan({"gpus": facts["gpu_facts_gpus"], "mdev_parents": facts["gpu_facts_mdev_parents"],
                      "host": facts["gpu_facts_host"]},
                     config(x=[{"devices": [1], "vgpu-devices": {"A100-4C": 2}},
                               {"devices": [2], "vgpu-devices": {"L40S-1Q": 1}}]), "x")
    assert plan == {
        "sriov": {st.A100: 20, st.L40S: 32},
        "mdev": [{"parent": st.A100, "type": "NVIDIA A100-4C", "count": 2, "pf": True},
                 {"parent": st.L40S, "type": "NVIDIA L40S-1Q", "count": 1, "pf": True}],
        "types": ["NVIDIA A100-4C", "NVIDIA L40S-1Q"],
    }


def test_plan_ignores_vfs_listed_as_gpus(tmp_path):
    tree = st.build_gpu_host(tmp_path)  # A100 and L40S each have 2 VFs, listed by gpu_facts
    facts = gpu_facts.gather({"addresses": None, "vendors": None, "classes": None, "include_all": False}, tree.root)
    assert [g["address"] for g in facts["gpu_facts_gpus"]][:3] == [st.A10, st.A100, st.A100_VFS[0]]
    plan = vgpu_plan({"gpus": facts["gpu_facts_gpus"], "mdev_parents": facts["gpu_facts_mdev_parents"],
                      "host": facts["gpu_facts_host"]},
                     config(x=[{"devices": "all", "vgpu-devices": {"A100-4C": 1}},
                               {"devices": [2], "vgpu-devices": {"L40S-1Q": 1}}]), "x")
    assert [(c["parent"], c["pf"]) for c in plan["mdev"]] == [
        (st.A10, False), (st.A100, True), (st.L40S, True), (st.L40S, True)]


# --------------------------------------------------------------------------- errors


_DEFAULT = object()


def fails(match, facts=None, cfg=_DEFAULT, name="A10-8Q", **kwargs):
    with pytest.raises(AnsibleFilterError, match=match):
        vgpu_plan(facts if facts is not None else facts_two_a10(), CONFIG if cfg is _DEFAULT else cfg, name, **kwargs)


def test_unknown_config_lists_the_defined_ones():
    fails(r"^vGPU configuration 'A10-24Q' is not defined; defined: A10-8Q, default, mixed$", name="A10-24Q")


def test_unknown_config_in_an_empty_mapping():
    fails(r"^vGPU configuration 'x' is not defined; defined: none$", cfg=config(), name="x")


@pytest.mark.parametrize("cfg", [None, {}, {"version": "v1"}, {"vgpu-configs": ["A10-8Q"]}])
def test_missing_vgpu_configs(cfg):
    fails(r"^the vGPU device configuration has no 'vgpu-configs' mapping$", cfg=cfg, name="x")


@pytest.mark.parametrize("entries", [{"devices": "all"}, "A10-8Q", None, 3])
def test_config_not_a_list(entries):
    fails(r"^vGPU configuration 'x' must be a list of entries with devices and vgpu-devices$",
          cfg=config(x=entries), name="x")


@pytest.mark.parametrize("entry", [{"devices": "all"}, {"vgpu-devices": ["A10-4Q"]}, "A10-4Q", None])
def test_entry_needs_vgpu_devices(entry):
    fails(r"^vGPU configuration 'x' entry 1: needs a 'vgpu-devices' mapping of type to count$",
          cfg=config(x=[{"vgpu-devices": {}}, entry]), name="x")


def test_index_out_of_range_names_it_and_the_parents():
    fails(r"^vGPU configuration 'x' entry 0: device index 2 is out of range; the host has 2 parent\(s\): "
          r"0000:17:00.0, 0000:65:00.0$", cfg=config(x=[{"devices": [0, 2], "vgpu-devices": {"A10-4Q": 1}}]), name="x")


def test_index_on_a_host_without_gpus():
    fails(r"device index 0 is out of range; the host has 0 parent\(s\): none$",
          facts={"gpus": [], "mdev_parents": [], "host": {}},
          cfg=config(x=[{"devices": [0], "vgpu-devices": {"A10-4Q": 1}}]), name="x")


@pytest.mark.parametrize("devices,match", [
    ([-1], r"entry 0 devices: count -1 is negative"),
    (["first"], r"entry 0 devices: count 'first' is not a whole number"),
    ([1.5], r"entry 0 devices: count 1.5 is not a whole number"),
    ([None], r"entry 0 devices: count None is not a whole number"),
    ("0", r"entry 0: devices must be 'all' or a list of indices, got '0'"),
    (0, r"entry 0: devices must be 'all' or a list of indices, got 0"),
    ({"0": 1}, r"entry 0: devices must be 'all' or a list of indices, got \{'0': 1\}"),
])
def test_bad_devices(devices, match):
    fails(match, cfg=config(x=[{"devices": devices, "vgpu-devices": {"A10-4Q": 1}}]), name="x")


@pytest.mark.parametrize("count,match", [
    (-2, r"^vGPU configuration 'x' entry 0 type A10-4Q: count -2 is negative$"),
    ("-2", r"^vGPU configuration 'x' entry 0 type A10-4Q: count -2 is negative$"),
    ("two", r"^vGPU configuration 'x' entry 0 type A10-4Q: count 'two' is not a whole number$"),
    (2.5, r"^vGPU configuration 'x' entry 0 type A10-4Q: count 2.5 is not a whole number$"),
    (True, r"^vGPU configuration 'x' entry 0 type A10-4Q: count True is not a whole number$"),
    (None, r"^vGPU configuration 'x' entry 0 type A10-4Q: count None is not a whole number$"),
    ([1], r"^vGPU configuration 'x' entry 0 type A10-4Q: count \[1\] is not a whole number$"),
])
def test_bad_counts(count, match):
    fails(match, cfg=config(x=[{"devices": "all", "vgpu-devices": {"A10-4Q": count}}]), name="x")


@pytest.mark.parametrize("numvfs,match", [(-1, r"^numvfs: count -1 is negative$"),
                                          ("many", r"^numvfs: count 'many' is not a whole number$")])
def test_bad_numvfs(numvfs, match):
    fails(match, facts=facts_a10_and_a100(), numvfs=numvfs)


def test_non_sriov_pf_is_refused():
    fails(r"^0000:17:00.0 is not an SR-IOV physical function \(no sriov_totalvfs\) on this host$",
          facts=facts_a10_and_a100(), sriov_pfs=[A10_A])


def test_sriov_gpu_missing_from_host_facts_is_refused():
    facts = facts_a10_and_a100()
    facts["host"] = {}
    fails(r"^0000:b1:00.0 is not an SR-IOV physical function", facts=facts)


@pytest.mark.parametrize("pf,numvfs", [(A10_A, 4), (A100, 32)])
def test_numvfs_checked_against_the_pf(pf, numvfs):
    with pytest.raises(AnsibleFilterError, match=pf):
        vgpu_plan(facts_a10_and_a100(), CONFIG, "A10-8Q", sriov_pfs=[pf], numvfs=numvfs)


def test_errors_come_before_any_plan_and_name_the_entry():
    cfg = config(x=[{"devices": "all", "vgpu-devices": {"A10-4Q": 1}},
                    {"devices": [5], "vgpu-devices": {"A10-4Q": 1}}])
    fails(r"^vGPU configuration 'x' entry 1: device index 5 is out of range", cfg=cfg, name="x")


# --------------------------------------------------------------------------- properties

GPU_ADDRESSES = ["0000:%02x:00.0" % bus for bus in (0x17, 0x31, 0x4b, 0x65, 0xb1, 0xca)]
TYPE_SPECS = ["A10-4Q", "A10-8Q", "NVIDIA A10-12Q", "nvidia-588", "L40S-1Q"]


@hs.composite
def plans(draw):
    n_gpus = draw(hs.integers(1, len(GPU_ADDRESSES)))
    addresses = GPU_ADDRESSES[:n_gpus]
    entries = draw(hs.lists(hs.fixed_dictionaries({
        "devices": hs.one_of(hs.just("all"), hs.lists(hs.integers(0, n_gpus - 1), max_size=4)),
        "vgpu-devices": hs.dictionaries(hs.sampled_from(TYPE_SPECS), hs.integers(0, 16), max_size=3),
    }), max_size=4))
    return addresses, entries


@settings(max_examples=200, deadline=None)
@given(drawn=plans())
def test_valid_configs_plan_one_call_per_parent_and_nonzero_type(drawn):
    addresses, entries = drawn
    facts = {"gpus": [gpu(a) for a in addresses],
             "mdev_parents": [{"name": a, "address": a, "types": A10_TYPES} for a in addresses],
             "host": {}}
    plan = vgpu_plan(facts, config(x=entries), "x")
    expected = []
    for entry in entries:
        picked = addresses if entry["devices"] == "all" else [addresses[i] for i in entry["devices"]]
        for spec, count in entry["vgpu-devices"].items():
            if count:
                expected.extend((parent, count) for parent in picked)
    assert [(c["parent"], c["count"]) for c in plan["mdev"]] == expected
    assert plan["sriov"] == {} and not any(c["pf"] for c in plan["mdev"])
    assert set(c["type"] for c in plan["mdev"]) <= set(plan["types"])
    assert len(plan["types"]) == len(set(plan["types"]))
    for resolved in plan["types"]:
        assert resolved in ("nvidia-588", "nvidia-589", "nvidia-590") or resolved.startswith("NVIDIA ")


JSONISH = hs.recursive(hs.one_of(hs.none(), hs.booleans(), hs.integers(-3, 3), hs.floats(allow_nan=False),
                                 hs.text(max_size=5), hs.just("all")),
                       lambda inner: hs.one_of(hs.lists(inner, max_size=3),
                                               hs.dictionaries(hs.one_of(hs.text(max_size=5),
                                                                         hs.sampled_from(["devices", "vgpu-devices"])),
                                                               inner, max_size=3)),
                       max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(configs=hs.one_of(JSONISH, hs.dictionaries(hs.just("x"), JSONISH, max_size=1)),
       numvfs=hs.one_of(hs.integers(-2, 40), hs.text(max_size=3)))
def test_any_config_gives_a_plan_or_a_filter_error(configs, numvfs):
    try:
        plan = vgpu_plan(facts_a10_and_a100(), {"version": "v1", "vgpu-configs": configs}, "x", numvfs=numvfs)
    except AnsibleFilterError as exc:
        assert str(exc)
    else:
        assert sorted(plan) == ["mdev", "sriov", "types"]
        assert all(isinstance(c["count"], int) and c["count"] > 0 for c in plan["mdev"])
