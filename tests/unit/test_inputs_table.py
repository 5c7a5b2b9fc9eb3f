"""The README's table of inventory inputs names every gpuops_* input the roles and playbooks read, and no other."""

import glob
import os
import re

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FACTS = {"gpuops_gpus", "gpuops_iommu", "gpuops_host", "gpuops_mdev_parents", "gpuops_pci_ids", "gpuops_cluster_access",
         "gpuops_run"}


def used():
    names = set()
    paths = glob.glob(os.path.join(TOP, "roles", "*", "*", "*.yml"))
    paths += glob.glob(os.path.join(TOP, "playbooks", "**", "*.yml"), recursive=True)
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            names.update(re.findall(r"(?<![\w])gpuops_[a-z0-9_]+", handle.read()))
    return names - FACTS


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
    assert {"gpuops_workload_type", "gpuops_kubeconfig", "gpuops_reboot_ok"} <= used()
