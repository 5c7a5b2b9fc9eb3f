# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What keeps the DRA driver from moving a GPU between nvidia and vfio-pci (module dra_blockers).

This file is private to the gpuops.sandbox collection: its interface may change at any time.

The DRA driver's kubelet plugin unbinds a GPU from ``nvidia`` when a VM's claim is prepared; that blocks while
any process holds one of the GPU's ``/dev/nvidia*`` nodes. This file finds those processes (through the one
holder scan, ``_holders.find_holders``), tells what each is (a display server, nvidia-persistenced, DCGM,
dcgm-exporter, the classic device plugin, or something else), where it runs (a systemd service, a user
session, a container or pod) and what to do about it. It reads ``/proc`` under a root given by the caller and
never changes anything itself: stopping units goes through :class:`Systemd`, whose commands the module runs.
Errors are raised as :class:`BlockerError`.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError
from ansible_collections.gpuops.sandbox.plugins.module_utils._holders import find_holders
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path

DISPLAY_MANAGER = "display-manager"
PERSISTENCED = "nvidia-persistenced"
DCGM = "dcgm"
DCGM_EXPORTER = "dcgm-exporter"
DEVICE_PLUGIN = "nvidia-device-plugin"
OTHER = "other"
KINDS = (DISPLAY_MANAGER, PERSISTENCED, DCGM, DCGM_EXPORTER, DEVICE_PLUGIN, OTHER)
# Kinds the caller may allow the module to stop: every known one. A process the module does not recognise is
# never stopped, whatever the caller allows.
STOPPABLE_KINDS = KINDS[:-1]

# Driver roots: the host's own driver, and the GPU Operator's driver container (its /dev seen from the host).
DEFAULT_DRIVER_ROOTS = ("/", "/run/nvidia/driver")

# From this DRA driver version the kubelet plugin turns persistence mode off before the switch and back on
# after it, so nvidia-persistenced may keep running.
PERSISTENCED_HANDLED_FROM = (0, 4, 0)
# From this version DCGM (and dcgm-exporter, with its experimental bind/unbind watch on) let go of a GPU that
# changes driver.
DCGM_RELEASES_FROM = (4, 5, 0)

# A version as people write it: 0.4, 0.4.1, v0.4.1, 0.4.0-rc.1, 4.5.0-1 (a package revision), 4.5.0-4.6.0-ubuntu22.04
# (a dcgm-exporter image tag: DCGM version, then the exporter's). A suffix that starts with a letter after the dash
# (-rc.1, -beta) marks a pre-release, which comes before the version it precedes.
_VERSION_RE = re.compile(r"\A[vV]?([0-9]{1,6})\.([0-9]{1,6})(?:\.([0-9]{1,6}))?(?:([-+~])([0-9A-Za-z][0-9A-Za-z.+~_-]*))?\Z")

# Names of known holders: the process's comm (the kernel keeps 15 characters), the base name of its argv[0], or
# the systemd unit it runs in.
_COMMS = {
    DISPLAY_MANAGER: ("Xorg", "X", "Xwayland", "Xorg.bin", "gdm", "gdm3", "gdm-x-session", "gdm-wayland-ses",
                      "sddm", "sddm-greeter", "lightdm", "xdm", "lxdm", "slim", "gnome-shell", "kwin_wayland",
                      "kwin_x11", "plasmashell"),
    PERSISTENCED: ("nvidia-persiste", "nvidia-persistenced"),
    DCGM: ("nv-hostengine",),
    DCGM_EXPORTER: ("dcgm-exporter",),
    DEVICE_PLUGIN: ("nvidia-device-p", "nvidia-device-plugin"),
}
_UNITS = {
    DISPLAY_MANAGER: ("display-manager.service", "gdm.service", "gdm3.service", "sddm.service", "lightdm.service",
                      "xdm.service", "lxdm.service", "slim.service"),
    PERSISTENCED: ("nvidia-persistenced.service",),
    DCGM: ("nvidia-dcgm.service", "dcgm.service"),
    DCGM_EXPORTER: ("dcgm-exporter.service", "nvidia-dcgm-exporter.service"),
    DEVICE_PLUGIN: ("nvidia-device-plugin.service",),
}
# The GPU Operator's per-node deploy label of each kind it deploys as a pod.
_OPERANDS = {DCGM: "dcgm", DCGM_EXPORTER: "dcgm-exporter", DEVICE_PLUGIN: "device-plugin", PERSISTENCED: "driver"}

