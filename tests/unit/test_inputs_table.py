"""The README's table of inventory inputs names every gpuops_* input the roles and playbooks read, and no other;
the collection's own facts and registered results never take the inputs' gpuops_ prefix."""

import glob
import os
import re

import yaml

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The one gpuops_ name the collection sets itself: prepare_hosts.yml keeps the workload type it found from the
# inventory groups for the plays that follow, the same value a user would have set.
CARRIED_INPUTS = {"gpuops_workload_type"}


def yaml_paths():
    paths = glob.glob(os.path.join(TOP, "roles", "*", "*", "*.yml"))
    paths += glob.glob(os.path.join(TOP, "playbooks", "**", "*.yml"), recursive=True)
    return paths


def used():
    names = set()
    for path in yaml_paths():
        with open(path, encoding="utf-8") as handle:
            names.update(re.findall(r"(?<![\w])gpuops_[a-z0-9_]+", handle.read()))
    return names


def tasks(node):
    """Every task dict in a loaded playbook or task file (blocks, rescue and always included)."""
    if isinstance(node, list):
        for item in node:
            yield from tasks(item)
    elif isinstance(node, dict):
        yield node
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from tasks(node.get(key) or [])


def set_names():
    """Names the roles and playbooks set: set_fact keys and registered results."""
    names = set()
    for path in yaml_paths():
        if os.sep + "tasks" + os.sep not in path and os.sep + "playbooks" + os.sep not in path:
            continue
        with open(path, encoding="utf-8") as handle:
            for task in tasks(yaml.safe_load(handle) or []):
                if isinstance(task.get("register"), str):
                    names.add(task["register"])
                for key in ("ansible.builtin.set_fact", "set_fact"):
                    if isinstance(task.get(key), dict):
                        names.update(name for name in task[key] if name != "cacheable")
    return names


def module_facts():
    """The facts gpu_facts returns (the keys of its RETURN's ansible_facts)."""
    from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
    return set(yaml.safe_load(gpu_facts.RETURN)["ansible_facts"]["contains"])


def documented():
    with open(os.path.join(TOP, "README.md"), encoding="utf-8") as handle:
        text = handle.read()
    table = text[text.index("### Inventory inputs"):]
    table = table[:table.index("\n\n", table.index("| input |"))]
    return set(re.findall(r"`(gpuops_[a-z0-9_]+)`", table.split("| input |", 1)[1]))


def test_every_input_is_in_the_table():
    assert used() - documented() == set()


def test_the_table_names_no_input_nothing_reads():
    assert documented() - used() == set()


def test_the_scan_finds_the_main_inputs():
    assert {"gpuops_workload_type", "gpuops_kubeconfig", "gpuops_reboot_ok", "gpuops_mdev_parents"} <= used()


def test_no_fact_or_result_takes_the_input_prefix():
    names = set_names()
    assert {"host_lock_run", "kube_access_result", "host_verify_report"} <= names  # the scan sees them
    assert {name for name in names if name.startswith("gpuops_")} == CARRIED_INPUTS


def test_gpu_facts_are_named_after_their_module():
    facts = module_facts()
    assert {"gpu_facts_gpus", "gpu_facts_iommu", "gpu_facts_host", "gpu_facts_mdev_parents", "gpu_facts_pci_ids"} == facts
