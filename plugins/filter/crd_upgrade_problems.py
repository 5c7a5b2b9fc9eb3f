# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible_collections.gpuops.sandbox.plugins.module_utils._chart_upgrade import schema_problems
from ansible_collections.gpuops.sandbox.plugins.plugin_utils._filter_input import require_lists_of_mappings


def crd_upgrade_problems(new_crds, stored_crds, objects):
    require_lists_of_mappings("crd_upgrade_problems", "objects (mappings)", ("the new CRDs", new_crds),
                              ("stored_crds", stored_crds), ("objects", objects))
    return schema_problems(new_crds, stored_crds, objects)


class FilterModule:
    """New CRDs against the objects stored under the old ones."""

    def filters(self):
        return {"crd_upgrade_problems": crd_upgrade_problems}
