#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: mdev_create
short_description: Create and remove mediated devices and NVIDIA vendor-specific vGPUs
version_added: 1.0.0
description:
  - Creates or removes mediated devices (mdev) of one type on one or more parents, for example
    C(nvidia-692) (C(NVIDIA A100-4C)) on the SR-IOV VFs of an A100, or C(mtty-1) on the kernel's
    C(mtty) sample parent.
  - Device UUIDs are stable. Unless O(uuids) is given, the UUID of the N-th device of a type on a parent
    is derived with uuid5 from a fixed namespace, the parent, the type id and N, so re-runs find the same
    devices. Devices of the requested type that already exist on a parent (whatever their UUID) are adopted
    and count towards O(count).
  - On hosts with the NVIDIA vendor-specific vGPU interface (vGPU 17 and later, kernel 6.8 and later,
    Ada/Hopper/Blackwell GPUs) there is no C(/sys/class/mdev_bus). The module detects that and writes the
    type id to C(nvidia/current_vgpu_type) of free SR-IOV VFs instead. VFs are never bound to vfio-pci.
  - The whole request is validated before anything is created or removed. If a later step fails, the
    changes made by this run are undone in reverse order and the error reports both the failure and the
    rollback result.
  - Every write is confirmed by reading back C(/sys/bus/mdev/devices/<uuid>) and its C(mdev_type) link, or
    C(current_vgpu_type).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  type:
    description:
      - The mdev type, by id (C(nvidia-692), C(mtty-2)) or by name (C(NVIDIA A100-4C), C(Dual port serial)).
      - For the vendor-specific interface, the numeric vGPU type id (an integer greater than 0 listed in the
        VF's C(creatable_vgpu_types), in the ASCII digits 0-9, at most 9 digits) or its name (C(NVIDIA L40S-8Q)).
      - At most 200 characters.
    type: str
    required: true
  parents:
    description:
      - Parent devices, as PCI addresses (C(0000:3b:00.4)) or names of entries of C(/sys/class/mdev_bus)
        such as C(mtty). Non-PCI names are case-sensitive.
      - With the vendor-specific interface, the VF addresses to give the type to (one vGPU per VF).
      - O(count) devices are ensured on B(each) parent.
    type: list
    elements: str
    aliases: [parent]
  pf:
    description:
      - PCI address of an SR-IOV physical function. Its functions that are mdev parents (its VFs, or the
        PF itself on GPUs before Ampere), or its VFs with the vendor-specific interface, are the parents.
      - O(count) is then the B(total) number of devices across those functions, filled in VF order.
    type: str
  count:
    description:
      - Number of devices of the type to ensure (per parent with O(parents), in total with O(pf)).
      - Must be a positive integer (a boolean is refused). Defaults to V(1) when O(uuids) is not given.
      - Existing devices beyond the count are left alone. Ignored with O(state=absent).
    type: int
  uuids:
    description:
      - Explicit UUIDs (36 characters) for the devices, instead of derived ones. Needs exactly one parent.
      - With O(state=absent), only these UUIDs are removed.
      - Not available with the vendor-specific interface, whose vGPUs have no UUID.
    type: list
    elements: str
  state:
    description:
      - V(present) creates the missing devices; V(absent) removes every device of the type on the parents
        (or only the given O(uuids)) together with their persistent definitions.
    type: str
    choices: [present, absent]
    default: present
  persistent:
    description:
      - Record the devices so that they are re-created at boot (see notes). Written only after the live
        change succeeded; with O(state=absent) the matching definitions are dropped.
      - If writing them fails, the files are put back and the devices created or removed by this run are
        removed or re-created, and the failure says so.
    type: bool
    default: true
  backend:
    description:
      - V(auto) uses the vendor-specific interface when none of the parents is an mdev parent and they have
        C(nvidia/current_vgpu_type); otherwise the mdev bus.
    type: str
    choices: [auto, mdev, nvidia]
    default: auto
  timeout:
    description:
      - Seconds to wait for parents and types that appear late (after C(nvidia-vgpud) or C(sriov-manage)
        ran, or after VFs were enabled) before failing. Also bounds each read-back.
      - A whole number from V(0) to V(3600), checked before anything is changed.
    type: int
    default: 10
attributes:
  check_mode:
    description: Reports the devices that would be created or removed; writes nothing.
  diff_mode:
    support: full
    description: Shows the devices and persistent definitions before and after.
  idempotent:
    description: A second run with the same arguments finds the devices (stable UUIDs) and changes nothing.
extends_documentation_fragment:
  - gpuops.sandbox.attributes
notes:
  - "Persistence: the module keeps its own definitions file C(/etc/gpuops/mdev-devices.conf) (lines
    C(mdev <parent> <type-id> <uuid>) and C(vgpu <vf> <type-id>)), a small POSIX shell script
    C(/usr/local/libexec/gpuops-mdev-restore) and a systemd oneshot unit C(gpuops-mdev-restore.service)
    enabled for C(multi-user.target). At boot the script re-creates each definition, retrying every
    2 seconds for up to 3 minutes while a parent or type is not there yet, then fails naming what is missing."
  - "Why not mdevctl's C(/etc/mdevctl.d/<parent>/<uuid>) JSON: mdevctl cannot express the vendor-specific
    vGPUs (no mdev bus, no UUID), which need this mechanism anyway; one mechanism for both interfaces means
    one file to inspect and one unit to debug; it works on hosts without the mdevctl package; and its bounded
    retry covers types that appear well after the parent (nvidia-vgpud), which a udev-triggered start can
    miss. A device also defined by mdevctl is harmless: the script accepts a device that already exists
    with the right type."
  - Parent names are case-sensitive; PCI addresses are normalised to lower case.
  - Devices open by a process (a VM holding the VFIO group) are never removed; the module fails naming them.
  - Root privileges are needed to write to sysfs and C(/etc).
