"""The kernel arguments a VM node's plan puts on its command line, by CPU vendor, and host_prepare's call of them.

The kernel knows intel_iommu=on; it has no amd_iommu=on (AMD-Vi is on whenever the firmware has an IVRS table,
and the amd_iommu= values only tune it or turn it off), so an AMD host gets iommu=pt alone.
"""

import pytest

from ansible_collections.gpuops.sandbox.plugins.filter.host_plan import host_plan
from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted

GPU = {"address": "0000:65:00.0", "driver": "nvidia"}


def plan(vendor, pt, workload_type="vm-passthrough"):
    iommu = {"enabled": False, "platform_vendor": vendor, "firmware_tables": ["DMAR" if vendor == "intel" else "IVRS"],
             "cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro"}
    return host_plan([GPU], iommu, {}, {"workload_type": workload_type, "iommu_pt": pt})


def boot_task(name):
    return next(t for t in load("roles/host_prepare/tasks/boot.yml") if t["name"] == name)


@pytest.mark.parametrize("vendor, pt, wanted", [
    ("intel", True, ["intel_iommu=on", "iommu=pt"]), ("intel", False, ["intel_iommu=on"]),
    ("amd", True, ["iommu=pt"]), ("amd", False, None),
])
def test_arguments_by_vendor(vendor, pt, wanted):
    found = plan(vendor, pt)
    call = found["calls"].get("cmdline")
    assert (call or {}).get("arguments") == wanted
    assert found["expected"]["kernel_arguments"] == (wanted or [])
    if wanted:
        assert "add %s to the kernel command line" % " ".join(wanted) in [c["detail"] for c in found["changes"]]
    # host_prepare calls kernel_cmdline with the plan's arguments, and not at all when the plan has no call.
    task = boot_task("Turn the IOMMU on in the kernel command line")
    variables = {"__host_prepare_calls": found["calls"]}
    assert templar(variables).evaluate_conditional(trusted(task["when"])) is bool(wanted)
    if wanted:
        assert templar(variables).template(trusted(task["gpuops.sandbox.kernel_cmdline"]["arguments"])) == wanted


@pytest.mark.parametrize("workload_type", ["vm-vgpu", "dra"])
def test_every_iommu_type_gets_them(workload_type):
    assert plan("intel", True, workload_type)["calls"]["cmdline"]["arguments"] == ["intel_iommu=on", "iommu=pt"]


def test_a_container_node_gets_none():
    assert "cmdline" not in plan("intel", True, "container")["calls"]
