# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private helpers for SR-IOV physical functions and their virtual functions.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
Every function that touches the filesystem takes the root as an argument (default ``/``) so unit
tests can build a fake sysfs/procfs tree under a temporary directory. Errors are raised as
exceptions (SriovError or SysfsError); only modules turn them into ``fail_json``.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import (
    SysfsError,
    host_path,
    link_name,
    pci_device_dir,
    read_attr,
    write_attr,
    wait_until,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError
from ansible_collections.gpuops.sandbox.plugins.module_utils._holders import vfio_holders
from ansible_collections.gpuops.sandbox.plugins.module_utils._persist import restore_retry_end

VIRTFN_RE = re.compile(r"\Avirtfn([0-9]{1,9})\Z")


class SriovError(GpuopsError):
    """An SR-IOV precondition failed or a change could not be applied or confirmed.

    ``details`` (e.g. ``rollback``) are also result keys of the failure (``extra``).
    """

    def __init__(self, msg, **details):
        super().__init__(msg, **details)
        self.msg = msg
        self.details = details


def _read_int(path, what):
    text = read_attr(path)
    try:
        return int(text, 0)
    except ValueError:
        raise SriovError("%s (%s) holds %r, not an integer" % (what, path, text))


def list_vfs(pf_dir):
    """Return the PCI addresses of the VFs of a PF directory, ordered by VF index."""
    found = []
    try:
        names = os.listdir(pf_dir)
    except OSError:
        return []
    for name in names:
        match = VIRTFN_RE.fullmatch(name)
        if match:
            target = link_name(os.path.join(pf_dir, name))
            if target:
                found.append((int(match.group(1)), target))
    return [address for _index, address in sorted(found)]


def vf_usage(vf_address, root="/"):
    """Return the reasons why a VF is in use (empty list when it is free to be destroyed)."""
    vf_dir = host_path(root, "/sys/bus/pci/devices/" + vf_address)
    reasons = []
    driver = link_name(os.path.join(vf_dir, "driver"))
    if driver == "vfio-pci":
        reasons.append("%s is bound to vfio-pci" % vf_address)
    for pid, command in vfio_holders(vf_dir, root):
        reasons.append("%s: its VFIO group is open by PID %d (%s)" % (vf_address, pid, command))
    current = read_attr(os.path.join(vf_dir, "nvidia", "current_vgpu_type"), default="0")
    if current not in ("", "0"):
        reasons.append("%s carries vGPU type %s" % (vf_address, current))
    try:
        children = sorted(os.listdir(vf_dir))
    except OSError:
        children = []
    mdevs = [name for name in children if os.path.isdir(os.path.join(vf_dir, name, "mdev_type"))]
    if mdevs:
        reasons.append("%s has mediated devices %s" % (vf_address, ", ".join(mdevs)))
    return reasons


def pf_state(pf, root="/"):
    """Read the SR-IOV state of a PF. Raises SysfsError/SriovError on a bad or non-SR-IOV device."""
    pf_dir = pci_device_dir(pf, root)
    address = os.path.basename(pf_dir)
    total_path = os.path.join(pf_dir, "sriov_totalvfs")
    if not os.path.exists(total_path):
        raise SriovError("PCI device %s is not an SR-IOV physical function (no sriov_totalvfs)" % address)
    autoprobe_text = read_attr(os.path.join(pf_dir, "sriov_drivers_autoprobe"), default="")
    return {
        "pf": address,
        "dir": pf_dir,
        "totalvfs": _read_int(total_path, "sriov_totalvfs"),
        "numvfs": _read_int(os.path.join(pf_dir, "sriov_numvfs"), "sriov_numvfs"),
        "driver": link_name(os.path.join(pf_dir, "driver")),
        "autoprobe": None if autoprobe_text == "" else autoprobe_text not in ("0", "n", "N"),
        "vfs": list_vfs(pf_dir),
    }


def plan(state, count, autoprobe=None, force=False, root="/"):
    """Check the request against the PF and return what has to change.

    ``state`` is the dict from pf_state. Returns ``{"numvfs": new or None, "autoprobe": new or None}``
    (None: leave as is). Raises SriovError, without writing anything, when the request is refused.
    """
    address = state["pf"]
    if count < 0:
        raise SriovError("count must be 0 or a positive integer, got %d" % count)
    if count > state["totalvfs"]:
        raise SriovError(
            "cannot enable %d VFs on %s: sriov_totalvfs is %d" % (count, address, state["totalvfs"]))
    changes = {"numvfs": None, "autoprobe": None}
    if autoprobe is not None and state["autoprobe"] is None:
        raise SriovError("%s has no sriov_drivers_autoprobe attribute; cannot set autoprobe" % address)
    if autoprobe is not None and autoprobe != state["autoprobe"]:
        changes["autoprobe"] = autoprobe
    if count == state["numvfs"]:
        return changes
    if not state["driver"]:
        raise SriovError(
            "%s has no driver bound; sriov_numvfs can only be changed while the PF is bound to a driver "
            "that supports SR-IOV" % address)
    if state["numvfs"] and not force:
        busy = []
        for vf in state["vfs"]:
            busy.extend(vf_usage(vf, root))
        if busy:
            raise SriovError(
                "refusing to change the VF count of %s from %d to %d while VFs are in use (%s); stop the "
                "users first or set force=true" % (address, state["numvfs"], count, "; ".join(busy)))
    changes["numvfs"] = count
    return changes


def _write_numvfs(pf_dir, address, driver, count):
    try:
        write_attr(os.path.join(pf_dir, "sriov_numvfs"), str(count))
    except SysfsError as exc:
        hint = ""
        if "No such file" in exc.msg:
            hint = " (driver %s may not support configuring SR-IOV)" % driver
        raise SriovError("setting sriov_numvfs of %s to %d failed: %s%s" % (address, count, exc.msg, hint))


def _confirm_numvfs(pf_dir, address, count, timeout):
    def done():
        try:
            current = int(read_attr(os.path.join(pf_dir, "sriov_numvfs"), default="-1"))
        except ValueError:
            return False
        return current == count and len(list_vfs(pf_dir)) == count

    if not wait_until(done, timeout):
        current = read_attr(os.path.join(pf_dir, "sriov_numvfs"), default="?")
        raise SriovError(
            "wrote %d to sriov_numvfs of %s but read back %s with %d VF links after %ss"
            % (count, address, current, len(list_vfs(pf_dir)), timeout))


def _return_to_numvfs(state, timeout, confirm_zero):
    """Set ``sriov_numvfs`` back to ``state["numvfs"]`` unless it reads so already: through 0 (confirmed only with
    ``confirm_zero``), then the old count, confirmed. Raises SriovError or SysfsError."""
    pf_dir, address, old = state["dir"], state["pf"], state["numvfs"]
    current = int(read_attr(os.path.join(pf_dir, "sriov_numvfs"), default="0") or 0)
    if current != old:
        if current:
            _write_numvfs(pf_dir, address, state["driver"], 0)
            if confirm_zero:
                _confirm_numvfs(pf_dir, address, 0, timeout)
        if old:
            _write_numvfs(pf_dir, address, state["driver"], old)
            _confirm_numvfs(pf_dir, address, old, timeout)


def set_numvfs(state, count, timeout=10):
    """Change the VF count through 0, confirming each step. Restores the old count on failure."""
    pf_dir, address, old = state["dir"], state["pf"], state["numvfs"]
    try:
        if old:
            _write_numvfs(pf_dir, address, state["driver"], 0)
            _confirm_numvfs(pf_dir, address, 0, timeout)
        if count:
            _write_numvfs(pf_dir, address, state["driver"], count)
            _confirm_numvfs(pf_dir, address, count, timeout)
    except SriovError as exc:
        if not old:
            raise
        rollback = "restored sriov_numvfs to %d" % old
        try:
            _return_to_numvfs(state, timeout, confirm_zero=False)
        except (SriovError, SysfsError) as rexc:
            rollback = "restoring sriov_numvfs to %d also failed: %s" % (old, getattr(rexc, "msg", rexc))
        raise SriovError("%s; rollback: %s" % (exc.msg, rollback), rollback=rollback)


def undo_numvfs(state, timeout=10):
    """Put ``sriov_numvfs`` back to ``state["numvfs"]`` (through 0) after this run changed it.

    Returns one line saying what was done, or why it failed; never raises.
    """
    address, old = state["pf"], state["numvfs"]
    try:
        _return_to_numvfs(state, timeout, confirm_zero=True)
        return "sriov_numvfs of %s set back to %d" % (address, old)
    except (SriovError, SysfsError) as exc:
        return "setting sriov_numvfs of %s back to %d failed: %s" % (address, old, exc.msg)
    except (ValueError, OSError) as exc:
        return "setting sriov_numvfs of %s back to %d failed: %s" % (address, old, exc)


def set_autoprobe(state, value):
    """Write sriov_drivers_autoprobe and read it back."""
    path = os.path.join(state["dir"], "sriov_drivers_autoprobe")
    write_attr(path, "1" if value else "0")
    back = read_attr(path, default="")
    if (back not in ("0", "n", "N")) != bool(value):
        raise SriovError("wrote %d to sriov_drivers_autoprobe of %s but read back %r"
                         % (int(bool(value)), state["pf"], back))


# --------------------------------------------------------------------------- VFs at boot

# VFs do not survive a reboot. A PF given with persistent=true is recorded here and a oneshot unit sets
# its VF count again at boot, before the mdev/vGPU restore unit runs (VFs are the vGPU parents on Ampere).
DEFINITIONS_FILE = "/etc/gpuops/sriov-vfs.conf"
RESTORE_SCRIPT = "/usr/local/libexec/gpuops-sriov-restore"
UNIT_NAME = "gpuops-sriov-restore.service"
UNIT_FILE = "/etc/systemd/system/" + UNIT_NAME
WANTS_LINK = "/etc/systemd/system/multi-user.target.wants/" + UNIT_NAME

DEFINITIONS_HEADER = (
    "# Managed by gpuops.sandbox.sriov_vfs; re-applied at boot by %s.\n"
    "# <pf-address> <numvfs> [autoprobe 0|1]\n" % UNIT_NAME)

RESTORE_SCRIPT_TEXT = r"""#!/bin/sh
# Managed by gpuops.sandbox.sriov_vfs: set the SR-IOV VF count of each recorded PF again at boot.
# A PF whose driver is not bound yet is retried a bounded number of times; the count goes through 0.
# With "stop" (at shutdown) the VFs are removed in order before the PF's driver goes away.
conf=${1:-/etc/gpuops/sriov-vfs.conf}
tries=${GPUOPS_SRIOV_TRIES:-30}
status=0
pending=$(grep -Ev '^[[:space:]]*(#|$)' "$conf")
if [ "${2:-start}" = stop ]; then
    echo "$pending" | while read -r pf count autoprobe; do
        [ -n "$pf" ] && [ -w "/sys/bus/pci/devices/$pf/sriov_numvfs" ] || continue
        echo 0 > "/sys/bus/pci/devices/$pf/sriov_numvfs" && echo "stopped: $pf VFs removed"
    done
    exit 0
fi
attempt=0
while [ -n "$pending" ]; do
    attempt=$((attempt + 1))
    retry=""
    while read -r pf count autoprobe; do
        dev=/sys/bus/pci/devices/$pf
        if [ ! -e "$dev/sriov_numvfs" ] || [ ! -e "$dev/driver" ]; then
            retry="$retry$pf $count $autoprobe
"
            continue
        fi
        if [ -n "$autoprobe" ]; then
            echo "$autoprobe" > "$dev/sriov_drivers_autoprobe" || status=1
        fi
        current=$(cat "$dev/sriov_numvfs")
        if [ "$current" != "$count" ]; then
            [ "$current" = 0 ] || echo 0 > "$dev/sriov_numvfs"
            if echo "$count" > "$dev/sriov_numvfs"; then
                echo "ok: $pf $count VFs"
            else
                echo "failed: $pf $count VFs" >&2
                status=1
            fi
        else
            echo "ok: $pf already has $count VFs"
        fi
    done <<END
$pending
END
""" + restore_retry_end("PF or its driver still missing for")

UNIT_TEXT = """[Unit]
Description=Enable the SR-IOV virtual functions recorded by gpuops.sandbox
ConditionPathExists=%(conf)s
After=systemd-modules-load.service systemd-udev-settle.service nvidia-vgpud.service
Before=gpuops-mdev-restore.service nvidia-vgpu-mgr.service libvirtd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh %(script)s %(conf)s
ExecStop=/bin/sh %(script)s %(conf)s stop
TimeoutStartSec=300
TimeoutStopSec=60

[Install]
WantedBy=multi-user.target
""" % {"conf": DEFINITIONS_FILE, "script": RESTORE_SCRIPT}


def parse_definitions(text):
    """Return ``{pf: (count, autoprobe_or_None)}`` from a definitions file."""
    entries = {}
    for line in (text or "").splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#") or len(fields) not in (2, 3):
            continue
        try:
            count = int(fields[1])
        except ValueError:
            continue
        autoprobe = None if len(fields) == 2 else fields[2] == "1"
        entries[fields[0]] = (count, autoprobe)
    return entries


def render_definitions(entries):
    lines = [DEFINITIONS_HEADER]
    for pf in sorted(entries):
        count, autoprobe = entries[pf]
        line = "%s %d" % (pf, count)
        if autoprobe is not None:
            line += " %d" % int(autoprobe)
        lines.append(line + "\n")
    return "".join(lines)


def persistence_wanted(current_text, pf, count, autoprobe):
    """Return ``{path: text_or_None}`` of the boot files after recording ``pf`` (count 0 drops it)."""
    entries = parse_definitions(current_text)
    if count:
        if autoprobe is None and pf in entries:
            # autoprobe not given: the run leaves it as it is, so the record keeps it too.
            autoprobe = entries[pf][1]
        entries[pf] = (count, autoprobe)
    else:
        entries.pop(pf, None)
    if not entries:
        return {DEFINITIONS_FILE: None, RESTORE_SCRIPT: None, UNIT_FILE: None}
    return {DEFINITIONS_FILE: render_definitions(entries), RESTORE_SCRIPT: RESTORE_SCRIPT_TEXT,
            UNIT_FILE: UNIT_TEXT}
