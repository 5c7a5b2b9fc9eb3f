"""Leaving vm-vgpu: host_prepare's cleanup turns off the VFs gpu_facts lists as recorded for boot.

gpu_facts gives ``sriov_recorded`` as a list of PF addresses; the cleanup once read ``item.key`` from it and
failed with a templating error on every host that had persistent VFs. The cleanup now makes the calls of the host's
plan (the host_plan filter on those facts, as the preflight role works it out). Run for real on localhost, in check
mode, against a PF address that does not exist here: the module must be reached with that address.
"""

import json
import sys

from playbook import ansible_playbook

from ansible_collections.gpuops.sandbox.plugins.filter.host_plan import host_plan

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Clean up
      ansible.builtin.include_role:
        name: gpuops.sandbox.host_prepare
        tasks_from: vgpu_cleanup.yml
"""


def test_recorded_vfs_reach_sriov_vfs_by_address(tmp_path):
    (tmp_path / "play.yml").write_text(PLAY)
    host = {"mdev_devices": [], "sriov_recorded": ["0000:ff:1f.7"],
            "managed_files": {"mdev_definitions": [], "sriov_definitions": ["/etc/gpuops/sriov-vfs.conf"]}}
    plan = host_plan([], {}, host, {"workload_type": "container"})
    assert plan["calls"]["sriov_remove"] == [{"pf": "0000:ff:1f.7", "state": "absent", "persistent": True}]
    facts = {"ansible_python_interpreter": sys.executable, "gpu_facts_host": host, "preflight_plan": plan}
    (tmp_path / "vars.json").write_text(json.dumps(facts))
    rc, out = ansible_playbook("-i", "localhost,", "-c", "local", tmp_path / "play.yml", "--check",
                               "-e", "@%s" % (tmp_path / "vars.json"))
    assert "has no attribute" not in out, out[-3000:]
    # The module itself answered, about the recorded PF (which this machine does not have).
    assert rc != 0 and "PCI device 0000:ff:1f.7 does not exist on this host" in out, out[-3000:]


MAIN = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Prepare without the preflight role
      ansible.builtin.include_role:
        name: gpuops.sandbox.host_prepare
      vars:
        host_prepare_workload_type: container
"""


def test_host_prepare_without_the_plan_stops_naming_the_preflight_role(tmp_path):
    (tmp_path / "play.yml").write_text(MAIN)
    rc, out = ansible_playbook("-i", "localhost,", "-c", "local", tmp_path / "play.yml", "--check",
                               "-e", "ansible_python_interpreter=%s" % sys.executable)
    assert rc != 0, out[-3000:]
    assert "needs the host's plan from the role gpuops.sandbox.preflight" in " ".join(out.split()), out[-3000:]
    assert "Nothing was changed" in out and "Traceback" not in out


VGPU = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Prepare the vGPU devices
      ansible.builtin.include_role:
        name: gpuops.sandbox.host_prepare
        tasks_from: vgpu.yml
"""


def _vgpu_node_plan(host, gpus):
    config = {"version": "v1", "vgpu-configs": {"A10-8Q": [{"devices": "all", "vgpu-devices": {"A10-8Q": 2}}]}}
    settings = {"workload_type": "vm-vgpu", "vgpu_devices": "host", "vgpu_device_config": config,
                "vgpu_config_name": "A10-8Q"}
    return host_plan(gpus, {"enabled": True}, host, settings, mdev_parents=[])


def test_vgpu_devices_are_the_plans_calls(tmp_path):
    """tasks/vgpu.yml makes the plan's sriov_vfs and mdev_create calls: with a PF this machine lacks, sriov_vfs is
    reached with the plan's address and count, and the stale type the plan removes is never worked out again."""
    (tmp_path / "play.yml").write_text(VGPU)
    pf = "0000:ff:1e.0"
    gpus = [{"address": pf, "vendor_id": "10de", "class_id": "030200", "sriov_totalvfs": 4, "driver": "nvidia"}]
    host = {"mdev_devices": [], "sriov": {pf: {"totalvfs": 4, "numvfs": 0}}, "managed_files": {}}
    plan = _vgpu_node_plan(host, gpus)
    assert plan["calls"]["sriov"] == [{"pf": pf, "count": 4, "persistent": True}]
    assert plan["calls"]["mdev"] == [{"type": "NVIDIA A10-8Q", "count": 2, "persistent": True, "pf": pf}]
    # Facts that disagree with the plan: the role must not read them (the plan is what preflight checked).
    facts = {"ansible_python_interpreter": sys.executable, "preflight_plan": plan,
             "gpu_facts_gpus": [], "gpu_facts_host": {"mdev_devices": [], "sriov": {}}, "gpu_facts_mdev_parents": []}
    (tmp_path / "vars.json").write_text(json.dumps(facts))
    rc, out = ansible_playbook("-i", "localhost,", "-c", "local", tmp_path / "play.yml", "--check",
                               "-e", "@%s" % (tmp_path / "vars.json"))
    flat = " ".join(out.split())
    assert "has no attribute" not in out and "Traceback" not in out, out[-3000:]
    assert rc != 0 and "%s: 4 VFs" % pf in flat, out[-3000:]
    assert "PCI device %s does not exist on this host" % pf in flat, out[-3000:]


def test_vgpu_node_with_nothing_to_do_makes_no_call(tmp_path):
    """A plan with no VFs and no vGPU devices to make (a vm-vgpu node whose configuration gives no device): the task
    file runs through, changing nothing."""
    (tmp_path / "play.yml").write_text(VGPU)
    plan = {"calls": {"sriov": [], "mdev_remove": [], "mdev": []}}
    facts = {"ansible_python_interpreter": sys.executable, "preflight_plan": plan}
    (tmp_path / "vars.json").write_text(json.dumps(facts))
    rc, out = ansible_playbook("-i", "localhost,", "-c", "local", tmp_path / "play.yml", "--check",
                               "-e", "@%s" % (tmp_path / "vars.json"))
    assert rc == 0, out[-3000:]
    assert "changed=0" in out and "failed=0" in out, out[-3000:]
