# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import PlanError, workload_labels


def gpu_node_labels(workload_type, vgpu_config_name=None, vgpu_configs=None):
    try:
        return workload_labels(workload_type, vgpu_config_name or None,
                               None if vgpu_configs is None else list(vgpu_configs))
    except PlanError as exc:
        raise AnsibleFilterError(exc.msg)


class FilterModule:
    """Filters for the cluster side."""

    def filters(self):
        return {"gpu_node_labels": gpu_node_labels}
