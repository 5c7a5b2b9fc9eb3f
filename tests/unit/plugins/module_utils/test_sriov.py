# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Unit tests for _sriov, on a fake sysfs tree with a small simulated kernel (fakes/sriov_kernel.py)."""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _sriov
from ansible_collections.gpuops.sandbox.plugins.module_utils import _sysfs
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import SysfsError
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sriov_kernel import (
    NVME_PF,
    FakeTree,
    _oserror,
    add_nvme_pf,
    install_kernel,
)


@pytest.fixture
def tree(tmp_path):
    return FakeTree(tmp_path)


@pytest.fixture
def kernel(tree, monkeypatch):
    return install_kernel(tree, monkeypatch)


# --------------------------------------------------------------------------- reading


def test_pf_state_reads_everything(tree, kernel):
    add_nvme_pf(tree)
    state = _sriov.pf_state("01:00.0", tree.root)
    assert state["pf"] == NVME_PF
    assert (state["totalvfs"], state["numvfs"], state["driver"], state["autoprobe"]) == (4, 0, "nvme", True)
    assert state["vfs"] == []


def test_pf_state_not_sriov(tree):
    tree.add_pci("0000:02:00.0", "0x8086", "0x10d3", "0x020000", driver="e1000e")
    with pytest.raises(_sriov.SriovError, match="not an SR-IOV physical function"):
        _sriov.pf_state("0000:02:00.0", tree.root)


@pytest.mark.parametrize("bad", ["0000:01:00.8", "zz:00.0", "", "0000:01:00.0/../x"])
def test_pf_state_bad_address(tree, bad):
    add_nvme_pf(tree)
    with pytest.raises(SysfsError, match="not valid"):
        _sriov.pf_state(bad, tree.root)


def test_pf_state_missing_device(tree):
    with pytest.raises(SysfsError, match="does not exist"):
        _sriov.pf_state("0000:05:00.0", tree.root)


def test_list_vfs_orders_by_index_not_name(tree, kernel):
    add_nvme_pf(tree, totalvfs=12)
    state = _sriov.pf_state(NVME_PF, tree.root)
    _sriov.set_numvfs(state, 11, timeout=0)
    vfs = _sriov.list_vfs(state["dir"])
    assert vfs[0] == "0000:01:00.1" and vfs[9] == "0000:01:01.2" and len(vfs) == 11


