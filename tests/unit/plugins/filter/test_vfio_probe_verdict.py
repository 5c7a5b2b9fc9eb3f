# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""vfio_probe_verdict: host_verify's check and the VFIO column from a registered vfio_probe result."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.vfio_probe_verdict import vfio_probe_verdict

OK = {"name": "0000:65:00.0", "ok": True, "problem_kind": None, "problem": None}
BUSY = {"name": "0000:65:00.1", "ok": False, "problem_kind": "busy", "problem": "in use: pid 7 (qemu) holds /dev/vfio/12"}
BAD = {"name": "0000:66:00.0", "ok": False, "problem_kind": "not-viable",
       "problem": "IOMMU group 13 is not viable: 0000:66:00.1 is on snd_hda_intel"}


def result(*devices):
    return {"changed": False, "devices": list(devices), "backends": {"dra_setting": "LegacyOnly"}}


def test_every_device_taken():
    verdict = vfio_probe_verdict(result(OK, dict(OK, name="x")))
    assert verdict["verdict"] == "yes" and (verdict["probed"], verdict["ok"]) == (2, 2)
    assert verdict["check"] == {"check": "a VMM can take the devices", "ok": True,
                                "detail": "2 of 2 taken by the VFIO calls of a VMM"}
    assert verdict["dra_setting"] == "LegacyOnly"


def test_a_device_in_use_by_a_vm_passes():
    verdict = vfio_probe_verdict(result(OK, BUSY))
    assert verdict["verdict"] == "busy" and verdict["check"]["ok"] is True
    assert verdict["check"]["detail"] == "1 of 2 taken by the VFIO calls of a VMM, 1 in use by a VM"


def test_a_failed_device_fails_the_check_and_names_why():
    verdict = vfio_probe_verdict(result(OK, BUSY, BAD))
    assert verdict["verdict"] == "NO" and verdict["failed"] == 1
    assert verdict["check"] == {"check": "a VMM can take the devices", "ok": False,
                                "detail": "0000:66:00.0: " + BAD["problem"]}


def test_nothing_probed_or_not_run_adds_no_check():
    assert vfio_probe_verdict(result())["check"] is None
    assert vfio_probe_verdict(result())["verdict"] == "-"
    skipped = vfio_probe_verdict({"skipped": True, "changed": False, "skip_reason": "Conditional result was False"})
    assert (skipped["verdict"], skipped["check"]) == ("-", None)


def test_a_module_failure_fails_the_check():
    verdict = vfio_probe_verdict({"failed": True, "msg": "cannot list the devices to probe: boom"})
    assert verdict["verdict"] == "NO"
    assert verdict["check"] == {"check": "a VMM can take the devices", "ok": False,
                                "detail": "cannot list the devices to probe: boom"}


@pytest.mark.parametrize("bad", ["x", None, {"devices": "x"}])
def test_bad_input_is_named(bad):
    with pytest.raises(AnsibleFilterError):
        vfio_probe_verdict(bad)
