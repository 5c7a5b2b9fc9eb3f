# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Every module starts, ends and fails one way: module_utils/_module.py.

main() is a single run_module(build_module, body, ...) call; build_module() goes through create_module (so
`inf` and huge integers are messages); no module calls exit_json or fail_json itself; every deliberate
error of module_utils derives from GpuopsError, so run_module reports its message.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODULES = sorted(f[:-3] for f in os.listdir(os.path.join(TOP, "plugins", "modules"))
                 if f.endswith(".py") and not f.startswith("_"))
UTILS = sorted(f[:-3] for f in os.listdir(os.path.join(TOP, "plugins", "module_utils"))
               if f.endswith(".py") and f != "__init__.py")


def tree(kind, name):
    with open(os.path.join(TOP, "plugins", kind, name + ".py"), encoding="utf-8") as handle:
        return ast.parse(handle.read())


def function(node, name):
    return next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def called(node):
    return [n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
            for n in ast.walk(node) if isinstance(n, ast.Call)]


def test_the_list_is_whole():
    assert len(MODULES) >= 10 and {"vfio_bind", "mdev_create", "iommu_check", "kernel_cmdline"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_main_is_one_run_module_call(name):
    module = tree("modules", name)
    main = function(module, "main")
    assert main is not None
    statements = [s for s in main.body if not isinstance(s, ast.Expr) or not isinstance(s.value, ast.Constant)]
    assert len(statements) == 1 and isinstance(statements[0], ast.Expr), ast.dump(main)
    call = statements[0].value
    assert isinstance(call, ast.Call) and getattr(call.func, "id", None) == "run_module"
    assert getattr(call.args[0], "id", None) == "build_module"


@pytest.mark.parametrize("name", MODULES)
def test_the_module_never_exits_by_itself(name):
    calls = called(tree("modules", name))
    assert "fail_json" not in calls and "exit_json" not in calls
    build = function(tree("modules", name), "build_module")
    assert build is not None and "create_module" in called(build) and "AnsibleModule" not in called(build)


@pytest.mark.parametrize("name", UTILS)
def test_every_error_class_is_a_gpuops_error(name):
    util = importlib.import_module("ansible_collections.gpuops.sandbox.plugins.module_utils." + name)
    for dummy, cls in inspect.getmembers(util, inspect.isclass):
        if issubclass(cls, Exception) and cls.__module__ == util.__name__:
            assert issubclass(cls, GpuopsError), cls
