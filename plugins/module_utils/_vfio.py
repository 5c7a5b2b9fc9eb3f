# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private helpers to bind PCI functions to vfio-pci (or a vfio-pci variant driver) and back.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
Every function that touches the host takes its filesystem root as an argument (default ``/``) so unit
tests can build a fake tree under a temporary directory. Errors are raised as :class:`VfioError` (or
the :class:`SysfsError` of the discovery helpers); only the module turns them into ``fail_json``.

The work is split in two: ``plan_bind``/``plan_unbind`` read the host and decide, per function, what
must change, refusing (before anything is written) whatever is unsafe; ``apply_steps`` performs the
steps in order, verifies each by reading the ``driver`` link back, and rolls every step already done
back, in reverse order, when one fails.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re

from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import (
    SysfsError,
    host_path,
    link_name,
    normalize_pci_address,
    pci_device_dir,
    read_attr,
    write_attr,
    wait_until,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._pci import (
    VFIO_PCI_DRIVER,
    driver_allows_vfio,
    group_viability,
    iommu_group_of,
    iommu_groups,
    list_functions,
    read_identity,
    sriov_info,
    vgpu_info,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils import _modprobe
from ansible_collections.gpuops.sandbox.plugins.module_utils._holders import find_holders, vfio_group_node, vfio_nodes
from ansible_collections.gpuops.sandbox.plugins.module_utils._cmdline import normalize_key, parse_cmdline
from ansible_collections.gpuops.sandbox.plugins.module_utils._persist import read_text
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError, error_text

PCI_DRIVERS = "/sys/bus/pci/drivers"
DRIVERS_PROBE = "/sys/bus/pci/drivers_probe"
UDEV_RULES_DIR = "/etc/udev/rules.d"
UDEV_RULE_PREFIX = "61-gpuops-vfio-"
RECORD_DIR = "/var/lib/gpuops/vfio_bind"
NONE_DRIVER = "none"
DEFAULT_ALLOWED_DRIVERS = ("nvidia", "nouveau", VFIO_PCI_DRIVER, NONE_DRIVER)
# Drivers of the auxiliary functions NVIDIA boards put in the GPU's IOMMU group: HDMI/DP audio, the
# USB-C xHCI controller and its UCSI (I2C) function.
DEFAULT_ALLOWED_GROUP_DRIVERS = ("snd_hda_intel", "xhci_hcd", "nvidia-gpu", "ucsi_ccg")
# \A and \Z: ^ and $ would let a trailing newline through (.match is used on these too).
DRIVER_NAME_RE = re.compile(r"\A[A-Za-z0-9_.-]{1,64}\Z")
_NVIDIA_MINOR_RE = re.compile(r"^Device Minor:[ \t]*([0-9]{1,9})[ \t]*$", re.MULTILINE)
_NVIDIA_NODE_RE = re.compile(r"\Anvidia([0-9]{1,9})\Z")
_NULL_OVERRIDE = "(null)"

# Indirection so unit tests can make waiting instant.


class VfioError(GpuopsError):
    """Binding or restoring failed, or was refused; ``msg`` says why and what to do.

    ``rollback`` lists, when a change was undone, one line per function with the rollback result (also
    in ``extra``, so it is a key of the failure result).
    """

    def __init__(self, msg, rollback=None):
        rollback = list(rollback or [])
        super().__init__(msg, **({"rollback": rollback} if rollback else {}))
        self.msg = msg
        self.rollback = rollback


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

def is_vfio_driver(driver):
    """True for vfio-pci itself and its variant drivers (``nvgrace_gpu_vfio_pci``, ``mlx5_vfio_pci``)."""
    return driver is not None and (driver == VFIO_PCI_DRIVER or driver.endswith("_vfio_pci"))


def check_driver_names(values, option):
    """Return ``values`` (driver names or ``none``) after checking each looks like a driver name."""
    for value in values:
        if not isinstance(value, str) or not DRIVER_NAME_RE.fullmatch(value):
            raise VfioError("%s entry %r is not a driver name (letters, digits, '_', '-', '.'; e.g. nvidia, "
                            "or none for a function without a driver)" % (option, value))
    return list(values)


def driver_label(driver):
    """Human form of a driver (``none`` for a function without one)."""
    return driver if driver else NONE_DRIVER


def current_driver(address, root="/"):
    """Name of the driver ``address`` is bound to, or None."""
    return link_name(os.path.join(pci_device_dir(address, root), "driver"))


def read_override(address, root="/"):
    """``driver_override`` of a function, None when unset (the kernel shows ``(null)``)."""
    value = read_attr(os.path.join(pci_device_dir(address, root), "driver_override"), default="")
    return None if value in ("", _NULL_OVERRIDE) else value


def driver_loaded(driver, root="/"):
    """Whether ``driver`` is registered with the PCI bus (built in or its module loaded)."""
    return os.path.isdir(host_path(root, "%s/%s" % (PCI_DRIVERS, driver)))


def module_for_driver(driver):
    """The kernel module that provides a vfio driver (``vfio-pci`` is module ``vfio_pci``)."""
    return "vfio_pci" if driver == VFIO_PCI_DRIVER else driver


# ---------------------------------------------------------------------------------------------
# Variant drivers: modalias against the ``alias vfio_pci:`` lines of modules.alias
# ---------------------------------------------------------------------------------------------

def parse_vfio_aliases(text):
    """Return ``[(pattern, module)]`` from the ``alias vfio_pci:<pattern> <module>`` lines of modules.alias."""
    aliases = []
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "alias" and parts[1].startswith("vfio_pci:"):
            aliases.append((parts[1][len("vfio_pci:"):], parts[2]))
    return aliases


def read_modules_alias(root="/", release=None, name="modules.alias"):
    """Text of ``/lib/modules/<release>/modules.alias`` (or another file there, ``name``; '' when missing)."""
    release = release or os.uname().release
    path = host_path(root, "/lib/modules/%s/%s" % (release, name))
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (IOError, OSError):
        return ""


def match_variant(modalias, aliases):
    """Pick the vfio driver for a device ``modalias`` (``pci:v000010DEd...``) from ``aliases``.

    Every ``vfio_pci:`` alias whose pattern matches the modalias (after its ``pci:`` prefix) is a
    candidate; the most specific one (fewest ``*``, then first in the file) wins. The generic
    ``vfio_pci`` module (``alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci``) maps to ``vfio-pci``.
    Returns None when nothing matches.
    """
    if not modalias or not modalias.startswith("pci:"):
        return None
    body = modalias[len("pci:"):]
    best = None
    for index, (pattern, module) in enumerate(aliases):
        if fnmatch.fnmatchcase(body, pattern):
            key = (pattern.count("*"), index)
            if best is None or key < best[0]:
                best = (key, module)
    if best is None:
        return None
    module = best[1]
    return VFIO_PCI_DRIVER if module in ("vfio_pci", VFIO_PCI_DRIVER) else module


def target_driver(address, requested, root="/", release=None, aliases=None):
    """The vfio driver to bind ``address`` to: ``requested``, or with ``auto`` the matching variant."""
    if requested != "auto":
        return requested
    modalias = read_attr(os.path.join(pci_device_dir(address, root), "modalias"), default="")
    if aliases is None:
        aliases = parse_vfio_aliases(read_modules_alias(root, release))
    return match_variant(modalias, aliases) or VFIO_PCI_DRIVER


# ---------------------------------------------------------------------------------------------
# Host drivers: modalias against the ``alias pci:`` lines of modules.alias (and modules.builtin.alias)
# ---------------------------------------------------------------------------------------------

def parse_pci_aliases(text):
    """Return ``[(pattern, module)]`` from the ``alias pci:<pattern> <module>`` lines of modules.alias."""
    aliases = []
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "alias" and parts[1].startswith("pci:"):
            aliases.append((parts[1][len("pci:"):], parts[2]))
    return aliases


def read_pci_aliases(root="/", release=None):
    """The ``alias pci:`` lines of the running kernel's modules.alias, then those of its built-in drivers."""
    return (parse_pci_aliases(read_modules_alias(root, release))
            + parse_pci_aliases(read_modules_alias(root, release, "modules.builtin.alias")))


def _module_key(name):
    return name.replace("-", "_")


def is_host_module(module):
    """False for the vfio modules (vfio_pci, its variants, vfio itself) and pci_stub, which only hold devices."""
    key = _module_key(module)
    return not (key.startswith("vfio") or key.endswith("_vfio_pci") or key == "pci_stub")


def host_modules(modalias, aliases):
    """The host modules (:func:`is_host_module`) whose ``alias pci:`` pattern matches ``modalias``, in file order."""
    if not modalias or not modalias.startswith("pci:"):
        return []
    body = modalias[len("pci:"):]
    found = []
    for pattern, module in aliases:
        key = _module_key(module)
        if key not in found and is_host_module(key) and fnmatch.fnmatchcase(body, pattern):
            found.append(key)
    return found


def pci_drivers_by_module(root="/"):
    """``{module: [driver, ...]}`` of the PCI drivers registered now, from ``/sys/bus/pci/drivers/<driver>/module``.

    A PCI driver's name need not be its module's (module ``xhci_pci`` registers driver ``xhci_hcd``); built-in
    drivers have the link too (to ``/sys/module/<name>``).
    """
    base = host_path(root, PCI_DRIVERS)
    try:
        names = sorted(os.listdir(base))
    except (IOError, OSError):
        return {}
    found = {}
    for name in names:
        module = link_name(os.path.join(base, name, "module"))
        if module and DRIVER_NAME_RE.fullmatch(name):
            found.setdefault(_module_key(module), []).append(name)
    return found


def host_driver(address, root="/", release=None, aliases=None):
    """Work out the host driver of ``address`` when nothing recorded it; return ``(driver or None, modules, loaded)``.

    ``modules`` are the host modules whose ``alias pci:`` lines match the function's ``modalias``; ``loaded`` the
    PCI drivers registered now that those modules provide (neither vfio nor pci-stub). ``driver`` is set only
    when exactly one is loaded: that is the driver to bind explicitly.
    """
    modalias = read_attr(os.path.join(pci_device_dir(address, root), "modalias"), default="")
    if aliases is None:
        aliases = read_pci_aliases(root, release)
    modules = host_modules(modalias, aliases)
    by_module = pci_drivers_by_module(root)
    loaded = sorted({d for m in modules for d in by_module.get(m, [])
                     if not is_vfio_driver(d) and _module_key(d) != "pci_stub"})
    return (loaded[0] if len(loaded) == 1 else None), modules, loaded


# ---------------------------------------------------------------------------------------------
# Device state, holders
# ---------------------------------------------------------------------------------------------

def device_state(address, root="/"):
    """Everything the planner needs about one function, as plain data."""
    addr = normalize_pci_address(address)
    devdir = pci_device_dir(addr, root)
    ident = read_identity(addr, root)
    sriov = sriov_info(addr, root)
    boot_vga = read_attr(os.path.join(devdir, "boot_vga"), default="0")
    return {
        "address": addr,
        "vendor": ident["vendor"],
        "device": ident["device"],
        "subsystem_vendor": ident.get("subsystem_vendor"),
        "subsystem_device": ident.get("subsystem_device"),
        "class": ident["class"],
        "is_bridge": ident["is_bridge"],
        "driver": ident["driver"],
        "override": read_override(addr, root),
        "group": iommu_group_of(addr, root),
        "boot_vga": boot_vga.strip() == "1",
        "numvfs": sriov["numvfs"] or 0,
        "is_vf": sriov["physfn"] is not None,
        "vendor_vgpu": vgpu_info(addr, root) is not None,
    }


def nvidia_device_nodes(address, root="/"):
    """The ``/dev/nvidiaN`` nodes that pin ``address`` to the nvidia driver.

    The minor comes from ``/proc/driver/nvidia/gpus/<BDF>/information`` (``Device Minor:``); when it
    cannot be read, every ``/dev/nvidiaN`` of the host is returned (refusing too often beats hanging in
    an unbind), and ``/dev/nvidia0`` when ``/dev`` shows none.
    """
    minor = nvidia_minor(address, root)
    if minor is not None:
        return ["/dev/nvidia%d" % minor]
    try:
        names = os.listdir(host_path(root, "/dev"))
    except (IOError, OSError):
        names = []
    nodes = sorted(("/dev/" + n for n in names if _NVIDIA_NODE_RE.fullmatch(n)),
                   key=lambda p: int(_NVIDIA_NODE_RE.fullmatch(os.path.basename(p)).group(1)))
    return nodes or ["/dev/nvidia0"]


def nvidia_minor(address, root="/"):
    """The nvidia driver's minor number of ``address`` (``Device Minor:`` of its information file), or None."""
    text = read_attr(host_path(root, "/proc/driver/nvidia/gpus/%s/information" % address), default="")
    match = _NVIDIA_MINOR_RE.search(text)
    return int(match.group(1)) if match else None


def mig_instances(address, root="/"):
    """How many MIG GPU instances exist on ``address``: the ``gi<N>`` capability directories the nvidia driver
    keeps under ``/proc/driver/nvidia/capabilities/gpu<minor>/mig``; None when the nvidia driver does not hold it."""
    minor = nvidia_minor(address, root)
    if minor is None:
        return None
    try:
        names = os.listdir(host_path(root, "/proc/driver/nvidia/capabilities/gpu%d/mig" % minor))
    except (IOError, OSError):
        return 0
    return sum(1 for name in names if re.fullmatch(r"gi[0-9]+", name))


def holder_paths(state, root="/"):
    """Device nodes whose holders stop ``state``'s function from being unbound from its driver."""
    driver = state["driver"]
    devdir = pci_device_dir(state["address"], root)
    paths = []
    if driver == "nvidia":
        paths.extend(nvidia_device_nodes(state["address"], root))
    elif is_vfio_driver(driver):
        paths.extend(vfio_nodes(devdir))
    if driver is not None:
        drm_dir = os.path.join(devdir, "drm")
        if os.path.isdir(drm_dir):
            paths.extend("/dev/dri/" + name for name in sorted(os.listdir(drm_dir))
                         if name.startswith(("card", "renderD")))
    return paths


def holders_problem(state, root="/"):
    """A refusal message when processes hold ``state``'s device nodes open, else None."""
    if state["driver"] is None:
        return None
    holders = find_holders(holder_paths(state, root), root)
    if not holders:
        return None
    listed = ", ".join("pid %d (%s) holds %s" % (h["pid"], h["cmdline"] or h["comm"] or "?", h["device"])
                       for h in holders)
    return ("%s is in use (driver %s): %s; stop these processes first (this module never stops or kills "
            "anything)" % (state["address"], state["driver"], listed))


# ---------------------------------------------------------------------------------------------
# Claims made outside this module (hand-made setups)
# ---------------------------------------------------------------------------------------------

DRIVERCTL_DIR = "/etc/driverctl.d"
_ANY_ID = 0xFFFFFFFF


def _id_matches(entry, state):
    """Whether one ``vfio-pci`` ``ids`` entry (``vendor:device[:subvendor:subdevice[:class:class_mask]]``,
    hexadecimal, as the driver parses it) matches the function ``state``."""
    try:
        fields = [int(part, 16) for part in entry.split(":")]
    except ValueError:
        return False
    if len(fields) < 2 or len(fields) > 6:
        return False
    fields += [_ANY_ID, _ANY_ID, 0, 0][len(fields) - 2:]
    have = []
    for key in ("vendor", "device", "subsystem_vendor", "subsystem_device", "class"):
        try:
            have.append(int(state.get(key) or "", 16))
        except ValueError:
            have.append(None)
    for want, value in zip(fields[:4], have[:4]):
        if want != _ANY_ID and want != value:
            return False
    return have[4] is None or (have[4] & fields[5]) == (fields[4] & fields[5])


def _options_ids(line):
    """The ``ids=`` entries of an ``options vfio-pci`` line (a logical line), or None for any other line."""
    return _modprobe.option_values(line, VFIO_PCI_DRIVER, "ids")


def _modprobe_ids(root):
    """``[(file, ids entry)]`` from ``options vfio-pci ids=`` lines of the modprobe.d directories."""
    found = []
    for path, text in _modprobe.modprobe_files(root):
        for line in _modprobe.modprobe_logical_lines(text):
            found.extend((path, item) for item in _options_ids(line) or [])
    return found


def _cmdline_ids(root):
    """``[(key, value)]`` of the ``vfio-pci.ids`` arguments of the running kernel's command line, as written."""
    text = read_text(root, "/proc/cmdline") or ""
    return [(key, value) for key, value in parse_cmdline(text)
            if normalize_key(key) == "vfio_pci.ids" and value]


def find_claims(state, root="/"):
    """How the host claims ``state``'s function for vfio-pci outside this module: a dict per claim.

    ``kind`` is ``cmdline``, ``modprobe`` or ``driverctl``; ``path`` the file (``/proc/cmdline`` for the
    command line); ``entry`` the ``ids`` entry (the override's driver for driverctl); ``text`` a line saying so.
    """
    claims = []
    for _key, value in _cmdline_ids(root):
        for entry in value.split(","):
            if entry and _id_matches(entry, state):
                claims.append({"kind": "cmdline", "path": "/proc/cmdline", "entry": entry,
                               "text": "vfio-pci.ids=%s on the kernel command line (/proc/cmdline; put there by the "
                                       "boot configuration, e.g. /etc/default/grub)" % entry})
    for path, entry in _modprobe_ids(root):
        if _id_matches(entry, state):
            claims.append({"kind": "modprobe", "path": path, "entry": entry,
                           "text": "options vfio-pci ids=%s in %s" % (entry, path)})
    path = driverctl_path(state["address"])
    override = read_text(root, path)
    if override is not None and is_vfio_driver(override.strip()):
        claims.append({"kind": "driverctl", "path": path, "entry": override.strip(),
                       "text": "a driverctl override to %s (%s)" % (override.strip(), path)})
    return claims


def vfio_claims(state, root="/"):
    """How the host claims ``state``'s function for vfio-pci outside this module, one line each.

    ``vfio-pci.ids`` on the running kernel's command line, ``options vfio-pci ids=`` in modprobe.d and a
    driverctl override all give the function back to vfio-pci as soon as it is released (or at the next
    boot), so a function claimed that way cannot be given back to its host driver by unbinding it.
    """
    return [claim["text"] for claim in find_claims(state, root)]


def driverctl_path(address):
    return "%s/pci-%s" % (DRIVERCTL_DIR, address)


def claims_problem(state, root="/"):
    """A refusal message when the host claims ``state``'s function for vfio-pci outside this module."""
    claims = vfio_claims(state, root)
    if not claims:
        return None
    return ("%s (%s:%s) is claimed for vfio-pci by %s; it would go back to vfio-pci as soon as it is released. "
            "Remove that claim first (kernel arguments: the kernel_cmdline module with state=absent, then a "
            "reboot; modprobe.d: delete the line and rebuild the initramfs; driverctl: driverctl unset-override %s), "
            "or set remove_claims=true to have this module remove the modprobe.d and driverctl claims, bind the "
            "host driver explicitly and return the kernel arguments to take off (cmdline_claims)"
            % (state["address"], state["vendor"], state["device"], " and ".join(claims), state["address"]))


def _claimed_by_none(entry, states):
    return not any(_id_matches(entry, state) for state in states)


def strip_modprobe_ids(text, states):
    """``text`` of a modprobe.d file without the ``ids`` entries of ``options vfio-pci`` lines that match any of
    ``states``; the other entries and options of the line stay, and the line goes only when nothing is left on it
    (its comment with it). A line that changes is written as one line with single spaces; the others as they were.
    """
    return _modprobe.keep_option_values(text, VFIO_PCI_DRIVER, "ids", lambda entry: _claimed_by_none(entry, states))


def claim_changes(states, root="/"):
    """What ``remove_claims`` does for the functions ``states``: ``(files, cmdline)``.

    ``files`` is ``[(path, old_text, new_text or None)]``: the modprobe.d files without the ``ids`` entries that
    match one of the functions (None: nothing but blank lines left, the file goes) and the driverctl overrides of
    the functions to delete. ``cmdline`` is a dict per ``vfio-pci.ids`` argument of the running kernel that
    claims one of them: ``argument`` as written on the command line, ``replace_with`` the argument with the
    entries of other devices only, or None when none is left (take it off).
    """
    files = []
    for path, text in _modprobe.modprobe_files(root):
        new = strip_modprobe_ids(text, states)
        if new != text:
            files.append((path, text, new if new.strip() else None))
    for state in states:
        path = driverctl_path(state["address"])
        override = read_text(root, path)
        if override is not None and is_vfio_driver(override.strip()):
            files.append((path, override, None))
    cmdline = []
    for key, value in _cmdline_ids(root):
        entries = [e for e in value.split(",") if e]
        left = [e for e in entries if _claimed_by_none(e, states)]
        if len(left) == len(entries):
            continue
        argument = {"argument": "%s=%s" % (key, value), "replace_with": "%s=%s" % (key, ",".join(left)) if left else None}
        if argument not in cmdline:
            cmdline.append(argument)
    return files, cmdline


# ---------------------------------------------------------------------------------------------
# Persistence and records
# ---------------------------------------------------------------------------------------------

def udev_rule_path(address):
    return "%s/%s%s.rules" % (UDEV_RULES_DIR, UDEV_RULE_PREFIX, address)


def udev_rule_text(state, target):
    """udev rule giving ``state``'s function to ``target`` again at every boot (or hot-add).

    The rule sets ``driver_override`` while udev handles the function's ``add`` event, loads the vfio
    module, then has the function (re)probed: taken from a driver that already claimed it (only
    possible when that driver was loaded first, for another device) and probed, so only ``target``
    can bind it. The address is validated, so nothing in the rule comes from free text.
    """
    addr = normalize_pci_address(state["address"])
    if not isinstance(target, str) or not DRIVER_NAME_RE.fullmatch(target):
        raise VfioError("driver %r is not a driver name" % (target,))
    script = ("cd /sys/bus/pci/devices/{a} && if [ -e driver ] && [ ! driver -ef /sys/bus/pci/drivers/{t} ]; "
              "then echo {a} > driver/unbind; fi; echo {a} > /sys/bus/pci/drivers_probe").format(a=addr, t=target)
    return (
        "# Managed by gpuops.sandbox.vfio_bind; removed by state=absent. Do not edit.\n"
        "# Gives %s (%s:%s) to %s at boot instead of its host driver.\n"
        'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="%s", ATTR{driver_override}="%s", '
        'RUN+="/sbin/modprobe -q %s", RUN+="/bin/sh -c \'%s\'"\n'
        % (addr, state["vendor"], state["device"], target, addr, target, module_for_driver(target), script)
    )


def record_path(address):
    return "%s/%s.json" % (RECORD_DIR, address)


def record_text(state, target):
    """JSON record of the driver a function had before it was bound to ``target``."""
    return json.dumps({
        "address": state["address"],
        "vendor": state["vendor"],
        "device": state["device"],
        "driver": state["driver"],
        "driver_override": state["override"],
        "bound_to": target,
    }, sort_keys=True, indent=2) + "\n"


INFERRED = "modules.alias"


def inferred_record_text(state, target, claims, root="/", release=None, aliases=None):
    """JSON record for a function the host's own claim (``claims``, :func:`find_claims`) had put on a vfio driver
    before this module bound it: its original driver as far as the running kernel's modules.alias tells.

    ``host_modules`` are the host modules whose ``alias pci:`` lines match its modalias; ``driver`` is set only when
    there is exactly one: the PCI driver that module registers when it is loaded (exactly one), else the module's
    name. ``origin`` says the driver was inferred, so :func:`plan_unbind` binds it only when it is loaded then.
    """
    modalias = read_attr(os.path.join(pci_device_dir(state["address"], root), "modalias"), default="")
    if aliases is None:
        aliases = read_pci_aliases(root, release)
    modules = host_modules(modalias, aliases)
    driver = None
    if len(modules) == 1:
        registered = [d for d in pci_drivers_by_module(root).get(modules[0], [])
                      if not is_vfio_driver(d) and _module_key(d) != "pci_stub"]
        driver = registered[0] if len(registered) == 1 else (modules[0] if not registered else None)
    return json.dumps({
        "address": state["address"],
        "vendor": state["vendor"],
        "device": state["device"],
        "driver": driver,
        "driver_override": None,
        "bound_to": target,
        "origin": INFERRED,
        "host_modules": modules,
        "claimed_by": sorted({c["kind"] for c in claims}),
    }, sort_keys=True, indent=2) + "\n"


def read_record(address, root="/"):
    """The record written when ``address`` was bound, or None (missing or not a valid record).

    ``origin`` is ``"bind"`` for the driver the function had when this module bound it, :data:`INFERRED` for one
    inferred from modules.alias (:func:`inferred_record_text`); ``host_modules`` are the modules of such a record.
    """
    text = read_text(root, record_path(address))
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("address") != address:
        return None
    driver = data.get("driver")
    if driver is not None and (not isinstance(driver, str) or not DRIVER_NAME_RE.fullmatch(driver)):
        return None
    override = data.get("driver_override")
    if override is not None and (not isinstance(override, str) or not DRIVER_NAME_RE.fullmatch(override)):
        override = None
    if data.get("origin") == INFERRED:
        modules = data.get("host_modules")
        if not isinstance(modules, list) or not all(isinstance(m, str) and DRIVER_NAME_RE.fullmatch(m) for m in modules):
            modules = []
        return {"driver": driver, "driver_override": None, "origin": INFERRED, "host_modules": modules}
    return {"driver": driver, "driver_override": override, "origin": "bind", "host_modules": []}


# ---------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------

def _step(state, target, role, action):
    return {"address": state["address"], "state": state, "role": role, "action": action, "target": target,
            "before": state["driver"], "before_override": state["override"], "restore_to": None}


def _group_members(state, root):
    if state["group"] is None:
        return []
    return group_viability(state["group"], root)["members"]


def slot_siblings(address, root="/"):
    """The other functions of ``address``'s PCI slot (same domain:bus:device), each a :func:`read_identity`
    dict with ``pci`` true, sorted by address.

    With the IOMMU on, the functions of a multifunction device without ACS share an IOMMU group: these are
    the functions the group of ``address`` will at least hold. SR-IOV VFs are left out (the IOMMU groups them
    through their PF's isolation, not by slot).
    """
    addr = normalize_pci_address(address)
    prefix = addr.rsplit(".", 1)[0] + "."
    siblings = []
    for other in list_functions(root):
        if other == addr or not other.startswith(prefix) or sriov_info(other, root)["physfn"] is not None:
            continue
        member = read_identity(other, root)
        member["pci"] = True
        siblings.append(member)
    return siblings


def _planned_members(step, root):
    """The functions ``step``'s function shares its IOMMU group with (or, predicted, its PCI slot with)."""
    if step.get("slot"):
        return slot_siblings(step["address"], root)
    return _group_members(step["state"], root)


def network_interfaces(address, root="/"):
    """The names of the network interfaces the kernel made of ``address`` (``/sys/bus/pci/devices/<addr>/net/``),
    sorted; empty for a function that is no network interface (or whose driver made none)."""
    try:
        return sorted(os.listdir(os.path.join(pci_device_dir(address, root), "net")))
    except (IOError, OSError, SysfsError):
        return []


def _network_problem(step, label, interfaces):
    """The refusal for a function that is a network interface of the host, going to vfio with a GPU."""
    state = step["state"]
    if step.get("slot_of"):
        where = ("in the PCI slot of %s, so it will most likely share its IOMMU group once the IOMMU is on and go to "
                 "%s with it" % (step["slot_of"], step["target"]))
    elif step.get("group_of"):
        where = "in the IOMMU group of %s, so it goes to %s with it" % (step["group_of"], step["target"])
    else:
        where = "selected for %s" % step["target"]
    named = ", ".join(interfaces)
    return ("%s (%s:%s, class %s) is a live network interface of the host, %s (driver %s), %s: that would take %s "
            "away from the host, with every connection over it. Leave %s on %s: give the VM a GPU whose slot (IOMMU "
            "group) holds no function the host needs, or move the host's network to another interface first and "
            "then disable this function (e.g. in the firmware setup)"
            % (state["address"], state["vendor"], state["device"], state["class"], named, label, where, named,
               named, label))


def _bind_problems(step, allowed, root, force_boot_vga):
    """Refusals for binding one function (it is not on its target driver yet)."""
    state = step["state"]
    addr = state["address"]
    problems = []
    if state["is_bridge"]:
        problems.append("%s is a PCI bridge (class %s); bridges are never bound to a vfio driver"
                        % (addr, state["class"]))
        return problems
    if state["group"] is None and not step.get("slot"):
        problems.append("%s has no IOMMU group: the IOMMU is off, so %s could not give it to a VM; enable "
                        "VT-d/AMD-Vi in the firmware, and on Intel boot with intel_iommu=on (see "
                        "gpuops.sandbox.iommu_check)" % (addr, step["target"]))
    if state["boot_vga"] and not force_boot_vga:
        problems.append("%s is the boot VGA device (the console the firmware set up); set force_boot_vga=true "
                        "to bind it anyway" % addr)
    label = driver_label(state["driver"])
    interfaces = network_interfaces(addr, root) if label not in allowed else []
    if interfaces:
        # Never the advice to allow its driver: that would take the host's interface away.
        problems.append(_network_problem(step, label, interfaces))
    elif label not in allowed and step.get("slot_of"):
        problems.append("%s (%s:%s, class %s) is in the PCI slot of %s, so it will most likely share its IOMMU "
                        "group once the IOMMU is on and go to %s with it, but it is bound to %s, which is not in "
                        "allowed_drivers or allowed_group_drivers (%s); add %s to allowed_group_drivers to give the "
                        "function to %s with %s, or unbind or disable the function (e.g. in the firmware setup)"
                        % (addr, state["vendor"], state["device"], state["class"], step["slot_of"], step["target"],
                           label, ", ".join(allowed), label, step["target"], step["slot_of"]))
    elif label not in allowed:
        option = "allowed_drivers" if step["role"] == "selected" else "allowed_drivers or allowed_group_drivers"
        problems.append("%s is bound to %s, which is not in %s (%s); add %s to %s to bind it anyway"
                        % (addr, label, option, ", ".join(allowed), label, option))
    if state["numvfs"] > 0:
        problems.append("%s is an SR-IOV physical function with %d VFs enabled; a PF with VFs cannot be passed "
                        "through: disable them first (sriov_numvfs=0, e.g. gpuops.sandbox.sriov_vfs with "
                        "state=absent)" % (addr, state["numvfs"]))
    if state["vendor_vgpu"]:
        problems.append("%s offers NVIDIA vendor-specific vGPU types (nvidia/creatable_vgpu_types); its vGPUs "
                        "are created with gpuops.sandbox.mdev_create, never by binding it to %s"
                        % (addr, step["target"]))
    if not problems:
        busy = holders_problem(state, root)
        if busy:
            problems.append(busy)
    return problems


def _ordered(steps):
    return sorted(steps, key=lambda s: s["address"])


def plan_bind(addresses, root="/", driver="auto", include_group=False, allowed_drivers=DEFAULT_ALLOWED_DRIVERS,
              allowed_group_drivers=DEFAULT_ALLOWED_GROUP_DRIVERS, force_boot_vga=False, release=None,
              assume_slot_groups=False):
    """Decide how to bind ``addresses`` (already selected and normalised) to their vfio driver.

    Returns ``{"steps": [...], "devices": [...]}``: a step per function that must change, a device entry
    per function considered (selected ones, plus group members with ``include_group``). Raises
    VfioError listing every reason to refuse; nothing is written here.

    ``assume_slot_groups`` is for predictions only (check mode): while the IOMMU is off (the host has no
    IOMMU group at all), a selected function that is not an SR-IOV VF is planned as if its group were the
    functions of its PCI slot (:func:`slot_siblings`), the group the IOMMU gives a multifunction device
    without ACS, instead of being refused for having no group. Functions behind a bridge without ACS may
    join that group too, which cannot be known before the IOMMU is on. With the IOMMU on it changes nothing.
    """
    aliases = parse_vfio_aliases(read_modules_alias(root, release)) if driver == "auto" else None
    predict = bool(assume_slot_groups) and not iommu_groups(root)
    entries = {}
    for address in addresses:
        state = device_state(address, root)
        entries[state["address"]] = _step(state, target_driver(state["address"], driver, root, release, aliases),
                                          "selected", "bind")
        if predict and state["group"] is None and not state["is_vf"] and not state["is_bridge"]:
            entries[state["address"]]["slot"] = True
    problems = []
    if include_group:
        for address in sorted(entries):
            if entries[address]["role"] != "selected":
                continue
            for member in _planned_members(entries[address], root):
                if member["address"] in entries or member["is_bridge"]:
                    continue
                if not member["pci"]:
                    if not driver_allows_vfio(member["driver"]):
                        problems.append("%s in IOMMU group %s is not a PCI function and is bound to %s; it "
                                        "cannot be given to vfio-pci, so the group cannot be passed through"
                                        % (member["address"], entries[address]["state"]["group"],
                                           member["driver"]))
                    continue
                if member["driver"] is not None and driver_allows_vfio(member["driver"]) \
                        and not is_vfio_driver(member["driver"]):
                    continue
                state = device_state(member["address"], root)
                # A member already on a vfio driver stays there (and is reported, and persisted).
                target = state["driver"] if is_vfio_driver(state["driver"]) else \
                    target_driver(state["address"], driver, root, release, aliases)
                entries[state["address"]] = _step(state, target, "group", "bind")
                entries[state["address"]]["group_of"] = address
                if entries[address].get("slot"):
                    entries[state["address"]].update(slot=True, slot_of=address)
    pci_aliases = None
    for step in _ordered(entries.values()):
        if not is_vfio_driver(step["before"]):
            continue
        existing = read_record(step["address"], root)
        if existing is not None:
            if existing["origin"] == INFERRED:
                step["record"] = read_text(root, record_path(step["address"]))
            continue
        claims = find_claims(step["state"], root)
        if claims:
            if pci_aliases is None:
                pci_aliases = read_pci_aliases(root, release)
            step["record"] = inferred_record_text(step["state"], step["target"], claims, root, release, pci_aliases)
    base_allowed = list(allowed_drivers)
    for step in _ordered(entries.values()):
        if step["before"] == step["target"]:
            step["action"] = "none"
            continue
        allowed = base_allowed + [d for d in [step["target"]] if d not in base_allowed]
        if step["role"] == "group":
            allowed += [d for d in allowed_group_drivers if d not in allowed]
        problems.extend(_bind_problems(step, allowed, root, force_boot_vga))
    if not include_group:
        seen = set()
        for step in _ordered(entries.values()):
            group = step["state"]["group"]
            if step.get("slot"):
                slot = step["address"].rsplit(".", 1)[0]
                if slot in seen:
                    continue
                seen.add(slot)
                blockers = [m for m in slot_siblings(step["address"], root)
                            if m["address"] not in entries and not m["is_bridge"] and not driver_allows_vfio(m["driver"])]
                if blockers:
                    listed = ", ".join("%s is bound to %s" % (b["address"], b["driver"]) for b in blockers)
                    problems.append("the PCI slot of %s, whose functions will most likely share its IOMMU group "
                                    "once the IOMMU is on, would not be viable for passthrough: %s; set "
                                    "include_group=true to bind the other functions of the slot too"
                                    % (step["address"], listed))
                continue
            if group is None or group in seen or step["state"]["is_bridge"]:
                continue
            seen.add(group)
            blockers = [b for b in group_viability(group, root)["blockers"] if b["address"] not in entries]
            if blockers:
                listed = ", ".join("%s is bound to %s" % (b["address"], b["driver"]) for b in blockers)
                problems.append("IOMMU group %d of %s is not viable for passthrough: %s; set include_group=true "
                                "to bind the other functions of the group too"
                                % (group, step["address"], listed))
    if problems:
        raise VfioError("refusing to change anything: " + "; ".join(problems))
    ordered = _ordered(entries.values())
    return {"steps": [s for s in ordered if s["action"] != "none"], "devices": ordered}


def _no_host_driver(modules, loaded):
    if not modules:
        return "the modules.alias of the running kernel names no host driver for it"
    if not loaded:
        return "none of its host drivers (%s, from modules.alias) is loaded" % ", ".join(modules)
    return "more than one host driver for it is loaded (%s), so which one it had is not known" % ", ".join(loaded)


def plan_unbind(addresses, root="/", include_group=False, remove_claims=False, release=None):
    """Decide how to give ``addresses`` back to their host drivers (``state=absent``).

    A function needs work when it is on a vfio driver, still carries a vfio ``driver_override``, or
    has a record or a udev rule of this module. With ``include_group`` the other functions of its
    IOMMU group that are on a vfio driver are restored too. Raises VfioError listing holders of the
    VFIO device nodes; nothing is written here.

    A function goes back to the driver its record names. Without a record, when it has to be bound again, the
    one loaded host driver that modules.alias gives for its ``modalias`` (:func:`host_driver`) is bound
    explicitly; only when there is none (or more than one) is the kernel left to probe one (``probe``).

    A function the host claims for vfio-pci outside this module (:func:`find_claims`) is refused, unless
    ``remove_claims``: then the plan also holds ``claim_files`` and ``cmdline_claims`` (:func:`claim_changes`)
    for every function considered. A function claimed on the kernel command line that has no host driver to
    bind now is not probed (the probe would give it straight back to vfio-pci): it is left on no driver until
    the boot without the claim, and its step's ``until_boot`` lists the host modules modules.alias gives for it
    (the kernel's choice at that boot; empty when none).
    """
    entries = {}
    for address in addresses:
        state = device_state(address, root)
        entries[state["address"]] = _step(state, None, "selected", "restore")
    if include_group:
        for address in sorted(entries):
            if entries[address]["role"] != "selected":
                continue
            for member in _group_members(entries[address]["state"], root):
                if member["address"] in entries or member["is_bridge"] or not member["pci"]:
                    continue
                if is_vfio_driver(member["driver"]) or read_record(member["address"], root) is not None:
                    state = device_state(member["address"], root)
                    entries[state["address"]] = _step(state, None, "group", "restore")
    problems = []
    claimed = []
    aliases = None
    for step in _ordered(entries.values()):
        state = step["state"]
        addr = state["address"]
        claims = find_claims(state, root)
        if remove_claims and claims:
            claimed.append(state)
        record = read_record(addr, root)
        inferred = record is not None and record["origin"] == INFERRED
        on_vfio = is_vfio_driver(state["driver"])
        override_set = state["override"] is not None and is_vfio_driver(state["override"])
        restore_to = record["driver"] if record and not inferred else None
        if not (on_vfio or override_set or (record and not inferred and state["driver"] != restore_to)):
            step["action"] = "none"
            continue
        step["restore_override"] = record["driver_override"] if record else None
        step["probe"] = record is None or inferred
        if (record is None or inferred) and (on_vfio or state["driver"] is None):
            if aliases is None:
                aliases = read_pci_aliases(root, release)
            restore_to, modules, loaded = host_driver(addr, root, release, aliases)
            if inferred:
                # The driver recorded at the preparation is bound when it is loaded now; the running kernel's
                # modules.alias is asked otherwise, and its modules (or the recorded ones) are what the boot gets.
                if record["driver"] and not is_vfio_driver(record["driver"]) and driver_loaded(record["driver"], root):
                    restore_to = record["driver"]
                modules = modules or record["host_modules"]
            step["probe"] = restore_to is None
            step["no_host_driver"] = None if restore_to else _no_host_driver(modules, loaded)
            step["host_modules"] = modules
        step["restore_to"] = restore_to
        if on_vfio:
            busy = holders_problem(state, root)
            if busy:
                problems.append(busy)
        if not claims:
            continue
        if not remove_claims:
            problems.append(claims_problem(state, root))
            continue
        on_cmdline = [c["entry"] for c in claims if c["kind"] == "cmdline"]
        if on_cmdline and step["probe"] and step.get("no_host_driver"):
            # No host driver to bind now, and the kernel's probe would give it straight back to vfio-pci while
            # vfio-pci.ids is on the running command line: it is left on no driver until the boot without the
            # claim (cmdline_claims), when the kernel probes the driver modules.alias gives (if any, and not
            # blacklisted).
            step["probe"] = False
            step["until_boot"] = step["host_modules"]
    if problems:
        raise VfioError("refusing to change anything: " + "; ".join(problems))
    ordered = _ordered(entries.values())
    plan = {"steps": [s for s in ordered if s["action"] != "none"], "devices": ordered}
    if remove_claims:
        plan["claim_files"], plan["cmdline_claims"] = claim_changes(claimed, root)
    return plan


def drivers_to_load(plan, root="/"):
    """The vfio drivers the plan binds to that are not registered yet, sorted."""
    return sorted({s["target"] for s in plan["steps"] if s["action"] == "bind" and not driver_loaded(s["target"], root)})


# ---------------------------------------------------------------------------------------------
# Applying
# ---------------------------------------------------------------------------------------------

def _dev(root, address, attr):
    return host_path(root, "/sys/bus/pci/devices/%s/%s" % (address, attr))


def _unbind(address, driver, root):
    write_attr(host_path(root, "%s/%s/unbind" % (PCI_DRIVERS, driver)), address)


def _set_override(address, value, root):
    write_attr(_dev(root, address, "driver_override"), value if value else "\n")


def _bind(address, driver, root):
    write_attr(host_path(root, "%s/%s/bind" % (PCI_DRIVERS, driver)), address)


def _probe(address, root):
    write_attr(host_path(root, DRIVERS_PROBE), address)


def _expect_driver(address, expected, root, timeout):
    found = wait_until(lambda: current_driver(address, root) == expected, timeout)
    if not found:
        raise VfioError("%s is bound to %s after the change, not %s"
                        % (address, driver_label(current_driver(address, root)), driver_label(expected)))


def bind_one(step, root="/", timeout=10):
    """Unbind (if bound), set ``driver_override``, bind to the target, and verify by reading back."""
    addr = step["address"]
    target = step["target"]
    driver = current_driver(addr, root)
    if driver is not None and driver != target:
        _unbind(addr, driver, root)
    _set_override(addr, target, root)
    if current_driver(addr, root) != target:
        _bind(addr, target, root)
    _expect_driver(addr, target, root, timeout)
    group = step["state"]["group"]
    if group is not None:
        node = host_path(root, vfio_group_node(group))
        if not wait_until(lambda: os.path.exists(node), timeout):
            raise VfioError("%s is bound to %s but %s did not appear" % (addr, target, vfio_group_node(group)))


def restore_one(step, root="/", timeout=10):
    """Give a function back to its recorded driver (or let the kernel probe one) and verify."""
    addr = step["address"]
    driver = current_driver(addr, root)
    if driver is not None and is_vfio_driver(driver):
        _unbind(addr, driver, root)
    _set_override(addr, step.get("restore_override"), root)
    wanted = step["restore_to"]
    if current_driver(addr, root) is None:
        if wanted is not None and driver_loaded(wanted, root):
            _bind(addr, wanted, root)
        elif wanted is not None or step.get("probe"):
            _probe(addr, root)
    if wanted is not None:
        _expect_driver(addr, wanted, root, timeout)
    elif is_vfio_driver(current_driver(addr, root)):
        raise VfioError("%s is still bound to %s after the change" % (addr, current_driver(addr, root)))


def undo_one(step, root="/", timeout=10):
    """Put a function back on the driver and ``driver_override`` it had before this run; return the driver."""
    addr = step["address"]
    before = step["before"]
    driver = current_driver(addr, root)
    if driver is not None and driver != before:
        _unbind(addr, driver, root)
    _set_override(addr, step["before_override"], root)
    if before is not None and current_driver(addr, root) != before:
        _bind(addr, before, root)
    _expect_driver(addr, before, root, timeout)
    return before


def rollback(done, root="/", timeout=10):
    """Undo ``done`` steps in reverse order, carrying on past errors; return one line per step."""
    lines = []
    for step in reversed(done):
        try:
            driver = undo_one(step, root, timeout)
            lines.append("%s back on %s" % (step["address"], driver_label(driver)))
        except Exception as exc:  # pylint: disable=broad-exception-caught
            # Carry on past any error: the other functions must still go back.
            lines.append("%s NOT restored: %s" % (step["address"], error_text(exc)))
    return lines


def describe_rollback(lines):
    if not lines:
        return "nothing had been changed"
    return "rolled back: " + "; ".join(lines)


def apply_steps(steps, root="/", timeout=10):
    """Run every step in order; on a failure roll back all steps started so far and raise VfioError.

    Any exception counts as a failure (a bug must not leave functions on the wrong driver).
    """
    done = []
    for step in steps:
        done.append(step)
        try:
            if step["action"] == "bind":
                bind_one(step, root, timeout)
            else:
                restore_one(step, root, timeout)
        except Exception as exc:  # pylint: disable=broad-exception-caught
            what = ("binding %s to %s" % (step["address"], step["target"]) if step["action"] == "bind"
                    else "restoring %s" % step["address"])
            lines = rollback(done, root, timeout)
            reason = error_text(exc)
            raise VfioError("%s failed: %s; %s" % (what, reason, describe_rollback(lines)), rollback=lines)
    return done
