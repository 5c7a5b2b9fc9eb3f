# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Unit tests for _mdev on fake hosts: an A100 whose VFs are mdev parents, an L40S with the NVIDIA
vendor-specific vGPU interface, and the kernel's mtty sample parent.

``MdevKernel`` and the host builders are in fakes/mdev_hosts.py.
"""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _mdev, _sysfs
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import SysfsError
from ansible_collections.gpuops.sandbox.tests.unit.fakes.mdev_hosts import (
    A100_PF, A100_VFS, L40S_PF, L40S_VFS, VGPU_HEADER, MdevKernel, avail, build_a100, build_l40s, build_mtty, install)
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sriov_kernel import FakeTree
from ansible_collections.gpuops.sandbox.tests.unit.plugins.mdev_fakes import fake_host, refuse_create


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Fake host with an A100 and the mtty sample (mdev bus)."""
    return fake_host(tmp_path / "a100", monkeypatch, build_a100, build_mtty)


@pytest.fixture
def vgpu_host(tmp_path, monkeypatch):
    """Fake host with an L40S on the vendor-specific interface and no /sys/class/mdev_bus."""
    return fake_host(tmp_path / "l40s", monkeypatch, build_l40s)


def request(**kw):
    base = {"type": "mtty-1", "state": "present", "backend": "auto", "pf": None, "parents": ["mtty"],
            "uuids": None, "count": 1}
    base.update(kw)
    return base


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("bad", ["4b20d080-1b54-4048-85b3-a6a62d165c0", "{4b20d080-1b54-4048-85b3-a6a62d165c01}",
                                 "4b20d0801b54404885b3a6a62d165c01", "", None, 12])
def test_normalize_uuid_rejects(bad):
    with pytest.raises(_mdev.MdevError, match="exactly 36 characters"):
        _mdev.normalize_uuid(bad)


def test_normalize_uuid_lowercases():
    assert _mdev.normalize_uuid("4B20D080-1B54-4048-85B3-A6A62D165C01") == "4b20d080-1b54-4048-85b3-a6a62d165c01"


def test_normalize_parent():
    assert _mdev.normalize_parent("3B:00.4") == "0000:3b:00.4"
    assert _mdev.normalize_parent("MTTY") == "MTTY"
    for bad in ("../mtty", "mt ty", "", ".", "a/b", None):
        with pytest.raises(_mdev.MdevError, match="not valid"):
            _mdev.normalize_parent(bad)


@pytest.mark.parametrize("bad", [0, -3, True, "2", 1.5, None])
def test_check_count(bad):
    with pytest.raises(_mdev.MdevError, match="count must be a positive integer"):
        _mdev.check_count(bad)


def test_derive_uuid_is_stable_and_distinct():
    first = _mdev.derive_uuid("mtty", "mtty-1", 0)
    assert first == _mdev.derive_uuid("mtty", "mtty-1", 0)
    assert len({first, _mdev.derive_uuid("mtty", "mtty-1", 1), _mdev.derive_uuid("mtty", "mtty-2", 0)}) == 3
    assert len(first) == 36


# --------------------------------------------------------------------------- reading


def test_reads_parents_and_types(host):
    tree, _kernel = host
    assert _mdev.list_parents(tree.root) == A100_VFS + ["mtty"]
    types = _mdev.parent_types(A100_VFS[0], tree.root)
    assert types["nvidia-692"]["name"] == "NVIDIA A100-4C"
    assert types["nvidia-692"]["available_instances"] == 1
    assert _mdev.parent_types("mtty", tree.root)["mtty-2"]["available_instances"] == 12


def test_vgpu_types_parse():
    text = VGPU_HEADER + "1153  : NVIDIA L40S-4Q\n1155  : NVIDIA L40S-8Q\n0 : bogus\n"
    assert _mdev.parse_vgpu_types(text) == {1153: "NVIDIA L40S-4Q", 1155: "NVIDIA L40S-8Q"}


