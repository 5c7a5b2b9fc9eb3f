# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private, pure: the cluster half's plan, what playbooks/cluster.yml would change, worked out before it runs.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
It takes what the cluster roles would send (each node's labels and taints, the Helm releases with their values, the
KubeVirt settings) and, when the cluster was read, what is there now (the nodes, the KubeVirt CR, the releases'
charts and values), and answers with the same rules the modules apply (:func:`_cluster.plan_node`,
:func:`_cluster.plan_kubevirt`). Without the cluster's state it says what the cluster half would set.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import (
    PlanError,
    desired_host_devices,
    needed_feature_gates,
    plan_kubevirt,
    plan_node,
)

# Values under a key of these words are shown as this, never as given (a token or password in a user's values).
HIDDEN = "********"
SECRET_WORDS = ("password", "passwd", "secret", "token", "apikey", "api_key", "licen", "credential", "auth")
NODE_KEYS = ("name", "workload_type", "labels", "release_to", "taints", "gpus", "mdev_parents", "vgpu_type_names")
RELEASE_KEYS = ("name", "namespace", "chart", "version", "values")


def hide_secrets(value):
    """``value`` with what a key naming a secret holds replaced by :data:`HIDDEN`, at any depth."""
    if isinstance(value, Mapping):
        shown = {}
        for key, item in value.items():
            word = str(key).lower().replace("-", "").replace(".", "")
            secret = any(w in word for w in SECRET_WORDS) and not isinstance(item, (Mapping, list, bool))
            shown[key] = HIDDEN if secret and item not in (None, "") else hide_secrets(item)
        return shown
    if isinstance(value, list):
        return [hide_secrets(item) for item in value]
    return value


