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