def test_wait_until_is_bounded(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(_sysfs, "_monotonic", lambda: clock[0])

    def tick(seconds):
        clock[0] += seconds

    monkeypatch.setattr(_sysfs, "_sleep", tick)
    calls = []
    assert not _sriov.wait_until(lambda: calls.append(1), 1.0, interval=0.25)
    assert len(calls) == 5


# --------------------------------------------------------------------------- planning


def test_plan_refuses_count_above_total_and_changes_nothing(tree, kernel):
    add_nvme_pf(tree)
    before = tree.snapshot()
    state = _sriov.pf_state(NVME_PF, tree.root)
    with pytest.raises(_sriov.SriovError) as info:
        _sriov.plan(state, 5, root=tree.root)
    assert info.value.msg == "cannot enable 5 VFs on 0000:01:00.0: sriov_totalvfs is 4"
    assert tree.snapshot() == before and kernel.writes == []


def test_plan_refuses_negative(tree, kernel):
    add_nvme_pf(tree)
    with pytest.raises(_sriov.SriovError, match="0 or a positive integer"):
        _sriov.plan(_sriov.pf_state(NVME_PF, tree.root), -1, root=tree.root)


def test_plan_needs_a_driver(tree, kernel):
    add_nvme_pf(tree, driver=None)
    with pytest.raises(_sriov.SriovError, match="has no driver bound"):
        _sriov.plan(_sriov.pf_state(NVME_PF, tree.root), 2, root=tree.root)


def test_plan_noop_when_equal(tree, kernel):
    add_nvme_pf(tree, driver=None)
    changes = _sriov.plan(_sriov.pf_state(NVME_PF, tree.root), 0, root=tree.root)
    assert changes == {"numvfs": None, "autoprobe": None}


def test_plan_refuses_vfio_bound_vf_unless_forced(tree, kernel):
    add_nvme_pf(tree)
    _sriov.set_numvfs(_sriov.pf_state(NVME_PF, tree.root), 2, timeout=0)
    tree.link("/sys/bus/pci/devices/0000:01:00.2/driver", "/sys/bus/pci/drivers/vfio-pci")
    state = _sriov.pf_state(NVME_PF, tree.root)
    with pytest.raises(_sriov.SriovError, match=r"VFs are in use \(0000:01:00.2 is bound to vfio-pci\)"):
        _sriov.plan(state, 3, root=tree.root)
    assert _sriov.plan(state, 3, force=True, root=tree.root)["numvfs"] == 3


def test_plan_refuses_open_vfio_group(tree, kernel):
    add_nvme_pf(tree)
    _sriov.set_numvfs(_sriov.pf_state(NVME_PF, tree.root), 1, timeout=0)
    group = os.path.basename(os.readlink(tree.p("/sys/bus/pci/devices/0000:01:00.1/iommu_group")))
    tree.open_fd(4242, "qemu-kvm", "/dev/vfio/%s" % group)
    with pytest.raises(_sriov.SriovError, match=r"open by PID 4242 \(qemu-kvm\)"):
        _sriov.plan(_sriov.pf_state(NVME_PF, tree.root), 0, root=tree.root)


def test_plan_autoprobe(tree, kernel):
    add_nvme_pf(tree)
    state = _sriov.pf_state(NVME_PF, tree.root)
    assert _sriov.plan(state, 0, autoprobe=False, root=tree.root) == {"numvfs": None, "autoprobe": False}
    assert _sriov.plan(state, 0, autoprobe=True, root=tree.root) == {"numvfs": None, "autoprobe": None}


# --------------------------------------------------------------------------- applying


def test_set_numvfs_goes_through_zero(tree, kernel):
    add_nvme_pf(tree)
    _sriov.set_numvfs(_sriov.pf_state(NVME_PF, tree.root), 2, timeout=0)
    kernel.writes.clear()
    _sriov.set_numvfs(_sriov.pf_state(NVME_PF, tree.root), 4, timeout=0)
    assert [w[1] for w in kernel.writes] == ["0", "4"]
    assert tree.read("/sys/bus/pci/devices/%s/sriov_numvfs" % NVME_PF) == "4"
    assert _sriov.list_vfs(tree.p("/sys/bus/pci/devices/" + NVME_PF)) == [
        "0000:01:00.1", "0000:01:00.2", "0000:01:00.3", "0000:01:00.4"]


def test_set_numvfs_driver_without_sriov_support(tree, kernel):
    add_nvme_pf(tree)
    kernel.refuse["/sriov_numvfs"] = errno.ENOENT
    with pytest.raises(_sriov.SriovError, match="driver nvme may not support configuring SR-IOV"):
        _sriov.set_numvfs(_sriov.pf_state(NVME_PF, tree.root), 2, timeout=0)


def _grow_from_two_to_three_refused(tree, kernel, refused, error):
    """Set 2 VFs, make the kernel refuse writing ``refused(value)`` to sriov_numvfs with ``error``, then ask for 3;
    return the SriovError message."""
    add_nvme_pf(tree)
    _sriov.set_numvfs(_sriov.pf_state(NVME_PF, tree.root), 2, timeout=0)
    state = _sriov.pf_state(NVME_PF, tree.root)

    def refuse(_kernel, _path, rel, value):
        if rel.endswith("/sriov_numvfs") and refused(value):
            raise _oserror(error, rel)
        return False

    kernel.hooks.append(refuse)
    with pytest.raises(_sriov.SriovError) as info:
        _sriov.set_numvfs(state, 3, timeout=0)
    return info.value.msg


def test_set_numvfs_restores_old_count_on_failure(tree, kernel):
    msg = _grow_from_two_to_three_refused(tree, kernel, lambda value: value == "3", errno.ENOMEM)
    assert "Cannot allocate memory" in msg
    assert "rollback: restored sriov_numvfs to 2" in msg
    assert tree.read("/sys/bus/pci/devices/%s/sriov_numvfs" % NVME_PF) == "2"


def test_set_numvfs_reports_failed_rollback(tree, kernel):
    msg = _grow_from_two_to_three_refused(tree, kernel, lambda value: value != "0", errno.EIO)
    assert "restoring sriov_numvfs to 2 also failed" in msg
    assert "Input/output error" in msg


def test_set_numvfs_readback_timeout(tree, kernel):
    add_nvme_pf(tree)

    def ignore(_kernel, _path, rel, _value):
        return rel.endswith("/sriov_numvfs")

    kernel.hooks.append(ignore)
    with pytest.raises(_sriov.SriovError, match="wrote 2 to sriov_numvfs of 0000:01:00.0 but read back 0"):
        _sriov.set_numvfs(_sriov.pf_state(NVME_PF, tree.root), 2, timeout=0)


def test_set_autoprobe_reads_back(tree, kernel):
    add_nvme_pf(tree)
    state = _sriov.pf_state(NVME_PF, tree.root)
    _sriov.set_autoprobe(state, False)
    assert tree.read("/sys/bus/pci/devices/%s/sriov_drivers_autoprobe" % NVME_PF) == "0"
    kernel.hooks.append(lambda _k, _p, rel, _v: rel.endswith("autoprobe"))
    with pytest.raises(_sriov.SriovError, match="read back '0'"):
        _sriov.set_autoprobe(state, True)


# --------------------------------------------------------------------------- bounded waits, rollback helper


@pytest.mark.parametrize("timeout", [10 ** 400, 10 ** 30, float("inf"), float("nan"), -5, None, "junk", True])
def test_wait_until_never_raises_and_is_bounded(bounded_clock, timeout):
    # 10**400 used to raise OverflowError in float(); inf waited for ever.
    clock = bounded_clock
    assert _sriov.wait_until(lambda: False, timeout) is False
    assert clock[0] <= _sysfs.MAX_WAIT + _sysfs.POLL_INTERVAL


def test_undo_numvfs_goes_back_through_zero(tree, kernel):
    add_nvme_pf(tree)
    _sriov.set_numvfs(_sriov.pf_state(NVME_PF, tree.root), 2, timeout=0)
    state = _sriov.pf_state(NVME_PF, tree.root)
    _sriov.set_numvfs(state, 4, timeout=0)
    kernel.writes.clear()
    assert _sriov.undo_numvfs(state, timeout=0) == "sriov_numvfs of 0000:01:00.0 set back to 2"
    assert [v for _p, v in kernel.writes] == ["0", "2"]
    assert len(_sriov.list_vfs(state["dir"])) == 2
    kernel.writes.clear()
    assert _sriov.undo_numvfs(state, timeout=0) == "sriov_numvfs of 0000:01:00.0 set back to 2"
    assert kernel.writes == []


def test_undo_numvfs_reports_a_failure(tree, kernel):
    add_nvme_pf(tree)
    state = _sriov.pf_state(NVME_PF, tree.root)
    _sriov.set_numvfs(state, 3, timeout=0)
    kernel.refuse["/sriov_numvfs"] = errno.EBUSY
    line = _sriov.undo_numvfs(state, timeout=0)
    assert line.startswith("setting sriov_numvfs of 0000:01:00.0 back to 0 failed: ")
    assert "Device or resource busy" in line


def test_sriov_error_details_are_result_keys():
    assert _sriov.SriovError("failed", rollback="restored sriov_numvfs to 2").extra == {
        "rollback": "restored sriov_numvfs to 2"}


def test_virtfn_links_are_matched_in_full(tree, kernel):
    add_nvme_pf(tree)
    _sriov.set_numvfs(_sriov.pf_state(NVME_PF, tree.root), 1, timeout=0)
    pf_dir = _sriov.pf_state(NVME_PF, tree.root)["dir"]
    os.symlink("../0000:01:00.1", os.path.join(pf_dir, "virtfn\u0661"))
    os.symlink("../0000:01:00.1", os.path.join(pf_dir, "virtfn0\n"))
    assert _sriov.list_vfs(pf_dir) == ["0000:01:00.1"]
