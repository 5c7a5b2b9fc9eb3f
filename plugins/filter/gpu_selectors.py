# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import PlanError
from ansible_collections.gpuops.sandbox.plugins.module_utils._host_plan import gpu_selectors as _gpu_selectors


def gpu_selectors(vendor_ids, device_ids=None):
    try:
        return _gpu_selectors(vendor_ids, device_ids)
    except PlanError as exc:
        raise AnsibleFilterError("gpu_selectors: %s" % exc.msg)


class FilterModule:
    """The GPU selectors, by one rule."""

    def filters(self):
        return {"gpu_selectors": gpu_selectors}