def _differing_keys(before, after, prefix=""):
    """The dotted paths where two values trees differ."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        keys = []
        for key in sorted(set(before) | set(after), key=str):
            path = "%s%s" % (prefix, key)
            if key not in before or key not in after:
                keys.append(path)
            else:
                keys.extend(_differing_keys(before[key], after[key], path + "."))
        return keys
    return [] if before == after else [prefix.rstrip(".") or "(all)"]


def _check_shape(where, value, keys):
    if not isinstance(value, Mapping):
        raise PlanError("%s must be a mapping with %s, got %r" % (where, ", ".join(keys), value))
    missing = [key for key in keys[:2] if not value.get(key)]
    if missing:
        raise PlanError("%s has no %s: %r" % (where, " or ".join(missing), dict(value)))


def _labels_text(labels, gone="removed"):
    return ", ".join("%s=%s" % (k, v) if v is not None else "%s %s" % (k, gone) for k, v in sorted(labels.items()))


def _nodes(plan, entries, live_nodes, taint_key_prefixes):
    rows = []
    for entry in entries:
        _check_shape("a node of the cluster plan", entry, NODE_KEYS)
        name = entry["name"]
        labels = dict(entry.get("labels") or {})
        row = {"name": name, "workload_type": entry["workload_type"],
               "labels": {k: v for k, v in labels.items() if v is not None},
               "labels_removed": sorted(k for k, v in labels.items() if v is None),
               "taints": entry.get("taints"), "changed": None}
        if live_nodes is None:
            plan["changes"].append({"what": "labels", "node": name,
                                    "detail": "label %s: %s" % (name, _labels_text(labels, "not set"))})
        elif name not in live_nodes:
            plan["refusals"].append({"check": "node %s" % name, "problem": "the cluster has no node %s" % name,
                                     "fix": "join the node first, or set gpuops_node_name to its node name"})
        else:
            patch, before, after = plan_node(live_nodes[name], labels, entry.get("taints"), taint_key_prefixes,
                                             entry.get("release_to"))
            row["changed"] = patch is not None
            changed = {k: v for k, v in after["labels"].items() if before["labels"].get(k) != v}
            if changed:
                plan["changes"].append({"what": "labels", "node": name,
                                        "detail": "label %s: %s" % (name, _labels_text(changed))})
            if after.get("taints") != before.get("taints"):
                plan["changes"].append({"what": "taints", "node": name, "detail": "taint %s: %s (now %s)" % (
                    name, ", ".join(after["taints"]) or "none", ", ".join(before["taints"]) or "none")})
        rows.append(row)
    return rows


def _releases(plan, releases, live_releases):
    rows = []
    for release in releases:
        _check_shape("a Helm release of the cluster plan", release, RELEASE_KEYS)
        name, namespace = release["name"], release["namespace"]
        values = release.get("values") or {}
        version = str(release.get("version") or "")
        row = {"name": name, "namespace": namespace, "chart": release.get("chart"), "version": version or None,
               "values": hide_secrets(values), "action": "install or upgrade"}
        chart = "%s%s" % (release.get("chart"), " " + version if version else "")
        if live_releases is not None:
            deployed = live_releases.get(name)
            if not isinstance(deployed, Mapping):
                row["action"] = "install"
            else:
                differs = _differing_keys(deployed.get("values") or {}, values)
                # Helm names the deployed chart <name>-<version>, the version as its Chart.yaml writes it (v or not).
                bare = version.lstrip("v")
                new_chart = bool(version) and not any(str(deployed.get("chart") or "").endswith("-" + v)
                                                      for v in (bare, "v" + bare))
                row["action"] = ("upgrade" if new_chart else "change values") if (differs or new_chart) else "unchanged"
                row["values_changed"] = differs
        if row["action"] == "install":
            detail = "install the Helm release %s/%s from %s" % (namespace, name, chart)
        elif row["action"] == "upgrade":
            detail = "upgrade the Helm release %s/%s from %s to %s" % (namespace, name, live_releases[name].get("chart"),
                                                                       chart)
        elif row["action"] == "change values":
            detail = "change the values of the Helm release %s/%s: %s" % (namespace, name,
                                                                          ", ".join(row["values_changed"]))
        elif row["action"] == "unchanged":
            detail = None
        else:
            detail = "install or upgrade the Helm release %s/%s from %s (%d top-level values)" % (
                namespace, name, chart, len(values))
        if detail:
            plan["changes"].append({"what": "helm", "release": name, "detail": detail})
        rows.append(row)
    return rows


def _entry_text(entry):
    selector = entry.get("pciVendorSelector") or entry.get("mdevNameSelector")
    return "%s as %s" % (selector, entry.get("resourceName"))


def _kubevirt(plan, entries, settings, live):
    # The hosts as role kubevirt_devices gives them to its module, when they are given; else the nodes.
    given = settings.get("hosts")
    hosts = [{k: e.get(k) for k in ("name", "workload_type", "gpus", "mdev_parents", "vgpu_type_names")}
             for e in (entries if given is None else given)]
    kind = dict(pci_vendor_ids=tuple(settings.get("pci_vendor_ids") or ("10de",)),
                resource_names=settings.get("resource_names") or None,
                plugin_pci_ids=settings.get("plugin_pci_ids") or None)
    version = settings.get("version") or None
    if live is None:
        pci, mdev, needs_dra, needs_vgpu, notes = desired_host_devices(hosts, **kind)
        try:
            gates = needed_feature_gates(version, bool(pci or mdev), needs_vgpu, needs_dra,
                                         settings.get("disable_mdev_configuration", True),
                                         settings.get("feature_gates") or ())
        except PlanError as exc:
            gates = []
            notes = notes + ["feature gates: %s" % exc.msg]
        for entry in pci + mdev:
            plan["changes"].append({"what": "kubevirt", "detail": "permit %s in the KubeVirt CR" % _entry_text(entry)})
        if gates:
            plan["changes"].append({"what": "kubevirt", "detail": "KubeVirt feature gates %s" % ", ".join(gates)})
        return {"pciHostDevices": pci, "mediatedDevices": mdev, "feature_gates": gates, "added": None,
                "removed": None, "notes": notes}
    if not isinstance(live, Mapping) or not live:
        plan["refusals"].append({"check": "KubeVirt CR", "problem": "the cluster has no KubeVirt CR in namespace %s"
                                 % settings.get("namespace", "kubevirt"),
                                 "fix": "install KubeVirt first, or set gpuops_kubevirt_enabled=false"})
        return None
    try:
        result = plan_kubevirt(live, hosts, kubevirt_version=version,
                               disable_mdev_configuration=settings.get("disable_mdev_configuration", True),
                               extra_feature_gates=settings.get("feature_gates") or (),
                               prune=bool(settings.get("prune", True)), **kind)
    except PlanError as exc:
        plan["refusals"].append({"check": "KubeVirt CR", "problem": exc.msg,
                                 "fix": "resolve the conflicts named, then plan again"})
        return None
    for entry in result["added"]:
        plan["changes"].append({"what": "kubevirt", "detail": "permit %s in the KubeVirt CR" % _entry_text(entry)})
    for entry in result["removed"]:
        plan["changes"].append({"what": "kubevirt", "detail": "remove %s from the KubeVirt CR (no host offers it)"
                                % _entry_text(entry)})
    if result["feature_gates_added"]:
        plan["changes"].append({"what": "kubevirt", "detail": "turn on the KubeVirt feature gates %s"
                                % ", ".join(result["feature_gates_added"])})
    after = result["after"]["permittedHostDevices"]
    return {"pciHostDevices": after["pciHostDevices"], "mediatedDevices": after["mediatedDevices"],
            "feature_gates": result["after"]["featureGates"], "added": result["added"], "removed": result["removed"],
            "notes": result["notes"]}


def cluster_plan(nodes, releases=(), kubevirt=None, live=None, taint_key_prefixes=("nvidia.com/",), unread=()):
    """The cluster half's plan.

    ``nodes`` are the entries of the gpu_hosts filter; ``releases`` the Helm releases the cluster half installs
    (``name``, ``namespace``, ``chart``, ``version``, ``values``); ``kubevirt`` the KubeVirt settings (None: the
    cluster half leaves KubeVirt alone). ``live``, when the cluster was read, has ``nodes`` (name -> Node),
    ``kubevirt_cr`` (the CR, None when there is none) and ``releases`` (name -> ``{chart, values}``, absent when the
    release is not installed). ``unread`` names the GPU hosts whose facts are missing: the cluster half needs every
    node's facts (the releases' values and the KubeVirt entries are the whole fleet's), so they are a refusal. Returns
    ``read``, ``nodes``, ``releases``, ``kubevirt``, ``changes``, ``refusals``
    and ``empty``.
    """
    if not isinstance(nodes, list):
        raise PlanError("the cluster plan's nodes must be a list of the gpu_hosts filter's entries, got %r" % (nodes,))
    if not isinstance(releases, (list, tuple)):
        raise PlanError("the cluster plan's releases must be a list, got %r" % (releases,))
    if kubevirt is not None and not isinstance(kubevirt, Mapping):
        raise PlanError("the cluster plan's kubevirt settings must be a mapping or null, got %r" % (kubevirt,))
    if live is not None and not isinstance(live, Mapping):
        raise PlanError("the cluster's state must be a mapping of nodes, kubevirt_cr and releases, got %r" % (live,))
    plan = {"read": live is not None, "changes": [], "refusals": []}
    if unread:
        plan["refusals"].append({
            "check": "facts", "problem": "the facts of %s were not read (unreachable, or failed before them); the "
            "releases' values and the KubeVirt entries below leave them out" % ", ".join(unread),
            "fix": "make them reachable and plan again, or plan the others alone with --limit"})
    live_nodes = None if live is None else dict(live.get("nodes") or {})
    live_releases = None if live is None else dict(live.get("releases") or {})
    plan["nodes"] = _nodes(plan, nodes, live_nodes, tuple(taint_key_prefixes or ()))
    plan["releases"] = _releases(plan, list(releases), live_releases)
    plan["kubevirt"] = None
    if kubevirt is not None:
        plan["kubevirt"] = _kubevirt(plan, nodes, kubevirt, None if live is None else (live.get("kubevirt_cr") or {}))
    plan["empty"] = live is not None and not plan["changes"] and not plan["refusals"]
    return plan
