"""The inventories the project ships (the example and the lab) put the cluster-wide settings where the cluster half
sees them.

The cluster half (playbooks/cluster.yml) runs on the controller's implicit localhost, which belongs to no inventory
group but `all`: a setting the roles read there (the MIG and device plugin configurations, the driver's upgrade
policy, the vGPU device configuration) set in group_vars/container.yml or on a host never reaches the chart. Each
node's own choices (its MIG config, its vGPU config name) are read per host and may be anywhere. The check asks
ansible-inventory itself what localhost sees."""

import json
import os
import subprocess
import sys

import pytest
import yaml

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Read only on the controller (role defaults of cluster_nodes, gpu_operator, kubevirt_devices, dra_driver).
CLUSTER_WIDE = ("gpuops_mig_configs", "gpuops_mig_profiles", "gpuops_mig_strategy", "gpuops_device_plugin_configs",
                "gpuops_device_plugin_config_default", "gpuops_driver_upgrade_policy", "gpuops_driver_version",
                "gpuops_vgpu_device_config", "gpuops_vgpu_config_default", "gpuops_dra_driver_version")


def defined_anywhere(inventory):
    """{variable: [where]} for the cluster-wide names set in the inventory's files outside group_vars/all."""
    found = {}
    for root, _dirs, files in os.walk(inventory):
        for name in files:
            path = os.path.join(root, name)
            if not name.endswith((".yml", ".yaml")) or path.endswith(os.path.join("group_vars", "all.yml")):
                continue
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            for var in CLUSTER_WIDE:
                if "\n" + var + ":" in "\n" + text or " " + var + ":" in text:
                    found.setdefault(var, []).append(os.path.relpath(path, TOP))
    return found


@pytest.mark.parametrize("inventory", ["example", "lab"])
def test_cluster_wide_settings_are_where_the_controller_sees_them(inventory):
    directory = os.path.join(TOP, "inventories", inventory)
    assert defined_anywhere(directory) == {}
    with open(os.path.join(directory, "group_vars", "all.yml"), encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    given = [v for v in CLUSTER_WIDE if v in data]
    assert given, "the %s inventory sets none of the cluster-wide settings" % inventory
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-inventory"), "-i", directory,
                          "--host", "localhost"], cwd=TOP, check=True, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE).stdout
    seen = json.loads(out)
    assert [v for v in given if v not in seen] == [], seen.keys()
