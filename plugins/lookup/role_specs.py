# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: role_specs
short_description: The argument specs and defaults of the collection roles that a playbook runs
version_added: 1.0.0
description:
  - Reads each playbook and finds the roles of this collection that it runs, in order of first use,
    from its plays' C(roles), C(import_role) and C(include_role) tasks (inside blocks too), C(import_playbook)
    followed recursively, and role dependencies. Roles of other collections and role names that are
    templates are ignored.
  - Returns one entry per role with the options of its C(meta/argument_specs.yml) entry point and its
    C(defaults/main.yml) as written (templates not evaluated), ready for the
    P(gpuops.sandbox.survey_spec#filter) filter.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _terms:
    description: Playbook paths, relative to O(collection_root) unless absolute.
    type: list
    elements: path
    required: true
  collection_root:
    description:
      - Directory of the collection (or the project checkout) that holds C(roles/) and C(playbooks/).
      - When not set, the collection this plugin belongs to.
    type: path
  entry_point:
    description: Argument spec entry point to read.
    type: str
    default: main
  every_role:
    description: Return every role of the collection (sorted by name) after the roles of the playbooks.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Show the options of every role that site.yml runs
  ansible.builtin.debug:
    msg: "{{ item.role }}: {{ item.options | list }}"
  loop: "{{ query('gpuops.sandbox.role_specs', 'playbooks/site.yml') }}"
"""

RETURN = r"""
_raw:
  description: One entry per role, in order of first use, without duplicates across the terms.
  type: list
  elements: dict
  contains:
    role:
      description: Name of the role inside the collection.
      type: str
    options:
      description: The entry point's options from C(meta/argument_specs.yml); empty when the role has none.
      type: dict
    defaults:
      description: The role's C(defaults/main.yml), templates left as text.
      type: dict
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpuops.sandbox.plugins.plugin_utils._awx_survey import SurveyError, playbook_roles, role_specs

_OWN_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        root = self.get_option("collection_root") or _OWN_ROOT
        entry_point = self.get_option("entry_point")
        result = []
        seen = set()
        try:
            for term in terms:
                path = term if os.path.isabs(term) else os.path.join(root, term)
                for role in playbook_roles(path, root):
                    if role not in seen:
                        seen.add(role)
                        result.append(role_specs(role, root, entry_point))
            if self.get_option("every_role"):
                for role in sorted(os.listdir(os.path.join(root, "roles"))):
                    if role not in seen and os.path.isdir(os.path.join(root, "roles", role)):
                        seen.add(role)
                        result.append(role_specs(role, root, entry_point))
        except SurveyError as exc:
            raise AnsibleLookupError("role_specs: %s" % exc) from exc
        return result