def test_backend_detection_mdev(host):
    tree, _k = host
    assert _mdev.detect_backend(request(pf=A100_PF, parents=None), tree.root) == "mdev"
    assert _mdev.detect_backend(request(parents=["mtty"]), tree.root) == "mdev"


def test_backend_detection_vendor_specific(vgpu_host):
    vtree, _k = vgpu_host
    assert not os.path.exists(vtree.p("/sys/class/mdev_bus"))
    assert _mdev.detect_backend(request(pf=L40S_PF, parents=None), vtree.root) == "nvidia"
    assert _mdev.detect_backend(request(parents=[L40S_VFS[0]]), vtree.root) == "nvidia"


# --------------------------------------------------------------------------- planning: errors (RELIABILITY 3, 5, 12, 14)


def test_missing_parent_lists_existing_and_is_case_sensitive(host):
    tree, kernel = host
    before = tree.snapshot()
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.build_plan(request(parents=["MTTY"]), tree.root)
    assert info.value.kind == _mdev.E_PARENT
    assert info.value.msg == ("mdev parent 'MTTY' does not exist (parent names are case-sensitive); existing "
                              "parents: 0000:3b:00.4, 0000:3b:00.5, 0000:3b:00.6, 0000:3b:00.7, mtty")
    assert tree.snapshot() == before and kernel.writes == []


def test_missing_type_lists_types(host):
    tree, kernel = host
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.build_plan(request(type="mtty-9"), tree.root)
    assert info.value.kind == _mdev.E_TYPE
    assert info.value.msg == ("mdev type 'mtty-9' does not exist on parent mtty; types there: "
                              "mtty-1 (Single port serial), mtty-2 (Dual port serial)")
    assert kernel.writes == []


def test_too_few_instances_says_available_and_needed(host):
    tree, _kernel = host
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.build_plan(request(type="mtty-2", count=13), tree.root)
    assert info.value.kind == _mdev.E_CAPACITY
    assert "12 available, 13 needed" in info.value.msg


def test_uuid_active_with_other_type(host):
    tree, _kernel = host
    dev = "4b20d080-1b54-4048-85b3-a6a62d165c01"
    _mdev.apply_plan(_mdev.build_plan(request(type="mtty-2", uuids=[dev], count=1), tree.root), tree.root, 0)
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.build_plan(request(type="mtty-1", uuids=[dev]), tree.root)
    assert info.value.kind == _mdev.E_CONFLICT
    assert info.value.msg == ("UUID %s is already active with another type: type mtty-2 on parent mtty "
                              "(wanted mtty-1 on mtty)" % dev)


def test_uuids_need_one_parent(host):
    tree, _kernel = host
    with pytest.raises(_mdev.MdevError, match="uuids needs exactly one parent"):
        _mdev.build_plan(request(parents=["mtty", A100_VFS[0]], uuids=["4b20d080-1b54-4048-85b3-a6a62d165c01"]),
                         tree.root)


def test_no_mdev_bus_and_no_vendor_interface(tmp_path):
    tree = FakeTree(tmp_path)
    with pytest.raises(_mdev.MdevError, match="this host has no mdev parents"):
        _mdev.build_plan(request(), tree.root)


def test_wait_for_late_parent(tmp_path, monkeypatch):
    tree = FakeTree(tmp_path)
    kernel = MdevKernel(tree)
    install(monkeypatch, kernel)
    slept = []

    def appear(seconds):
        slept.append(seconds)
        if len(slept) == 3:
            build_mtty(tree, kernel)

    monkeypatch.setattr(_sysfs, "_sleep", appear)
    plan = _mdev.build_plan_waiting(request(), tree.root, timeout=30)
    assert len(slept) == 3 and len(plan["create"]) == 1


