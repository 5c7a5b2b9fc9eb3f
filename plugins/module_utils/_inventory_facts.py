# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The GPU facts an inventory gives in place of gpu_facts, checked against the shape gpu_facts returns.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
A node whose host another tool prepares (``gpuops_host_managed: false``) is never read: its ``gpu_facts_gpus``,
``gpu_facts_host`` and ``gpu_facts_mdev_parents`` come from the inventory, written by hand or by another tool.
:func:`check_facts` takes them where they enter (the play's first task for such a host, and the cluster filters
that read every GPU host's variables) and returns them in gpu_facts' shape, or one sentence per problem naming the
host, the key, the value and what is accepted. A number YAML made of an ID is taken as the ID it shows where that
is unambiguous (``device: 2236`` is ``"2236"``); anything else is refused, so that no fact of the wrong type reaches
the code that reads it. Keys gpu_facts does not return are kept as they are. What gpu_facts itself returns passes
unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError

FACT_KEYS = ("gpu_facts_gpus", "gpu_facts_host", "gpu_facts_mdev_parents")
REQUIRED_GPU_KEYS = ("address", "vendor", "device")

_ADDRESS_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_ID_RE = re.compile(r"^(0[xX])?[0-9a-fA-F]{4}$")
_CLASS_RE = re.compile(r"^(0[xX])?[0-9a-fA-F]{6}$")
_DRIVER_SOURCES = ("host", "operator", "other")


class _Bad(GpuopsError):
    """A value that is not of gpu_facts' shape: ``accepted`` says what would be (never leaves this file)."""

    def __init__(self, accepted):
        super().__init__(accepted)
        self.accepted = accepted


def shown(value):
    """``value`` as the user could write it (JSON), for messages."""
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _plain(value):
    """A copy of ``value`` made of plain dicts, lists, str, int, float, bool and None (template data is made of
    subclasses of them)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return dict((_plain(k), _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------------
# Scalars
# ---------------------------------------------------------------------------------------------

def _address(value):
    if isinstance(value, str) and _ADDRESS_RE.match(value):
        return value.lower()
    raise _Bad('a PCI address as text, domain:bus:slot.function such as "0000:65:00.0"')


def _id(what):
    def check(value):
        if isinstance(value, str) and _ID_RE.match(value):
            return value[-4:].lower()
        # YAML reads an unquoted 2236 as a number. One of four decimal digits is the ID those digits spell; any
        # other number could come from 0233 (octal) or 0x2335 (hexadecimal), whose digits YAML did not keep.
        if _is_int(value) and 1000 <= value <= 9999:
            return "%04d" % value
        raise _Bad('the PCI %s ID as 4 hex digits in quotes, such as %s (YAML reads an unquoted 0233 or 0x2335 as '
                   'another number)' % (what, '"10de"' if what.endswith("vendor") else '"2335"'))
    return check


def _class(value):
    if isinstance(value, str) and _CLASS_RE.match(value):
        return value[-6:].lower()
    raise _Bad('the PCI class code as 6 hex digits in quotes, such as "030200" (YAML reads an unquoted 030200 as an '
               'octal number)')


def _text(value):
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise _Bad("text, in quotes for one that looks like a number (%s)" % shown(str(value)))
    raise _Bad("text")


def _version(example, number):
    def check(value):
        if isinstance(value, str):
            return str(value)
        if _is_int(value):
            return str(value)
        raise _Bad('text such as "%s" (quote it: YAML reads an unquoted %s as a number and drops its trailing zero)'
                   % (example, number))
    return check


def _bool(value):
    if isinstance(value, bool):
        return value
    raise _Bad("true or false")


def _int(value):
    if _is_int(value):
        return int(value)
    raise _Bad("a whole number")


def _int_or_text(value):
    if _is_int(value) or isinstance(value, str):
        return _plain(value)
    raise _Bad("a whole number or text")


def _choice(*choices):
    def check(value):
        if isinstance(value, str) and value in choices:
            return str(value)
        raise _Bad("one of %s" % ", ".join(choices))
    return check


def _nullable(check, accepted_null=" or null"):
    def nullable(value):
        if value is None:
            return None
        try:
            return check(value)
        except _Bad as exc:
            raise _Bad(exc.accepted + accepted_null)
    return nullable


def _any(value):
    return _plain(value)


def _mapping_of_any(value):
    if isinstance(value, Mapping):
        return _plain(value)
    raise _Bad("a mapping")


# ---------------------------------------------------------------------------------------------
# Containers
# ---------------------------------------------------------------------------------------------

class _Checker:
    """Walks one host's facts; ``problems`` collects a sentence per bad value."""

    def __init__(self, host):
        self.host = host
        self.problems = []

    def bad(self, path, value, accepted):
        self.problems.append("host %s: %s is %s; accepted: %s" % (self.host, path, shown(value), accepted))

    def value(self, path, value, check):
        """``value`` checked by ``check`` (a scalar check or a :class:`_Walk`); a bad one is named and kept."""
        try:
            return check.walk(self, path, value) if isinstance(check, _Walk) else check(value)
        except _Bad as exc:
            self.bad(path, value, exc.accepted)
            return _plain(value)


class _Walk:
    """A check of a container, which names the bad values inside it by their path."""

    accepted = "a value"

    def walk(self, checker, path, value):
        raise NotImplementedError


class _ListOf(_Walk):
    """A list whose items ``item`` checks; ``accepted`` says what the list is."""

    def __init__(self, item, accepted):
        self.item = item
        self.accepted = accepted

    def walk(self, checker, path, value):
        if not isinstance(value, (list, tuple)):
            raise _Bad(self.accepted)
        return [checker.value("%s[%d]" % (path, index), item, self.item) for index, item in enumerate(value)]


class _Map(_Walk):
    """A mapping whose keys ``fields`` check (others are kept as they are); ``required`` keys must have a value."""

    def __init__(self, fields, accepted, required=(), nullable=False):
        self.fields = fields
        self.accepted = accepted + (" or null" if nullable else "")
        self.required = required
        self.nullable = nullable

    def walk(self, checker, path, value):
        if value is None and self.nullable:
            return None
        if not isinstance(value, Mapping):
            raise _Bad(self.accepted)
        missing = [k for k in self.required if value.get(k) is None]
        if missing:
            checker.problems.append("host %s: %s (%s) has no %s" % (
                checker.host, path, shown(_plain(value)),
                " and no ".join("%s (%s)" % (k, _accepted(self.fields[k])) for k in missing)))
        result = {}
        for key, item in value.items():
            if key in missing:
                result[_plain(key)] = None
            else:
                result[_plain(key)] = checker.value("%s.%s" % (path, key), item, self.fields.get(key, _any))
        return result


def _accepted(check):
    if isinstance(check, _Walk):
        return check.accepted
    try:
        check(None)
    except _Bad as exc:
        return exc.accepted
    return "a value"


_NAME = _nullable(_text)
_ADDRESSES = _ListOf(_address, 'a list of PCI addresses such as "0000:65:00.4"')
_MAPPINGS = _ListOf(_mapping_of_any, "a list of mappings")
_MEMBERS = _ListOf(_Map({"address": _text, "vendor": _nullable(_id("vendor")), "device": _nullable(_id("device")),
                         "subsystem_vendor": _nullable(_id("subsystem vendor")),
                         "subsystem_device": _nullable(_id("subsystem device")), "class": _nullable(_class),
                         "driver": _NAME, "driver_override": _NAME, "is_bridge": _bool, "pci": _bool},
                        "a mapping with address, vendor, device, class and driver", required=("address",)),
                   "a list of the IOMMU group's functions")
_MDEV_TYPES = _ListOf(_Map({"id": _int_or_text, "name": _NAME, "available_instances": _nullable(_int),
                            "device_api": _NAME, "description": _NAME, "resource_name": _NAME},
                           "a mapping with id and name"), "a list of mediated device types")
_VGPU = _Map({"creatable_types": _ListOf(_Map({"id": _int_or_text, "name": _NAME}, "a mapping with id and name"),
                                         "a list of vGPU types"),
              "current_type": _nullable(_int_or_text)},
             "a mapping with creatable_types and current_type", nullable=True)

GPU = _Map({
    "address": _address, "vendor": _id("vendor"), "device": _id("device"),
    "subsystem_vendor": _nullable(_id("subsystem vendor")), "subsystem_device": _nullable(_id("subsystem device")),
    "class": _nullable(_class), "vendor_name": _NAME, "device_name": _NAME, "subsystem_name": _NAME,
    "class_name": _NAME, "driver": _NAME, "driver_override": _NAME, "mig_instances": _nullable(_int),
    "is_bridge": _bool, "sysfs_path": _NAME, "numa_node": _nullable(_int), "boot_vga": _bool,
    "iommu_group": _nullable(_int), "iommu_group_members": _MEMBERS, "viable": _bool, "blockers": _MAPPINGS,
    "sriov_totalvfs": _nullable(_int), "sriov_numvfs": _nullable(_int), "physfn": _nullable(_address),
    "virtfns": _ADDRESSES, "is_vf": _bool, "mdev_types": _MDEV_TYPES, "vgpu": _VGPU, "sandbox_resource_name": _NAME,
}, "a mapping with address, vendor and device", required=REQUIRED_GPU_KEYS)

HOST = _Map({
    "os": _Map({"id": _NAME, "id_like": _ListOf(_text, "a list of text"),
                "version_id": _nullable(_version("22.04", "20.10")), "major": _nullable(_version("22", "20.10")),
                "codename": _NAME, "pretty_name": _NAME}, "a mapping with id, version_id and major", nullable=True),
    "kernel": _NAME,
    "mdev_devices": _ListOf(_Map({"uuid": _NAME, "parent": _NAME, "type_id": _nullable(_int_or_text)},
                                 "a mapping with uuid, parent and type_id"), "a list of mediated devices"),
    "managed_files": _nullable(_mapping_of_any),
    "sriov": _nullable(_mapping_of_any),
    "sriov_recorded": _ADDRESSES,
    "fingerprint": _NAME,
    "nvidia_driver": _Map({"loaded": _nullable(_bool), "version": _nullable(_version("580.159.04", "535.10")),
                           "host_module": _NAME, "source": _nullable(_choice(*_DRIVER_SOURCES))},
                          "a mapping with loaded, version, host_module and source", nullable=True),
    "prepared": _nullable(_mapping_of_any),
    "kernels": _MAPPINGS,
}, "a mapping as gpu_facts returns it (os, nvidia_driver, ...)", nullable=True)

_SHAPES = {
    "gpu_facts_gpus": _ListOf(GPU, "a list of mappings as gpu_facts returns them, each with at least address, vendor "
                                   "and device"),
    "gpu_facts_host": HOST,
    "gpu_facts_mdev_parents": _ListOf(_Map({"name": _text, "address": _nullable(_address), "sysfs_path": _NAME,
                                            "types": _MDEV_TYPES}, "a mapping with name and types", required=("name",)),
                                      "a list of mappings as gpu_facts returns them, each with name and types"),
}


def check_facts(host, hostvars, require_gpus=False):
    """The GPU facts of ``hostvars`` (a host's variables, any Mapping) in gpu_facts' shape: ``(facts, problems)``.

    ``facts`` holds each of :data:`FACT_KEYS` that ``hostvars`` has (a null ``gpu_facts_gpus`` or
    ``gpu_facts_mdev_parents`` is an empty list); ``problems`` one sentence per bad value. With ``require_gpus``
    a missing or null ``gpu_facts_gpus`` is a problem too.
    """
    checker = _Checker(host)
    if not isinstance(hostvars, Mapping):
        return {}, ["host %s: its host variables are %s, not a mapping" % (host, shown(hostvars))]
    facts = {}
    for key in FACT_KEYS:
        value = hostvars[key] if key in hostvars else None
        if value is None and key != "gpu_facts_host":
            if key == "gpu_facts_gpus" and require_gpus:
                checker.problems.append("host %s: gpu_facts_gpus is %s; accepted: %s" % (
                    host, "null" if key in hostvars else "not given", _SHAPES[key].accepted))
            if key in hostvars:
                facts[key] = []
            continue
        if key not in hostvars:
            continue
        facts[key] = checker.value(key, value, _SHAPES[key])
    return facts, checker.problems
