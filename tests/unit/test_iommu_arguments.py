"""The kernel arguments host_prepare puts on a VM node's command line, by CPU vendor.

The kernel knows intel_iommu=on; it has no amd_iommu=on (AMD-Vi is on whenever the firmware has an IVRS table,
and the amd_iommu= values only tune it or turn it off), so an AMD host gets iommu=pt alone.
"""

import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

try:
    from ansible.template import trust_as_template
except ImportError:  # ansible-core before 2.19 (scripts/test-cores.sh) templates every string it is given
    def trust_as_template(value):
        return value

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def iommu_task():
    with open(os.path.join(TOP, "roles", "host_prepare", "tasks", "boot.yml"), encoding="utf-8") as handle:
        tasks = yaml.safe_load(handle)
    return next(t for t in tasks if t["name"] == "Turn the IOMMU on in the kernel command line")


@pytest.mark.parametrize("vendor, pt, wanted", [
    ("intel", True, ["intel_iommu=on", "iommu=pt"]), ("intel", False, ["intel_iommu=on"]),
    ("amd", True, ["iommu=pt"]), ("amd", False, []),
])
def test_arguments_by_vendor(vendor, pt, wanted):
    task = iommu_task()
    variables = {"host_prepare_cpu_vendor": vendor, "host_prepare_iommu_pt": pt}
    variables.update((k, trust_as_template(v)) for k, v in task["vars"].items())
    templar = Templar(loader=DataLoader(), variables=variables)
    arguments = templar.template(trust_as_template(task["gpuops.sandbox.kernel_cmdline"]["arguments"]))
    assert arguments == wanted
    assert not any(a.startswith("amd_iommu") for a in arguments)
    # With nothing to add, the module is not called at all.
    assert "__host_prepare_iommu_arguments | length > 0" in task["when"]
