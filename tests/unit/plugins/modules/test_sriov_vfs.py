# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Module tests for sriov_vfs on a fake sysfs tree with a simulated kernel (see fakes/sriov_kernel.py)."""

from __future__ import annotations

import errno
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


from ansible_collections.gpuops.sandbox.plugins.module_utils import _sriov
from ansible_collections.gpuops.sandbox.plugins.modules import sriov_vfs
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import (
    TIMEOUTS_OUT_OF_BOUNDS,
    assert_run_ends_cleanly,
    raise_on_exit,
    run_main,
)
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sriov_kernel import (
    NVME_PF,
    FakeKernel,
    FakeTree,
    _oserror,
    add_nvme_pf,
    install_kernel,
)
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sysfs_tree import HOSTILE_VALUES


@pytest.fixture(autouse=True)
def patched(monkeypatch):
    raise_on_exit(monkeypatch)


@pytest.fixture
def host(tmp_path, monkeypatch):
    tree = FakeTree(tmp_path)
    kernel = install_kernel(tree, monkeypatch)
    add_nvme_pf(tree)
    return tree, kernel


def run(tree, args, check=False, diff=False):
    """Run the module on the fake tree; return (result, failed)."""
    full = dict(args)
    full.setdefault("timeout", 0)
    return run_main(sriov_vfs, tree.root, full, check=check, diff=diff)


def numvfs(tree):
    return int(tree.read("/sys/bus/pci/devices/%s/sriov_numvfs" % NVME_PF))


def test_check_run_check_run(host):
    tree, kernel = host
    args = {"pf": NVME_PF, "count": 3}
    before = tree.snapshot()
    result, failed = run(tree, args, check=True, diff=True)
    assert not failed and result["changed"] and result["numvfs"] == 3
    assert result["diff"]["before"].startswith("sriov_numvfs: 0\n")
    assert result["diff"]["after"].startswith("sriov_numvfs: 3\n")
    assert tree.snapshot() == before and kernel.writes == []
    result, failed = run(tree, args)
    assert not failed and result["changed"] and numvfs(tree) == 3
    assert result["vfs"] == ["0000:01:00.1", "0000:01:00.2", "0000:01:00.3"]
    result, failed = run(tree, args, check=True)
    assert not failed and not result["changed"]
    kernel.writes.clear()
    result, failed = run(tree, args)
    assert not failed and not result["changed"] and kernel.writes == []


def test_change_goes_through_zero_and_absent(host):
    tree, kernel = host
    run(tree, {"pf": "01:00.0", "count": 2})
    kernel.writes.clear()
    result, failed = run(tree, {"pf": NVME_PF, "count": 4})
    assert not failed and result["previous_numvfs"] == 2 and numvfs(tree) == 4
    assert [v for _p, v in kernel.writes] == ["0", "4"]
    result, failed = run(tree, {"pf": NVME_PF, "state": "absent"})
    assert not failed and result["changed"] and numvfs(tree) == 0 and result["vfs"] == []
    result, failed = run(tree, {"pf": NVME_PF, "state": "absent"})
    assert not failed and not result["changed"]


def test_autoprobe_set_before_vfs(host):
    tree, kernel = host
    result, failed = run(tree, {"pf": NVME_PF, "count": 2, "autoprobe": False})
    assert not failed and result["autoprobe"] is False
    assert [p.rsplit("/", 1)[1] for p, _v in kernel.writes] == ["sriov_drivers_autoprobe", "sriov_numvfs"]
    assert not os.path.lexists(tree.p("/sys/bus/pci/devices/0000:01:00.1/driver"))


@pytest.mark.parametrize("args,message", [
    ({"pf": NVME_PF, "count": 5}, "cannot enable 5 VFs on 0000:01:00.0: sriov_totalvfs is 4"),
    ({"pf": NVME_PF, "count": -1}, "count must be 0 or a positive integer, got -1"),
    ({"pf": "0000:01:00.9", "count": 1}, "PCI address '0000:01:00.9' is not valid"),
    ({"pf": "0000:07:00.0", "count": 1}, "PCI device 0000:07:00.0 does not exist on this host"),
    ({"pf": NVME_PF}, "state is present but all of the following are missing: count"),
    ({"pf": NVME_PF, "count": 1, "timeout": -5}, "timeout must be 0 or a positive"),
])
def test_errors_change_nothing(host, args, message):
    tree, kernel = host
    before = tree.snapshot()
    result, failed = run(tree, args)
    assert failed and result["msg"].startswith(message)
    assert tree.snapshot() == before and kernel.writes == []


def test_no_driver(tmp_path, monkeypatch):
    tree = FakeTree(tmp_path)
    kernel = FakeKernel(tree)
    monkeypatch.setattr(_sriov, "write_attr", kernel.write)
    add_nvme_pf(tree, driver=None)
    result, failed = run(tree, {"pf": NVME_PF, "count": 2})
    assert failed and "has no driver bound" in result["msg"] and kernel.writes == []


def test_not_sriov(tmp_path):
    tree = FakeTree(tmp_path)
    tree.add_pci("0000:02:00.0", "0x8086", "0x10d3", "0x020000", driver="e1000e")
    result, failed = run(tree, {"pf": "0000:02:00.0", "count": 1})
    assert failed and result["msg"] == "PCI device 0000:02:00.0 is not an SR-IOV physical function (no sriov_totalvfs)"


