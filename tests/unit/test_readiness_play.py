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


def test_the_table_reads_as_a_table_under_the_default_settings(tmp_path):
    """Ansible's defaults (the json result format, as in AWX) print a string's newlines as \\n on one line: the
    table must still print a row to a line, within 80 columns."""
    failed = {"host": "gpu-b", "workload_type": "container", "ready": False, "reboot_pending": False, "iommu_groups": 0,
              "mdevs": 0, "gpus": [], "checks": [{"check": "GPUs matching the selectors", "ok": False, "detail": "no GPU found"},
                                                 {"check": "no vfio-pci binding left", "ok": False, "detail": "vfio-pci"}]}
    ready = {"host": "gpu-a", "workload_type": "vm-passthrough", "ready": True, "reboot_pending": False,
             "iommu_groups": 12, "mdevs": 0, "vfio_probe": {"verdict": "yes", "probed": 1}, "gpus": ["0000:65:00.0=vfio-pci"],
             "checks": []}
    inventory = {"gpu_nodes": {"hosts": {"gpu-a": {"host_verify_report": ready}, "gpu-b": {"host_verify_report": failed},
                                         "gpu-c": {}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "name": "readiness", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Report", "ansible.builtin.import_tasks": os.path.join(TOP, "playbooks", "tasks", "readiness.yml")}]}]))
    # An empty ansible.cfg: every setting Ansible's default, but where the checkout's collection is found.
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    rc, out = ansible_playbook("-i", tmp_path / "hosts.yml", tmp_path / "play.yml", "-e", "gpuops_readiness_file=",
                               env={"ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
                                    "ANSIBLE_COLLECTIONS_PATH": os.path.join(TOP, ".build", "collections"),
                                    "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
                                    "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"})
    assert rc == 0, out[-3000:]
    task = out[out.index("TASK [Show the readiness table]"):]
    task = task[:task.index("\nTASK [")]
    assert "\\n" not in task, task
    printed = task.split("\n")
    # One JSON string a line: "HOST ...", each row, the continuation of a wrapped detail, the count.
    lines = [json.loads(line.strip().rstrip(",")) for line in printed if line.strip().startswith('"') and '"msg"' not in line]
    assert lines[0].split() == ["HOST", "TYPE", "READY", "VFIO", "MDEVS", "DETAIL"], task
    rows = dict((line.split()[0], line.split()) for line in lines[1:-1] if not line.startswith(" "))
    assert rows["gpu-a"] == ["gpu-a", "vm-passthrough", "yes", "yes", "0", "65:00.0=vfio-pci"], task
    assert rows["gpu-b"][:7] == ["gpu-b", "container", "NO", "-", "0", "failed:", "GPUs"], task
    assert rows["gpu-c"][:3] == ["gpu-c", "?", "NO"], task
    assert lines[-1] == "1 of 3 GPU nodes ready"
    assert "".join(lines).count("GPU nodes ready") == 1
    assert max(len(line) for line in printed) <= 80, task


def verify_hosts_task(play, name):
    plays = yaml.safe_load(open(os.path.join(TOP, "playbooks", "verify_hosts.yml"), encoding="utf-8"))
    return next(t for t in plays[play]["tasks"] if t["name"] == name)


VERIFY_REPORTS = {
    "gpu-a": {"host": "gpu-a", "workload_type": "dra", "ready": False, "reboot_pending": False,
              "checks": [{"check": "other installed kernels", "ok": False, "detail": "6.1.0-50-amd64: stale"},
                         {"check": "GPUs matching the selectors", "ok": True, "detail": "2 GPUs"}]},
    # A host another tool prepares: its report has managed: false and no readiness of its own.
    "gpu-b": {"host": "gpu-b", "workload_type": "container", "managed": False, "ready": None, "reboot_pending": False,
              "checks": []},
    "gpu-c": {"host": "gpu-c", "workload_type": "vm-vgpu", "ready": True, "reboot_pending": False, "checks": []},
}


def verify_inventory(tmp_path):
    inventory = {"gpu_nodes": {"hosts": dict((name, {"host_verify_report": report, "ansible_connection": "local"})
                                             for name, report in VERIFY_REPORTS.items())},
                 "ungrouped": {"hosts": {"localhost": {"ansible_connection": "local"}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    return tmp_path / "hosts.yml"


def test_verify_hosts_names_the_hosts_not_ready_beside_one_managed_elsewhere(tmp_path):
    task = verify_hosts_task(1, "Fail when a host is not ready")
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"name": "report", "hosts": "localhost", "gather_facts": False,
                                                        "tasks": [task]}]))
    rc, out = ansible_playbook("-i", verify_inventory(tmp_path), tmp_path / "play.yml")
    assert rc != 0 and "Not ready: gpu-a'" in out, out[-3000:]
    assert "has no attribute" not in out


def test_verify_hosts_limited_to_gpu_nodes_fails_each_host_not_ready(tmp_path):
    """A --limit without localhost skips the report play: the host that is not ready fails on its own, naming its
    failed checks; with localhost in the limit the report play does it."""
    task = verify_hosts_task(0, "Fail a host that is not ready when the limit leaves out the readiness report")
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"name": "check", "hosts": "gpu_nodes", "gather_facts": False,
                                                        "tasks": [task]}]))
    rc, out = ansible_playbook("-i", verify_inventory(tmp_path), tmp_path / "play.yml", "--limit", "gpu-a,gpu-b,gpu-c")
    assert rc != 0, out[-3000:]
    flat = " ".join(out.split())
    assert "gpu-a is not ready (dra): other installed kernels: 6.1.0-50-amd64: stale (--limit gpu-a,gpu-b,gpu-c" in flat, flat
    assert "failed=1" in flat and "gpu-b is not ready" not in flat and "gpu-c is not ready" not in flat
    rc, out = ansible_playbook("-i", verify_inventory(tmp_path), tmp_path / "play.yml", "--limit", "gpu-a,localhost")
    assert rc == 0 and "gpu-a is not ready" not in out, out[-3000:]
