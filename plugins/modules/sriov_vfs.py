#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sriov_vfs
short_description: Enable or disable SR-IOV virtual functions on a PCI physical function
version_added: 1.0.0
description:
  - Sets the number of SR-IOV virtual functions (VFs) of a physical function (PF) through
    C(/sys/bus/pci/devices/<PF>/sriov_numvfs), and optionally C(sriov_drivers_autoprobe).
  - The count is only ever changed through 0 (write 0, then the new count), as the kernel requires,
    and each step is confirmed by reading back C(sriov_numvfs) and the C(virtfnN) links within O(timeout).
  - The PF must be bound to a driver that supports SR-IOV configuration; a count above C(sriov_totalvfs)
    is refused before anything is written.
  - Existing VFs are destroyed when the count changes. The module refuses that while a VF is bound to
    vfio-pci, has its VFIO group open, carries a vGPU or has mediated devices, unless O(force=true).
  - If setting the new count fails after the old VFs were removed, the old count is restored and both
    results are reported.
  - VFs are runtime state. With O(persistent=true) the PF and its count are recorded in
    C(/etc/gpuops/sriov-vfs.conf) and the oneshot unit C(gpuops-sriov-restore.service) sets the count again at
    boot (bounded retry while the PF's driver is not bound yet), before C(gpuops-mdev-restore.service).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  pf:
    description:
      - PCI address of the physical function, C(DDDD:BB:SS.F) (or C(BB:SS.F) for domain 0000).
    type: str
    required: true
    aliases: [address]
  count:
    description:
      - Number of VFs wanted. Required with O(state=present). V(0) disables SR-IOV.
      - Must not exceed the PF's C(sriov_totalvfs). A boolean is refused (it is not taken as 0 or 1).
    type: int
  state:
    description:
      - V(present) sets the VF count to O(count); V(absent) sets it to 0.
    type: str
    choices: [present, absent]
    default: present
  autoprobe:
    description:
      - Value for C(sriov_drivers_autoprobe), written before VFs are created. When V(false), new VFs are not
        bound to a driver automatically. Left unchanged when omitted.
    type: bool
  force:
    description:
      - Change the count even when VFs are in use (bound to vfio-pci, VFIO group open, vGPU or mdev present).
        The VMs using them lose their devices.
    type: bool
    default: false
  persistent:
    description:
      - Record the count so that it is set again at boot (see the description). Written only after the live
        change succeeded. With O(state=absent) (or O(count=0)) the PF's record is dropped, and the unit and its
        script are removed when no PF is left.
      - If writing the boot files fails, they are put back, the VF count (and C(sriov_drivers_autoprobe)) are
        set back to what they were, and the failure says so.
      - V(false) leaves the boot records as they are.
    type: bool
    default: false
  timeout:
    description:
      - Seconds to wait for each read-back of C(sriov_numvfs) and the VF links.
      - A whole number from V(0) to V(3600), checked before anything is changed.
    type: int
    default: 10
attributes:
  check_mode:
    description: Reports whether the count or autoprobe would change; writes nothing.
  diff_mode:
    support: full
    description: Shows C(sriov_numvfs) and C(sriov_drivers_autoprobe) before and after.
  idempotent:
    description: Nothing is written when the PF already has the requested count and autoprobe value.
extends_documentation_fragment:
  - gpuops.sandbox.attributes
notes:
  - Root privileges are needed to write to sysfs.
seealso:
  - module: gpuops.sandbox.mdev_create
"""

EXAMPLES = r"""
- name: Enable 4 VFs on a PF and keep them from binding to a host driver
  gpuops.sandbox.sriov_vfs:
    pf: "0000:3b:00.0"
    count: 4
    autoprobe: false

- name: Change to 8 VFs even though a VF is bound to vfio-pci
  gpuops.sandbox.sriov_vfs:
    pf: "0000:3b:00.0"
    count: 8
    force: true

- name: Disable SR-IOV on the PF
  gpuops.sandbox.sriov_vfs:
    pf: "0000:3b:00.0"
    state: absent
"""

RETURN = r"""
pf:
  description: Canonical PCI address of the physical function.
  returned: success
  type: str
  sample: "0000:3b:00.0"
numvfs:
  description: VF count after the run (the intended count in check mode).
  returned: success
  type: int
  sample: 4
previous_numvfs:
  description: VF count before the run.
  returned: success
  type: int
  sample: 0
totalvfs:
  description: The PF's C(sriov_totalvfs).
  returned: success
  type: int
  sample: 16
driver:
  description: Driver the PF is bound to, or null.
  returned: success
  type: str
  sample: nvidia
autoprobe:
  description: Value of C(sriov_drivers_autoprobe) after the run (intended value in check mode), or null if absent.
  returned: success
  type: bool
  sample: true
boot_files_changed:
  description: Boot files (definitions, restore script, unit, wants link) written or removed for O(persistent).
  returned: success
  type: list
  elements: str
  sample: ["/etc/gpuops/sriov-vfs.conf"]
vfs:
  description: PCI addresses of the VFs after the run, in VF index order (in check mode, those present now).
  returned: success
  type: list
  elements: str
  sample: ["0000:3b:00.4", "0000:3b:00.5", "0000:3b:00.6", "0000:3b:00.7"]
rollback:
  description: When a change failed after the VF count was touched, what was done to put it back.
  returned: failure during the change
  type: str
  sample: "sriov_numvfs of 0000:3b:00.0 set back to 0"
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    GpuopsError,
    check_timeout,
    create_module,
    run_module,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils import _persist, _sriov
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import MAX_WAIT, SysfsError

# The filesystem root the module works on; unit tests point it at a fake tree.
ROOT = "/"


def build_module():
    return create_module(
        AnsibleModule,
        argument_spec=dict(
            pf=dict(type="str", required=True, aliases=["address"]),
            count=dict(type="int"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            autoprobe=dict(type="bool"),
            force=dict(type="bool", default=False),
            timeout=dict(type="int", default=10),
            persistent=dict(type="bool", default=False),
        ),
        required_if=[("state", "present", ("count",))],
        supports_check_mode=True,
    )


def _diff_text(numvfs, autoprobe):
    text = "sriov_numvfs: %d\n" % numvfs
    if autoprobe is not None:
        text += "sriov_drivers_autoprobe: %d\n" % int(autoprobe)
    return text


def check_params(params):
    """Checks the argument spec cannot express (booleans are ints to it); raise SriovError, change nothing."""
    check_timeout(params["timeout"], 0, MAX_WAIT, _sriov.SriovError)
    if isinstance(params["count"], bool):
        raise _sriov.SriovError("count must be a whole number of VFs, got %r (a boolean); nothing was changed"
                                % (params["count"],))
    if params["state"] == "present" and params["count"] is None:
        raise _sriov.SriovError("count is required with state=present (got null)")


def run(module, root):
    """The body of :func:`main` for ``run_module``: returns the result dict or raises, never exits."""
    params = module.params
    check_params(params)
    count = 0 if params["state"] == "absent" else params["count"]
    state = _sriov.pf_state(params["pf"], root)
    changes = _sriov.plan(state, count, params["autoprobe"], params["force"], root)
    boot_files = {}
    if params["persistent"]:
        current_text = _persist.read_text(root, _sriov.DEFINITIONS_FILE)
        boot_files = _persist.changed_files(
            root, _sriov.persistence_wanted(current_text, state["pf"], count, params["autoprobe"]))
        link_needed = count and _persist.wants_link_missing(root, _sriov.WANTS_LINK, _sriov.UNIT_FILE)
        link_stale = not count and not parse_left(current_text, state["pf"]) and \
            os.path.lexists(_sriov.host_path(root, _sriov.WANTS_LINK))
        if link_needed or link_stale:
            boot_files[_sriov.WANTS_LINK] = _sriov.UNIT_FILE if link_needed else None
    changed = changes["numvfs"] is not None or changes["autoprobe"] is not None or bool(boot_files)
    new_autoprobe = state["autoprobe"] if changes["autoprobe"] is None else changes["autoprobe"]
    result = {
        "changed": changed,
        "pf": state["pf"],
        "numvfs": count,
        "previous_numvfs": state["numvfs"],
        "totalvfs": state["totalvfs"],
        "driver": state["driver"],
        "autoprobe": new_autoprobe,
        "vfs": state["vfs"],
        "boot_files_changed": sorted(boot_files),
    }
    if module._diff:
        result["diff"] = {
            "before_header": "%s sriov" % state["pf"], "after_header": "%s sriov" % state["pf"],
            "before": _diff_text(state["numvfs"], state["autoprobe"]),
            "after": _diff_text(count, new_autoprobe),
        }
    if module.check_mode or not changed:
        return result
    if changes["autoprobe"] is not None:
        _sriov.set_autoprobe(state, changes["autoprobe"])
    if changes["numvfs"] is not None:
        try:
            _sriov.set_numvfs(state, changes["numvfs"], params["timeout"])
        except _sriov.SriovError as exc:
            if changes["autoprobe"] is not None:
                exc.msg += "; " + _undo_autoprobe(state)
            raise
    result["vfs"] = _sriov.list_vfs(state["dir"])
    if boot_files:
        saved = _persist.snapshot(root, [path for path in boot_files if path != _sriov.WANTS_LINK])
        saved_link = _persist.read_link(root, _sriov.WANTS_LINK)
        try:
            write_boot_files(module, root, dict(boot_files))
        except Exception as exc:  # pylint: disable=broad-exception-caught
            # PersistError (any failed write) or a link error; anything else must not skip the rollback either.
            undone = _persist.restore(module, root, saved) + _persist.restore_link(root, _sriov.WANTS_LINK, saved_link)
            lines = ["boot files put back" if not undone else "putting the boot files back failed: %s"
                     % "; ".join(undone)]
            # autoprobe first, so the VFs made again are probed (or not) as they were before the run.
            if changes["autoprobe"] is not None:
                lines.append(_undo_autoprobe(state))
            if changes["numvfs"] is not None:
                lines.append(_sriov.undo_numvfs(state, params["timeout"]))
            reason = exc if isinstance(exc, (GpuopsError, IOError, OSError)) else "%s: %s" % (type(exc).__name__, exc)
            raise _sriov.SriovError("the VF count was set, but recording it for boot failed: %s; rolled back: %s"
                                    % (reason, "; ".join(lines)), rollback="; ".join(lines))
    return result


def _undo_autoprobe(state):
    """Put sriov_drivers_autoprobe back to its value before the run; return a line saying how it went."""
    try:
        _sriov.set_autoprobe(state, state["autoprobe"])
        return "sriov_drivers_autoprobe restored to %d" % int(state["autoprobe"])
    except (_sriov.SriovError, SysfsError) as exc:
        return "restoring sriov_drivers_autoprobe failed: %s" % exc.msg


def parse_left(current_text, pf):
    """Entries other than ``pf`` left in the definitions text."""
    return [other for other in _sriov.parse_definitions(current_text) if other != pf]


def write_boot_files(module, root, boot_files):
    link = boot_files.pop(_sriov.WANTS_LINK, False)
    _persist.apply_files(module, root, boot_files)
    if link:
        _persist.make_wants_link(root, _sriov.WANTS_LINK, _sriov.UNIT_FILE)
    elif link is None:
        _persist.remove_file(root, _sriov.WANTS_LINK)
    if _sriov.UNIT_FILE in boot_files:
        _persist.daemon_reload(module, root)


def main():
    run_module(build_module, run, ROOT)


if __name__ == "__main__":
    main()
