#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dra_blockers
short_description: Find (and, when allowed, stop) what keeps the DRA driver from moving a GPU to vfio-pci
version_added: 1.0.0
description:
  - On a C(dra) node the DRA driver's kubelet plugin moves a GPU from the C(nvidia) driver to C(vfio-pci) when a
    VM's claim is prepared. The move hangs while any process on the host holds one of the C(/dev/nvidia*) nodes
    open. This module finds those processes and says what to do about each.
  - Scans every process's open descriptors for C(<root>/dev/nvidia*) under each of O(driver_roots) (the host's own
    driver, and the GPU Operator's driver container seen from the host). The whole host is scanned, not one GPU.
  - Each holder is classified from its systemd unit, its C(comm) or the base name of its C(argv[0]) as
    C(display-manager) (Xorg, Xwayland, gdm, sddm, lightdm and the like), C(nvidia-persistenced), C(dcgm)
    (C(nv-hostengine)), C(dcgm-exporter), C(nvidia-device-plugin) or C(other).
  - Where it runs is read from C(/proc/<pid>/cgroup) - a system service (its unit is named), a login session or
    user unit, or a container or Kubernetes pod. A holder in a container is never stopped here; its remedy is
    cluster-side (for the GPU Operator's operands, the node label C(nvidia.com/gpu.deploy.<operand>=false)).
  - A display manager and the classic device plugin always block. C(nvidia-persistenced) blocks only with a DRA
    driver older than 0.4.0, or of unknown version (O(dra_driver_version)); from 0.4.0 the DRA driver handles
    persistence mode itself. DCGM and dcgm-exporter block unless O(dcgm_version) or O(dcgm_exporter_version) is
    4.5.0 or later, which can let go of a GPU that changes driver; they are then reported in RV(warnings_list).
    Any other holder blocks.
  - With O(stop), the system services of the listed kinds that hold a node are stopped and disabled
    (C(systemctl stop), then C(systemctl disable) when the unit file is enabled), and read back (inactive, not
    enabled). Nothing else is ever stopped, and no process is ever killed. When a unit fails to stop, disable or
    read back, every unit already changed in this run is enabled and started again, and the message says so.
  - Everything is decided before anything is stopped. With O(fail_on_blocker) a blocker that would remain fails
    the module before any unit is stopped, naming each blocker and its remedy.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  driver_roots:
    description:
      - Directories whose C(dev/nvidia*) nodes count - V(/) for a driver installed on the host,
        V(/run/nvidia/driver) for the GPU Operator's driver container.
    type: list
    elements: str
    default: [/, /run/nvidia/driver]
  dra_driver_version:
    description:
      - Version of the DRA driver (its chart), such as V(0.4.1). Empty when unknown, and then
        C(nvidia-persistenced) counts as a blocker.
    type: str
    default: ""
  dcgm_version:
    description:
      - Version of DCGM (C(nv-hostengine)) on the node; from V(4.5.0) it is reported as a warning, not a blocker.
        Empty when unknown.
    type: str
    default: ""
  dcgm_exporter_version:
    description:
      - Version of dcgm-exporter on the node; from V(4.5.0) it is reported as a warning, not a blocker (its
        release of GPUs is an experimental setting that must be turned on). Empty when unknown.
    type: str
    default: ""
  stop:
    description:
      - Kinds of blocker whose system services the module may stop and disable. A kind not listed is never acted
        on; a holder in a container, a login session or outside any service is never stopped, nor is a process
        of kind C(other).
    type: list
    elements: str
    choices: [display-manager, nvidia-persistenced, dcgm, dcgm-exporter, nvidia-device-plugin]
    default: []
  fail_on_blocker:
    description:
      - Fail, before anything is stopped, when a blocker would remain, naming each with its remedy. With
        V(false) the allowed units are stopped and the rest is reported (RV(ok) is false).
    type: bool
    default: true
  command_timeout:
    description:
      - Seconds each systemctl command may take (a stop waits for the service to end).
    type: int
    default: 120
notes:
  - Needs root (other users' descriptors cannot be read).
  - A unit whose file is C(static), C(indirect) or transient cannot be disabled; it is stopped and a warning
    says something may start it again.
extends_documentation_fragment:
  - gpuops.sandbox.attributes
attributes:
  diff_mode:
    support: full
    details: The state of each unit to stop, before and after.
seealso:
  - module: gpuops.sandbox.vfio_bind
  - module: gpuops.sandbox.vfio_probe
"""

EXAMPLES = r"""
- name: Report what would block the DRA driver, failing when something does
  gpuops.sandbox.dra_blockers:
    dra_driver_version: 0.4.1

- name: Stop and disable nvidia-persistenced and DCGM when they hold a GPU
  gpuops.sandbox.dra_blockers:
    dra_driver_version: 0.3.0
    stop: [nvidia-persistenced, dcgm]

- name: Only report, for a readiness check
  gpuops.sandbox.dra_blockers:
    fail_on_blocker: false
  check_mode: true
  register: blockers
"""

RETURN = r"""
blockers:
  description: The holders that keep a GPU from moving to vfio-pci, sorted by pid (as found before any stop).
  returned: always
  type: list
  elements: dict
  contains:
    kind:
      description: >-
        C(display-manager), C(nvidia-persistenced), C(dcgm), C(dcgm-exporter), C(nvidia-device-plugin) or C(other).
      type: str
      sample: nvidia-persistenced
    pid:
      description: Process id.
      type: int
      sample: 1234
    comm:
      description: The process's C(comm) (15 characters at most), or null.
      type: str
      sample: nvidia-persiste
    cmdline:
      description: Its command line, arguments joined by spaces, or null.
      type: str
      sample: /usr/bin/nvidia-persistenced --user nvidia-persistenced
    unit:
      description: The systemd unit it runs in, or null (a container, or no unit).
      type: str
      sample: nvidia-persistenced.service
    where:
      description: C(system) (a system service or scope), C(user) (a login session or user unit), C(container)
        (a container or Kubernetes pod) or C(unknown).
      type: str
      sample: system
    paths:
      description: The device nodes it holds.
      type: list
      elements: str
      sample: [/dev/nvidia0, /dev/nvidiactl]
    remedy:
      description: What to do about it.
      type: str
      sample: "DRA driver 0.3.0 does not switch persistence mode off before moving a GPU; stop and disable ..."
    stoppable:
      description: Whether the module can stop it (a known kind in a system service), if O(stop) allows its kind.
      type: bool
      sample: true
tolerated:
  description: Holders that do not block with the versions given, each with C(kind), C(pid), C(comm), C(cmdline),
    C(unit), C(where), C(paths) and C(reason).
  returned: always
  type: list
  elements: dict
  sample: []
stopped:
  description: The units stopped (in check mode, that would be stopped).
  returned: always
  type: list
  elements: str
  sample: [nvidia-persistenced.service]
warnings_list:
  description: Holders reported without blocking (DCGM, dcgm-exporter 4.5.0 or later) and units that could not be
    disabled.
  returned: always
  type: list
  elements: str
  sample: []
ok:
  description: Whether nothing blocks once the allowed units are stopped.
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils import _dra_blockers as _db
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    check_range,
    create_module,
    run_module,
    run_timed,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import SysfsError

# Host root for everything this module reads. Only unit tests point it elsewhere.
ROOT = "/"
MAX_TIMEOUT = 3600


def build_module():
    return create_module(
        AnsibleModule,
        argument_spec=dict(
            driver_roots=dict(type="list", elements="str", default=list(_db.DEFAULT_DRIVER_ROOTS)),
            dra_driver_version=dict(type="str", default=""),
            dcgm_version=dict(type="str", default=""),
            dcgm_exporter_version=dict(type="str", default=""),
            stop=dict(type="list", elements="str", choices=list(_db.STOPPABLE_KINDS), default=[]),
            fail_on_blocker=dict(type="bool", default=True),
            command_timeout=dict(type="int", default=120),
        ),
        supports_check_mode=True,
    )


def _not_put_back(lines):
    """Whether a rollback left a unit changed (the host is then not as it was)."""
    return any(" not put back " in line for line in lines)


def run(module, root="/"):
    """Scan, decide, stop what is allowed (unless check mode), read back; return the result dict.

    The body of :func:`main` for ``run_module``: it never calls exit_json or fail_json.
    """
    params = module.params
    timeout = check_range("command_timeout", params["command_timeout"], 1, MAX_TIMEOUT)
    versions = dict((name, _db.parse_version(name, params[name]))
                    for name in ("dra_driver_version", "dcgm_version", "dcgm_exporter_version"))
    roots = _db.check_driver_roots(params["driver_roots"])
    try:
        holders = _db.scan(roots, root)
    except (SysfsError, OSError) as exc:
        raise _db.BlockerError("cannot scan the processes for open NVIDIA device nodes: %s; nothing was changed"
                               % exc) from exc
    blockers, tolerated, warnings = _db.assess(holders, versions)
    units, remaining = _db.plan_stops(blockers, params["stop"])

    report = {"blockers": blockers, "tolerated": tolerated, "warnings_list": warnings, "ok": not remaining}
    if remaining and params["fail_on_blocker"]:
        raise _db.BlockerError("%d process(es) hold NVIDIA device nodes, so the DRA driver cannot move a GPU to "
                               "vfio-pci: %s; nothing was changed"
                               % (len(remaining), "; ".join(_db.describe(b) for b in remaining)),
                               stopped=[], **report)

    systemd = None
    states = {}
    if units:
        systemctl = module.get_bin_path("systemctl")
        if not systemctl:
            raise _db.BlockerError("systemctl is needed to stop %s but is not installed; nothing was changed"
                                   % ", ".join(units))
        systemd = _db.Systemd(systemctl, lambda argv: run_timed(module, argv, timeout))
        states = dict((unit, systemd.state(unit)) for unit in units)

    result = {
        "changed": bool(units),
        "blockers": blockers,
        "tolerated": tolerated,
        "stopped": list(units),
        "warnings_list": warnings,
        "ok": not remaining,
    }
    if module._diff:
        result["diff"] = {"before_header": "units", "after_header": "units",
                          "before": "".join(_db.state_line(u, states[u]) for u in units),
                          "after": "".join(_db.state_line(u, _db.after_state(states[u])) for u in units)}
    if units and not module.check_mode:
        try:
            done, stop_warnings = _db.apply_stops(systemd, units, states)
        except _db.BlockerError as exc:
            lines = exc.extra.get("rollback", [])
            raise _db.BlockerError(exc.msg, rollback=lines, changed=_not_put_back(lines), stopped=[],
                                   **report) from exc
        warnings.extend(stop_warnings)
        # The stop is proved by the nodes being free: a process left holding one (it escaped its unit's cgroup)
        # is a failure, and the units go back as they were.
        stopped_pids = set(b["pid"] for b in blockers if b["unit"] in units)
        still = [h for h in _db.scan(roots, root) if h["pid"] in stopped_pids]
        if still:
            lines = _db.rollback(systemd, done)
            raise _db.BlockerError(
                "the units were stopped but %s still hold(s) NVIDIA device nodes; rolled back: %s"
                % (", ".join("pid %d (%s)" % (h["pid"], h["comm"] or "?") for h in still), "; ".join(lines)),
                rollback=lines, changed=_not_put_back(lines), stopped=[], **report)
    for warning in warnings:
        module.warn(warning)
    return result


def main():
    run_module(build_module, run, root=ROOT)


if __name__ == "__main__":
    main()
