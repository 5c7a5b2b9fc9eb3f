# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpuops.sandbox.plugins.module_utils._inventory_facts import check_facts


def inventory_gpu_facts(hostvars, host, require_gpus=True):
    try:
        require = boolean(require_gpus, strict=True)
    except TypeError:
        raise AnsibleFilterError("inventory_gpu_facts: require_gpus must be a boolean, got %r" % (require_gpus,))
    facts, problems = check_facts(host, hostvars, require_gpus=require)
    return {"facts": facts, "problems": problems}


class FilterModule:
    """gpuops.sandbox.inventory_gpu_facts"""

    def filters(self):
        return {"inventory_gpu_facts": inventory_gpu_facts}
