# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The readiness table reads at a glance in a terminal; the JSON document carries the same reports."""

from __future__ import annotations

import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.host_checks import host_checks
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


@pytest.mark.parametrize("width", [67, 69, 72, 100, 160])
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


def test_a_container_node_says_which_driver_serves_it_and_how_it_shares_its_gpus():
    """The real H200 host: a driver installed on the host, seven MIG instances, time-sliced."""
    h200 = dict(READY, host="h200", gpus=["0000:00:06.0=nvidia"], driver="host", driver_version="580.159.04",
                mig_config="all-1g.18gb", device_plugin_config="four-way")
    table = readiness_table([h200, dict(READY, driver="operator")], ["h200", "gpu-a"], width=200)
    rows = {line.split()[0]: line for line in table.split("\n")[1:-1]}
    assert rows["h200"].split()[5:] == ["00:06.0=nvidia", "(driver:", "host", "580.159.04)", "MIG", "all-1g.18gb",
                                        "plugin", "four-way"]
    assert rows["gpu-a"].split()[5:] == ["65:00.0=nvidia", "(driver:", "operator)"]
    document = readiness_document([h200], ["h200"])
    assert (document["nodes"][0]["driver"], document["nodes"][0]["mig_config"]) == ("host", "all-1g.18gb")


def test_a_node_managed_elsewhere_is_listed_apart_from_the_nodes_checked_here():
    """gpuops_host_managed false: READY is -, the detail says so with what the inventory gives, and the totals leave
    it out (one ready node of one checked here, all ready)."""
    other = {"host": "h200", "workload_type": "container", "managed": False, "ready": None, "gpus": ["0000:00:06.0=nvidia"],
             "mdevs": "-", "mig_config": "all-1g.18gb", "checks": []}
    table = readiness_table([READY, other], ["gpu-a", "h200"], width=200).split("\n")
    row = next(line for line in table if line.startswith("h200"))
    assert row.split()[:4] == ["h200", "container", "-", "-"]
    assert row.split()[5:] == ["host", "managed", "elsewhere:", "00:06.0=nvidia", "MIG", "all-1g.18gb"]
    assert table[-1] == "1 of 1 GPU nodes ready, 1 more managed elsewhere"
    doc = readiness_document([READY, other], ["gpu-a", "h200"])
    assert (doc["ready"], doc["total"], doc["all_ready"], doc["managed_elsewhere"]) == (1, 1, True, 1)
    # Without the key (every report host_verify writes) a node counts as checked here.
    assert readiness_document([READY], ["gpu-a"])["managed_elsewhere"] == 0


def test_the_document_has_every_node():
    doc = readiness_document([READY, FAILED], ["gpu-a", FAILED["host"], "gpu-d"])
    assert json.loads(json.dumps(doc)) == doc
    assert (doc["ready"], doc["total"], doc["all_ready"]) == (1, 3, False)
    assert [n["host"] for n in doc["nodes"]] == ["gpu-a", FAILED["host"], "gpu-d"]
    assert doc["nodes"][0]["checks"] == READY["checks"] and doc["nodes"][0]["checked"] is True
    assert doc["nodes"][2] == {"host": "gpu-d", "ready": False, "checked": False}
    assert readiness_document([READY], ["gpu-a"])["all_ready"] is True


@pytest.mark.parametrize("width", [0, 67, 69, 100])
def test_the_lines_are_those_of_the_string(width):
    table = readiness_table([READY, FAILED, PENDING], ["gpu-a", FAILED["host"], "gpu-c", "gpu-d"], width=width)
    lines = readiness_table([READY, FAILED, PENDING], ["gpu-a", FAILED["host"], "gpu-c", "gpu-d"], width=width, lines=True)
    assert isinstance(lines, list) and lines == table.split("\n")
    assert max(len(line) for line in lines) <= max(width, 67)  # 67 at the narrowest
    assert readiness_table([READY], ["gpu-a"], lines="yes") == readiness_table([READY], ["gpu-a"]).split("\n")


