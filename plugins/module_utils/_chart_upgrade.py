# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Upgrading a Helm release whose chart ships CRDs, worked out before anything changes (private to the collection).

Helm installs a chart's ``crds/`` on the first install only and never upgrades them, so the collection applies the
new chart's CRDs itself before it upgrades a release. What that needs decided, all pure functions of what was read:

- :func:`upgrade_plan`: from the release's history (``helm history -o json``) and the new chart's ``Chart.yaml``,
  whether this is an install, the same version, an upgrade or a downgrade (semantic versions), whether a stopped run
  left the release pending, and what stops the run (a downgrade not asked for, a pending release not to be rolled
  back).
- :func:`schema_problems`: the fields of stored objects that the new CRDs' schemas do not know, which the API server
  would prune once the new CRD is in place; and versions the new CRDs no longer serve that objects are stored in.
- :func:`crd_apply_plan`: which of the chart's CRDs to apply: those the cluster lacks or holds differently, except
  those another Helm release's chart carries (:func:`release_crds` reads them from a release's record).
- :func:`values_not_stored`: after the upgrade, the values of the rendered objects that the stored ones lack or
  hold differently (what the API server pruned).

Each returns sentences a person can act on; nothing here talks to a cluster.
"""

from __future__ import annotations

import re

PENDING = ("pending-install", "pending-upgrade", "pending-rollback")
PENDING_ACTIONS = ("fail", "rollback")
# The top-level keys of an object that a CRD's schema does not govern.
OBJECT_META = ("apiVersion", "kind", "metadata")

_SEMVER = re.compile(r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                     r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z.-]+)?$")


# ---------------------------------------------------------------------------------------------
# Versions and the release
# ---------------------------------------------------------------------------------------------

def semver_key(version):
    """A key that orders semantic versions (2.0.0 precedence; a leading ``v`` allowed, build metadata ignored);
    ValueError when ``version`` is not one."""
    found = _SEMVER.match(str(version).strip())
    if not found:
        raise ValueError("%r is not a semantic version" % (version,))
    core = tuple(int(part) for part in found.group(1, 2, 3))
    if found.group(4) is None:
        return core + ((1,),)  # a release sorts after every pre-release of the same version
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in found.group(4).split("."))
    return core + ((0,) + parts,)


def compare_versions(old, new):
    """-1, 0 or 1 as ``new`` is lower than, equal to or higher than ``old``; ValueError when either is not a
    semantic version."""
    old_key, new_key = semver_key(old), semver_key(new)
    return (new_key > old_key) - (new_key < old_key)


def chart_version(chart_field, chart_name):
    """The version in a release's ``chart`` field (``<name>-<version>``, as helm history and helm list give it)."""
    text = str(chart_field or "")
    prefix = "%s-" % chart_name
    if chart_name and text.startswith(prefix):
        return text[len(prefix):]
    # Another chart name: the version starts after the last dash followed by a digit or v<digit>.
    found = re.search(r"-(v?\d+\.\d+\.\d+\S*)$", text)
    return found.group(1) if found else ""


