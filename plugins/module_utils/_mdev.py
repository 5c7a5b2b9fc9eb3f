# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private helpers for mediated devices (mdev) and NVIDIA vendor-specific vGPUs.

This file is private to the gpuops.sandbox collection: its interface may change at any time.

Two kernel interfaces are covered:

* the mdev bus: parents under ``/sys/class/mdev_bus``, types under
  ``<parent>/mdev_supported_types/<type-id>``, devices under ``/sys/bus/mdev/devices/<uuid>``;
* the NVIDIA vendor-specific interface (vGPU 17+, kernel >= 6.8): per SR-IOV VF,
  ``nvidia/creatable_vgpu_types`` (``ID : name`` lines) and ``nvidia/current_vgpu_type``.

Every function that touches the filesystem takes the root as an argument (default ``/``). Planning
functions only read; the apply functions write and read back. Errors are raised as MdevError (or
SysfsError from the shared helpers); only modules turn them into ``fail_json``.
"""

from __future__ import annotations

import os
import re
import uuid as uuidlib

from ansible_collections.gpuops.sandbox.plugins.module_utils import _module, _sriov, _sysfs
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import (
    MAX_WAIT,
    PCI_ADDRESS_RE,
    SHORT_PCI_ADDRESS_RE,
    SysfsError,
    bounded_seconds,
    host_path,
    link_name,
    normalize_pci_address,
    pci_device_dir,
    read_attr,
    write_attr,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError, error_text
from ansible_collections.gpuops.sandbox.plugins.module_utils._persist import restore_retry_end
from ansible_collections.gpuops.sandbox.plugins.module_utils._pci import (
    parse_creatable_vgpu_types,
    read_mdev_types,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._holders import vfio_holders

MDEV_BUS = "/sys/class/mdev_bus"
MDEV_DEVICES = "/sys/bus/mdev/devices"
PCI_DEVICES = "/sys/bus/pci/devices"

# \A and \Z (not ^ and $, which let a trailing newline through); [0-9], not \d, which takes any script's digits.
UUID_RE = re.compile(r"\A[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
PARENT_NAME_RE = re.compile(r"\A[A-Za-z0-9_.:+-]+\Z")
# vGPU type ids are small integers (1155); more digits than this is a mistake, not an id.
VGPU_ID_MAX_DIGITS = 9

# Fixed namespace for the UUIDs this collection derives: uuid5(NS, "<parent>/<type-id>/<index>").
UUID_NAMESPACE = uuidlib.UUID("6d1c8f5e-3b1a-5c52-9a0e-6f7a2d9b4c10")

BACKEND_MDEV = "mdev"
BACKEND_NVIDIA = "nvidia"

# Error kinds, so callers and tests can tell the failures apart without parsing text.
E_INPUT = "input"
E_PARENT = "missing_parent"
E_TYPE = "missing_type"
E_CAPACITY = "capacity"
E_CONFLICT = "conflict"
E_BUSY = "busy"
E_APPLY = "apply"


class MdevError(GpuopsError):
    """A request was refused, or a change could not be applied or confirmed.

    ``kind`` is one of the ``E_*`` constants. ``retryable`` marks conditions that may clear on their
    own (a parent or a type that has not appeared yet). ``kind`` and, when there are ``details`` (what a
    rollback did), ``rollback`` are result keys of the failure (``extra``).
    """

    def __init__(self, msg, kind=E_INPUT, retryable=False, **details):
        extra = {"kind": kind}
        if details:
            extra["rollback"] = details
        super().__init__(msg, **extra)
        self.msg = msg
        self.kind = kind
        self.retryable = retryable
        self.details = details


# --------------------------------------------------------------------------- input validation


def normalize_uuid(value):
    """Return the lower-case 36-character form of a UUID, or raise MdevError."""
    text = value.strip() if isinstance(value, str) else value
    if not isinstance(text, str) or not UUID_RE.fullmatch(text):
        raise MdevError(
            "UUID %r is not valid: the kernel wants exactly 36 characters, 8-4-4-4-12 hex digits "
            "(e.g. 4b20d080-1b54-4048-85b3-a6a62d165c01)" % (value,))
    return text.lower()


def normalize_parent(name):
    """Return a parent name: a PCI address in canonical form, or a non-PCI name kept verbatim.

    Non-PCI names (``mtty``) are case-sensitive and may not contain ``/`` or whitespace.
    """
    if not isinstance(name, str) or not name.strip():
        raise MdevError("parent %r is not valid: give a PCI address or an mdev parent name" % (name,))
    text = name.strip()
    if SHORT_PCI_ADDRESS_RE.fullmatch(text) or PCI_ADDRESS_RE.fullmatch(text):
        return normalize_pci_address(text)
    if text in (".", "..") or not PARENT_NAME_RE.fullmatch(text):
        raise MdevError(
            "parent %r is not valid: give a PCI address (DDDD:BB:SS.F) or the name of an entry of %s"
            % (name, MDEV_BUS))
    return text


def check_count(count):
    """Raise MdevError unless ``count`` is a positive integer."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise MdevError("count must be a positive integer, got %r" % (count,))
    return count


