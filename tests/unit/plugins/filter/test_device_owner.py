# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""device_owner: one rule for who binds the GPUs and creates the vGPU devices, and no role keeps a copy of it."""

from __future__ import annotations

import glob
import os

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.device_owner import FilterModule

device_owner = FilterModule().filters()["device_owner"]
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))))


@pytest.mark.parametrize("given, kubeconfig, expected", [
    ("", "", "host"),
    (None, "", "host"),
    ("", None, "host"),
    ("", "/home/me/.kube/config", "operator"),
    ("host", "/home/me/.kube/config", "host"),
    ("operator", "", "operator"),
    ("bogus", "", "bogus"),  # returned as given: preflight refuses it with the accepted values
])
def test_the_rule(given, kubeconfig, expected):
    assert device_owner(given, kubeconfig) == expected


@pytest.mark.parametrize("given, kubeconfig", [(["host"], ""), ("", 3), (True, "")])
def test_a_value_that_is_not_a_string_is_named(given, kubeconfig):
    with pytest.raises(AnsibleFilterError) as err:
        device_owner(given, kubeconfig)
    assert repr(given if not isinstance(given, str) else kubeconfig) in str(err.value)


def test_no_role_writes_the_rule_itself():
    copies = []
    for path in glob.glob(os.path.join(TOP, "roles", "*", "defaults", "main.yml")):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        for name in ("gpuops_vfio_binding", "gpuops_vgpu_devices"):
            for line in text.splitlines():
                if name in line and "device_owner" not in line:
                    copies.append("%s: %s" % (os.path.relpath(path, TOP), line.strip()))
    assert copies == []
    readers = [path for path in glob.glob(os.path.join(TOP, "roles", "*", "defaults", "main.yml"))
               if "device_owner" in open(path, encoding="utf-8").read()]
    assert len(readers) == 3  # preflight, host_prepare and host_verify
