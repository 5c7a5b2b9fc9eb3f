"""A GPU node whose host another tool prepares (gpuops_host_managed: false): the real playbooks never connect to it
(it is an SSH host at an address nothing answers, so a task that connected would leave it unreachable), the readiness report says its
host is checked elsewhere and shows the sharing the inventory gives, and an inventory without its GPU facts is
refused naming the host."""

import json
import os

import pytest
import yaml

from ansible_collections.gpuops.sandbox.tests.unit.playbook import ansible_playbook

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H200 = {"address": "0000:00:06.0", "vendor": "10de", "device": "2335", "class": "030200", "driver": "nvidia"}


def inventory(tmp_path, **host_vars):
    hostvars = {"ansible_connection": "ssh", "ansible_host": "192.0.2.1", "ansible_timeout": 3, "gpuops_host_managed": False,
                "gpu_facts_gpus": [H200], "gpuops_mig_config": "all-1g.18gb",
                "gpu_facts_host": {"nvidia_driver": {"source": "host", "version": "580.159.04", "loaded": True}}}
    hostvars.update(host_vars)
    hostvars = {k: v for k, v in hostvars.items() if v is not None}
    data = {"all": {"children": {"gpu_nodes": {"children": {"container": {"hosts": {"gpu-h200": hostvars}}}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(data))
    return tmp_path / "hosts.yml"


@pytest.mark.parametrize("playbook", ["verify_hosts.yml", "prepare_hosts.yml"])
def test_the_host_half_leaves_an_unmanaged_host_alone(tmp_path, playbook):
    out_file = tmp_path / "ready.json"
    rc, out = ansible_playbook("-i", inventory(tmp_path), os.path.join(TOP, "playbooks", playbook),
                               "-e", "gpuops_readiness_file=%s" % out_file)
    assert rc == 0, out[-4000:]
    recap = out[out.index("PLAY RECAP"):]
    assert "unreachable=0" in recap and "failed=0" in recap, recap
    if playbook == "verify_hosts.yml":
        row = next(line for line in out.splitlines() if "gpu-h200" in line and "container" in line)
        assert row.split()[:4] == ["gpu-h200", "container", "-", "-"], row
        words = " ".join(out.split())
        assert "host managed elsewhere: 00:06.0=nvidia (driver: host 580.159.04) MIG all-1g.18gb" in words, out[-3000:]
        assert "0 of 0 GPU nodes ready, 1 more managed elsewhere" in out, out[-3000:]
        doc = json.loads(out_file.read_text())
        node = doc["nodes"][0]
        assert (node["managed"], node["ready"], node["gpus"], node["mig_config"]) == (
            False, None, ["0000:00:06.0=nvidia"], "all-1g.18gb")
        assert (doc["total"], doc["managed_elsewhere"]) == (0, 1)


@pytest.mark.parametrize("facts, shown", [(None, '"nothing"'), ("0000:00:06.0", '"0000:00:06.0"'),
                                          ([{"vendor": "10de"}], '"vendor": "10de"')])
def test_an_unmanaged_host_without_its_gpu_facts_is_refused(tmp_path, facts, shown):
    rc, out = ansible_playbook("-i", inventory(tmp_path, gpu_facts_gpus=facts),
                               os.path.join(TOP, "playbooks", "prepare_hosts.yml"))
    assert rc != 0
    assert "gpu-h200 has gpuops_host_managed false" in out, out[-3000:]
    assert "must give them as gpu_facts_gpus" in out and shown in out and "Nothing was changed" in out
    assert "UNREACHABLE" not in out and "Traceback" not in out
