"""The cluster half on GPU facts the inventory gives (issue 43): nodes whose hosts another tool prepares
(gpuops_host_managed: false), an H200 (10de:2335) and an L40S (10de:26b9), and the user's own gpuops_mig_configs.

playbooks/cluster.yml runs for real: against a stand-in API server that answers only the access checks, so the run
reaches the check of each node's MIG config against its GPUs, which must refuse every impossible config with its
reason before anything on the cluster is read or changed (under ansible-core 2.19 the host variables a play hands
the filters are a Mapping, not a dict: the check used to skip every node), and a device plugin config given as a
list with its own message. The facts an inventory gives in shapes gpu_facts never returns are named where they
enter the play."""

import json
import os

import pytest
import yaml

from ansible_collections.gpuops.sandbox.tests.unit.fakes import role_fakes
from ansible_collections.gpuops.sandbox.tests.unit.playbook import ansible_playbook

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H200 = {"address": "0000:00:06.0", "vendor": "10de", "device": "2335", "class": "030200", "driver": "nvidia",
        "device_name": "GH100 [H200 SXM 141GB]"}
L40S = {"address": "0000:ca:00.0", "vendor": "10de", "device": "26b9", "class": "030200", "driver": "nvidia",
        "device_name": "AD102GL [L40S]"}
DRIVER = {"nvidia_driver": {"source": "host", "version": "580.159.04", "loaded": True,
                            "host_module": "updates/dkms/nvidia.ko.zst"}}


TIME_SLICED = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}


def mig(**devices):
    return [{"devices": "all", "mig-enabled": True, "mig-devices": devices}]


MIG_CONFIGS = {
    "all-disabled": [{"devices": "all", "mig-enabled": False}],
    "seven": mig(**{"1g.18gb": 7}),
    "eight": mig(**{"1g.18gb": 8}),
    "a100-sizes": mig(**{"1g.20gb": 7}),
    "memory-over": mig(**{"3g.71gb": 2, "1g.18gb": 1}),
    "two-types": mig(**{"1g.18gb": 2, "2g.35gb": 1}),
    "for-an-a100": [{"device-filter": "0x20B510DE", "devices": "all", "mig-enabled": True,
                     "mig-devices": {"1g.10gb": 7}}],
}


def node(gpu, **host_vars):
    return dict({"ansible_connection": "ssh", "ansible_host": "192.0.2.1", "ansible_timeout": 3,
                 "gpuops_host_managed": False, "gpu_facts_gpus": [gpu], "gpu_facts_host": DRIVER}, **host_vars)