seealso:
  - module: gpuops.sandbox.sriov_vfs
"""

EXAMPLES = r"""
- name: Two single-port serial devices on the mtty sample parent
  gpuops.sandbox.mdev_create:
    type: mtty-1
    parents: [mtty]
    count: 2

- name: The same type given by name, with explicit UUIDs and no boot persistence
  gpuops.sandbox.mdev_create:
    type: Single port serial
    parent: mtty
    uuids:
      - 4b20d080-1b54-4048-85b3-a6a62d165c01
    persistent: false

- name: Four NVIDIA A100-4C vGPUs spread over the VFs of an A100 (one mdev parent per VF)
  gpuops.sandbox.mdev_create:
    type: NVIDIA A100-4C
    pf: "0000:3b:00.0"
    count: 4
    timeout: 60

- name: Three L40S-8Q vGPUs through the vendor-specific interface (detected automatically)
  gpuops.sandbox.mdev_create:
    type: NVIDIA L40S-8Q
    pf: "0000:c1:00.0"
    count: 3

- name: Remove every mtty-1 device from the mtty parent, and its boot definitions
  gpuops.sandbox.mdev_create:
    type: mtty-1
    parents: [mtty]
    state: absent
"""

RETURN = r"""
backend:
  description: Interface used, V(mdev) (mdev bus) or V(nvidia) (vendor-specific C(current_vgpu_type)).
  returned: success
  type: str
  sample: mdev
devices:
  description:
    - With O(state=present), the devices that satisfy the request (adopted and created).
    - C(uuid) is null for vendor-specific vGPUs.
  returned: success
  type: list
  elements: dict
  sample: &mtty_device
    - {"uuid": "9a6b1b2a-58b6-5c55-8d4b-3b5d1d3c6f10", "parent": "mtty", "type_id": "mtty-1",
       "type_name": "Single port serial", "backend": "mdev"}
created:
  description: Devices created by this run (would be created, in check mode).
  returned: success
  type: list
  elements: dict
  sample: *mtty_device
removed:
  description: Devices removed by this run (would be removed, in check mode).
  returned: success
  type: list
  elements: dict
  sample:
    - {"uuid": null, "parent": "0000:c1:00.4", "type_id": 1155, "type_name": "NVIDIA L40S-8Q", "backend": "nvidia"}
definitions_file:
  description: Path of the persistent definitions file.
  returned: success
  type: str
  sample: /etc/gpuops/mdev-devices.conf
