"""Leaving vm-vgpu: host_prepare's cleanup turns off the VFs gpu_facts lists as recorded for boot.

gpu_facts gives ``sriov_recorded`` as a list of PF addresses; the cleanup once read ``item.key`` from it and
failed with a templating error on every host that had persistent VFs. Run for real on localhost, in check
mode, against a PF address that does not exist here: the module must be reached with that address.
"""

import json
import sys

from playbook import ansible_playbook

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
    facts = {"ansible_python_interpreter": sys.executable, "gpu_facts_host": host}
    (tmp_path / "vars.json").write_text(json.dumps(facts))
    rc, out = ansible_playbook("-i", "localhost,", "-c", "local", tmp_path / "play.yml", "--check",
                               "-e", "@%s" % (tmp_path / "vars.json"))
    assert "has no attribute" not in out, out[-3000:]
    # The module itself answered, about the recorded PF (which this machine does not have).
    assert rc != 0 and "PCI device 0000:ff:1f.7 does not exist on this host" in out, out[-3000:]
