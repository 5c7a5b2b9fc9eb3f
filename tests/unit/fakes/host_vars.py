# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A host's variables as a play hands them to a filter: under ansible-core 2.19 ``hostvars[host]`` (and each item of
``groups[...] | map('extract', hostvars)``) is a HostVarsVars, a read-only Mapping that is not a dict."""

from __future__ import annotations

from collections.abc import Mapping


class HostVars(Mapping):
    """A read-only Mapping over ``data``, not a dict (as HostVarsVars is not)."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def __repr__(self):
        return "HostVars(%r)" % (self._data.get("inventory_hostname"),)
