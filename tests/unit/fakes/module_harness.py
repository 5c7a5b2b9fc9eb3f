# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Run a module's main() or run_module() with given arguments; exit_json/fail_json raise instead of exiting."""

from __future__ import annotations

import contextlib
import json
import os
from unittest import mock

from ansible.module_utils import basic

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core before 2.19 (scripts/test-cores.sh): the arguments as AnsibleModule reads them
    @contextlib.contextmanager
    def patch_module_args(args=None):
        with mock.patch.object(basic, "_ANSIBLE_ARGS", json.dumps({"ANSIBLE_MODULE_ARGS": args or {}}).encode()):
            yield


# Timeouts outside the 0 to 3600 seconds the modules that write sysfs accept (_sysfs.MAX_WAIT), each with the
# message it gives (mdev_create, sriov_vfs, vfio_bind).
TIMEOUTS_OUT_OF_BOUNDS = [
    (10 ** 30, "timeout must be 0 to 3600 seconds, got a number of 31 digits; nothing was changed"),
    (3601, "timeout must be 0 to 3600 seconds, got 3601; nothing was changed"),
    (True, "timeout must be a whole number of seconds, got True; nothing was changed"),
]


class ModuleExit(SystemExit):
    """exit_json was called; ``result`` holds its keyword arguments (a SystemExit, as the real exit_json's)."""

    def __init__(self, result):
        super().__init__(result)
        self.result = result


class ModuleFail(SystemExit):
    """fail_json was called; ``result`` holds its keyword arguments (``msg`` included; a SystemExit too)."""

    def __init__(self, result):
        super().__init__(result)
        self.result = result


def _exit_json(self, **kwargs):  # pylint: disable=unused-argument
    kwargs.setdefault("changed", False)
    raise ModuleExit(kwargs)


def _fail_json(self, msg, **kwargs):  # pylint: disable=unused-argument
    kwargs["failed"] = True
    kwargs["msg"] = msg
    raise ModuleFail(kwargs)


@contextlib.contextmanager
def patched_module(monkeypatch, args):
    """Expose ``args`` to AnsibleModule and make exit/fail raise; restored when the context ends."""
    with monkeypatch.context() as patch:
        patch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
        patch.setattr(basic.AnsibleModule, "fail_json", _fail_json)
        with patch_module_args(args):
            yield


def call(monkeypatch, func, args):
    """Call ``func()`` with module ``args``; return ``("exit"|"fail", result)``."""
    with patched_module(monkeypatch, args):
        try:
            func()
        except ModuleExit as exc:
            return "exit", exc.result
        except ModuleFail as exc:
            return "fail", exc.result
    raise AssertionError("the module returned without calling exit_json or fail_json")


def call_main(monkeypatch, module, root, args):
    """Run ``module.main()``, its only entry point, with ``args`` on the tree at ``root`` (its ROOT for the
    rest of the test); return ``("exit"|"fail", result)``."""
    monkeypatch.setattr(module, "ROOT", root)
    return call(monkeypatch, module.main, args)


def assert_ends_cleanly(kind, result):
    """The run ended in exit_json, or in fail_json with a message of its own (no traceback, no bug)."""
    assert kind in ("exit", "fail")
    if kind == "fail":
        assert isinstance(result["msg"], str) and result["msg"]
        assert "Traceback" not in result["msg"] and "unexpectedly" not in result["msg"]


def assert_fails_with(kind, result, fragments):
    """The run ended in fail_json with a message that contains every one of ``fragments``."""
    assert kind == "fail"
    for fragment in fragments:
        assert fragment in result["msg"]


def assert_run_ends_cleanly(result, failed):
    """A :func:`run_main` outcome: failed with a message of its own (no traceback), or a changed flag."""
    assert isinstance(result, dict)
    if failed:
        assert isinstance(result["msg"], str) and result["msg"]
        assert "Traceback" not in result["msg"]
    else:
        assert isinstance(result["changed"], bool)


def raising(exc):
    """A stand-in for a function of the module under test that raises ``exc`` whatever it is called with."""
    def stand_in(*_args, **_kwargs):
        raise exc
    return stand_in


def raise_on_exit(monkeypatch):
    """Make exit_json/fail_json raise ModuleExit/ModuleFail for the rest of the test."""
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)


def run_with_commands(module, host, params, check=False, diff=False):
    """Run ``module.main()`` on ``host`` (a command_host.CommandHost): the module's ``ROOT`` at its root,
    ``get_bin_path`` finding only its fake commands; return the result of exit_json or fail_json with the
    ``warnings`` the module gave."""
    warnings = []

    def get_bin_path(self, arg, required=False, opt_dirs=None):  # pylint: disable=unused-argument
        candidate = os.path.join(host.bin, arg)
        if os.path.exists(candidate):
            return candidate
        if required:
            self.fail_json(msg="Failed to find required executable %r" % arg)
        return None

    full = dict(params, _ansible_check_mode=check, _ansible_diff=diff)
    with mock.patch.multiple(basic.AnsibleModule, exit_json=_exit_json, fail_json=_fail_json,
                             get_bin_path=get_bin_path, warn=lambda self, text: warnings.append(text)), \
            mock.patch.object(module, "ROOT", host.root), patch_module_args(full):
        try:
            module.main()
        except (ModuleExit, ModuleFail) as done:
            return dict(done.result, warnings=warnings)
    raise AssertionError("the module returned without calling exit_json or fail_json")


def command_runner(module):
    """The ``run(host, check=False, diff=False, **params)`` of the tests of ``module``: run it on ``host`` with
    :func:`run_with_commands`; return the result with ``failed`` (False when the run did not fail) and the
    ``warnings`` it gave."""

    def run(host, check=False, diff=False, **params):
        result = run_with_commands(module, host, params, check=check, diff=diff)
        result.setdefault("failed", False)
        return result

    return run


def run_main(module, root, args, check=False, diff=False):
    """Run ``module.main()`` with its ROOT at ``root`` and ``args`` (exit/fail_json patched to raise, see
    raise_on_exit); return ``(result, failed)``."""
    full = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    module.ROOT = root
    try:
        with patch_module_args(full):
            module.main()
    except ModuleExit as done:
        return done.result, False
    except ModuleFail as failed:
        return failed.result, True
    finally:
        module.ROOT = "/"
    raise AssertionError("the module returned without calling exit_json or fail_json")