def no_gpu(host, optional):
    """The report host_verify makes of a container node without a GPU."""
    checks = host_checks([], {"enabled": False, "group_count": 0, "cmdline": "ro", "cmdline_flags": {}}, {}, "container",
                         gpus_optional=optional, selectors={"vendors": ["10de"], "classes": ["030000"]})
    return {"host": host, "workload_type": "container", "ready": all(c["ok"] for c in checks), "reboot_pending": False,
            "iommu_groups": 0, "mdevs": 0, "gpus": [], "vfio_probe": {"verdict": "-"}, "checks": checks}


def test_a_node_without_a_gpu_is_not_ready_unless_its_inventory_allows_it():
    reports = [no_gpu("gpu-none", False), no_gpu("gpu-allowed", True), dict(READY, host="gpu-old", gpus=[])]
    table = readiness_table(reports, ["gpu-none", "gpu-allowed", "gpu-old"], width=200)
    rows = {line.split()[0]: line for line in table.split("\n")[1:-1]}
    assert rows["gpu-none"].split()[1:3] == ["container", "NO"] and "failed: GPUs matching the selectors" in rows["gpu-none"]
    assert rows["gpu-allowed"].split()[1:3] == ["container", "yes"]
    assert rows["gpu-allowed"].endswith("  no GPU found, allowed by the inventory"), table
    # A report without the check (an older one) says only what it found.
    assert rows["gpu-old"].endswith("  no GPU found"), table
    doc = readiness_document(reports[:2], ["gpu-none", "gpu-allowed"])
    assert (doc["ready"], doc["all_ready"]) == (1, False)
    detail = doc["nodes"][0]["checks"][0]["detail"]
    assert "the GPU selectors (vendors 10de, classes 030000)" in detail and "gpuops_gpus_optional: true" in detail


@pytest.mark.parametrize("reports, hosts, lines", [("x", [], False), ([1], [], False), ([READY], "gpu-a", False),
                                                   ([READY], ["gpu-a"], "maybe")])
def test_bad_input_is_named(reports, hosts, lines):
    with pytest.raises(AnsibleFilterError, match="readiness_table"):
        readiness_table(reports, hosts, lines=lines)


def test_a_function_without_a_driver_says_so():
    """host_verify writes a function bound to no driver as "0000:00:03.0=None" (the template's null); a node whose
    inventory gives a GPU without its driver, as "=none". The table says what that means (issue 43)."""
    lab = dict(READY, host="lab", gpus=["0000:00:03.0=None", "0000:00:04.0=vfio-pci"])
    other = {"host": "other", "workload_type": "container", "managed": False, "ready": None, "mdevs": "-",
             "gpus": ["0000:00:06.0=none"], "checks": []}
    table = readiness_table([lab, other], ["lab", "other"], width=200)
    rows = {line.split()[0]: line for line in table.split("\n")[1:-1]}
    assert rows["lab"].endswith("  00:03.0=(no driver) 00:04.0=vfio-pci"), table
    assert rows["other"].endswith("  host managed elsewhere: 00:06.0=(no driver)"), table
    assert "None" not in table and "=none" not in table
    # Narrow, the column has one GPU a line: "(no driver)" is not cut in two.
    narrow = readiness_table([lab], ["lab"], width=67).split("\n")
    assert [line.strip() for line in narrow[1:-1]][1:] == ["00:04.0=vfio-pci"]
    assert narrow[1].endswith("  00:03.0=(no driver)"), narrow


def test_a_driver_version_that_is_not_text_does_not_break_the_table():
    """A report a play wrote from an inventory's numeric version (550.54) reads as the number."""
    other = {"host": "other", "workload_type": "container", "managed": False, "ready": None, "mdevs": "-",
             "gpus": ["0000:00:06.0=nvidia"], "driver": "host", "driver_version": 550.54, "checks": []}
    row = readiness_table([other], ["other"], width=200).split("\n")[1]
    assert row.split()[5:] == ["host", "managed", "elsewhere:", "00:06.0=nvidia", "(driver:", "host", "550.54)"]