def shown(value, limit=40):
    """``repr(value)``, cut to ``limit`` characters with the full length said, for messages."""
    return _module.shown(value, limit)


def vgpu_type_id(spec):
    """The vGPU type id ``spec`` gives as a number (an int), or None when ``spec`` is not a number (a name).

    Raise MdevError, naming the value, for a number that is not a valid id: written with digits other than
    ASCII 0-9 (``int()`` would take them), longer than VGPU_ID_MAX_DIGITS digits (``int()`` of thousands of
    digits raises ValueError), or not greater than 0.
    """
    text = str(spec).strip()
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or not all(ch.isdigit() for ch in body):
        return None
    if not body.isascii():
        raise MdevError("vGPU type id %s is not valid: write type ids with the ASCII digits 0-9 (e.g. 1155)"
                        % shown(text))
    if len(body) > VGPU_ID_MAX_DIGITS:
        raise MdevError("vGPU type id %s is not valid: type ids have at most %d digits (e.g. 1155)"
                        % (shown(text), VGPU_ID_MAX_DIGITS))
    type_id = int(text)
    if type_id <= 0:
        raise MdevError("vGPU type id %s is not valid: type ids are integers greater than 0" % text)
    return type_id


def derive_uuid(parent, type_id, index):
    """Return the stable UUID this collection uses for the ``index``-th device of a type on a parent."""
    return str(uuidlib.uuid5(UUID_NAMESPACE, "%s/%s/%d" % (parent, type_id, index)))


# --------------------------------------------------------------------------- mdev bus: reading


def list_parents(root="/"):
    """Return the sorted names of the mdev parents (entries of /sys/class/mdev_bus)."""
    try:
        return sorted(os.listdir(host_path(root, MDEV_BUS)))
    except OSError:
        return []


def is_mdev_parent(parent, root="/"):
    return os.path.isdir(host_path(root, "%s/%s/mdev_supported_types" % (MDEV_BUS, parent)))


def parent_types(parent, root="/"):
    """Return ``{type_id: {"name", "available_instances", "device_api", "description"}}`` of a parent.

    Read by ``_pci.read_mdev_types``; here a missing text is ``""`` and an unknown instance count 0.
    """
    types = {}
    for mtype in read_mdev_types(host_path(root, "%s/%s" % (MDEV_BUS, parent))):
        types[mtype["id"]] = {
            "name": mtype["name"] or "",
            "available_instances": mtype["available_instances"] or 0,
            "device_api": mtype["device_api"] or "",
            "description": mtype["description"] or "",
        }
    return types


def _describe_types(types):
    if not types:
        return "none"
    return ", ".join("%s (%s)" % (tid, info["name"]) if info.get("name") else tid
                     for tid, info in sorted(types.items()))


def resolve_mdev_type(parent, spec, types):
    """Return the type id on ``parent`` matching ``spec`` (a type id or a type name)."""
    if spec in types:
        return spec
    by_name = sorted(tid for tid, info in types.items() if info["name"] == spec)
    if len(by_name) == 1:
        return by_name[0]
    if len(by_name) > 1:
        raise MdevError("type name %r is ambiguous on parent %s: it names %s; give the type id"
                        % (spec, parent, ", ".join(by_name)), kind=E_TYPE)
    raise MdevError("mdev type %r does not exist on parent %s; types there: %s"
                    % (spec, parent, _describe_types(types)), kind=E_TYPE, retryable=True)


def list_mdev_devices(root="/"):
    """Return ``{uuid: {"uuid", "parent", "type_id"}}`` for every live mediated device."""
    base = host_path(root, MDEV_DEVICES)
    devices = {}
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return devices
    for name in names:
        path = os.path.join(base, name)
        parent = os.path.basename(os.path.dirname(os.path.realpath(path)))
        devices[name.lower()] = {
            "uuid": name.lower(),
            "parent": parent,
            "type_id": link_name(os.path.join(path, "mdev_type")),
        }
    return devices


def mdev_holders(dev_uuid, root="/"):
    """Return ``[(pid, command)]`` holding the VFIO group or the iommufd cdev of a mediated device open."""
    return vfio_holders(host_path(root, "%s/%s" % (MDEV_DEVICES, dev_uuid)), root)


# --------------------------------------------------------------------------- vendor-specific vGPU: reading