def test_vf_on_vfio_refused_unless_force(host):
    tree, kernel = host
    run(tree, {"pf": NVME_PF, "count": 2})
    tree.link("/sys/bus/pci/devices/0000:01:00.1/driver", "/sys/bus/pci/drivers/vfio-pci")
    before = tree.snapshot()
    kernel.writes.clear()
    result, failed = run(tree, {"pf": NVME_PF, "state": "absent"})
    assert failed and result["msg"] == (
        "refusing to change the VF count of 0000:01:00.0 from 2 to 0 while VFs are in use (0000:01:00.1 is bound "
        "to vfio-pci); stop the users first or set force=true")
    assert tree.snapshot() == before and kernel.writes == []
    result, failed = run(tree, {"pf": NVME_PF, "state": "absent", "force": True})
    assert not failed and numvfs(tree) == 0


def test_driver_refuses_and_old_count_restored(host):
    tree, kernel = host
    run(tree, {"pf": NVME_PF, "count": 2})

    def refuse(_kernel, _path, rel, value):
        if rel.endswith("/sriov_numvfs") and value == "4":
            raise _oserror(errno.ENOMEM, rel)
        return False

    kernel.hooks.append(refuse)
    result, failed = run(tree, {"pf": NVME_PF, "count": 4})
    assert failed and "Cannot allocate memory" in result["msg"]
    assert "rollback: restored sriov_numvfs to 2" in result["msg"]
    assert numvfs(tree) == 2


def test_driver_refuses_and_autoprobe_restored(host):
    tree, kernel = host
    kernel.refuse["/sriov_numvfs"] = errno.ENOMEM
    result, failed = run(tree, {"pf": NVME_PF, "count": 2, "autoprobe": False})
    assert failed and "Cannot allocate memory" in result["msg"]
    assert result["msg"].endswith("; sriov_drivers_autoprobe restored to 1")
    assert tree.read("/sys/bus/pci/devices/%s/sriov_drivers_autoprobe" % NVME_PF) == "1" and numvfs(tree) == 0


def test_driver_refuses_and_restoring_autoprobe_fails(host):
    tree, kernel = host
    autoprobe_writes = []

    def refuse(_kernel, _path, rel, value):
        if rel.endswith("/sriov_numvfs"):
            raise _oserror(errno.ENOMEM, rel)
        if rel.endswith("/sriov_drivers_autoprobe"):
            autoprobe_writes.append(value)
            if len(autoprobe_writes) > 1:
                raise _oserror(errno.EIO, rel)
        return False

    kernel.hooks.append(refuse)
    result, failed = run(tree, {"pf": NVME_PF, "count": 2, "autoprobe": False})
    assert failed and "Cannot allocate memory" in result["msg"]
    assert "; restoring sriov_drivers_autoprobe failed: " in result["msg"] and autoprobe_writes == ["0", "1"]
    assert tree.read("/sys/bus/pci/devices/%s/sriov_drivers_autoprobe" % NVME_PF) == "0"


# --------------------------------------------------------------------------- bounds checked before any change


@pytest.mark.parametrize("count", [True, False])
def test_boolean_count_is_refused(host, count):
    # A boolean is an int to Python and to ansible-core: count=true used to tear the VFs down and make 1.
    tree, kernel = host
    run(tree, {"pf": NVME_PF, "count": 2})
    before = tree.snapshot()
    kernel.writes.clear()
    for check in (True, False):
        result, failed = run(tree, {"pf": NVME_PF, "count": count}, check=check)
        assert failed, result
        assert result["msg"] == "count must be a whole number of VFs, got %r (a boolean); nothing was changed" % count
    assert tree.snapshot() == before and kernel.writes == []


@pytest.mark.parametrize("timeout,message", TIMEOUTS_OUT_OF_BOUNDS + [
    ("1e400", "timeout must be 0 to 3600 seconds, got a number of 401 digits; nothing was changed"),
    (10 ** 400, "timeout must be 0 to 3600 seconds, got a number of 401 digits; nothing was changed"),
])
def test_timeout_out_of_bounds_is_refused_before_any_change(host, timeout, message):
    # 10**400 ("1e400" to ansible-core) used to raise OverflowError in the read-back wait, after the VFs
    # were torn down.
    tree, kernel = host
    run(tree, {"pf": NVME_PF, "count": 2})
    before = tree.snapshot()
    kernel.writes.clear()
    result, failed = run(tree, {"pf": NVME_PF, "count": 3, "timeout": timeout})
    assert failed and result["msg"] == message
    assert tree.snapshot() == before and kernel.writes == []


# --------------------------------------------------------------------------- fuzzing

HOSTILE = st.sampled_from(HOSTILE_VALUES)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.fixed_dictionaries({}, optional={
    "pf": st.one_of(st.none(), st.text(max_size=20), st.integers(), st.sampled_from([NVME_PF, "01:00.0", "x"]),
                    HOSTILE),
    "count": st.one_of(st.none(), st.integers(min_value=-5, max_value=10), st.text(max_size=4), st.booleans(),
                       HOSTILE),
    "state": st.one_of(st.text(max_size=8), st.sampled_from(["present", "absent"]), HOSTILE),
    "autoprobe": st.one_of(st.none(), st.booleans(), st.text(max_size=5), HOSTILE),
    "force": st.one_of(st.booleans(), st.text(max_size=5), st.integers(), HOSTILE),
    "timeout": st.one_of(st.integers(min_value=-3, max_value=0), st.text(max_size=4), HOSTILE),
    "persistent": st.one_of(st.booleans(), HOSTILE),
}), check=st.booleans())
def test_fuzz_never_raises(host, args, check):
    tree, _kernel = host
    assert_run_ends_cleanly(*run(tree, args, check=check))
