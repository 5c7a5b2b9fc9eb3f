# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which VMs on a node hold GPUs (and so cannot live-migrate)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.gpu_vms import gpu_vms


def vmi(name, node="n1", phase="Running", namespace="vms", owner=None, **spec):
    meta = {"name": name, "namespace": namespace}
    if owner:
        meta["ownerReferences"] = [{"kind": "VirtualMachine", "name": owner}]
    return {"metadata": meta, "spec": spec, "status": {"nodeName": node, "phase": phase}}


GPU = {"devices": {"gpus": [{"name": "g", "deviceName": "nvidia.com/GA102GL_A10"}]}}
HOSTDEV = {"devices": {"hostDevices": [{"name": "h", "deviceName": "nvidia.com/NVIDIA_A10-24Q"}]}}


def test_gpus_host_devices_and_claims_count_on_this_node_only():
    found = gpu_vms([
        vmi("b", domain=GPU, owner="b-vm"), vmi("a", domain=HOSTDEV),
        vmi("c", domain={"devices": {}}, resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "vfio-gpu"}]),
        vmi("plain", domain={"devices": {"disks": [{"name": "d"}]}}), vmi("other", node="n2", domain=GPU),
        vmi("done", phase="Succeeded", domain=GPU), vmi("failed", phase="Failed", domain=GPU),
        vmi("pending", phase="Scheduling", domain=GPU), vmi("x", namespace="a", domain=GPU)], "n1")
    wanted = [("a", "x"), ("vms", "a"), ("vms", "b"), ("vms", "c"), ("vms", "pending")]
    assert [(v["namespace"], v["name"]) for v in found] == wanted
    by = dict((v["name"], v) for v in found)
    assert by["b"]["devices"] == ["nvidia.com/GA102GL_A10"] and by["b"]["owner"] == "b-vm"
    assert by["a"]["devices"] == ["nvidia.com/NVIDIA_A10-24Q"] and by["a"]["owner"] is None
    assert by["c"]["devices"] == ["claim vfio-gpu"]


def test_objects_without_spec_or_status_are_no_gpu_vms():
    assert gpu_vms([{}, {"metadata": {"name": "x"}}], "n1") == []


@pytest.mark.parametrize("value", ["x", None, [1]])
def test_bad_input_is_named(value):
    with pytest.raises(AnsibleFilterError):
        gpu_vms(value, "n1")
