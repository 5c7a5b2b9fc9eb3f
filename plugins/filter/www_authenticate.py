# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: www_authenticate
short_description: Parse an HTTP WWW-Authenticate challenge, such as a container registry's
version_added: 1.0.0
description:
  - Parses the first challenge of an HTTP C(WWW-Authenticate) header (RFC 7235) into its scheme and
    parameters. Container registries answer C(/v2/) with C(Basic realm=...) (htpasswd) or
    C(Bearer realm=...,service=...) (token authentication); a play uses the result to decide how to
    authenticate.
  - The scheme is returned in lower case, parameter names in lower case, quoted values unquoted.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: The header value; an empty or missing value gives an empty scheme.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Parse a registry challenge
  ansible.builtin.debug:
    msg: "{{ 'Bearer realm=\"https://auth.example.com/token\",service=\"registry\"' | gpuops.sandbox.www_authenticate }}"
  # => {"scheme": "bearer", "params": {"realm": "https://auth.example.com/token", "service": "registry"}}
"""

RETURN = r"""
_value:
  description: The scheme (lower case, empty when there is no challenge) and the parameters.
  type: dict
  contains:
    scheme:
      description: The authentication scheme, such as C(basic) or C(bearer).
      type: str
    params:
      description: The challenge's parameters, names in lower case.
      type: dict
"""

import re

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.text.converters import to_text

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_PARAM = re.compile(r'\s*(%s)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(%s))\s*(?:,|$)' % (_TOKEN, _TOKEN))
_SCHEME = re.compile(r"\s*(%s)(?:\s+|$)" % _TOKEN)
_ESCAPE = re.compile(r"\\(.)")


def parse_www_authenticate(value):
    """Return {'scheme': ..., 'params': {...}} for the first challenge of a WWW-Authenticate value."""
    if value is None:
        return {"scheme": "", "params": {}}
    if not isinstance(value, (str, bytes)):
        raise AnsibleFilterError("www_authenticate expects a string, got %s" % type(value).__name__)
    text = to_text(value).strip()
    if not text:
        return {"scheme": "", "params": {}}
    match = _SCHEME.match(text)
    if not match:
        raise AnsibleFilterError("not a WWW-Authenticate challenge: %r" % text)
    scheme = match.group(1).lower()
    rest = text[match.end():]
    params = {}
    pos = 0
    while pos < len(rest):
        param = _PARAM.match(rest, pos)
        if not param:
            # The rest is another challenge (a new scheme) or a token68 value: the first challenge ends here.
            break
        name = param.group(1).lower()
        if param.group(2) is not None:
            params[name] = _ESCAPE.sub(r"\1", param.group(2))
        else:
            params[name] = param.group(3)
        pos = param.end()
    return {"scheme": scheme, "params": params}


class FilterModule:
    """Filters for talking to container registries."""

    def filters(self):
        return {"www_authenticate": parse_www_authenticate}