def vf_dir(address, root="/"):
    return host_path(root, "%s/%s" % (PCI_DEVICES, address))


def has_vgpu_interface(address, root="/"):
    """True when a PCI function has the NVIDIA vendor-specific vGPU attributes."""
    return os.path.exists(os.path.join(vf_dir(address, root), "nvidia", "current_vgpu_type"))


def parse_vgpu_types(text):
    """Parse ``creatable_vgpu_types`` text into ``{id: name}`` (through ``_pci.parse_creatable_vgpu_types``)."""
    return dict((entry["id"], entry["name"]) for entry in parse_creatable_vgpu_types(text))


def creatable_vgpu_types(address, root="/"):
    return parse_vgpu_types(read_attr(os.path.join(vf_dir(address, root), "nvidia", "creatable_vgpu_types"),
                                      default=""))


def current_vgpu_type(address, root="/"):
    """Return the vGPU type id active on a VF (0 when none)."""
    text = read_attr(os.path.join(vf_dir(address, root), "nvidia", "current_vgpu_type"), default="0")
    match = re.match(r"\s*([0-9]{1,9})(?![0-9])", text)
    return int(match.group(1)) if match else 0


def _describe_vgpu_types(types):
    if not types:
        return "none"
    return ", ".join("%d (%s)" % (tid, name) for tid, name in sorted(types.items()))


# --------------------------------------------------------------------------- planning (read only)


def _entry(backend, parent, type_id, type_name, dev_uuid=None):
    return {"backend": backend, "parent": parent, "type_id": type_id, "type_name": type_name,
            "uuid": dev_uuid}


def _pf_functions(pf, root):
    """Return the normalized PF address and its function list (the PF itself first, then its VFs)."""
    pf_dir = pci_device_dir(pf, root)
    address = os.path.basename(pf_dir)
    return address, [address] + _sriov.list_vfs(pf_dir)


def detect_backend(request, root="/"):
    """Pick ``mdev`` or ``nvidia`` for a request whose ``backend`` is ``auto``."""
    if request.get("backend") in (BACKEND_MDEV, BACKEND_NVIDIA):
        return request["backend"]
    if request.get("pf"):
        try:
            _address, functions = _pf_functions(request["pf"], root)
        except SysfsError:
            return BACKEND_MDEV
        candidates = functions
    else:
        candidates = request.get("parents") or []
    if any(is_mdev_parent(c, root) for c in candidates):
        return BACKEND_MDEV
    if any(PCI_ADDRESS_RE.fullmatch(c) and has_vgpu_interface(c, root) for c in candidates):
        return BACKEND_NVIDIA
    return BACKEND_MDEV


def _missing_parent(parent, root, backend):
    if backend == BACKEND_NVIDIA:
        return MdevError("VF %s does not exist or has no NVIDIA vGPU interface (nvidia/current_vgpu_type)"
                         % parent, kind=E_PARENT, retryable=True)
    parents = list_parents(root)
    if parents:
        return MdevError("mdev parent %r does not exist (parent names are case-sensitive); existing parents: %s"
                         % (parent, ", ".join(parents)), kind=E_PARENT, retryable=True)
    return MdevError("mdev parent %r does not exist: this host has no mdev parents (%s is absent or empty); "
                     "is the vendor driver loaded and, for SR-IOV GPUs, are the VFs enabled?"
                     % (parent, MDEV_BUS), kind=E_PARENT, retryable=True)


def _targets(request, backend, root):
    """Return the list of parents/VFs a request is about (checked to exist)."""
    if request.get("pf"):
        address, functions = _pf_functions(request["pf"], root)
        if backend == BACKEND_NVIDIA:
            found = [f for f in functions[1:] if has_vgpu_interface(f, root)]
            what = "VFs with the NVIDIA vGPU interface (nvidia/current_vgpu_type)"
        else:
            found = [f for f in functions if is_mdev_parent(f, root)]
            what = "functions registered as mdev parents under %s" % MDEV_BUS
        if not found:
            raise MdevError("PF %s has no %s; enable its VFs first (sriov_vfs or sriov-manage)" % (address, what),
                            kind=E_PARENT, retryable=True)
        return found
    targets = []
    for parent in request["parents"]:
        ok = has_vgpu_interface(parent, root) if backend == BACKEND_NVIDIA else is_mdev_parent(parent, root)
        if not ok:
            raise _missing_parent(parent, root, backend)
        if parent not in targets:
            targets.append(parent)
    return targets


