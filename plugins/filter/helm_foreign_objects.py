# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import helm_foreign_objects


class FilterModule:
    """A chart's objects against what the cluster already holds."""

    def filters(self):
        return {"helm_foreign_objects": helm_foreign_objects}
