# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The user's chart values against the chart that takes them (private to the collection).

- :func:`unknown_keys`: keys of the user's values that the chart's own ``values.yaml`` does not have (a typo such as
  ``sandboxWorkloads.enable`` for ``enabled`` is stored in the release and read by no template), each named by its
  full path with the nearest key the chart has.
- :func:`as_given` and :func:`defaulted_problems`: values a chart template passes through Helm's ``default``
  function, which takes 0, false and the empty string for "not set" and puts its own default in their place. Where
  the chart accepts another spelling of the same value (``maxUnavailable: "0%"`` for 0) the value is rewritten to it;
  where it does not, the value is refused with the reason.

Pure functions of what was read; nothing here talks to a cluster.
"""

from __future__ import annotations

import difflib

# Maps that take keys of the user's choosing wherever they appear in a chart's values (Kubernetes label and
# annotation maps, node selectors, resource lists, environment maps): nothing below them is checked.
FREE_FORM_NAMES = frozenset((
    "nodeSelector", "tolerations", "labels", "annotations", "env", "resources", "args", "affinity",
    "podAnnotations", "podLabels", "podSecurityContext", "securityContext", "extraArgs", "extraEnv",
    "commonLabels", "commonAnnotations", "global",
))

# Values of the GPU Operator chart that its templates pass through `default` (both charts checked: the repository's
# and v25.10.1): path, what the chart renders instead of a "zero" value, and the spelling the chart keeps.
# driver.upgradePolicy.maxUnavailable: `| default "25%"` in clusterpolicy.yaml and nvidiadriver.yaml;
# driver.licensingConfig.nlsEnabled: `| default true` in nvidiadriver.yaml.
DEFAULTED = {
    "gpu-operator": (
        (("driver", "upgradePolicy", "maxUnavailable"), "25%", {0: "0%", "0": "0%"}),
        (("driver", "licensingConfig", "nlsEnabled"), True, {}),
    ),
}


def _is_zero(value):
    """Whether Helm's ``default`` takes ``value`` for unset (Go templates' empty: 0, false, "", empty list/map)."""
    if value is None or value is False:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return value == 0
    if isinstance(value, (str, list, dict)):
        return len(value) == 0
    return False


def _lookup(values, path):
    node = values
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def as_given(values, chart):
    """``values`` with each value that ``chart``'s templates would replace through ``default`` written in a spelling
    the chart keeps (maxUnavailable 0 as "0%"); other values are left as they are. A new mapping; ``values`` is not
    changed."""
    if not isinstance(values, dict):
        return values
    result = _copy(values)
    for path, _default, spelling in DEFAULTED.get(chart, ()):
        found, value = _lookup(result, path)
        if not found or isinstance(value, bool):
            continue
        key = value.strip() if isinstance(value, str) else value
        if key in spelling:
            parent = result
            for part in path[:-1]:
                parent = parent[part]
            parent[path[-1]] = spelling[key]
    return result


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def defaulted_problems(values, chart, where="values"):
    """Sentences for each value of ``values`` that ``chart`` would replace with its own default (after
    :func:`as_given`): the chart would not install what was asked."""
    problems = []
    for path, default, _spelling in DEFAULTED.get(chart, ()):
        found, value = _lookup(values, path)
        if found and value is not None and _is_zero(value):
            problems.append("%s.%s is %s, which the %s chart replaces with its default %s (its template passes the "
                            "value through Helm's default, which takes 0, false and \"\" for not set), so the cluster "
                            "would not get what was asked%s"
                            % (where, ".".join(path), _show(value), chart, _show(default),
                               "; leave it out to get %s" % _show(default) if default is not True
                               else "; leave it out for %s, there is no way to give false through this chart" % _show(default)))
    return problems


def _show(value):
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return '"%s"' % value
    return repr(value)


def _free_form(path, chart_value, free_form):
    if path and path[-1] in FREE_FORM_NAMES:
        return True
    if ".".join(path) in free_form:
        return True
    # A map whose default is empty (or null) takes keys of the user's choosing.
    return chart_value is None or chart_value == {}


def unknown_keys(values, chart_values, where="values", free_form=(), subcharts=()):
    """Sentences, one per key of ``values`` (the user's) that ``chart_values`` (the chart's values.yaml) does not
    have, naming its full path (``where.a.b``) and the nearest key the chart has at that level.

    Below a key the chart gives as something other than a map (a list, a string), nothing is checked; nor below a
    map that takes any key: one whose default is empty or null, one named in :data:`FREE_FORM_NAMES`, one whose
    dotted path is in ``free_form``, or a top-level key naming a subchart (``subcharts``: its values are the
    subchart's own)."""
    free_form = {str(p).strip() for p in free_form or () if str(p).strip()}
    problems = []
    if not isinstance(values, dict) or not isinstance(chart_values, dict):
        return problems
    _check(values, chart_values, (), where, free_form, set(subcharts or ()), problems)
    return problems


def _check(values, chart_values, path, where, free_form, subcharts, problems):
    for key, value in values.items():
        here = path + (str(key),)
        if not path and (key in subcharts or key == "global"):
            continue
        if ".".join(here) in free_form:
            continue
        if key not in chart_values:
            known = [str(k) for k in chart_values]
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            if near:
                hint = "did you mean %s?" % ".".join(path + (near[0],))
            else:
                hint = "the chart has %s" % (", ".join(sorted(known)[:12]) + (", ..." if len(known) > 12 else "")
                                             if known else "no keys there")
            problems.append("%s.%s is not a value of the chart (%s)" % (where, ".".join(here), hint))
            continue
        default = chart_values[key]
        if isinstance(value, dict) and isinstance(default, dict) and not _free_form(here, default, free_form):
            _check(value, default, here, where, free_form, subcharts, problems)