def _plan_mdev_present(request, targets, root):
    spec = request["type"]
    existing = list_mdev_devices(root)
    types = {p: parent_types(p, root) for p in targets}
    resolved = {p: resolve_mdev_type(p, spec, types[p]) for p in targets}
    plan = {"create": [], "keep": [], "remove": []}

    def name_of(parent):
        return types[parent][resolved[parent]]["name"]

    def mine(parent):
        return sorted(u for u, d in existing.items() if d["parent"] == parent and d["type_id"] == resolved[parent])

    def fresh_uuids(parent, how_many):
        out, index = [], 0
        while len(out) < how_many:
            candidate = derive_uuid(parent, resolved[parent], index)
            if candidate not in existing:
                out.append(candidate)
            index += 1
        return out

    if request.get("uuids"):
        parent = targets[0]
        wanted = []
        for dev_uuid in request["uuids"]:
            if dev_uuid in wanted:
                continue
            wanted.append(dev_uuid)
            live = existing.get(dev_uuid)
            if live is None:
                plan["create"].append(_entry(BACKEND_MDEV, parent, resolved[parent], name_of(parent), dev_uuid))
            elif live["parent"] == parent and live["type_id"] == resolved[parent]:
                plan["keep"].append(_entry(BACKEND_MDEV, parent, resolved[parent], name_of(parent), dev_uuid))
            else:
                raise MdevError("UUID %s is already active with another type: type %s on parent %s (wanted %s on %s)"
                                % (dev_uuid, live["type_id"], live["parent"], resolved[parent], parent),
                                kind=E_CONFLICT)
        avail = types[parent][resolved[parent]]["available_instances"]
        if len(plan["create"]) > avail:
            raise MdevError("not enough instances of type %s on parent %s: %d available, %d needed"
                            % (resolved[parent], parent, avail, len(plan["create"])), kind=E_CAPACITY)
        return plan

    count = request["count"]
    if request.get("pf"):
        have = [(p, u) for p in targets for u in mine(p)]
        for parent, dev_uuid in have[:count]:
            plan["keep"].append(_entry(BACKEND_MDEV, parent, resolved[parent], name_of(parent), dev_uuid))
        need = count - len(have)
        total_avail = 0
        for parent in targets:
            avail = types[parent][resolved[parent]]["available_instances"]
            total_avail += avail
            take = min(avail, max(need, 0))
            for dev_uuid in fresh_uuids(parent, take):
                plan["create"].append(_entry(BACKEND_MDEV, parent, resolved[parent], name_of(parent), dev_uuid))
            need -= take
        if need > 0:
            raise MdevError("not enough instances of type %s on the functions of PF %s: %d available, %d needed "
                            "(%d already exist, count %d)"
                            % (spec, request["pf"], total_avail, count - len(have), len(have), count),
                            kind=E_CAPACITY)
        return plan

    for parent in targets:
        have = mine(parent)
        for dev_uuid in have[:count]:
            plan["keep"].append(_entry(BACKEND_MDEV, parent, resolved[parent], name_of(parent), dev_uuid))
        need = count - len(have)
        if need <= 0:
            continue
        avail = types[parent][resolved[parent]]["available_instances"]
        if need > avail:
            raise MdevError("not enough instances of type %s (%s) on parent %s: %d available, %d needed "
                            "(%d already exist, count %d)"
                            % (resolved[parent], name_of(parent), parent, avail, need, len(have), count),
                            kind=E_CAPACITY)
        for dev_uuid in fresh_uuids(parent, need):
            plan["create"].append(_entry(BACKEND_MDEV, parent, resolved[parent], name_of(parent), dev_uuid))
    return plan


def _plan_mdev_absent(request, root):
    spec = request["type"]
    existing = list_mdev_devices(root)
    plan = {"create": [], "keep": [], "remove": []}
    if request.get("pf"):
        try:
            _address, functions = _pf_functions(request["pf"], root)
        except SysfsError:
            functions = []
        targets = [f for f in functions if is_mdev_parent(f, root)]
    else:
        targets = list(request["parents"])
    type_ids = {spec}
    for parent in targets:
        types = parent_types(parent, root)
        try:
            type_ids.add(resolve_mdev_type(parent, spec, types))
        except MdevError:
            continue
    names = {}
    for parent in targets:
        for tid, info in parent_types(parent, root).items():
            names[(parent, tid)] = info["name"]
    if request.get("uuids"):
        for dev_uuid in request["uuids"]:
            live = existing.get(dev_uuid)
            if live is None:
                continue
            if live["parent"] not in targets or live["type_id"] not in type_ids:
                raise MdevError("UUID %s is active with another type: type %s on parent %s; not removing it"
                                % (dev_uuid, live["type_id"], live["parent"]), kind=E_CONFLICT)
            plan["remove"].append(_entry(BACKEND_MDEV, live["parent"], live["type_id"],
                                         names.get((live["parent"], live["type_id"]), ""), dev_uuid))
    else:
        for dev_uuid, live in sorted(existing.items()):
            if live["parent"] in targets and live["type_id"] in type_ids:
                plan["remove"].append(_entry(BACKEND_MDEV, live["parent"], live["type_id"],
                                             names.get((live["parent"], live["type_id"]), ""), dev_uuid))
    busy = []
    for item in plan["remove"]:
        for pid, command in mdev_holders(item["uuid"], root):
            busy.append("%s is open by PID %d (%s)" % (item["uuid"], pid, command))
    if busy:
        raise MdevError("refusing to remove mediated devices in use: %s" % "; ".join(busy), kind=E_BUSY)
    plan["targets"] = targets
    plan["type_ids"] = sorted(type_ids)
    return plan