def write_inventory(tmp_path, hosts, **all_vars):
    data = {"all": {"vars": all_vars, "children": {"gpu_nodes": {"children": {"container": {"hosts": hosts}}}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(name="kube")
def fixture_kube():
    server = role_fakes.FakeKubeAccess()
    yield server
    server.close()


def cluster_run(tmp_path, kube, hosts, **all_vars):
    inventory = write_inventory(tmp_path, hosts, gpuops_kubeconfig=kube.kubeconfig(tmp_path / "kubeconfig"), **all_vars)
    return ansible_playbook("-i", inventory, os.path.join(TOP, "playbooks", "cluster.yml"))


def test_impossible_mig_configs_on_inventory_given_facts_are_refused(tmp_path, kube):
    hosts = {"h200-seven": node(H200, gpuops_mig_config="seven"),
             "h200-eight": node(H200, gpuops_mig_config="eight"),
             "h200-profile": node(H200, gpuops_mig_config="a100-sizes"),
             "h200-memory": node(H200, gpuops_mig_config="memory-over"),
             "h200-types": node(H200, gpuops_mig_config="two-types"),
             "h200-filtered": node(H200, gpuops_mig_config="for-an-a100"),
             "l40s": node(L40S, gpuops_mig_config="seven"),
             "l40s-listed": node(L40S, gpuops_device_plugin_config=["four-way"])}
    rc, out = cluster_run(tmp_path, kube, hosts, gpuops_mig_configs=MIG_CONFIGS,
                          gpuops_device_plugin_configs={"four-way": TIME_SLICED})
    assert rc != 0, out[-4000:]
    words = " ".join(out.split())
    assert "The GPU sharing settings are not valid, so no node was changed" in words, out[-4000:]
    h200 = "GPU 0 (10de:2335, GH100 [H200 SXM 141GB] at 0000:00:06.0), a H200-141GB"
    for expected in (
            "host h200-eight: node h200-eight %s, fits at most 7 instances of 1g.18gb, not 8" % h200,
            "host h200-profile: node h200-profile %s, has no MIG profile 1g.20gb; its profiles: 1g.18gb (up to 7)" % h200,
            "host h200-memory: node h200-memory %s, has 7 compute and 8 memory slices; 1g.18gb x1, 3g.71gb x2 needs 7 "
            "and 9, which do not fit" % h200,
            "host h200-types: node h200-types: MIG config two-types creates 1g.18gb, 2g.35gb, but the single MIG strategy "
            "exposes one MIG device type per node",
            "host h200-filtered: node h200-filtered GPU 0 (10de:2335, GH100 [H200 SXM 141GB] at 0000:00:06.0): no entry "
            "of MIG config for-an-a100 applies to it",
            "host l40s: node l40s GPU 0 (10de:26b9, AD102GL [L40S] at 0000:ca:00.0) has no MIG (neither the collection "
            "nor the GPU Operator's default MIG configuration knows MIG profiles for it), so no MIG config can "
            "partition it: give node l40s no gpuops_mig_config (or all-disabled), and to share the GPU use time-slicing "
            "or MPS (gpuops_device_plugin_config)",
            'host l40s-listed: gpuops_device_plugin_config is ["four-way"], which is not the name of one of '
            "gpuops_device_plugin_configs; accepted: one of their names as a string (it has: four-way)"):
        assert expected in words, (expected, out[-6000:])
    assert "host h200-seven" not in words, out[-6000:]
    # Refused before the cluster was read, let alone changed: the access checks were all it was asked.
    assert {path for _method, path in kube.requests} == {"/version", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"}
    assert "Traceback" not in out and "UNREACHABLE" not in out


# The shapes of issue 43 a user wrote by hand: each is named with its host, key and value, and the run stops for that
# host before anything reads the facts; a device ID written as a number of four digits is the ID it spells.
A10 = {"address": "0000:65:00.0", "vendor": "10de", "device": 2236, "class": "030200", "driver": "vfio-pci"}
BAD_FACTS = {
    "no-device": ({"gpu_facts_gpus": [{k: v for k, v in H200.items() if k != "device"}]},
                  'gpu_facts_gpus[0] ({"address": "0000:00:06.0", "class": "030200", "device_name": "GH100 [H200 SXM '
                  '141GB]", "driver": "nvidia", "vendor": "10de"}) has no device (the PCI device ID as 4 hex digits in '
                  'quotes, such as "2335"'),
    "numeric-name": ({"gpu_facts_gpus": [dict(H200, device_name=4090)]},
                     'gpu_facts_gpus[0].device_name is 4090; accepted: text, in quotes for one that looks like a number '
                     '("4090") or null'),
    "driver-as-text": ({"gpu_facts_host": {"nvidia_driver": "host"}},
                       'gpu_facts_host.nvidia_driver is "host"; accepted: a mapping with loaded, version, host_module '
                       'and source or null'),
    "numeric-version": ({"gpu_facts_host": {"nvidia_driver": {"source": "host", "version": 550.54, "loaded": True}}},
                        'gpu_facts_host.nvidia_driver.version is 550.54; accepted: text such as "580.159.04" (quote it: '
                        'YAML reads an unquoted 535.10 as a number and drops its trailing zero) or null'),
    "octal-device": ({"gpu_facts_gpus": [dict(H200, device=155)]},
                     'gpu_facts_gpus[0].device is 155; accepted: the PCI device ID as 4 hex digits in quotes, such as '
                     '"2335" (YAML reads an unquoted 0233 or 0x2335 as another number)'),
}


def test_inventory_facts_of_the_wrong_shape_are_named_and_a_numeric_id_is_taken(tmp_path):
    hosts = {name: node(H200, **facts) for name, (facts, _message) in BAD_FACTS.items()}
    hosts["a10"] = node(A10, gpu_facts_host={"nvidia_driver": {"source": "host", "version": "550.54.15", "loaded": True}})
    inventory = write_inventory(tmp_path, hosts)
    assert "device: 2236\n" in inventory.read_text()  # the number, as a user writes it unquoted
    out_file = tmp_path / "ready.json"
    rc, out = ansible_playbook("-i", inventory, os.path.join(TOP, "playbooks", "verify_hosts.yml"),
                               "-e", "gpuops_readiness_file=%s" % out_file)
    assert rc != 0
    words = " ".join(out.split())
    for name, (_facts, message) in BAD_FACTS.items():
        assert "%s has gpuops_host_managed false" % name in words, (name, out[-6000:])
        assert "host %s: %s" % (name, message) in words, (name, message, out[-6000:])
    recap = out[out.index("PLAY RECAP"):]
    for name in BAD_FACTS:
        assert "%s : ok=0 changed=0 unreachable=0 failed=1" % name in " ".join(recap.split()), recap
    assert "has no attribute" not in out and "KeyError" not in out and "Traceback" not in out
    # The A10 passes, its device ID taken as "2236", and the readiness table shows it.
    assert "a10 container - - - host managed elsewhere: 65:00.0=vfio-pci (driver: host 550.54.15)" in words, out[-4000:]
    node_doc = next(n for n in json.loads(out_file.read_text())["nodes"] if n["host"] == "a10")
    assert node_doc["gpus"] == ["0000:65:00.0=vfio-pci"] and node_doc["driver_version"] == "550.54.15"


def test_a_device_id_written_as_a_number_reaches_the_cluster_half_as_the_id(tmp_path, kube):
    """A vm-passthrough node's KubeVirt entry is worked out from its device ID (10DE:2236): given as the number 2236,
    the cluster half's checks pass and the run goes on to read the nodes (which this stand-in does not have)."""
    hosts = {"a10": node(A10, gpuops_workload_type="vm-passthrough")}
    rc, out = cluster_run(tmp_path, kube, hosts, gpuops_gpu_operator_enabled=False, gpuops_kubevirt_enabled=False)
    assert rc != 0
    assert "cannot list the nodes: 404" in out, out[-4000:]
    assert "has no attribute" not in out and "Traceback" not in out
    assert ("GET", "/api/v1/nodes") in kube.requests
