"""playbooks/plan.yml, run for real on an inventory of nodes whose hosts another tool prepares (no host is connected
to, no kubeconfig): the host rows read as managed elsewhere, and the cluster half's plan beside them says what it
would set - each node's labels by its type (given by a group only, one by a variable), both Helm releases with the
values the roles would install, and the KubeVirt entry of the passthrough node's H200 under the sandbox device
plugin's name. The JSON holds the same, and nothing changes."""

import json
import os

import yaml

from ansible_collections.gpuops.sandbox.plugins.module_utils._plugin_names import passthrough_resource_name
from ansible_collections.gpuops.sandbox.tests.unit.playbook import ansible_playbook

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H200 = {"address": "0000:00:06.0", "vendor": "10de", "device": "2335", "class": "030200", "driver": "nvidia",
        "device_name": "GH100 [H200 SXM 141GB]"}


def node(gpu, **host_vars):
    return dict({"ansible_connection": "ssh", "ansible_host": "192.0.2.1", "ansible_timeout": 3,
                 "gpuops_host_managed": False, "gpu_facts_gpus": [gpu],
                 "gpu_facts_host": {"nvidia_driver": {"source": "host", "version": "580.159.04", "loaded": True}}},
                **host_vars)


def test_plan_shows_the_cluster_half_beside_the_hosts(tmp_path):
    inventory = {"all": {
        "vars": {"gpu_operator_chart_ref": "charts/gpu-operator", "dra_driver_chart_ref": "charts/dra-driver",
                 "gpuops_plan_file": str(tmp_path / "plan.json")},
        "children": {"gpu_nodes": {"children": {
            "container": {"hosts": {"h200-a": node(H200, gpuops_mig_config="all-1g.18gb")}},
            "vm_passthrough": {"hosts": {"h200-b": node(dict(H200, driver="vfio-pci"))}},
            "dra": {"hosts": {"h200-c": node(H200, gpuops_node_name="node-c")}},
        }}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    rc, out = ansible_playbook("-i", tmp_path / "hosts.yml", os.path.join(TOP, "playbooks", "plan.yml"))
    flat = " ".join(out.split())
    assert rc == 0 and "Traceback" not in out, out[-4000:]
    assert "changed=0" in out and "unreachable=0" in out, out[-3000:]
    with open(tmp_path / "plan.json", encoding="utf-8") as handle:
        document = json.load(handle)
    assert sorted(document["hosts"]) == ["h200-a", "h200-b", "h200-c"]
    assert all(plan["managed"] is False for plan in document["hosts"].values()), document["hosts"]
    cluster = document["cluster"]
    assert cluster["read"] is False and cluster["refusals"] == [], cluster
    labels = {n["name"]: n["labels"] for n in cluster["nodes"]}
    assert labels["h200-a"] == {"nvidia.com/gpu.workload.config": "container", "nvidia.com/mig.config": "all-1g.18gb",
                                "nvidia.com/gpu.deploy.driver": "false"}, labels
    assert labels["h200-b"] == {"nvidia.com/gpu.workload.config": "vm-passthrough"}, labels
    assert labels["node-c"]["nvidia.com/gpu.workload.config"] == "container", labels
    assert labels["node-c"]["nvidia.com/gpu.deploy.device-plugin"] == "false", labels
    releases = {r["name"]: r for r in cluster["releases"]}
    assert sorted(releases) == ["dra-driver-nvidia-gpu", "gpu-operator"], releases
    operator = releases["gpu-operator"]
    assert operator["chart"] == "charts/gpu-operator" and operator["action"] == "install or upgrade", operator
    assert operator["values"]["sandboxWorkloads"]["enabled"] is True, operator["values"]
    # Every container and dra node runs the host's driver: the operator's driver container is off.
    assert operator["values"]["driver"] == {"enabled": False}, operator["values"]
    entry = {"pciVendorSelector": "10DE:2335", "resourceName": passthrough_resource_name("2335"),
             "externalResourceProvider": True}
    assert cluster["kubevirt"]["pciHostDevices"] == [entry], cluster["kubevirt"]
    # The table: the host rows, then the cluster section, an item a line.
    assert "CLUSTER not read (no gpuops_kubeconfig): what it would set" in flat, out[-4000:]
    assert "permit 10DE:2335 as %s in the KubeVirt CR" % entry["resourceName"] in flat, out[-4000:]
    assert "install or upgrade the Helm release gpu-operator/gpu-operator from charts/gpu-operator" in flat, out[-4000:]
