"""playbooks/remove_nodes.yml refuses a bad request in its first play, naming what is wrong and what it accepts,
before any play reaches a host or the cluster: the GPU hosts are SSH hosts at an address nothing answers and the
kubeconfig names an API server nobody runs, so a later play that started would leave them unreachable or fail on
the server. The removal itself runs in tests/integration/test_70_cluster.py against a real API server."""

import os

import pytest
import yaml

from ansible_collections.gpuops.sandbox.tests.unit.playbook import ansible_playbook

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def inventory(tmp_path, kubeconfig=True):
    host = {"ansible_connection": "ssh", "ansible_host": "192.0.2.1", "ansible_timeout": 3}
    all_vars = {"gpuops_kubeconfig": str(tmp_path / "kubeconfig")} if kubeconfig else {}
    data = {"all": {"vars": all_vars,
                    "hosts": {"localhost": {"ansible_connection": "local"}},
                    "children": {"gpu_nodes": {"hosts": {"gpu-1": dict(host), "gpu-2": dict(host)}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(data))
    return tmp_path / "hosts.yml"


@pytest.mark.parametrize("args, kubeconfig, expect", [
    ([], True, "Name the nodes to take out: -e gpuops_remove_nodes=<host>[,<host>...] (inventory names of gpu_nodes "
               "hosts; got [])"),
    (["-e", "gpuops_remove_nodes=gpu-1,gpu-9"], True, "gpu-9: not a host of group gpu_nodes (it has: gpu-1, gpu-2)"),
    (["-e", "gpuops_remove_nodes=gpu-1", "--limit", "gpu-1,localhost"], True,
     "--limit gpu-1,localhost: run without --limit; the remaining hosts' GPUs decide which KubeVirt entries stay"),
    (["-e", "gpuops_remove_nodes=gpu-1", "-e", "gpuops_remove_give_back=maybe"], True,
     'gpuops_remove_give_back "maybe" is not a boolean'),
    (["-e", "gpuops_remove_nodes=gpu-2"], False, "gpuops_kubeconfig is not set: taking a node out is done on the cluster"),
], ids=["no-names", "unknown-name", "limit", "give-back-not-boolean", "no-kubeconfig"])
def test_a_bad_request_is_refused_before_any_host_or_the_cluster_is_reached(tmp_path, args, kubeconfig, expect):
    rc, out = ansible_playbook("-i", inventory(tmp_path, kubeconfig), os.path.join(TOP, "playbooks", "remove_nodes.yml"),
                               *args)
    words = " ".join(out.split())
    assert rc != 0, out[-3000:]
    assert expect in words and "Nothing was changed." in words, out[-3000:]
    assert "Traceback" not in out
    # Only the first play ran: no host was contacted and no later play started.
    assert "PLAY [Cordon and drain the leaving nodes]" not in out and "UNREACHABLE" not in out, out[-3000:]
