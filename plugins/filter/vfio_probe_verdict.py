# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: the readiness verdict of a vfio_probe result (host_verify's check and the VFIO column)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
---
name: vfio_probe_verdict
short_description: Turn a vfio_probe result into a readiness check and a one-word verdict
version_added: 1.0.0
description:
  - Takes the registered result of M(gpuops.sandbox.vfio_probe) (run with C(fail_on_problem=false)) and returns
    C(verdict) (C(yes) every device was taken, C(busy) some are in use by a VM and none failed, C(NO) at least
    one failed, C(-) nothing was probed), the counts C(probed), C(ok), C(busy), C(failed), the C(dra_setting)
    that worked, and C(check), a readiness check (C(check), C(ok), C(detail)) or null when nothing was probed.
  - A device in use by a VM is not a failure of the host, since the VM that holds it is the proof.
  - A skipped task (the probe did not run) gives verdict C(-) and no check.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The registered result of M(gpuops.sandbox.vfio_probe).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Add the probe's check to the host's checks
  ansible.builtin.set_fact:
    checks: "{{ checks + ([verdict.check] if verdict.check else []) }}"
  vars:
    verdict: "{{ probe | gpuops.sandbox.vfio_probe_verdict }}"
"""

RETURN = r"""
_value:
  description: C(verdict), C(probed), C(ok), C(busy), C(failed), C(dra_setting) and C(check).
  type: dict
"""

CHECK_NAME = "a VMM can take the devices"


def vfio_probe_verdict(result):
    if not isinstance(result, dict):
        raise AnsibleFilterError("vfio_probe_verdict expects the registered result of vfio_probe, got %r" % (result,))
    devices = result.get("devices")
    if result.get("skipped") is True or devices is None:
        if result.get("failed"):
            msg = result.get("msg") or "vfio_probe failed"
            return {"verdict": "NO", "probed": 0, "ok": 0, "busy": 0, "failed": 0, "dra_setting": None,
                    "check": {"check": CHECK_NAME, "ok": False, "detail": msg}}
        return {"verdict": "-", "probed": 0, "ok": 0, "busy": 0, "failed": 0, "dra_setting": None, "check": None}
    if not isinstance(devices, list):
        raise AnsibleFilterError("vfio_probe_verdict: devices must be a list, got %r" % (devices,))
    ok = [d for d in devices if d.get("ok")]
    busy = [d for d in devices if not d.get("ok") and d.get("problem_kind") == "busy"]
    failed = [d for d in devices if not d.get("ok") and d.get("problem_kind") != "busy"]
    if not devices:
        verdict = "-"
    elif failed:
        verdict = "NO"
    elif busy:
        verdict = "busy"
    else:
        verdict = "yes"
    check = None
    if devices:
        if failed:
            detail = "; ".join("%s: %s" % (d.get("name"), d.get("problem")) for d in failed)
        else:
            detail = "%d of %d taken by the VFIO calls of a VMM%s" % (
                len(ok), len(devices), (", %d in use by a VM" % len(busy)) if busy else "")
        check = {"check": CHECK_NAME, "ok": not failed, "detail": detail}
    return {"verdict": verdict, "probed": len(devices), "ok": len(ok), "busy": len(busy), "failed": len(failed),
            "dra_setting": (result.get("backends") or {}).get("dra_setting"), "check": check}


class FilterModule:
    """gpuops.sandbox.vfio_probe_verdict"""

    def filters(self):
        return {"vfio_probe_verdict": vfio_probe_verdict}
