"""What the verifiers know of a lab host's PCI functions, read from the host itself, so the same checks hold on
every layout (lab/layout.py): the GPUs are the functions the lab inventory's selectors pick, and the functions
that go with them are the other endpoints of their IOMMU groups."""

import os

import yaml

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
GROUP_VARS = os.path.join(TOP, "inventories", "lab", "group_vars", "all.yml")

FUNCTIONS = (
    "for f in /sys/bus/pci/devices/*; do "
    "d=-; [ -e \"$f/driver\" ] && d=$(basename \"$(readlink \"$f/driver\")\"); "
    "g=-; [ -e \"$f/iommu_group\" ] && g=$(basename \"$(readlink \"$f/iommu_group\")\"); "
    "echo \"$(basename \"$f\") $(cat \"$f/vendor\" \"$f/device\" \"$f/class\" | tr '\\n' ' ')$d "
    "$(cat \"$f/driver_override\") $g\"; done")


def selectors():
    """(vendor ids, device ids, class ids) the lab inventory selects GPUs by, as sysfs spells them (0x...)."""
    with open(GROUP_VARS, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    return tuple(frozenset("0x" + str(v).lower() for v in data[key])
                 for key in ("gpuops_gpu_vendor_ids", "gpuops_gpu_device_ids", "gpuops_gpu_class_ids"))


def functions(host):
    """{address: {vendor, device, class, driver, override, group}} of every PCI function of the host."""
    return parse(host.check_output(FUNCTIONS).splitlines())


def parse(lines):
    """The functions from lines of FUNCTIONS' output (also what a scenario recorded on the host)."""
    found = {}
    for line in lines:
        address, vendor, device, klass, driver, override, group = line.split()
        found[address] = {"vendor": vendor, "device": device, "class": klass, "driver": driver,
                          "override": override, "group": group}
    return found


def gpus(found):
    """The addresses of the functions the inventory's selectors pick, in order."""
    vendors, devices, classes = selectors()
    return sorted(a for a, f in found.items()
                  if f["vendor"] in vendors and f["device"] in devices and f["class"][:8] in classes)


def companions(found):
    """The other endpoints (not PCI bridges) of the GPUs' IOMMU groups: the functions bound with them."""
    chosen = gpus(found)
    groups = {found[a]["group"] for a in chosen} - {"-"}
    return sorted(a for a, f in found.items()
                  if f["group"] in groups and a not in chosen and not f["class"].startswith("0x0604"))
