# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""run_timed, the collection's one command runner, on real commands (sh, cat, timeout(1)) through a real
AnsibleModule."""

from __future__ import annotations

import shutil
import sys

import pytest

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils import _module
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import patched_module

pytestmark = pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")


@pytest.fixture(name="module")
def fixture_module(monkeypatch):
    with patched_module(monkeypatch, {}):
        yield AnsibleModule(argument_spec={})


def test_stdin_data_reaches_the_command_as_given(module):
    rc, out, err = _module.run_timed(module, ["cat"], 10, data='{"execute":"quit"}\nsecond')
    assert (rc, out, err) == (0, '{"execute":"quit"}\nsecond', "")


def test_the_command_runs_with_lc_all_c(module):
    rc, out, _err = _module.run_timed(module, ["sh", "-c", 'echo "$LC_ALL"'], 10)
    assert (rc, out) == (0, "C\n")


def test_a_command_past_its_time_is_told_with_the_option_that_sets_it(module):
    rc, _out, err = _module.run_timed(module, [sys.executable, "-c", "import time; time.sleep(30)"], 1,
                                      option="boot_timeout")
    assert rc == _module.TIMEOUT_RC
    assert err.endswith("did not finish within 1 seconds (boot_timeout)")


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(module):
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(30)"
    rc, out, err = _module.run_timed(module, [sys.executable, "-c", script], 1, kill_after=1)
    assert rc in _module.TIMED_OUT_RCS[1:]
    assert out == "up\n"
    assert "did not finish within 1 seconds (command_timeout)" in err


def test_a_failing_command_keeps_its_own_rc_and_stderr(module):
    rc, _out, err = _module.run_timed(module, ["sh", "-c", "echo broken >&2; exit 3"], 10)
    assert (rc, err) == (3, "broken\n")


def test_no_time_limit_runs_without_timeout(module):
    rc, out, _err = _module.run_timed(module, ["sh", "-c", "echo $PPID; ps -o comm= -p $PPID"], 0)
    assert rc == 0
    assert "timeout" not in out