def _resolve_vgpu_type(spec, targets, root):
    """Return ``(type_id, name)`` for a vendor-specific vGPU type given by id or by name."""
    known = {}
    for vf in targets:
        known.update(creatable_vgpu_types(vf, root))
    text = str(spec).strip()
    type_id = vgpu_type_id(text)
    if type_id is not None:
        if type_id in known:
            return type_id, known[type_id]
        if any(current_vgpu_type(vf, root) == type_id for vf in targets):
            return type_id, ""
        raise MdevError("vGPU type %d is not creatable on %s; creatable types: %s"
                        % (type_id, ", ".join(targets), _describe_vgpu_types(known)), kind=E_TYPE, retryable=True)
    matches = sorted(tid for tid, name in known.items() if name == text)
    if len(matches) == 1:
        return matches[0], text
    raise MdevError("vGPU type %r is not creatable on %s; creatable types: %s"
                    % (text, ", ".join(targets), _describe_vgpu_types(known)), kind=E_TYPE, retryable=True)


def _plan_nvidia_present(request, targets, root):
    if request.get("uuids"):
        raise MdevError("uuids cannot be used with the NVIDIA vendor-specific interface: its vGPUs have no UUID")
    current = {vf: current_vgpu_type(vf, root) for vf in targets}
    text = str(request["type"]).strip()
    wanted = vgpu_type_id(text)
    if not request.get("pf") and wanted:
        for vf in targets:
            if current[vf] and current[vf] != wanted:
                raise MdevError("VF %s already carries vGPU type %d, not %s; remove it first (state=absent)"
                                % (vf, current[vf], text), kind=E_CONFLICT)
    type_id, name = _resolve_vgpu_type(request["type"], targets, root)
    plan = {"create": [], "keep": [], "remove": []}
    count = request["count"]
    if not request.get("pf"):
        if count != 1:
            raise MdevError("a VF holds at most one vGPU: count must be 1 when VFs are listed in parents "
                            "(got %d); list more VFs or use pf and count instead" % count)
        for vf in targets:
            if current[vf] == type_id:
                plan["keep"].append(_entry(BACKEND_NVIDIA, vf, type_id, name))
                continue
            if current[vf]:
                raise MdevError("VF %s already carries vGPU type %d, not %d; remove it first (state=absent)"
                                % (vf, current[vf], type_id), kind=E_CONFLICT)
            creatable = creatable_vgpu_types(vf, root)
            if type_id not in creatable:
                raise MdevError("vGPU type %d (%s) is not creatable on VF %s now; creatable there: %s"
                                % (type_id, name, vf, _describe_vgpu_types(creatable)), kind=E_CAPACITY)
            plan["create"].append(_entry(BACKEND_NVIDIA, vf, type_id, name))
        return plan
    have = [vf for vf in targets if current[vf] == type_id]
    for vf in have[:count]:
        plan["keep"].append(_entry(BACKEND_NVIDIA, vf, type_id, name))
    need = count - len(have)
    free = [vf for vf in targets if current[vf] == 0 and type_id in creatable_vgpu_types(vf, root)]
    if need > len(free):
        raise MdevError("not enough VFs of PF %s can take vGPU type %d (%s): %d available, %d needed "
                        "(%d already carry it, count %d)"
                        % (request["pf"], type_id, name, len(free), need, len(have), count), kind=E_CAPACITY)
    for vf in free[:max(need, 0)]:
        plan["create"].append(_entry(BACKEND_NVIDIA, vf, type_id, name))
    return plan


