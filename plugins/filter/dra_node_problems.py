# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import DRA_DRIVER, dra_node_problems


def dra_node_problems_filter(entries, slices, device_classes, driver=DRA_DRIVER, device_types=("vfio", "gpu"),
                             wanted_classes=("vfio.gpu.nvidia.com",)):
    return dra_node_problems(entries, slices, device_classes, driver, tuple(device_types), tuple(wanted_classes))


class FilterModule:
    """DRA nodes against what the DRA driver published."""

    def filters(self):
        return {"dra_node_problems": dra_node_problems_filter}