def upgrade_plan(history, chart, release, namespace, allow_downgrade=False, pending_action="fail",
                 variables=None, helm="helm"):
    """What moving release ``namespace/release`` to ``chart`` (its Chart.yaml as a dict) means.

    ``history`` is the list ``helm history -o json`` prints (empty or None: no such release). ``variables`` names the
    role's inputs for the messages: ``allow_downgrade`` and ``pending_release``. Returns a dict:

    - ``change``: ``install`` (no release), ``same``, ``upgrade``, ``downgrade`` or ``unknown`` (a version that is not
      semantic, which Helm itself refuses in a chart);
    - ``installed_version``, ``target_version``, ``chart``: the versions and the chart's name;
    - ``status``, ``revision``: the latest revision's status and number; ``pending``: whether it is one a stopped
      run leaves (pending-install, pending-upgrade, pending-rollback);
    - ``rollback_revision``: the last deployed revision (0 when none), what a rollback goes back to;
    - ``rollback``: whether the run rolls the release back before anything else;
    - ``problems``: sentences saying why the run must stop before any change (empty: it may go on).
    """
    if pending_action not in PENDING_ACTIONS:
        raise ValueError("pending_action %r is not one of %s" % (pending_action, ", ".join(PENDING_ACTIONS)))
    names = dict({"allow_downgrade": "allow_downgrade", "pending_release": "pending_release"}, **(variables or {}))
    chart = chart or {}
    name = str(chart.get("name") or "")
    target = str(chart.get("version") or "")
    revisions = sorted((r for r in history or [] if isinstance(r, dict) and "revision" in r),
                       key=lambda r: int(r["revision"]))
    plan = {"chart": name, "target_version": target, "installed_version": "", "status": "", "revision": 0,
            "pending": False, "rollback_revision": 0, "rollback": False, "change": "install", "problems": []}
    if not revisions:
        return plan
    where = "%s/%s" % (namespace, release)
    latest = revisions[-1]
    deployed = [r for r in revisions if r.get("status") == "deployed"]
    base = deployed[-1] if deployed else latest
    plan.update(status=str(latest.get("status") or ""), revision=int(latest["revision"]),
                rollback_revision=int(deployed[-1]["revision"]) if deployed else 0,
                installed_version=chart_version(base.get("chart"), name))
    plan["pending"] = plan["status"] in PENDING
    problems = plan["problems"]
    if plan["pending"]:
        stuck = ("Helm release %s is %s (revision %d, since %s): a run that was stopped before it finished left it so, "
                 "and Helm refuses every further change to it (\"another operation (install/upgrade/rollback) is in "
                 "progress\")" % (where, plan["status"], plan["revision"], latest.get("updated") or "an unknown time"))
        if not plan["rollback_revision"]:
            problems.append("%s. It has no deployed revision to roll back to; if no other run is working on it, "
                            "uninstall it (%s uninstall %s --namespace %s --no-hooks) and run again"
                            % (stuck, helm, release, namespace))
        elif pending_action == "fail":
            problems.append("%s. If no other run is working on it, set %s=rollback to roll it back to revision %d "
                            "(the last deployed, chart %s) before the run goes on, or roll it back yourself "
                            "(%s rollback %s %d --namespace %s)"
                            % (stuck, names["pending_release"], plan["rollback_revision"],
                               base.get("chart") or "unknown", helm, release, plan["rollback_revision"], namespace))
        else:
            plan["rollback"] = True
    installed = plan["installed_version"]
    try:
        order = compare_versions(installed, target)
    except ValueError:
        plan["change"] = "unknown"
        if not allow_downgrade:
            problems.append("Cannot tell whether chart %s %s is newer than %s, which release %s runs (not both are "
                            "semantic versions), so it could be a downgrade; set %s=true to install it anyway"
                            % (name or "?", target or "(no version)", installed or "an unknown version", where,
                               names["allow_downgrade"]))
        return plan
    plan["change"] = ("downgrade", "same", "upgrade")[order + 1]
    if order < 0 and not allow_downgrade:
        problems.append("Chart %s %s is older than %s, which release %s runs: that is a downgrade. Set %s=true to "
                        "downgrade on purpose (the chart's CRDs are then applied where they differ from the cluster's, after "
                        "checking the stored objects keep every field)"
                        % (name, target, installed, where, names["allow_downgrade"]))
    return plan


# ---------------------------------------------------------------------------------------------
# CRD schemas against stored objects
# ---------------------------------------------------------------------------------------------

def _version_schema(crd, version):
    """The openAPIV3Schema of ``version`` of ``crd`` (None when the CRD has no such version)."""
    for entry in crd.get("spec", {}).get("versions") or []:
        if entry.get("name") == version:
            return (entry.get("schema") or {}).get("openAPIV3Schema") or {}
    return None


def _storage_version(crd):
    for entry in crd.get("spec", {}).get("versions") or []:
        if entry.get("storage"):
            return entry.get("name")
    return None


def unknown_fields(value, schema, path=""):
    """The paths in ``value`` that ``schema`` (a structural openAPIV3Schema node) does not know, so the API server
    prunes them, as a sorted list (``spec.a.b``, ``spec.list[].c``); a path is given once, at its first unknown
    level."""
    found = set()
    _walk(value, schema or {}, path, found)
    return sorted(found)


def _join(path, key):
    return "%s.%s" % (path, key) if path else str(key)