def _plan_nvidia_absent(request, root):
    if request.get("pf"):
        try:
            _address, functions = _pf_functions(request["pf"], root)
        except SysfsError:
            functions = []
        targets = [f for f in functions[1:] if has_vgpu_interface(f, root)]
    else:
        targets = [p for p in request["parents"] if has_vgpu_interface(p, root)]
    plan = {"create": [], "keep": [], "remove": [], "targets": targets if request.get("pf") else
            list(request["parents"])}
    text = str(request["type"]).strip()
    wanted = vgpu_type_id(text)
    if wanted is not None:
        type_id, name = wanted, ""
    else:
        try:
            type_id, name = _resolve_vgpu_type(text, targets, root) if targets else (None, "")
        except MdevError:
            type_id, name = None, ""
    plan["type_ids"] = [] if type_id is None else [type_id]
    if type_id is None:
        return plan
    busy = []
    for vf in targets:
        if current_vgpu_type(vf, root) == type_id:
            for pid, command in vfio_holders(vf_dir(vf, root), root):
                busy.append("%s is open by PID %d (%s)" % (vf, pid, command))
            plan["remove"].append(_entry(BACKEND_NVIDIA, vf, type_id, name))
    if busy:
        raise MdevError("refusing to remove vGPUs in use: %s" % "; ".join(busy), kind=E_BUSY)
    return plan


def build_plan(request, root="/"):
    """Validate a request against the host and return the plan; never writes.

    ``request`` keys: type, state, parents (normalized list) or pf, count (int), uuids (normalized
    list or None), backend (auto|mdev|nvidia). The plan has ``backend``, ``create``, ``keep``,
    ``remove`` (lists of entries: backend, parent, type_id, type_name, uuid), ``targets`` and
    ``type_ids`` (what persistent definitions to match).
    """
    backend = detect_backend(request, root)
    if request["state"] == "absent":
        plan = _plan_nvidia_absent(request, root) if backend == BACKEND_NVIDIA else _plan_mdev_absent(request, root)
    else:
        if request.get("uuids") and (request.get("pf") or len(request.get("parents") or []) != 1):
            raise MdevError("uuids needs exactly one parent (got %s)"
                            % ("pf" if request.get("pf") else "%d parents" % len(request.get("parents") or [])))
        targets = _targets(request, backend, root)
        if backend == BACKEND_NVIDIA:
            plan = _plan_nvidia_present(request, targets, root)
        else:
            plan = _plan_mdev_present(request, targets, root)
        plan["targets"] = targets
        plan["type_ids"] = sorted({e["type_id"] for e in plan["create"] + plan["keep"]}, key=str)
    plan["backend"] = backend
    return plan


def build_plan_waiting(request, root="/", timeout=0):
    """build_plan, retried for up to ``timeout`` seconds (clamped to 0..MAX_WAIT) while a parent or a type is
    missing."""
    deadline = _sysfs._monotonic() + bounded_seconds(timeout, MAX_WAIT)
    while True:
        try:
            return build_plan(request, root)
        except (MdevError, SysfsError) as exc:
            retryable = getattr(exc, "retryable", False)
            if not retryable:
                raise
            if _sysfs._monotonic() >= deadline:
                if timeout:
                    exc.msg = "%s (waited %ss)" % (exc.msg, timeout)
                    exc.args = (exc.msg,)
                raise
        _sysfs._sleep(_sysfs.POLL_INTERVAL)


# --------------------------------------------------------------------------- applying (writes + read-back)


def create_entry(entry, root="/", timeout=5):
    """Create one device (mdev or vendor-specific vGPU) and confirm it by reading back."""
    if entry["backend"] == BACKEND_NVIDIA:
        path = os.path.join(vf_dir(entry["parent"], root), "nvidia", "current_vgpu_type")
        write_attr(path, str(entry["type_id"]))
        if not _sysfs.wait_until(lambda: current_vgpu_type(entry["parent"], root) == entry["type_id"], timeout):
            got = current_vgpu_type(entry["parent"], root)
            if got == entry["type_id"]:
                return
            raise MdevError("wrote vGPU type %d to %s but current_vgpu_type reads %d"
                            % (entry["type_id"], entry["parent"], got), kind=E_APPLY)
        return
    create = host_path(root, "%s/%s/mdev_supported_types/%s/create" % (MDEV_BUS, entry["parent"], entry["type_id"]))
    write_attr(create, entry["uuid"])
    dev = host_path(root, "%s/%s" % (MDEV_DEVICES, entry["uuid"]))

    def confirmed():
        return os.path.exists(dev) and link_name(os.path.join(dev, "mdev_type")) == entry["type_id"]

    if not _sysfs.wait_until(confirmed, timeout):
        found = link_name(os.path.join(dev, "mdev_type")) if os.path.exists(dev) else None
        if os.path.exists(dev):
            try:
                write_attr(os.path.join(dev, "remove"), "1")
            except SysfsError:
                pass
        raise MdevError("wrote %s to %s but %s/%s %s"
                        % (entry["uuid"], create, MDEV_DEVICES, entry["uuid"],
                           "has type %s" % found if found else "did not appear"), kind=E_APPLY)


