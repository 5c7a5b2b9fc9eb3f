# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter: what is wrong with the numeric and duration inputs of a role."""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
---
name: input_problems
short_description: Check role inputs that an argument spec cannot bound (seconds, counts, Helm durations)
version_added: 1.0.0
description:
  - A role's argument spec checks that a timeout is an integer, but accepts 0, negative numbers and
    booleans (a boolean is an integer to Python), and a Helm duration is just a string to it. This filter
    checks such inputs and returns one message per bad value, naming the variable, its value and what is
    accepted; the roles assert that the list is empty before they change anything.
  - A whole number may be given as an integer or as a string of ASCII digits (extra variables are strings).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description:
      - Variable name to check. Each check has C(value) and either C(min) and C(max) (a whole number in that
        range; C(unit) names what it counts, default C(seconds)), or C(duration=true) (a Helm/Go duration such
        as C(10m) or C(1h30m), more than zero, at most C(max_seconds) when given).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Check the timeouts
  ansible.builtin.assert:
    that: __problems | length == 0
    fail_msg: "{{ __problems | join('; ') }}"
    quiet: true
  vars:
    __problems: >-
      {{ {'host_reboot_timeout': {'value': host_reboot_timeout, 'min': 1, 'max': 86400},
          'gpu_operator_wait_timeout': {'value': gpu_operator_wait_timeout, 'duration': true}}
         | gpuops.sandbox.input_problems }}
"""

RETURN = r"""
_value:
  description: One message per bad input, in the order of the variable names; empty when all are good.
  type: list
  elements: str
"""

_DIGITS = re.compile(r"[+-]?[0-9]{1,18}")
# Go's time.ParseDuration, which Helm uses for --timeout: a sequence of decimal numbers with units.
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def _shown(value):
    text = repr(value)
    return text if len(text) <= 40 else "%s... (%d characters)" % (text[:30], len(text))


def whole_number(value):
    """``value`` as an int when it is a whole number (int, or ASCII digits in a string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        return int(value.strip())
    return None


def duration_seconds(value):
    """Seconds of a Go duration string (``10m``, ``1h30m``, ``90s``, ``0``), or None when it is not one."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text in ("0", "+0", "-0"):
        return 0.0
    sign = -1 if text.startswith("-") else 1
    text = text.lstrip("+-")
    if not text or len(text) > 64:
        return None
    total, pos = 0.0, 0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if not match or match.group(1) in ("", "."):
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    return sign * total


def input_problems(checks):
    if not isinstance(checks, dict):
        raise AnsibleFilterError("input_problems expects a dict of variable name to check, got %s" % type(checks).__name__)
    problems = []
    for name in checks:
        check = checks[name]
        if not isinstance(check, dict) or "value" not in check:
            raise AnsibleFilterError("input_problems: the check of %s needs a value (got %r)" % (name, check))
        value = check["value"]
        if check.get("duration"):
            seconds = duration_seconds(value)
            limit = check.get("max_seconds")
            if seconds is None:
                problems.append("%s=%s is not a duration; give a number with a unit, such as 90s, 10m or 1h30m"
                                % (name, _shown(value)))
            elif seconds <= 0:
                problems.append("%s=%s must be longer than zero" % (name, _shown(value)))
            elif limit is not None and seconds > limit:
                problems.append("%s=%s is longer than the %d seconds allowed" % (name, _shown(value), limit))
            continue
        low, high, unit = check.get("min"), check.get("max"), check.get("unit", "seconds")
        number = whole_number(value)
        if number is None:
            problems.append("%s=%s is not a whole number of %s; give one from %s to %s" % (name, _shown(value), unit, low, high))
        elif (low is not None and number < low) or (high is not None and number > high):
            problems.append("%s=%s is out of range; give a whole number of %s from %s to %s" % (name, _shown(value), unit, low, high))
    return problems


class FilterModule:
    """gpuops.sandbox.input_problems"""

    def filters(self):
        return {"input_problems": input_problems}