# cgroup path components that mean a container runtime or Kubernetes owns the process.
_CONTAINER_RE = re.compile(r"\A(?:kubepods\b.*|pod[0-9a-f_-]{8,}(?:\.slice)?|(?:docker|cri-containerd|crio|libpod|"
                           r"containerd)-[0-9a-f]{12,}\.scope|[0-9a-f]{64})\Z")
_CONTAINER_TOPS = ("docker", "lxc", "kubepods", "machine.slice", "libpod_parent")
# A unit name this module passes to systemctl: what systemd writes in cgroup paths.
UNIT_RE = re.compile(r"\A[A-Za-z0-9_:.\\@-]+\.(service|scope)\Z")

# UnitFileState values that `systemctl disable` changes; the others (static, indirect, generated, transient, masked,
# disabled, empty) are left alone.
ENABLED_STATES = ("enabled", "enabled-runtime", "linked", "linked-runtime")
# ActiveState values of a unit that is not running.
STOPPED_STATES = ("inactive", "failed")


class BlockerError(GpuopsError):
    """A request that cannot be carried out; ``msg`` says why (naming the bad value and what is accepted)."""


# ---------------------------------------------------------------------------------------------
# Input
# ---------------------------------------------------------------------------------------------

def parse_version(option, value):
    """``(major, minor, patch, prerelease)`` of ``value``, or None when it is empty (unknown); BlockerError else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    match = _VERSION_RE.match(value.strip()) if isinstance(value, str) else None
    if not match:
        raise BlockerError("%s %r is not a version; expected MAJOR.MINOR or MAJOR.MINOR.PATCH, optionally with a "
                           "leading v and a suffix (0.4.0, v0.4.1, 0.4.0-rc.1, 4.5.0-1), or empty when unknown; "
                           "nothing was changed" % (option, value))
    prerelease = match.group(4) == "-" and match.group(5)[0].isalpha()
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0), prerelease)


def at_least(version, threshold):
    """True when ``version`` (a :func:`parse_version` result, not None) is ``threshold`` or later."""
    numbers = version[:3]
    if numbers != threshold:
        return numbers > threshold
    return not version[3]


def version_text(version):
    return "%d.%d.%d%s" % (version[0], version[1], version[2], " (pre-release)" if version[3] else "")


def check_driver_roots(values):
    """The driver roots as absolute, normalised paths; BlockerError naming a bad one."""
    roots = []
    for value in values or []:
        if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in "*?[]\n\0"):
            raise BlockerError("driver_roots entry %r is not valid; expected an absolute directory without wildcards, "
                               "such as / (a driver installed on the host) or /run/nvidia/driver (the GPU Operator's "
                               "driver container); nothing was changed" % (value,))
        path = os.path.normpath(value)
        if path not in roots:
            roots.append(path)
    if not roots:
        raise BlockerError("driver_roots must name at least one directory (/ for a driver installed on the host, "
                           "/run/nvidia/driver for the GPU Operator's driver); nothing was changed")
    return roots


def device_patterns(driver_roots):
    """``<root>/dev/nvidia*`` for each driver root (``nvidia-caps/*`` included by the pattern)."""
    return [os.path.join(root, "dev", "nvidia*") for root in driver_roots]


# ---------------------------------------------------------------------------------------------
# Where a process runs
# ---------------------------------------------------------------------------------------------

def read_cgroup(pid, root="/"):
    """The cgroup path of ``pid``: the unified (cgroup v2) line of ``/proc/<pid>/cgroup``, else the
    ``name=systemd`` line of cgroup v1, else the first line with a path; None when unreadable."""
    try:
        with open(host_path(root, "/proc/%d/cgroup" % pid), "r", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except (IOError, OSError):
        return None
    entries = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            entries.append((parts[0], parts[1], parts[2]))
    for wanted in (lambda e: e[0] == "0" and e[1] == "", lambda e: e[1] == "name=systemd", lambda e: True):
        for entry in entries:
            if wanted(entry):
                return entry[2]
    return None


def placement(cgroup):
    """Where a process with cgroup path ``cgroup`` runs: ``{"unit", "where"}``.

    ``where`` is ``container`` (a Kubernetes pod or a container runtime's cgroup; ``unit`` is then None),
    ``system`` (a service or scope of the system manager), ``user`` (a login session or a user manager's
    unit) or ``unknown`` (no cgroup could be read, or none of these).
    """
    if not cgroup:
        return {"unit": None, "where": "unknown"}
    parts = [p for p in cgroup.split("/") if p]
    if parts and (parts[0] in _CONTAINER_TOPS or any(_CONTAINER_RE.match(p) for p in parts)):
        return {"unit": None, "where": "container"}
    units = [p for p in parts if UNIT_RE.match(p)]
    if not units:
        return {"unit": None, "where": "unknown"}
    if parts[0] == "user.slice":
        return {"unit": units[-1], "where": "user"}
    # The outermost unit: a service that delegates sub-cgroups (Delegate=yes) keeps its name at its top.
    return {"unit": units[0], "where": "system"}


def classify(comm, cmdline, unit):
    """The kind of a holder from its unit name, comm or argv[0] base name (see KINDS)."""
    argv0 = os.path.basename((cmdline or "").split(" ", 1)[0]) if cmdline else ""
    for kind in STOPPABLE_KINDS:
        if unit and unit in _UNITS[kind]:
            return kind
    for kind in STOPPABLE_KINDS:
        if comm in _COMMS[kind] or argv0 in _COMMS[kind]:
            return kind
    return OTHER


# ---------------------------------------------------------------------------------------------
# Scan and assessment
# ---------------------------------------------------------------------------------------------

def scan(driver_roots, root="/"):
    """The processes holding NVIDIA device nodes under ``driver_roots``, one entry per process, sorted by pid:
    ``{"pid", "comm", "cmdline", "paths", "cgroup", "unit", "where", "kind"}``."""
    by_pid = {}
    for holder in find_holders([], root, patterns=device_patterns(driver_roots)):
        entry = by_pid.get(holder["pid"])
        if entry is None:
            cgroup = read_cgroup(holder["pid"], root)
            where = placement(cgroup)
            entry = by_pid[holder["pid"]] = {
                "pid": holder["pid"], "comm": holder["comm"], "cmdline": holder["cmdline"], "paths": [],
                "cgroup": cgroup, "unit": where["unit"], "where": where["where"],
                "kind": classify(holder["comm"], holder["cmdline"], where["unit"]),
            }
        if holder["device"] not in entry["paths"]:
            entry["paths"].append(holder["device"])
    return [by_pid[pid] for pid in sorted(by_pid)]


def is_stoppable(holder):
    """Whether the module could stop the holder: a known kind running in a system service (never a container,
    a login session, a scope or a process outside any unit)."""
    return (holder["kind"] != OTHER and holder["where"] == "system" and bool(holder["unit"])
            and holder["unit"].endswith(".service"))


def _deploy_label(kind):
    return "nvidia.com/gpu.deploy.%s=false" % _OPERANDS[kind]


def remedy(holder, versions):
    """What to do about one blocker, in words for the person running the play."""
    kind, unit, where = holder["kind"], holder["unit"], holder["where"]
    in_unit = "stop and disable %s (systemctl disable --now %s)" % (unit, unit) if unit and where == "system" else None
    if kind == DISPLAY_MANAGER:
        fix = in_unit or ("stop the display manager that started it (the unit display-manager.service points at)"
                          if where == "user" else "end the graphical session that runs it")
        return ("A graphical session keeps the GPU open and must not run on a DRA node: %s and make the node boot "
                "without one (systemctl set-default multi-user.target)." % fix)
    if kind == DEVICE_PLUGIN:
        return ("The DRA driver hands out this node's GPUs to containers and VMs alike, so the classic device plugin "
                "must not run here: %s." % (
                    "keep its pods off the node (GPU Operator: node label %s; otherwise a node selector or taint on "
                    "its DaemonSet)" % _deploy_label(kind) if where == "container" else in_unit or "stop it"))
    if kind == PERSISTENCED:
        known = versions.get("dra_driver_version")
        why = ("DRA driver %s does not switch persistence mode off before moving a GPU" % version_text(known)
               if known else "the DRA driver's version is not known (dra_driver_version), so it may not switch "
               "persistence mode off before moving a GPU")
        fix = ("the daemon runs in the GPU Operator's driver container: upgrade the DRA driver"
               if where == "container" else in_unit or "stop the daemon")
        return ("%s; %s, or run DRA driver 0.4.0 or later (which handles persistence mode itself) and say so in "
                "dra_driver_version." % (why[0].upper() + why[1:], fix))
    if kind in (DCGM, DCGM_EXPORTER):
        name = "DCGM's host engine" if kind == DCGM else "dcgm-exporter"
        option = "dcgm_version" if kind == DCGM else "dcgm_exporter_version"
        known = versions.get(option)
        age = ("version %s does not let go of a GPU that changes driver" % version_text(known) if known
               else "its version is not known (%s), so it may not let go of a GPU that changes driver" % option)
        fix = ("keep it off the node (GPU Operator: node label %s)" % _deploy_label(kind) if where == "container"
               else in_unit or "stop it")
        return "%s holds the GPU and %s; better disabled on DRA nodes: %s." % (name, age, fix)
    return ("A process this module does not recognise holds the GPU; it must close it (stop it or move its work to "
            "another node) before a VM can claim the GPU. It is never stopped by this module.")


def assess(holders, versions):
    """Split ``holders`` (see :func:`scan`) into ``(blockers, tolerated, warnings)``.

    ``versions``: :func:`parse_version` results under ``dra_driver_version``, ``dcgm_version`` and
    ``dcgm_exporter_version`` (None: unknown). nvidia-persistenced is tolerated from DRA driver 0.4.0, DCGM and
    dcgm-exporter from 4.5.0 (with a warning); everything else holding a node is a blocker.
    """
    blockers, tolerated, warnings = [], [], []
    for holder in holders:
        item = {
            "kind": holder["kind"], "pid": holder["pid"], "comm": holder["comm"], "cmdline": holder["cmdline"],
            "unit": holder["unit"], "where": holder["where"], "paths": list(holder["paths"]),
        }
        who = "%s (pid %d%s)" % (holder["kind"], holder["pid"], ", %s" % holder["unit"] if holder["unit"] else "")
        if holder["kind"] == PERSISTENCED and versions.get("dra_driver_version") and \
                at_least(versions["dra_driver_version"], PERSISTENCED_HANDLED_FROM):
            item["reason"] = ("DRA driver %s switches persistence mode off and on around the move itself"
                              % version_text(versions["dra_driver_version"]))
            tolerated.append(item)
            continue
        option = {DCGM: "dcgm_version", DCGM_EXPORTER: "dcgm_exporter_version"}.get(holder["kind"])
        if option and versions.get(option) and at_least(versions[option], DCGM_RELEASES_FROM):
            item["reason"] = "%s %s can let go of a GPU that changes driver" % (
                holder["kind"], version_text(versions[option]))
            tolerated.append(item)
            if holder["kind"] == DCGM:
                warnings.append("%s holds %s: DCGM %s can release a GPU when it changes driver, so it is not counted "
                                "as a blocker; disabling it on DRA nodes remains the safer choice"
                                % (who, ", ".join(holder["paths"]), version_text(versions[option])))
            else:
                warnings.append("%s holds %s: dcgm-exporter %s lets go of a GPU that changes driver only with its "
                                "experimental bind/unbind watch on (DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH=true), "
                                "so it is not counted as a blocker; check that setting, or disable it on DRA nodes"
                                % (who, ", ".join(holder["paths"]), version_text(versions[option])))
            continue
        item["remedy"] = remedy(holder, versions)
        item["stoppable"] = is_stoppable(holder)
        blockers.append(item)
    return blockers, tolerated, warnings


def plan_stops(blockers, allowed):
    """``(units, remaining)``: the units to stop (each once, in blocker order) and the blockers that stay.

    A blocker goes when it is stoppable and its kind is in ``allowed``; every other one remains.
    """
    units, remaining = [], []
    for blocker in blockers:
        if blocker["stoppable"] and blocker["kind"] in allowed:
            if blocker["unit"] not in units:
                units.append(blocker["unit"])
        else:
            remaining.append(blocker)
    return units, remaining


def describe(blocker):
    """One line naming a blocker and its remedy."""
    where = {"container": "in a container", "user": "in the user unit %s" % blocker["unit"],
             "system": "in %s" % blocker["unit"], "unknown": "outside any unit"}[blocker["where"]]
    return "%s pid %d (%s) %s holds %s: %s" % (
        blocker["kind"], blocker["pid"], blocker["cmdline"] or blocker["comm"] or "?", where,
        ", ".join(blocker["paths"]), blocker["remedy"])


# ---------------------------------------------------------------------------------------------
# systemd
# ---------------------------------------------------------------------------------------------

def parse_show(text):
    """The ``Key=Value`` lines of ``systemctl show`` as a dict."""
    values = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


class Systemd:
    """The systemctl commands of the module. ``run(argv)`` returns ``(rc, stdout, stderr)``."""

    PROPERTIES = "LoadState,ActiveState,UnitFileState"

    def __init__(self, systemctl, run):
        self.systemctl = systemctl
        self.run = run

    def _call(self, *args):
        argv = [self.systemctl] + list(args)
        rc, out, err = self.run(argv)
        if rc != 0:
            raise BlockerError("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or out).strip()[-1000:] or
                                                          "(no output)"))
        return out

    def state(self, unit):
        """``{"active", "file", "load"}`` of ``unit`` (ActiveState, UnitFileState, LoadState)."""
        values = parse_show(self._call("show", "--property=" + self.PROPERTIES, unit))
        return {"active": values.get("ActiveState", ""), "file": values.get("UnitFileState", ""),
                "load": values.get("LoadState", "")}

    def stop(self, unit):
        self._call("stop", unit)

    def start(self, unit):
        self._call("start", unit)

    def disable(self, unit):
        self._call("disable", unit)

    def enable(self, unit):
        self._call("enable", unit)


def state_line(unit, state):
    return "%s: %s, %s\n" % (unit, state["active"] or "unknown", state["file"] or "no unit file state")


def after_state(state):
    """The state a unit is expected in once stopped and disabled."""
    return {"active": "inactive", "load": state["load"],
            "file": "disabled" if state["file"] in ENABLED_STATES else state["file"]}


def rollback(systemd, done):
    """Put the units of ``done`` (``[(unit, stopped, disabled)]``) back, newest first, carrying on past errors;
    return one line per unit."""
    lines = []
    for unit, stopped, disabled in reversed(done):
        steps = []
        try:
            if disabled:
                systemd.enable(unit)
                steps.append("enabled")
            if stopped:
                systemd.start(unit)
                steps.append("started")
            lines.append("%s %s again" % (unit, " and ".join(steps)) if steps else "%s left as it was" % unit)
        except BlockerError as exc:
            lines.append("%s not put back (%s): %s" % (unit, " and ".join(steps) + " only" if steps else "nothing done",
                                                       exc.msg))
    return lines


def apply_stops(systemd, units, states):
    """Stop and disable each unit, reading back that it is inactive and disabled; on a failure put back every unit
    already changed (this one included) and raise BlockerError with both outcomes (``rollback`` holds the lines).

    Returns ``(done, warnings)``.
    """
    done = []
    warnings = []
    for unit in units:
        stopped = disabled = False
        try:
            systemd.stop(unit)
            stopped = True
            if states[unit]["file"] in ENABLED_STATES:
                systemd.disable(unit)
                disabled = True
            else:
                warnings.append("%s was stopped; its unit file state is %s, which systemctl disable does not change, "
                                "so something else may start it again" % (unit, states[unit]["file"] or "empty"))
            now = systemd.state(unit)
            if now["active"] not in STOPPED_STATES or now["file"] in ENABLED_STATES:
                raise BlockerError("%s is %s and %s after systemctl stop and disable (inactive and not enabled "
                                   "expected)" % (unit, now["active"] or "in no known state", now["file"] or "-"))
        except BlockerError as exc:
            lines = rollback(systemd, done + ([(unit, stopped, disabled)] if stopped or disabled else []))
            raise BlockerError("stopping %s failed: %s; rolled back: %s"
                               % (unit, exc.msg, "; ".join(lines) or "nothing had been changed"), rollback=lines)
        done.append((unit, stopped, disabled))
    return done, warnings
