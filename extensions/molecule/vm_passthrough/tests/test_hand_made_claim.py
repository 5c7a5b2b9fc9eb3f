"""The GPU stand-ins were claimed for vfio-pci by hand before the preparation (vfio-pci.ids in /etc/default/grub,
written by the scenario's prepare step): the preparation left that claim where it was written. Its drop-in adds
the collection's arguments to /etc/default/grub's value instead of copying it, so the claim is in effect after the
preparation's reboot and is still the host owner's to edit; the switch scenario takes it off."""

import pytest

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
    assert claim in host.file("/etc/default/grub").content_string
    dropin = host.file(DROPIN).content_string
    assert "vfio-pci.ids" not in dropin, dropin
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in dropin.splitlines(), dropin
