"""The readiness report of site.yml and verify_hosts.yml, run for real on localhost from made-up host reports."""

import json
import os

import yaml

from ansible_collections.gpuops.sandbox.tests.unit.playbook import ansible_playbook

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_play_prints_a_table_and_writes_the_json(tmp_path):
    report = {"host": "gpu-a", "workload_type": "vm-passthrough", "ready": True, "reboot_pending": False,
              "iommu_groups": 12, "mdevs": 0, "vfio_probe": {"verdict": "yes", "probed": 1}, "gpus": ["0000:65:00.0=vfio-pci"], "checks": []}
    inventory = {"gpu_nodes": {"hosts": {"gpu-a": {"host_verify_report": report}, "gpu-b": {}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "name": "readiness", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Report", "ansible.builtin.import_tasks": os.path.join(TOP, "playbooks", "tasks", "readiness.yml")}]}]))
    out_file = tmp_path / "ready.json"
    rc, out = ansible_playbook("-i", tmp_path / "hosts.yml", tmp_path / "play.yml", "-e", "gpuops_readiness_file=%s" % out_file)
    assert rc == 0, out[-3000:]
    # The table is one block: each row on a line of its own, within 80 columns with the callback's indent.
    block = out[out.index("HOST "):]
    block = block[:block.index("GPU nodes ready") + len("GPU nodes ready")]
    lines = [line.strip() for line in block.split("\n")]
    assert lines[1].split() == ["gpu-a", "vm-passthrough", "yes", "yes", "0", "65:00.0=vfio-pci"], block
    assert lines[2].split()[:3] == ["gpu-b", "?", "NO"] and "not checked" in block
    assert lines[-1] == "1 of 2 GPU nodes ready"
    printed = out.split("\n")
    first = next(i for i, line in enumerate(printed) if "HOST " in line)
    assert max(len(line) for line in printed[first:first + len(lines)]) <= 80, block
    doc = json.loads(out_file.read_text())
    assert doc["nodes"][0] == dict(report, checked=True) and doc["nodes"][1]["checked"] is False
    assert (doc["ready"], doc["total"], doc["all_ready"]) == (1, 2, False)
