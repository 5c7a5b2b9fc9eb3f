# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Fixtures of the module tests that read the fake GPU host (gpu_facts, iommu_check).

A test file whose module acts on another kind of host defines its own ``host`` fixture, which takes
precedence over this one.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st


@pytest.fixture
def host(tmp_path):
    """A fresh fake GPU host (sysfs_tree.build_gpu_host) for one test."""
    return st.build_gpu_host(tmp_path)


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    """The root of one fake GPU host shared by the fuzz tests of a file (they change nothing)."""
    return st.build_gpu_host(tmp_path_factory.mktemp("fuzz")).root
