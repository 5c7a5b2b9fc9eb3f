# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The readiness table reads at a glance in a terminal; the JSON document carries the same reports."""

from __future__ import annotations

import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.readiness_document import readiness_document
from ansible_collections.gpuops.sandbox.plugins.filter.readiness_table import readiness_table

READY = {"host": "gpu-a", "workload_type": "container", "ready": True, "reboot_pending": False, "iommu_groups": 0,
         "mdevs": 0, "gpus": ["0000:65:00.0=nvidia"], "checks": [{"check": "nouveau", "ok": True}]}
FAILED = {"host": "gpu-b-with-a-rather-long-inventory-name", "workload_type": "vm-passthrough", "ready": False,
          "reboot_pending": False, "iommu_groups": 41, "mdevs": 0, "vfio_probe": {"verdict": "NO", "probed": 8},
          "gpus": ["0000:%02x:00.0=vfio-pci" % n for n in range(8)],
          "checks": [{"check": "gpus on vfio-pci %d" % n, "ok": False} for n in range(12)]}
PENDING = dict(READY, host="gpu-c", workload_type="vm-vgpu", ready=False, reboot_pending=True,
               vfio_probe={"verdict": "busy", "probed": 2})


@pytest.mark.parametrize("width", [72, 100, 160])
def test_no_line_is_wider_than_asked_and_rows_do_not_wrap_mid_row(width):
    table = readiness_table([READY, FAILED, PENDING], ["gpu-a", FAILED["host"], "gpu-c", "gpu-d"], width=width)
    lines = table.split("\n")
    assert max(len(line) for line in lines) <= width, table
    assert lines[0].split() == ["HOST", "TYPE", "READY", "VFIO", "MDEVS", "DETAIL"]
    detail_at = lines[0].index("DETAIL")
    # A row starts at column 0; a continuation line is blank up to the DETAIL column.
    rows = [line for line in lines[1:-1] if not line.startswith(" ")]
    continued = [line for line in lines[1:-1] if line.startswith(" ")]
    host_width = lines[0].index("TYPE") - 2
    shown = FAILED["host"] if len(FAILED["host"]) <= host_width else FAILED["host"][:host_width - 1] + "~"
    assert [row.split()[0] for row in rows] == ["gpu-a", shown, "gpu-c", "gpu-d"]
    assert all(line[:detail_at].strip() == "" for line in continued)
    assert lines[-1] == "1 of 4 GPU nodes ready"


def test_cells_say_what_a_person_needs():
    table = readiness_table([READY, FAILED, PENDING], ["gpu-a", FAILED["host"], "gpu-c", "gpu-d"], width=200)
    rows = {line.split()[0]: line for line in table.split("\n")[1:-1] if not line.startswith(" ")}
    # A container node hands nothing to VMs: no probe, "-".
    assert rows["gpu-a"].split()[1:6] == ["container", "yes", "-", "0", "65:00.0=nvidia"]
    failed = rows[FAILED["host"][:31] + "~"]
    assert failed.split()[1:5] == ["vm-passthrough", "NO", "NO", "0"] and "failed: gpus on vfio-pci 0" in failed
    assert rows["gpu-c"].split()[1:4] == ["vm-vgpu", "reboot", "busy"] and "reboot pending" in rows["gpu-c"]
    assert "not checked: unreachable" in rows["gpu-d"] and rows["gpu-d"].split()[1:3] == ["?", "NO"]


def test_the_document_has_every_node():
    doc = readiness_document([READY, FAILED], ["gpu-a", FAILED["host"], "gpu-d"])
    assert json.loads(json.dumps(doc)) == doc
    assert (doc["ready"], doc["total"], doc["all_ready"]) == (1, 3, False)
    assert [n["host"] for n in doc["nodes"]] == ["gpu-a", FAILED["host"], "gpu-d"]
    assert doc["nodes"][0]["checks"] == READY["checks"] and doc["nodes"][0]["checked"] is True
    assert doc["nodes"][2] == {"host": "gpu-d", "ready": False, "checked": False}
    assert readiness_document([READY], ["gpu-a"])["all_ready"] is True


@pytest.mark.parametrize("reports, hosts", [("x", []), ([1], []), ([READY], "gpu-a")])
def test_bad_input_is_named(reports, hosts):
    with pytest.raises(AnsibleFilterError):
        readiness_table(reports, hosts)
