# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: the readiness report of the GPU nodes, as a table for a terminal and as a document for files."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpuops.sandbox.plugins.filter.host_checks import GPUS_CHECK

# Column names and the widest each may get (a longer host name is cut, and marked with ~).
COLUMNS = (("HOST", 32), ("TYPE", 14), ("READY", 6), ("VFIO", 4), ("MDEVS", 5))
# The narrowest table: a 12-column host, the other columns at their widest, a 16-column detail, 2 spaces between.
MIN_WIDTH = 12 + sum(cap for name, cap in COLUMNS[1:]) + 2 * len(COLUMNS) + 16


def _managed(report):
    """False for a node whose host another tool prepares (gpuops_host_managed: false): nothing of it is checked here."""
    return report.get("managed") is not False


def _ready(report):
    if not _managed(report):
        return "-"
    if report.get("ready"):
        return "yes"
    return "reboot" if report.get("reboot_pending") else "NO"


def _vfio(report):
    """The vfio_probe verdict: yes, busy (in use by a VM), NO, or - (nothing handed to VMs, or not probed)."""
    probe = report.get("vfio_probe")
    return probe.get("verdict", "-") if isinstance(probe, Mapping) else "-"


def _serving(report):
    """What serves a node's GPUs beyond their drivers: the NVIDIA driver's source, a container node's sharing."""
    extra = []
    if report.get("driver"):
        version = " %s" % (report["driver_version"],) if report.get("driver_version") else ""
        extra.append("(driver: %s%s)" % (report["driver"], version))
    if report.get("mig_config"):
        extra.append("MIG %s" % report["mig_config"])
    if report.get("device_plugin_config"):
        extra.append("plugin %s" % report["device_plugin_config"])
    return extra


# How a report writes the driver of a function bound to none (the template's rendering of null, or of a fact left out).
_NO_DRIVER = ("None", "none", "")
NO_DRIVER = "(no driver)"
# Kept on one line by the wrapping of the detail column: its space is this character until the lines are made.
_KEEP = "\x1f"


def _gpu(entry):
    """One "address=driver" of a report, as a person reads it: PCI domain 0000 left out ("65:00.0=nvidia" reads as
    well and keeps a narrow column to one GPU per line), and "(no driver)" for a function bound to none."""
    text = str(entry)
    address, sep, driver = text.rpartition("=")
    if sep and driver in _NO_DRIVER:
        text = address + "=" + NO_DRIVER.replace(" ", _KEEP)
    return text[5:] if text.startswith("0000:") else text


def _gpus(report):
    """The GPUs and their drivers."""
    return " ".join(_gpu(g) for g in report.get("gpus") or [])


def _detail(report):
    if not _managed(report):
        gpus = _gpus(report)
        return " ".join(["host managed elsewhere:"] + ([gpus] if gpus else []) + _serving(report))
    failed = [c.get("check", "?") for c in report.get("checks") or [] if not c.get("ok")]
    if failed:
        return "failed: " + ", ".join(failed)
    if report.get("reboot_pending"):
        return "reboot pending"
    gpus = _gpus(report)
    if gpus:
        return " ".join([gpus] + _serving(report))
    allowed = any(c.get("check") == GPUS_CHECK and c.get("ok") for c in report.get("checks") or [])
    return "no GPU found, allowed by the inventory" if allowed else "no GPU found"


def _rows(reports, hosts):
    if not isinstance(reports, list) or not all(isinstance(r, Mapping) for r in reports):
        raise AnsibleFilterError("readiness_table expects a list of host_verify_report dicts, got %r" % (reports,))
    if not isinstance(hosts, list):
        raise AnsibleFilterError("readiness_table: hosts must be a list of inventory names, got %r" % (hosts,))
    by_host = dict((r.get("host"), r) for r in reports)
    rows = []
    for host in list(hosts) + [h for h in by_host if h not in hosts]:
        report = by_host.get(host)
        if report is None:
            rows.append((host, "?", "NO", "-", "-", "not checked: unreachable or failed before the check"))
        else:
            rows.append((host, report.get("workload_type", "?"), _ready(report), _vfio(report),
                         str(report.get("mdevs", "-")), _detail(report)))
    return rows


def readiness_table(reports, hosts, width=100, lines=False):
    width = max(int(width), MIN_WIDTH)
    try:
        as_lines = boolean(lines, strict=True)
    except TypeError:
        raise AnsibleFilterError("readiness_table: lines must be a boolean, got %r" % (lines,))
    rows = _rows(reports, hosts)
    sizes = [max([len(name)] + [len(row[i]) for row in rows]) for i, (name, dummy) in enumerate(COLUMNS)]
    sizes = [min(size, cap) for size, (dummy, cap) in zip(sizes, COLUMNS)]
    fixed = sum(sizes[1:]) + 2 * len(sizes)
    sizes[0] = max(min(sizes[0], width - fixed - 16), 12)  # the host column gives way to a readable DETAIL
    left = sizes[0] + fixed
    detail_width = max(width - left, 16)
    table = ["  ".join(name.ljust(size) for (name, dummy), size in zip(COLUMNS, sizes)) + "  DETAIL"]
    for row in rows:
        cells = [cell if len(cell) <= size else cell[:size - 1] + "~" for cell, size in zip(row[:-1], sizes)]
        wrapped = [line.replace(_KEEP, " ") for line in
                   textwrap.wrap(row[-1], detail_width, break_on_hyphens=False, break_long_words=False)] or [""]
        table.append("  ".join(cell.ljust(size) for cell, size in zip(cells, sizes)) + "  " + wrapped[0])
        table.extend(" " * left + more for more in wrapped[1:])
    ready = sum(1 for row in rows if row[2] == "yes")
    elsewhere = sum(1 for row in rows if row[2] == "-")
    table.append("%d of %d GPU nodes ready" % (ready, len(rows) - elsewhere)
                 + (", %d more managed elsewhere" % elsewhere if elsewhere else ""))
    table = [line.rstrip() for line in table]
    return table if as_lines else "\n".join(table)


class FilterModule:
    """gpuops.sandbox.readiness_table"""

    def filters(self):
        return {"readiness_table": readiness_table}