definitions_changed:
  description: Whether the persistent definitions or the boot unit were (or would be) changed.
  returned: success
  type: bool
  sample: true
rollback:
  description: On a failed apply, the changes undone and any rollback errors.
  returned: failure during apply
  type: dict
  sample: {"done": ["4b20d080-1b54-4048-85b3-a6a62d165c01 (type mtty-1 on mtty)"],
           "rolled_back": ["4b20d080-1b54-4048-85b3-a6a62d165c01 (type mtty-1 on mtty)"], "rollback_errors": []}
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    GpuopsError,
    check_timeout,
    create_module,
    run_module,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils import _mdev, _persist
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import MAX_WAIT, SysfsError

# The filesystem root the module works on; unit tests point it at a fake tree.
ROOT = "/"

# Longest type (id or name) accepted; real ones are a few dozen characters (nvidia-692, NVIDIA A100-4C).
MAX_TYPE_LENGTH = 200


def build_module():
    return create_module(
        AnsibleModule,
        argument_spec=dict(
            type=dict(type="str", required=True),
            parents=dict(type="list", elements="str", aliases=["parent"]),
            pf=dict(type="str"),
            count=dict(type="int"),
            uuids=dict(type="list", elements="str"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            persistent=dict(type="bool", default=True),
            backend=dict(type="str", choices=["auto", "mdev", "nvidia"], default="auto"),
            timeout=dict(type="int", default=10),
        ),
        mutually_exclusive=[("parents", "pf"), ("uuids", "count"), ("uuids", "pf")],
        required_one_of=[("parents", "pf")],
        supports_check_mode=True,
    )


def build_request(params):
    """Validate and normalise the module parameters into a request for _mdev.build_plan (before any change)."""
    if not params["type"] or not params["type"].strip():
        raise _mdev.MdevError("type must not be empty")
    if len(params["type"]) > MAX_TYPE_LENGTH:
        raise _mdev.MdevError("type %s is not valid: mdev type ids and names have at most %d characters"
                              % (_mdev.shown(params["type"]), MAX_TYPE_LENGTH))
    check_timeout(params["timeout"], 0, MAX_WAIT, _mdev.MdevError)
    # A numeric vGPU type id is checked here too (ASCII digits, sane length), whatever the backend.
    _mdev.vgpu_type_id(params["type"])
    request = {
        "type": params["type"].strip(),
        "state": params["state"],
        "backend": params["backend"],
        "pf": None,
        "parents": None,
        "uuids": None,
        "count": 1,
    }
    if params["count"] is not None:
        request["count"] = _mdev.check_count(params["count"])
    if params["pf"] is not None:
        request["pf"] = _mdev.normalize_pci_address(params["pf"])
    else:
        if not params["parents"]:
            raise _mdev.MdevError("parents must list at least one parent")
        request["parents"] = [_mdev.normalize_parent(p) for p in params["parents"]]
    if params["uuids"] is not None:
        if not params["uuids"]:
            raise _mdev.MdevError("uuids must not be an empty list")
        request["uuids"] = [_mdev.normalize_uuid(u) for u in params["uuids"]]
        request["count"] = len(set(request["uuids"]))
    return request


def _public(entry):
    return {k: entry[k] for k in ("uuid", "parent", "type_id", "type_name", "backend")}


def _device_lines(entries):
    return "".join("%s\n" % _mdev.describe_entry(e) for e in entries)


def persistence_changes(root, definitions_text):
    """Return ``{path: new_text}`` of the files to write and whether the wants link must be made."""
    files = {}
    for path, text in ((_mdev.DEFINITIONS_FILE, definitions_text),
                       (_mdev.RESTORE_SCRIPT, _mdev.RESTORE_SCRIPT_TEXT),
                       (_mdev.UNIT_FILE, _mdev.UNIT_TEXT)):
        if _persist.read_text(root, path) != text:
            files[path] = text
    return files, _persist.wants_link_missing(root, _mdev.WANTS_LINK, _mdev.UNIT_FILE)


def apply_persistence(module, root, files, need_link):
    for path in (_mdev.RESTORE_SCRIPT, _mdev.UNIT_FILE, _mdev.DEFINITIONS_FILE):
        if path in files:
            _persist.write_text(module, root, path, files[path])
    if need_link:
        _persist.make_wants_link(root, _mdev.WANTS_LINK, _mdev.UNIT_FILE)
    if _mdev.UNIT_FILE in files:
        _persist.daemon_reload(module, root)


def run(module, root):
    """Plan, check, apply (unless check mode) and return the result dict; raises MdevError/SysfsError."""
    params = module.params
    request = build_request(params)
    timeout = params["timeout"] if params["state"] == "present" else 0
    plan = _mdev.build_plan_waiting(request, root, timeout)

    current_defs = _mdev.read_definitions(root)
    files, need_link = {}, False
    if params["persistent"]:
        new_defs = _mdev.desired_definitions(plan, request, current_defs)
        if params["state"] == "present" or new_defs != current_defs:
            files, need_link = persistence_changes(root, _mdev.render_definitions(new_defs))
        if params["state"] == "absent":
            files = {k: v for k, v in files.items() if k == _mdev.DEFINITIONS_FILE}
            need_link = False
    definitions_changed = bool(files) or need_link
    changed = bool(plan["create"] or plan["remove"]) or definitions_changed

    result = {
        "changed": changed,
        "backend": plan["backend"],
        "devices": [_public(e) for e in plan["keep"] + plan["create"]] if params["state"] == "present" else [],
        "created": [_public(e) for e in plan["create"]],
        "removed": [_public(e) for e in plan["remove"]],
        "definitions_file": _mdev.DEFINITIONS_FILE,
        "definitions_changed": definitions_changed,
    }
    if module._diff:
        before_devices = plan["keep"] + plan["remove"]
        after_devices = plan["keep"] + plan["create"]
        old_text = _persist.read_text(root, _mdev.DEFINITIONS_FILE) or ""
        result["diff"] = [
            {"before_header": "devices", "after_header": "devices",
             "before": _device_lines(before_devices), "after": _device_lines(after_devices)},
            {"before_header": _mdev.DEFINITIONS_FILE, "after_header": _mdev.DEFINITIONS_FILE,
             "before": old_text, "after": files.get(_mdev.DEFINITIONS_FILE, old_text)},
        ]
    if module.check_mode or not changed:
        return result

    timeout = max(params["timeout"], 1)
    done = _mdev.apply_plan(plan, root, timeout)
    if files or need_link:
        saved = _persist.snapshot(root, list(files))
        saved_link = _persist.read_link(root, _mdev.WANTS_LINK)
        try:
            apply_persistence(module, root, files, need_link)
        except Exception as exc:  # pylint: disable=broad-exception-caught
            # PersistError (any failed write) or a link error; anything else must not skip the rollback either.
            file_errors = _persist.restore(module, root, saved)
            file_errors += _persist.restore_link(root, _mdev.WANTS_LINK, saved_link)
            rolled_back, rollback_errors = _mdev.undo(done, root, timeout)
            files_line = ("boot files put back" if not file_errors else
                          "putting the boot files back failed: %s" % "; ".join(file_errors))
            devices_line = _mdev.describe_undo(done, rolled_back, rollback_errors)
            rollback_errors += ["boot files: %s" % e for e in file_errors]
            reason = exc if isinstance(exc, (GpuopsError, IOError, OSError)) else "%s: %s" % (type(exc).__name__, exc)
            raise _mdev.MdevError(
                "the devices were changed, but writing the boot definitions failed: %s; %s; %s"
                % (reason, files_line, devices_line),
                kind=_mdev.E_APPLY, done=[_mdev.describe_entry(e) for _a, e in done], rolled_back=rolled_back,
                rollback_errors=rollback_errors)
    return result


def body(module, root):
    """``run``, with the errors of the shared sysfs helpers given the ``kind`` of mdev's own."""
    try:
        return run(module, root)
    except _mdev.MdevError:
        raise
    except SysfsError as exc:
        raise _mdev.MdevError(exc.msg, kind=_mdev.E_INPUT)
    except (IOError, OSError) as exc:
        raise _mdev.MdevError("unexpected filesystem error: %s" % exc, kind=_mdev.E_APPLY)


def main():
    run_module(build_module, body, ROOT)


if __name__ == "__main__":
    main()
