# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible_collections.gpuops.sandbox.plugins.module_utils._chart_upgrade import crd_apply_plan as _plan
from ansible_collections.gpuops.sandbox.plugins.plugin_utils._filter_input import require_lists_of_mappings


def crd_apply_plan(new_crds, stored_crds, others=None):
    require_lists_of_mappings("crd_apply_plan", "mappings", ("the chart's CRDs", new_crds), ("stored_crds", stored_crds),
                              ("others", others or []))
    return _plan(new_crds, stored_crds, others)


class FilterModule:
    """A chart's CRDs against the cluster's."""

    def filters(self):
        return {"crd_apply_plan": crd_apply_plan}