def test_wait_is_bounded(tmp_path, monkeypatch):
    tree = FakeTree(tmp_path)
    clock = [100.0]
    monkeypatch.setattr(_sysfs, "_monotonic", lambda: clock[0])
    monkeypatch.setattr(_sysfs, "_sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.build_plan_waiting(request(), tree.root, timeout=2)
    assert info.value.msg.endswith("(waited 2s)")
    assert 102.0 <= clock[0] <= 102.5


def test_non_retryable_errors_do_not_wait(host, monkeypatch):
    tree, _kernel = host
    monkeypatch.setattr(_sysfs, "_sleep", lambda s: pytest.fail("must not wait"))
    with pytest.raises(_mdev.MdevError, match="13 needed"):
        _mdev.build_plan_waiting(request(type="mtty-2", count=13), tree.root, timeout=30)


# --------------------------------------------------------------------------- planning: idempotence and adoption


def test_name_and_id_give_the_same_devices(host):
    tree, _kernel = host
    by_id = _mdev.build_plan(request(type="mtty-1", count=2), tree.root)
    by_name = _mdev.build_plan(request(type="Single port serial", count=2), tree.root)
    assert [e["uuid"] for e in by_id["create"]] == [e["uuid"] for e in by_name["create"]]
    assert [e["uuid"] for e in by_id["create"]] == [_mdev.derive_uuid("mtty", "mtty-1", i) for i in (0, 1)]


def test_adopts_existing_devices_of_the_type(host):
    tree, _kernel = host
    foreign = "00000000-0000-4000-8000-000000000001"
    _mdev.apply_plan(_mdev.build_plan(request(uuids=[foreign]), tree.root), tree.root, 0)
    plan = _mdev.build_plan(request(count=2), tree.root)
    assert [e["uuid"] for e in plan["keep"]] == [foreign]
    assert len(plan["create"]) == 1


def spread_three_over_vfs(tree, name, same_type, pf, vfs, backend):
    """Create 3 devices of type ``name`` for ``pf``, one on each of its first three VFs, through ``backend``; then
    asking for 3 of ``same_type`` (the same type by another name) keeps them."""
    plan = _mdev.build_plan(request(type=name, pf=pf, parents=None, count=3), tree.root)
    assert plan["backend"] == backend
    assert [e["parent"] for e in plan["create"]] == vfs[:3]
    _mdev.apply_plan(plan, tree.root, 0)
    again = _mdev.build_plan(request(type=same_type, pf=pf, parents=None, count=3), tree.root)
    assert again["create"] == [] and len(again["keep"]) == 3


def test_a100_pf_spreads_over_vfs(host):
    tree, _kernel = host
    spread_three_over_vfs(tree, "NVIDIA A100-4C", "nvidia-692", A100_PF, A100_VFS, "mdev")
    assert [avail(tree, vf, "nvidia-692") for vf in A100_VFS] == [0, 0, 0, 1]
    with pytest.raises(_mdev.MdevError, match="1 available, 2 needed"):
        _mdev.build_plan(request(type="nvidia-692", pf=A100_PF, parents=None, count=5), tree.root)


# --------------------------------------------------------------------------- vendor-specific interface


def test_vgpu_by_name_and_idempotent(vgpu_host):
    tree, _kernel = vgpu_host
    spread_three_over_vfs(tree, "NVIDIA L40S-8Q", "1155", L40S_PF, L40S_VFS, "nvidia")
    assert [_mdev.current_vgpu_type(vf, tree.root) for vf in L40S_VFS] == [1155, 1155, 1155, 0]
    assert not os.path.exists(tree.p("/sys/bus/pci/drivers/vfio-pci"))


@pytest.mark.parametrize("spec,match", [
    ("0", "type ids are integers greater than 0"),
    ("-5", "type ids are integers greater than 0"),
    ("999", "vGPU type 999 is not creatable"),
    ("NVIDIA L40S-7Q", "vGPU type 'NVIDIA L40S-7Q' is not creatable"),
])
def test_vgpu_bad_type(vgpu_host, spec, match):
    tree, kernel = vgpu_host
    before = tree.snapshot()
    with pytest.raises(_mdev.MdevError, match=match):
        _mdev.build_plan(request(type=spec, pf=L40S_PF, parents=None), tree.root)
    assert tree.snapshot() == before and kernel.writes == []


def test_vgpu_capacity(vgpu_host):
    tree, _kernel = vgpu_host
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.build_plan(request(type="NVIDIA L40S-8Q", pf=L40S_PF, parents=None, count=5), tree.root)
    assert info.value.kind == _mdev.E_CAPACITY
    assert "4 available, 5 needed" in info.value.msg


def test_vgpu_vf_with_other_type(vgpu_host):
    tree, _kernel = vgpu_host
    _mdev.apply_plan(_mdev.build_plan(request(type="1153", parents=[L40S_VFS[0]]), tree.root), tree.root, 0)
    with pytest.raises(_mdev.MdevError, match="already carries vGPU type 1153, not 1155"):
        _mdev.build_plan(request(type="1155", parents=[L40S_VFS[0]]), tree.root)
    with pytest.raises(_mdev.MdevError, match="count must be 1"):
        _mdev.build_plan(request(type="1153", parents=[L40S_VFS[1]], count=2), tree.root)


def test_vgpu_absent(vgpu_host):
    tree, _kernel = vgpu_host
    _mdev.apply_plan(_mdev.build_plan(request(type="1155", pf=L40S_PF, parents=None, count=2), tree.root),
                     tree.root, 0)
    plan = _mdev.build_plan(request(type="NVIDIA L40S-8Q", pf=L40S_PF, parents=None, state="absent"), tree.root)
    assert [e["parent"] for e in plan["remove"]] == L40S_VFS[:2]
    _mdev.apply_plan(plan, tree.root, 0)
    assert [_mdev.current_vgpu_type(vf, tree.root) for vf in L40S_VFS] == [0, 0, 0, 0]


def test_vgpu_rollback_when_kernel_refuses(vgpu_host):
    tree, kernel = vgpu_host
    plan = _mdev.build_plan(request(type="1155", pf=L40S_PF, parents=None, count=3), tree.root)
    kernel.refuse[L40S_VFS[2] + "/nvidia/current_vgpu_type"] = errno.EIO
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.apply_plan(plan, tree.root, 0)
    assert "Input/output error" in info.value.msg and "rolled back 2 change(s)" in info.value.msg
    assert [_mdev.current_vgpu_type(vf, tree.root) for vf in L40S_VFS] == [0, 0, 0, 0]


# --------------------------------------------------------------------------- applying, read-back and rollback


def test_apply_creates_and_reads_back(host):
    tree, _kernel = host
    plan = _mdev.build_plan(request(type="mtty-2", count=3), tree.root)
    _mdev.apply_plan(plan, tree.root, 0)
    devices = _mdev.list_mdev_devices(tree.root)
    assert sorted(devices) == sorted(e["uuid"] for e in plan["create"])
    assert {d["parent"] for d in devices.values()} == {"mtty"}
    assert avail(tree, "mtty", "mtty-2") == 9 and avail(tree, "mtty", "mtty-1") == 18


def test_rollback_in_reverse_order_when_kernel_refuses(host):
    tree, kernel = host
    before = tree.snapshot()
    plan = _mdev.build_plan(request(type="mtty-1", count=3), tree.root)
    third = plan["create"][2]["uuid"]
    refuse_create(kernel, third, errno.ENOSPC)
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.apply_plan(plan, tree.root, 0)
    assert "No space left on device" in info.value.msg
    assert "rolled back 2 change(s) of this run" in info.value.msg
    removes = [rel for rel, _v in kernel.writes if rel.endswith("/remove")]
    assert removes == ["/sys/bus/mdev/devices/%s/remove" % plan["create"][i]["uuid"] for i in (1, 0)]
    assert tree.snapshot() == before


def test_rollback_continues_past_errors_and_reports_them(host):
    tree, kernel = host
    plan = _mdev.build_plan(request(type="mtty-1", count=3), tree.root)
    first, second, third = (e["uuid"] for e in plan["create"])
    refuse_create(kernel, third, errno.ENOSPC)
    kernel.refuse["%s/remove" % second] = errno.EBUSY
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.apply_plan(plan, tree.root, 0)
    assert "rollback errors: %s (type mtty-1 on mtty)" % second in info.value.msg
    assert "Device or resource busy" in info.value.msg
    assert info.value.details["rolled_back"] == ["%s (type mtty-1 on mtty)" % first]
    assert sorted(_mdev.list_mdev_devices(tree.root)) == [second]


def test_readback_failure_is_an_error(host):
    tree, kernel = host
    kernel.create_without_device = True
    plan = _mdev.build_plan(request(), tree.root)
    with pytest.raises(_mdev.MdevError, match="did not appear; nothing had been changed"):
        _mdev.apply_plan(plan, tree.root, 0)


def test_absent_refuses_devices_in_use(host):
    tree, _kernel = host
    plan = _mdev.build_plan(request(), tree.root)
    _mdev.apply_plan(plan, tree.root, 0)
    dev = plan["create"][0]["uuid"]
    tree.link("/sys/bus/mdev/devices/%s/iommu_group" % dev, "/sys/kernel/iommu_groups/77")
    tree.open_fd(900, "qemu-system-x86", "/dev/vfio/77")
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.build_plan(request(state="absent"), tree.root)
    assert info.value.kind == _mdev.E_BUSY
    assert "%s is open by PID 900 (qemu-system-x86)" % dev in info.value.msg


def test_absent_with_missing_parent_is_empty(host):
    tree, _kernel = host
    plan = _mdev.build_plan(request(parents=["gone"], state="absent"), tree.root)
    assert plan["remove"] == []


# --------------------------------------------------------------------------- definitions and the boot script


def test_definitions_round_trip_and_absent():
    entries = [("mdev", "mtty", "mtty-1", "4b20d080-1b54-4048-85b3-a6a62d165c01"), ("vgpu", L40S_VFS[0], "1155", "")]
    text = _mdev.render_definitions(entries)
    assert _mdev.parse_definitions(text) == sorted(entries)
    plan = {"backend": "mdev", "remove": [], "targets": ["mtty"], "type_ids": ["mtty-1"]}
    assert _mdev.desired_definitions(plan, {"state": "absent", "uuids": None}, entries) == [entries[1]]


def _run_script(tree, tries="1"):
    script = tree.p("/restore.sh")
    with open(script, "w") as fh:
        fh.write(_mdev.RESTORE_SCRIPT_TEXT)
    env = dict(os.environ, GPUOPS_SYSFS=tree.p("/sys"), GPUOPS_MDEV_TRIES=tries)
    return subprocess.run(["/bin/sh", script, tree.p("/etc/gpuops/mdev-devices.conf")], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="needs /bin/sh")
def test_boot_script_vgpu(vgpu_host):
    tree, _kernel = vgpu_host
    tree.write("/etc/gpuops/mdev-devices.conf", _mdev.render_definitions([("vgpu", L40S_VFS[1], "1155", "")]))
    done = _run_script(tree)
    assert done.returncode == 0, done.stderr
    assert tree.read("/sys/bus/pci/devices/%s/nvidia/current_vgpu_type" % L40S_VFS[1]) == "1155"


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="needs /bin/sh")
def test_boot_script_existing_mdev(host):
    mtree, _mk = host
    plan = _mdev.build_plan(request(), mtree.root)
    _mdev.apply_plan(plan, mtree.root, 0)
    mtree.write("/etc/gpuops/mdev-devices.conf", _mdev.render_definitions(
        [_mdev.definition_of(plan["create"][0])]))
    done = _run_script(mtree)
    assert done.returncode == 0 and "ok: mdev mtty mtty-1" in done.stdout


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="needs /bin/sh")
def test_boot_script_gives_up_on_missing_parent(tmp_path):
    tree = FakeTree(tmp_path)
    tree.write("/etc/gpuops/mdev-devices.conf", _mdev.render_definitions(
        [("mdev", "mtty", "mtty-1", "4b20d080-1b54-4048-85b3-a6a62d165c01")]))
    done = _run_script(tree, tries="1")
    assert done.returncode == 1
    assert "gave up after 1 attempts" in done.stderr and "mdev mtty mtty-1" in done.stderr


