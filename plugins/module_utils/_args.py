# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Creating AnsibleModule so that no bad argument value ends in a Python traceback."""

from __future__ import annotations

NOT_FINITE = ("inf", "infinity", "nan")


def create_module(module_class, argument_spec, **kwargs):
    """``module_class(argument_spec, **kwargs)`` (AnsibleModule), failing clearly for integers such as ``"inf"``.

    ansible-core's integer check raises OverflowError (instead of failing the task) on the strings
    ``inf``/``infinity``/``nan``; the arguments are then read without types, and the module fails naming
    the option and its value.
    """
    try:
        return module_class(argument_spec=argument_spec, **kwargs)
    except (OverflowError, ValueError) as exc:
        loose_spec = dict((name, dict(type="raw", aliases=spec.get("aliases", []), no_log=spec.get("no_log", False)))
                          for name, spec in argument_spec.items())
        loose = module_class(argument_spec=loose_spec, supports_check_mode=True)
        bad = ["%s=%r" % (name, loose.params.get(name)) for name, spec in sorted(argument_spec.items())
               if spec.get("type") in ("int", "float") and not spec.get("no_log")
               and str(loose.params.get(name)).strip().lstrip("+-").lower() in NOT_FINITE]
        loose.fail_json(msg="%s: expected a whole number (%s); nothing was changed"
                        % (", ".join(bad) or "an integer option", exc))
        raise  # not reached: fail_json exits