def remove_entry(entry, root="/", timeout=5):
    """Remove one device and confirm it is gone."""
    if entry["backend"] == BACKEND_NVIDIA:
        path = os.path.join(vf_dir(entry["parent"], root), "nvidia", "current_vgpu_type")
        write_attr(path, "0")
        if not _sysfs.wait_until(lambda: current_vgpu_type(entry["parent"], root) == 0, timeout):
            raise MdevError("wrote 0 to %s but current_vgpu_type still reads %d"
                            % (path, current_vgpu_type(entry["parent"], root)), kind=E_APPLY)
        return
    dev = host_path(root, "%s/%s" % (MDEV_DEVICES, entry["uuid"]))
    write_attr(os.path.join(dev, "remove"), "1")
    if not _sysfs.wait_until(lambda: not os.path.exists(dev), timeout):
        raise MdevError("wrote 1 to %s/%s/remove but the device is still there" % (MDEV_DEVICES, entry["uuid"]),
                        kind=E_APPLY)


def describe_entry(entry):
    if entry["backend"] == BACKEND_NVIDIA:
        return "vGPU type %s on %s" % (entry["type_id"], entry["parent"])
    return "%s (type %s on %s)" % (entry["uuid"], entry["type_id"], entry["parent"])


def undo(done, root="/", timeout=5):
    """Undo the ``(action, entry)`` changes of ``done`` in reverse order, carrying on past errors.

    Returns ``(rolled_back, rollback_errors)``: descriptions of the entries put back, and of the failures.
    """
    rolled_back, rollback_errors = [], []
    for action, entry in reversed(done):
        try:
            if action == "created":
                remove_entry(entry, root, timeout)
            else:
                create_entry(entry, root, timeout)
            rolled_back.append(describe_entry(entry))
        except Exception as rexc:  # pylint: disable=broad-exception-caught
            rollback_errors.append("%s: %s" % (describe_entry(entry), error_text(rexc)))
    return rolled_back, rollback_errors


def describe_undo(done, rolled_back, rollback_errors):
    """The sentence that ends a failure message: what the rollback did."""
    if not done:
        return "nothing had been changed"
    text = "rolled back %d change(s) of this run" % len(rolled_back)
    if rollback_errors:
        text += "; rollback errors: %s" % "; ".join(rollback_errors)
    return text


def apply_plan(plan, root="/", timeout=5):
    """Remove then create the plan's devices. On failure undo this run's changes in reverse order.

    Raises MdevError(kind=E_APPLY) whose ``details`` hold ``done`` (what was applied before the
    failure), ``rolled_back`` and ``rollback_errors``. Returns the list of ``(action, entry)`` done.
    Any exception counts as a failure (a bug must not leave half the devices made).
    """
    done = []
    try:
        for entry in plan["remove"]:
            remove_entry(entry, root, timeout)
            done.append(("removed", entry))
        for entry in plan["create"]:
            create_entry(entry, root, timeout)
            done.append(("created", entry))
    except Exception as exc:  # pylint: disable=broad-exception-caught
        rolled_back, rollback_errors = undo(done, root, timeout)
        msg = "%s; %s" % (error_text(exc), describe_undo(done, rolled_back, rollback_errors))
        raise MdevError(msg, kind=E_APPLY, done=[describe_entry(e) for _a, e in done],
                        rolled_back=rolled_back, rollback_errors=rollback_errors)
    return done


# --------------------------------------------------------------------------- persistent definitions

DEFINITIONS_FILE = "/etc/gpuops/mdev-devices.conf"
RESTORE_SCRIPT = "/usr/local/libexec/gpuops-mdev-restore"
UNIT_NAME = "gpuops-mdev-restore.service"
UNIT_FILE = "/etc/systemd/system/" + UNIT_NAME
WANTS_LINK = "/etc/systemd/system/multi-user.target.wants/" + UNIT_NAME

DEFINITIONS_HEADER = (
    "# Managed by gpuops.sandbox.mdev_create; re-applied at boot by %s.\n"
    "# mdev <parent> <type-id> <uuid>   mediated device on the mdev bus\n"
    "# vgpu <vf-address> <type-id>      NVIDIA vendor-specific vGPU (current_vgpu_type)\n" % UNIT_NAME)


def parse_definitions(text):
    """Return the sorted list of ``(kind, parent, type_id, uuid)`` tuples of a definitions file."""
    entries = set()
    for line in (text or "").splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0] == "mdev" and len(fields) == 4:
            entries.add(("mdev", fields[1], fields[2], fields[3].lower()))
        elif fields[0] == "vgpu" and len(fields) == 3:
            entries.add(("vgpu", fields[1], fields[2], ""))
    return sorted(entries)