def test_sysfs_errors_pass_through(host):
    tree, _kernel = host
    with pytest.raises(SysfsError, match="does not exist"):
        _mdev.build_plan(request(pf="0000:99:00.0", parents=None), tree.root)


# --------------------------------------------------------------------------- vGPU type ids: ASCII digits of sane length


@pytest.mark.parametrize("spec,expected", [("1155", 1155), (" 1155 ", 1155), ("+12", 12), ("NVIDIA L40S-8Q", None),
                                           ("nvidia-692", None), ("12a", None), ("", None), ("+", None)])
def test_vgpu_type_id(spec, expected):
    assert _mdev.vgpu_type_id(spec) == expected


@pytest.mark.parametrize("spec,match", [
    ("\u0661\u0662", r"vGPU type id '\u0661\u0662' is not valid: write type ids with the ASCII digits 0-9"),
    ("\uff11\uff12", r"vGPU type id '\uff11\uff12' is not valid: write type ids with the ASCII digits 0-9"),
    ("1" * 5000, r"vGPU type id '1{29}\.\.\. \(5000 characters\) is not valid: type ids have at most 9 digits"),
    ("1234567890", "type ids have at most 9 digits"),
    ("0", "type ids are integers greater than 0"),
    ("-5", "type ids are integers greater than 0"),
])
def test_vgpu_type_id_refused(spec, match):
    with pytest.raises(_mdev.MdevError, match=match):
        _mdev.vgpu_type_id(spec)