def _walk(value, schema, path, found):
    if isinstance(value, dict):
        if schema.get("x-kubernetes-embedded-resource"):
            value = {k: v for k, v in value.items() if k not in OBJECT_META}
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or extra is True
        for key, item in value.items():
            if key in properties:
                _walk(item, properties[key] or {}, _join(path, key), found)
            elif isinstance(extra, dict):
                _walk(item, extra, _join(path, key), found)
            elif not keep_unknown:
                found.add(_join(path, key))
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for item in value:
                _walk(item, items, path + "[]", found)


def schema_problems(new_crds, stored_crds, objects):
    """What applying ``new_crds`` (CRD documents of the new chart) would lose, before anything changes.

    ``stored_crds`` are the same CRDs as the cluster holds them (those it has; others are new), ``objects`` the
    stored custom resources of those kinds. Returns sentences: a version the cluster stores objects in that a new CRD
    no longer lists (the API server refuses such an update), and per object the fields the new schema does not
    know (the API server would prune them: an object keeps no field its CRD's schema lacks)."""
    problems = []
    by_name = {crd.get("metadata", {}).get("name"): crd for crd in new_crds or [] if isinstance(crd, dict)}
    by_kind = {}
    for crd in by_name.values():
        spec = crd.get("spec", {})
        by_kind[(spec.get("group"), (spec.get("names") or {}).get("kind"))] = crd
    for stored in stored_crds or []:
        name = stored.get("metadata", {}).get("name")
        new = by_name.get(name)
        if new is None:
            continue
        versions = {v.get("name") for v in new.get("spec", {}).get("versions") or []}
        dropped = sorted(set((stored.get("status") or {}).get("storedVersions") or []) - versions)
        if dropped:
            problems.append("CRD %s: objects are stored as version %s, which the new chart's CRD no longer has (the "
                            "API server refuses that change until they are migrated)" % (name, ", ".join(dropped)))
    for obj in objects or []:
        group, _slash, version = str(obj.get("apiVersion") or "").rpartition("/")
        crd = by_kind.get((group, obj.get("kind")))
        if crd is None:
            continue
        schema = _version_schema(crd, version)
        if schema is None:
            schema = _version_schema(crd, _storage_version(crd)) or {}
        body = {k: v for k, v in obj.items() if k not in OBJECT_META}
        lost = unknown_fields(body, schema)
        if lost:
            meta = obj.get("metadata") or {}
            where = "/".join(p for p in (meta.get("namespace"), meta.get("name")) if p)
            problems.append("%s %s uses %s, which the new chart's CRD %s does not know: the API server would drop "
                            "%s" % (obj.get("kind"), where, ", ".join(lost), crd["metadata"]["name"],
                                    "it" if len(lost) == 1 else "them"))
    return problems


# ---------------------------------------------------------------------------------------------
# After the upgrade: what the API server kept of the rendered objects
# ---------------------------------------------------------------------------------------------

_MISSING = object()


def _differences(want, have, path, found):
    if want is None:
        return  # a null is never stored
    if have is _MISSING:
        found.append("%s dropped" % path)
    elif isinstance(want, dict) and isinstance(have, dict):
        for key, item in want.items():
            _differences(item, have.get(key, _MISSING), _join(path, key), found)
    elif isinstance(want, list) and isinstance(have, list) and len(want) == len(have):
        for index, (item, kept) in enumerate(zip(want, have)):
            _differences(item, kept, "%s[%d]" % (path, index), found)
    elif want != have:
        found.append("%s is %s instead of %s" % (path, _short(have), _short(want)))


