"""The GPU stand-ins were claimed for vfio-pci by hand before the preparation (written by the scenario's prepare
step: vfio-pci.ids in /etc/default/grub on a grub host, in /etc/kernel/cmdline and every entry on a systemd-boot
host): the preparation left that claim where it was written. On grub its drop-in adds the collection's arguments
to /etc/default/grub's value instead of copying it; on systemd-boot it edits /etc/kernel/cmdline and writes the
entries again from it. Either way the claim is in effect after the preparation's reboot and is still the host
owner's to edit; the switch scenario takes it off."""

import importlib.util
import json
import os

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "lab_functions", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                  "lab_functions.py"))
lab_functions = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lab_functions)

DROPIN = "/etc/default/grub.d/99-gpuops-sandbox.cfg"


@pytest.fixture(scope="module")
def claim(host):
    marker = host.file("/var/tmp/gpuops-hand-made-claim")
    if not marker.exists:
        pytest.skip("the host was prepared before this scenario (GPUOPS_MOLECULE_REUSE): no hand-made claim")
    return marker.content_string.strip()


def test_the_claim_is_in_effect(host, claim):
    assert claim in host.file("/proc/cmdline").content_string.split()


def test_the_claim_stays_where_it_was_written(host, claim):
    if lab_functions.boot_path(host) == "systemd-boot":
        assert claim in host.file("/etc/kernel/cmdline").content_string.split()
        for name, options in lab_functions.entries(host).items():
            assert claim in options, (name, options)
        return
    assert claim in host.file("/etc/default/grub").content_string
    dropin = host.file(DROPIN).content_string
    assert "vfio-pci.ids" not in dropin, dropin
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in dropin.splitlines(), dropin


def test_the_claimed_functions_have_records_of_what_modules_alias_names(host, claim):
    """The claim had bound the stand-ins before the collection did: their records say so, with the host modules the
    lab kernel's modules.alias gives for them (the driver only when there is exactly one)."""
    vendor, device = claim.split("=", 1)[1].split(",")[0].split(":")
    records = []
    for path in host.file("/var/lib/gpuops/vfio_bind").listdir():
        data = json.loads(host.file("/var/lib/gpuops/vfio_bind/" + path).content_string)
        if (data["vendor"], data["device"]) == (vendor, device):
            records.append(data)
    assert records, "no record of a %s:%s function" % (vendor, device)
    for data in records:
        assert data["origin"] == "modules.alias" and data["claimed_by"] == ["cmdline"], data
        assert data["bound_to"] == "vfio-pci", data
        assert data["driver"] is not None or len(data["host_modules"]) != 1, data
        assert data["driver"] is None or len(data["host_modules"]) == 1, data