@pytest.mark.parametrize("spec", ["1" * 5000, "\u0661\u0661\u0665\u0665", "\uff11\uff11\uff15\uff15"])
@pytest.mark.parametrize("state", ["present", "absent"])
def test_vgpu_bad_type_id_is_refused_by_the_planner(vgpu_host, spec, state):
    # Thousands of digits used to escape as ValueError (Python's integer string limit); non-ASCII digits
    # were taken as the id 1155.
    tree, kernel = vgpu_host
    before = tree.snapshot()
    for parents, pf in ((None, L40S_PF), ([L40S_VFS[0]], None)):
        with pytest.raises(_mdev.MdevError, match="vGPU type id .* is not valid") as info:
            _mdev.build_plan(request(type=spec, pf=pf, parents=parents, state=state), tree.root)
        assert info.value.kind == _mdev.E_INPUT
    assert tree.snapshot() == before and kernel.writes == []


def test_current_vgpu_type_reads_ascii_digits_only(vgpu_host):
    tree, _kernel = vgpu_host
    tree.write("/sys/bus/pci/devices/%s/nvidia/current_vgpu_type" % L40S_VFS[0], "\u0661\u0661\u0665\u0665\n")
    assert _mdev.current_vgpu_type(L40S_VFS[0], tree.root) == 0