def render_definitions(entries):
    lines = [DEFINITIONS_HEADER]
    for kind, parent, type_id, dev_uuid in sorted(set(entries)):
        lines.append(("%s %s %s %s" % (kind, parent, type_id, dev_uuid)).rstrip() + "\n")
    return "".join(lines)


def read_definitions(root="/"):
    path = host_path(root, DEFINITIONS_FILE)
    try:
        with open(path, "r") as handle:
            return parse_definitions(handle.read())
    except (IOError, OSError):
        return []


def definition_of(entry):
    if entry["backend"] == BACKEND_NVIDIA:
        return ("vgpu", entry["parent"], str(entry["type_id"]), "")
    return ("mdev", entry["parent"], str(entry["type_id"]), entry["uuid"])


def desired_definitions(plan, request, current):
    """Return the definitions list after this run (``current`` is the list read from the file)."""
    result = set(current)
    if request["state"] == "present":
        result.update(definition_of(e) for e in plan["keep"] + plan["create"])
        return sorted(result)
    kind = "vgpu" if plan["backend"] == BACKEND_NVIDIA else "mdev"
    targets = set(plan.get("targets") or [])
    type_ids = {str(t) for t in plan.get("type_ids") or []}
    uuids = set(request.get("uuids") or [])
    for item in list(result):
        if item[0] != kind or item[1] not in targets or item[2] not in type_ids:
            continue
        if uuids and item[3] not in uuids:
            continue
        result.discard(item)
    result.difference_update(definition_of(e) for e in plan["remove"])
    return sorted(result)


RESTORE_SCRIPT_TEXT = r"""#!/bin/sh
# Managed by gpuops.sandbox.mdev_create; re-run the module instead of editing this file.
# Re-creates the mediated devices and NVIDIA vendor-specific vGPUs listed in the definitions file.
# Parents and types that appear late (nvidia-vgpud, sriov-manage, VF creation) are retried every
# 2 seconds, at most GPUOPS_MDEV_TRIES times; then the service fails and names what is missing.
conf="${1:-/etc/gpuops/mdev-devices.conf}"
tries="${GPUOPS_MDEV_TRIES:-90}"
sys="${GPUOPS_SYSFS:-/sys}"
[ -r "$conf" ] || exit 0

# Returns 0 when the definition is live, 1 when its parent or type is not there yet, 2 on error.
ensure() {
    kind=$1 parent=$2 type=$3 uuid=$4
    case "$kind" in
    mdev)
        dev="$sys/bus/mdev/devices/$uuid"
        if [ -e "$dev" ]; then
            [ "$(basename "$(readlink "$dev/mdev_type")")" = "$type" ] && return 0
            echo "mdev $uuid exists with another type" >&2
            return 2
        fi
        create="$sys/class/mdev_bus/$parent/mdev_supported_types/$type/create"
        [ -e "$create" ] || return 1
        echo "$uuid" > "$create" || return 2
        [ -e "$dev" ] || return 2
        ;;
    vgpu)
        cur="$sys/bus/pci/devices/$parent/nvidia/current_vgpu_type"
        [ -e "$cur" ] || return 1
        now=$(cat "$cur")
        [ "$now" = "$type" ] && return 0
        if [ "$now" != "0" ]; then
            echo "$parent carries vGPU type $now, wanted $type" >&2
            return 2
        fi
        grep -Eq "^[[:space:]]*$type[[:space:]]*:" "$sys/bus/pci/devices/$parent/nvidia/creatable_vgpu_types" || return 1
        echo "$type" > "$cur" || return 2
        [ "$(cat "$cur")" = "$type" ] || return 2
        ;;
    *)
        return 2
        ;;
    esac
    return 0
}

status=0
attempt=0
pending=$(grep -E '^(mdev|vgpu)[[:space:]]' "$conf")
while [ -n "$pending" ]; do
    attempt=$((attempt + 1))
    retry=""
    while read -r kind parent type uuid; do
        ensure "$kind" "$parent" "$type" "$uuid"
        case $? in
        0) echo "ok: $kind $parent $type $uuid" ;;
        1) retry="$retry$kind $parent $type $uuid
" ;;
        *) echo "failed: $kind $parent $type $uuid" >&2; status=1 ;;
        esac
    done <<EOF
$pending
EOF
""" + restore_retry_end("parent or type still missing for")

UNIT_TEXT = """[Unit]
Description=Re-create mediated devices and vGPUs defined by gpuops.sandbox
ConditionPathExists=%(conf)s
After=systemd-modules-load.service systemd-udev-settle.service nvidia-vgpud.service nvidia-vgpu-mgr.service
Before=libvirtd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh %(script)s %(conf)s
TimeoutStartSec=300

[Install]
WantedBy=multi-user.target
""" % {"conf": DEFINITIONS_FILE, "script": RESTORE_SCRIPT}
