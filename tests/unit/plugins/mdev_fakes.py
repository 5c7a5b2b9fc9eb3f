"""Fake mdev hosts, and the faults their kernel shows, for the mdev tests (module_utils/test_mdev.py and
modules/test_mdev_create.py)."""

from __future__ import annotations

from ansible_collections.gpuops.sandbox.tests.unit.fakes.mdev_hosts import MdevKernel, install
from ansible_collections.gpuops.sandbox.tests.unit.fakes.sriov_kernel import FakeTree, _oserror


def fake_host(path, monkeypatch, *builders):
    """A fake tree at ``path`` with the mdev kernel installed and ``builders`` run on it, their writes forgotten;
    ``(tree, kernel)``."""
    tree = FakeTree(path)
    kernel = MdevKernel(tree)
    install(monkeypatch, kernel)
    for builder in builders:
        builder(tree, kernel)
    kernel.writes.clear()
    return tree, kernel


def refuse_create(kernel, uuid, error):
    """The fake kernel fails the create of the mediated device ``uuid`` with ``error`` (an errno number) and creates
    every other one as before."""
    original = kernel.mdev_create

    def create(path, rel, value):
        if value == uuid:
            raise _oserror(error, rel)
        return original(path, rel, value)

    kernel.mdev_create = create