def _short(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def values_not_stored(rendered, stored):
    """The values of the ``rendered`` objects (what Helm sent) that the ``stored`` ones (read back) lack or hold
    differently, as sentences, one per object; objects not stored at all are named too. Metadata and status are
    left out: the API server and controllers add to them."""
    problems = []
    index = {}
    for obj in stored or []:
        meta = obj.get("metadata") or {}
        index[(obj.get("kind"), meta.get("namespace") or "", meta.get("name"))] = obj
    for obj in rendered or []:
        if not isinstance(obj, dict):
            continue
        meta = obj.get("metadata") or {}
        key = (obj.get("kind"), meta.get("namespace") or "", meta.get("name"))
        where = "%s %s" % (key[0], "/".join(p for p in key[1:] if p))
        kept = index.get(key)
        if kept is None and not key[1]:
            # helm template leaves a namespaced object's namespace to the release when its template does not set it
            kept = next((o for k, o in index.items() if (k[0], k[2]) == (key[0], key[2])), None)
        if kept is None:
            problems.append("%s was not found on the cluster" % where)
            continue
        found = []
        for top, value in obj.items():
            if top in OBJECT_META or top == "status":
                continue
            _differences(value, kept.get(top, _MISSING), top, found)
        if found:
            problems.append("%s: %s" % (where, "; ".join(found)))
    return problems


# ---------------------------------------------------------------------------------------------
# Which of the chart's CRDs to apply
# ---------------------------------------------------------------------------------------------

def covered(want, have):
    """Whether every value of ``want`` (a chart's CRD spec) is in ``have`` (the stored one, to which the API server
    adds its defaults): maps key by key, lists of the same length element by element, other values equal."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and covered(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(covered(w, h) for w, h in zip(want, have))
    return want == have


def release_crds(record):
    """What a Helm release record (the JSON Helm stores in its release Secret, decoded) says of the CRDs its chart
    carries: ``{"release": "<namespace>/<name>", "chart": "<name>-<version>", "crds": [names]}``, the names read from
    the files under the chart's ``crds/`` (the chart's own; Helm does not store its subcharts' in the record)."""
    import base64
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    chart = (record or {}).get("chart") or {}
    meta = chart.get("metadata") or {}
    names = []
    for entry in chart.get("files") or []:
        if not isinstance(entry, dict) or not str(entry.get("name") or "").startswith("crds/"):
            continue
        try:
            text = base64.b64decode(entry.get("data") or "").decode("utf-8")
            docs = list(yaml.load_all(text, Loader=loader))  # nosec B506 - a safe loader
        except (ValueError, UnicodeDecodeError, yaml.YAMLError):
            continue
        for doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                name = (doc.get("metadata") or {}).get("name")
                if name:
                    names.append(str(name))
    return {"release": "%s/%s" % (record.get("namespace") or "", record.get("name") or ""),
            "chart": "%s-%s" % (meta.get("name") or "?", meta.get("version") or "?"), "crds": names}


def decode_release(data):
    """The release record of a Helm release Secret's ``data.release`` (base64 of base64 of gzipped JSON)."""
    import base64
    import gzip
    import json

    raw = base64.b64decode(base64.b64decode(data))
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw.decode("utf-8"))


def crd_apply_plan(new_crds, stored_crds, others=None):
    """Which of ``new_crds`` (the chart's CRDs) to apply, whatever the order of the chart versions.

    ``stored_crds`` are those the cluster holds (by name); ``others`` what :func:`release_crds` says of the other
    Helm releases on the cluster. A CRD the cluster lacks is applied (Helm installs only on a first install); one the
    cluster holds as the chart has it is left (up to date); one that differs is applied, unless another release's
    chart carries it too: that CRD is that release's, left to it. Returns ``{"apply": [CRDs], "left": [{"name",
    "reason"}], "differ": [names of those that differ, applied or not]}``."""
    stored = {(c.get("metadata") or {}).get("name"): c for c in stored_crds or [] if isinstance(c, dict)}
    owners = {}
    for other in others or []:
        for name in other.get("crds") or []:
            owners.setdefault(name, []).append("%s (chart %s)" % (other.get("release"), other.get("chart")))
    plan = {"apply": [], "left": [], "differ": []}
    for crd in new_crds or []:
        name = (crd.get("metadata") or {}).get("name")
        have = stored.get(name)
        if have is None:
            plan["apply"].append(crd)
            continue
        if covered(crd.get("spec") or {}, have.get("spec") or {}):
            plan["left"].append({"name": name, "reason": "up to date"})
            continue
        plan["differ"].append(name)
        if name in owners:
            plan["left"].append({"name": name, "reason": "the chart of Helm release %s carries it too, and its copy "
                                                         "is on the cluster: left to that release"
                                                         % " and ".join(sorted(owners[name]))})
            continue
        plan["apply"].append(crd)
    return plan