def test_parse_vgpu_types_takes_ascii_ids_only():
    text = VGPU_HEADER + "1153  : NVIDIA L40S-4Q\n\u0661\u0661\u0665\u0665 : fake\n" + "9" * 5000 + " : huge\n"
    assert _mdev.parse_vgpu_types(text) == {1153: "NVIDIA L40S-4Q"}


@pytest.mark.parametrize("bad", ["4b20d080-1b54-4048-85b3-a6a62d165c01\n\n", "mtty\nx"])
def test_inputs_are_matched_in_full(bad):
    with pytest.raises(_mdev.MdevError, match="not valid"):
        if bad.startswith("mtty"):
            _mdev.normalize_parent(bad)
        else:
            _mdev.normalize_uuid(bad + "x")


def test_mdev_error_kind_and_rollback_are_result_keys():
    assert _mdev.MdevError("refused", kind=_mdev.E_BUSY).extra == {"kind": "busy"}
    err = _mdev.MdevError("failed", kind=_mdev.E_APPLY, done=["a"], rolled_back=["a"], rollback_errors=[])
    assert err.extra == {"kind": "apply", "rollback": {"done": ["a"], "rolled_back": ["a"], "rollback_errors": []}}


def test_wait_for_plan_is_bounded_with_a_huge_timeout(tmp_path, bounded_clock):
    tree = FakeTree(tmp_path)
    clock = bounded_clock
    for timeout in (10 ** 400, float("inf")):
        clock[0] = 0.0
        with pytest.raises(_mdev.MdevError, match="this host has no mdev parents"):
            _mdev.build_plan_waiting(request(), tree.root, timeout)
    assert clock[0] <= _sysfs.MAX_WAIT + 1


