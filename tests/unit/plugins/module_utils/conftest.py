# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures the module_utils tests share."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils import _sysfs


@pytest.fixture
def bounded_clock(monkeypatch):
    """A fake clock for the sysfs waits: sleeping moves it on, and a wait that sleeps past twice MAX_WAIT fails
    the test. Returns the one-item list holding the time (tests may reset it)."""
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds
        if clock[0] > 2 * _sysfs.MAX_WAIT:
            raise AssertionError("the wait is not bounded by MAX_WAIT")

    monkeypatch.setattr(_sysfs, "_monotonic", lambda: clock[0])
    monkeypatch.setattr(_sysfs, "_sleep", sleep)
    return clock
