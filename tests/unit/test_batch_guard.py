"""Rolling reboots stop at the first host that does not come back.

A real play (ansible-playbook, serial 2, four hosts on local connections) runs the batch guard of
prepare_hosts.yml and then host_reboot's reboot tasks on h1. Ansible refuses to reboot the controller over a
local connection, which stands for a host that does not come back: h1 fails with the role's message, and no
later batch starts unless gpuops_max_fail_percentage allows the failure; h2, in h1's batch, finishes its work.
(A batch whose hosts all fail ends the play in any case: that is Ansible's own rule.)
"""

import os
import sys

import pytest
import yaml

from ansible_collections.gpuops.sandbox.tests.unit.playbook import ansible_playbook

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOSTS = ["h1", "h2", "h3", "h4"]


def rolling(tmp_path, *extra, elsewhere=False):
    """The play on h1-h4; with `elsewhere`, first also on a host another tool prepares (gpuops_host_managed false),
    which prepare_hosts.yml's first task ends the play for."""
    play = [{"name": "rolling", "hosts": "all", "gather_facts": False, "serial": 2, "tasks": [
        {"name": "Unmanaged", "ansible.builtin.import_tasks": os.path.join(TOP, "playbooks", "tasks", "cluster_only.yml")},
        {"name": "Guard", "ansible.builtin.import_tasks": os.path.join(TOP, "playbooks", "tasks", "batch_guard.yml")},
        {"name": "Reboot h1", "ansible.builtin.include_role": {"name": "gpuops.sandbox.host_reboot", "tasks_from": "reboot.yml"},
         "when": "inventory_hostname == 'h1'", "vars": {"host_reboot_reasons": ["test"], "host_reboot_kubeconfig": ""}},
        {"name": "Work", "ansible.builtin.debug": {"msg": "worked on {{ inventory_hostname }}"}},
    ]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    inventory = {"all": {"hosts": dict((h, {"ansible_connection": "local", "ansible_python_interpreter": sys.executable})
                                       for h in HOSTS)}}
    if elsewhere:
        inventory["all"]["hosts"] = dict({"h0": {"ansible_connection": "local", "gpuops_host_managed": False,
                                                 "gpu_facts_gpus": [{"address": "0000:00:06.0", "vendor": "10de",
                                                                     "device": "2335", "driver": "nvidia"}]}},
                                         **inventory["all"]["hosts"])
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    return ansible_playbook("-i", tmp_path / "hosts.yml", tmp_path / "play.yml", *extra)


def test_a_host_that_does_not_come_back_stops_the_later_batches(tmp_path):
    rc, out = rolling(tmp_path)
    assert rc != 0
    assert "h1 did not come back from its reboot within 1800 seconds" in out, out[-3000:]
    assert "Later batches of the play are not started" in out
    assert "worked on h2" in out
    for host in HOSTS[2:]:
        assert "worked on %s" % host not in out, out[-3000:]
    assert out.count("Not started: 1 of 4 hosts failed in earlier batches (h1)") >= 2
    assert "Nothing was changed on h3" in out and "Nothing was changed on h4" in out


@pytest.mark.parametrize("budget, carries_on", [("25", True), ("24", False), ("100", True)])
def test_a_failure_budget_lets_the_play_carry_on(tmp_path, budget, carries_on):
    rc, out = rolling(tmp_path, "-e", "gpuops_max_fail_percentage=%s" % budget)
    assert rc != 0  # h1 failed either way
    assert "worked on h2" in out
    for host in HOSTS[2:]:
        assert ("worked on %s" % host in out) == carries_on, out[-3000:]


def test_a_host_managed_elsewhere_is_not_a_failed_host(tmp_path):
    """h0 leaves the play in its first task (gpuops_host_managed false) and h1 fails: the budget of one failed host
    in four lets the later batches carry on, and the message counts four hosts, not five."""
    rc, out = rolling(tmp_path, "-e", "gpuops_max_fail_percentage=25", elsewhere=True)
    assert rc != 0 and "worked on h2" in out
    for host in HOSTS[2:]:
        assert "worked on %s" % host in out, out[-3000:]
    assert "worked on h0" not in out
    rc, out = rolling(tmp_path, elsewhere=True)
    assert "Not started: 1 of 4 hosts failed in earlier batches (h1)" in out, out[-3000:]