def test_apply_rolls_back_on_any_exception(host, monkeypatch):
    tree, _kernel = host
    before = tree.snapshot()
    plan = _mdev.build_plan(request(type="mtty-1", count=3), tree.root)
    third = plan["create"][2]["uuid"]
    real = _mdev.create_entry

    def broken(entry, root="/", timeout=5):
        if entry["uuid"] == third:
            raise ValueError("a bug")
        return real(entry, root, timeout)

    monkeypatch.setattr(_mdev, "create_entry", broken)
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.apply_plan(plan, tree.root, 0)
    assert info.value.msg == "ValueError: a bug; rolled back 2 change(s) of this run"
    assert tree.snapshot() == before


@pytest.mark.parametrize("held", ["group", "cdev"])
def test_vgpu_absent_refuses_a_vf_held_through_its_group_or_its_iommufd_cdev(vgpu_host, held):
    """A VMM may use a vendor-specific vGPU VF through /dev/vfio/<group> or through its iommufd character
    device /dev/vfio/devices/vfioN: either holder keeps the live vGPU from being removed."""
    tree, _kernel = vgpu_host
    plan = _mdev.build_plan(request(type="1155", pf=L40S_PF, parents=None, count=1), tree.root)
    _mdev.apply_plan(plan, tree.root, 0)
    vf = L40S_VFS[0]
    tree.link("/sys/bus/pci/devices/%s/iommu_group" % vf, "/sys/kernel/iommu_groups/91")
    os.makedirs(tree.p("/sys/bus/pci/devices/%s/vfio-dev/vfio3" % vf))
    node = "/dev/vfio/91" if held == "group" else "/dev/vfio/devices/vfio3"
    tree.open_fd(4711, "qemu-system-x86", node)
    with open(tree.p("/proc/4711/cmdline"), "wb") as handle:
        handle.write(b"/usr/bin/qemu-system-x86_64\x00-name\x00guest=vm-7\x00")
    before = tree.snapshot()
    with pytest.raises(_mdev.MdevError) as info:
        _mdev.build_plan(request(type="1155", pf=L40S_PF, parents=None, state="absent"), tree.root)
    assert info.value.kind == _mdev.E_BUSY
    assert "%s is open by PID 4711 (/usr/bin/qemu-system-x86_64 -name guest=vm-7)" % vf in info.value.msg
    assert tree.snapshot() == before
    assert _mdev.current_vgpu_type(vf, tree.root) == 1155


def test_unknown_available_instances_counts_as_none_available(host):
    """The shared reader reports a count that is not a number as unknown; planning takes it as 0."""
    tree, _kernel = host
    path = "/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2/available_instances"
    with open(tree.p(path), "w") as handle:
        handle.write("lots\n")
    assert _mdev.parent_types("mtty", tree.root)["mtty-2"]["available_instances"] == 0
    assert _mdev.parent_types("mtty", tree.root)["mtty-1"]["available_instances"] == 24
