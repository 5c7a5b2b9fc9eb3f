# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Checks of the arguments the collection's filters take, shared by the filters that take the same kinds.

This file is private to the gpuops.sandbox collection: its interface may change at any time."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def require_lists_of_mappings(filter_name, what, *named):
    """Fails naming the filter and the argument when one of ``named`` ((name, value) pairs) is not a list of
    mappings; ``what`` says what the items are (for example "objects (mappings)")."""
    for name, value in named:
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise AnsibleFilterError("%s: %s must be a list of %s" % (filter_name, name, what))
