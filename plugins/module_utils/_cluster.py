# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private, pure planning logic of the cluster modules: what to change, never how to send it.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
Functions take plain dicts (Kubernetes objects as the API server returns them, host facts as
gpu_facts returns them) and return plain dicts; they raise ``PlanError`` for input that cannot be
applied. Nothing here talks to the API server, so every rule is unit-tested on its own.
"""

from __future__ import annotations

import copy
import json

from ansible_collections.gpuops.sandbox.plugins.module_utils._kube import parse_version
from ansible_collections.gpuops.sandbox.plugins.module_utils._plugin_names import (
    PluginNameError,
    passthrough_resource_name,
    vgpu_profile_resource_name,
    vgpu_resource_name,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError

WORKLOAD_TYPES = ("container", "vm-passthrough", "vm-vgpu", "dra")
# The types whose hosts need the IOMMU (firmware table, groups, the kernel arguments) and GPUs to give away:
# the VM types, and DRA, whose driver binds a GPU to vfio-pci when a VM's claim is prepared.
IOMMU_WORKLOAD_TYPES = ("vm-passthrough", "vm-vgpu", "dra")
# The types whose GPUs reach VMs through the sandbox device plugin and KubeVirt's permittedHostDevices.
HOST_DEVICE_WORKLOAD_TYPES = ("vm-passthrough", "vm-vgpu")
# The inventory groups (children of gpu_nodes) that stand for a workload type.
WORKLOAD_TYPE_GROUPS = {"container": "container", "vm_passthrough": "vm-passthrough", "vm_vgpu": "vm-vgpu", "dra": "dra"}
WORKLOAD_TYPE_KINDS = {"all": WORKLOAD_TYPES, "iommu": IOMMU_WORKLOAD_TYPES, "host_devices": HOST_DEVICE_WORKLOAD_TYPES}
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
RESOURCE_PREFIX = "nvidia.com/"
# Annotation on the KubeVirt CR listing the permittedHostDevices entries this collection added, so
# it can later remove its own stale entries and never anybody else's.
OWNED_ANNOTATION = "gpuops.sandbox/permitted-host-devices"


class PlanError(GpuopsError):
    """The input cannot be applied; ``msg`` names the bad value and what to do."""

    def __init__(self, msg):
        super().__init__(msg)
        self.msg = msg


# ---------------------------------------------------------------------------------------------
# A host's workload type: one rule for the host half and the cluster half
# ---------------------------------------------------------------------------------------------

def workload_type_of(group_names, given=""):
    """The workload type of a host: ``given`` (its gpuops_workload_type) when not empty, returned as it is (checking
    it is preflight's and workload_labels' job); otherwise the one type its inventory groups stand for
    (WORKLOAD_TYPE_GROUPS), or "" when they stand for none or for two. Raises PlanError for input of the wrong
    kind."""
    if given is not None and not isinstance(given, str):
        raise PlanError("the workload type given must be a string, got %r" % (given,))
    if given:
        return given
    if isinstance(group_names, str) or not isinstance(group_names, (list, tuple)):
        raise PlanError("workload_type_of takes the host's group names (a list), got %r" % (group_names,))
    found = []
    for name in group_names:
        kind = WORKLOAD_TYPE_GROUPS.get(name)
        if kind and kind not in found:
            found.append(kind)
    return found[0] if len(found) == 1 else ""


def host_workload_type(host_vars, given=""):
    """workload_type_of for a host's variables as a play holds them (hostvars[host]: gpuops_workload_type and the
    group_names Ansible sets); ``given``, when not empty, wins over their gpuops_workload_type."""
    return workload_type_of(list(host_vars.get("group_names") or []),
                            given or host_vars.get("gpuops_workload_type") or "")


def untyped_host_message(host, group_names):
    """Why a host without a workload type is refused, and the fix."""
    typed = [name for name in group_names or [] if name in WORKLOAD_TYPE_GROUPS]
    why = ("it is in the groups %s, which stand for different types" % ", ".join(typed) if len(typed) > 1
           else "gpuops_workload_type is not set and none of its groups stands for a type")
    return ("host %s has no workload type: %s; set gpuops_workload_type (one of %s) for the host or its group, or "
            "put it in exactly one of the groups %s" % (host, why, ", ".join(WORKLOAD_TYPES),
                                                        ", ".join(WORKLOAD_TYPE_GROUPS)))


# ---------------------------------------------------------------------------------------------
# Node labels and taints
# ---------------------------------------------------------------------------------------------

def _taint_id(taint):
    return (taint.get("key"), taint.get("value") or "", taint.get("effect"))


# Annotation on a node recording the labels this collection set there and their values, so it later
# removes only its own labels (never the GPU Operator's nvidia.com/gpu.deploy.*=true or a user's).
OWNED_LABELS_ANNOTATION = "gpuops.sandbox/labels"


def owned_labels(node):
    """The ``{key: value}`` this collection recorded on ``node`` (an unreadable record counts as empty)."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(OWNED_LABELS_ANNOTATION)
    try:
        owned = json.loads(text) if text else {}
    except (ValueError, RecursionError):
        return {}
    if not isinstance(owned, dict):
        return {}
    return dict((k, v) for k, v in owned.items() if isinstance(k, str) and isinstance(v, str))


def plan_node(node, labels, taints=None, taint_key_prefixes=(), release_to=None):
    """Work out the merge patch that gives ``node`` the wanted labels and taints.

    ``labels`` maps keys to a value, or to ``None`` for a label that must not be there. A label this
    collection set in an earlier run (recorded in the node's ``gpuops.sandbox/labels`` annotation) that
    is no longer wanted is removed only while it still has the value recorded: a value somebody else
    set (the GPU Operator's ``true`` on a deploy label, a user's choice) is theirs and stays. A released
    label named in ``release_to`` is set to the value given there instead of removed, and not recorded:
    it is handed to its next owner with the value that owner would give it. ``taints``
    (None: leave taints alone) is the full list of taints wanted among the managed ones: a taint is
    managed when its key starts with one of ``taint_key_prefixes`` or it has the key of a wanted
    taint; the node's other taints are kept as they are. Returns ``(patch, before, after)``; ``patch``
    is None when the node already matches. ``before``/``after`` hold only what is managed.
    """
    metadata = node.get("metadata") or {}
    current = metadata.get("labels") or {}
    recorded = owned_labels(node)
    label_patch = {}
    for key, value in labels.items():
        if value is None:
            if key in current:
                label_patch[key] = None
        elif current.get(key) != value:
            label_patch[key] = value
    release_to = release_to or {}
    released = sorted(k for k, v in recorded.items() if k not in labels and current.get(k) == v)
    for key in released:
        if release_to.get(key) != current.get(key):
            label_patch[key] = release_to.get(key)
    managed = sorted(set(labels) | set(released))
    before = {"labels": dict((k, current.get(k)) for k in managed)}
    after = {"labels": dict((k, labels[k] if k in labels else release_to.get(k)) for k in managed)}
    record = dict((k, v) for k, v in labels.items() if v is not None)
    record_text = json.dumps(record, sort_keys=True, separators=(",", ":")) if record else None
    patch = {}
    if label_patch:
        patch["metadata"] = {"labels": label_patch}
    if record != recorded or (record_text or None) != ((metadata.get("annotations") or {}).get(OWNED_LABELS_ANNOTATION) or None):
        patch.setdefault("metadata", {})["annotations"] = {OWNED_LABELS_ANNOTATION: record_text}
    if taints is not None:
        present = (node.get("spec") or {}).get("taints") or []
        wanted_keys = set(t["key"] for t in taints)

        def is_managed(taint):
            key = taint.get("key") or ""
            return key in wanted_keys or any(key.startswith(p) for p in taint_key_prefixes)

        kept = [t for t in present if not is_managed(t)]
        # A wanted taint already on the node is kept as it is (with its timeAdded).
        present_by_id = dict((_taint_id(t), t) for t in present if is_managed(t))
        wanted = []
        for taint in taints:
            entry = dict((k, v) for k, v in taint.items() if v is not None)
            wanted.append(present_by_id.get(_taint_id(entry), entry))
        new = kept + wanted
        before["taints"] = sorted([_taint_id(t) for t in present if is_managed(t)], key=str)
        after["taints"] = sorted([_taint_id(t) for t in wanted], key=str)
        if sorted(_taint_id(t) for t in new) != sorted(_taint_id(t) for t in present):
            patch.setdefault("spec", {})["taints"] = new
            # The list is replaced whole: refuse to overwrite a change made since we read the node.
            patch.setdefault("metadata", {})["resourceVersion"] = metadata.get("resourceVersion")
    return (patch or None), before, after


def inverse_patch(node, patch):
    """The merge patch that undoes ``patch`` on the node as it was before (for rollback)."""
    undo = {}
    metadata = node.get("metadata") or {}
    current = metadata.get("labels") or {}
    if (patch.get("metadata") or {}).get("labels"):
        undo["metadata"] = {"labels": dict((k, current.get(k)) for k in patch["metadata"]["labels"])}
    if "annotations" in (patch.get("metadata") or {}):
        annotations = metadata.get("annotations") or {}
        undo.setdefault("metadata", {})["annotations"] = dict(
            (k, annotations.get(k)) for k in patch["metadata"]["annotations"])
    if "taints" in (patch.get("spec") or {}):
        undo["spec"] = {"taints": (node.get("spec") or {}).get("taints") or []}
    return undo


# ---------------------------------------------------------------------------------------------
# Labels of a GPU node from its workload type
# ---------------------------------------------------------------------------------------------

# Operands the GPU Operator must not run on a DRA node (label nvidia.com/gpu.deploy.<operand>=false). A DRA
# node carries the workload label container, so the operator's container operands are its candidates; it
# honours a deploy label that already has a value. The DRA driver advertises the GPUs and binds them to
# vfio-pci itself, so the device plugin must not run (the DRA chart refuses to share a node with it); the
# operator validator's plugin check waits for nvidia.com/gpu, which never comes without the device plugin,
# so it goes too, and with it gpu-feature-discovery and dcgm-exporter, which wait for the validator's
# toolkit-ready file; DCGM holds /dev/nvidia* and blocks the DRA driver's switch between nvidia and
# vfio-pci (the DRA guide: DCGM before 4.5.0). The driver and the container toolkit stay.
DRA_DISABLED_OPERANDS = ("device-plugin", "operator-validator", "gpu-feature-discovery", "dcgm", "dcgm-exporter")
WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
VGPU_CONFIG_LABEL = "nvidia.com/vgpu.config"
# The config the vGPU Device Manager applies to a node without nvidia.com/vgpu.config (the chart's
# vgpuDeviceManager.config.default).
VGPU_DEFAULT_CONFIG = "default"


def release_labels(workload_type):
    """What the collection's released labels become on a node of ``workload_type`` (for :func:`plan_node`).

    A DRA node keeps the workload label ``container``, so when it turns into a container node the GPU
    Operator sees no change to act on: it relabels a node only when labels such as the workload label
    change, and never looks at deploy labels alone. The collection's ``false`` deploy labels are therefore
    handed over as ``true``, the value the operator gives a container node's operands, and are the
    operator's from then on. On the other types the operator's relabel (the workload label changes)
    decides, so the labels are just removed.
    """
    if workload_type != "container":
        return {}
    return dict(("nvidia.com/gpu.deploy.%s" % operand, "true") for operand in DRA_DISABLED_OPERANDS)


def workload_labels(workload_type, vgpu_config_name=None, vgpu_configs=None, vgpu_config_default=None):
    """The collection's labels of a GPU node (``None`` values: labels to remove).

    ``vgpu_configs`` (when not None) are the config names the vGPU Device Manager knows; a vm-vgpu
    node's ``vgpu_config_name`` must be one of them, and a vm-vgpu node without one is refused unless the
    config the manager falls back to (``vgpu_config_default``, else ``default``) is among them. Deploy
    labels are only ever set to ``false`` (on DRA nodes); the operator's own ``true`` values are never
    asked for or removed here (see :func:`plan_node` for how labels set earlier are released).
    """
    if workload_type not in WORKLOAD_TYPES:
        raise PlanError("workload type %r is not one of %s" % (workload_type, ", ".join(WORKLOAD_TYPES)))
    labels = {WORKLOAD_LABEL: "container" if workload_type == "dra" else workload_type, VGPU_CONFIG_LABEL: None}
    if workload_type == "vm-vgpu" and vgpu_config_name:
        if vgpu_configs is not None and vgpu_config_name not in vgpu_configs:
            raise PlanError("vGPU config %r is not in the vGPU Device Manager's configuration (it has: %s)"
                            % (vgpu_config_name, ", ".join(sorted(vgpu_configs)) or "none"))
        labels[VGPU_CONFIG_LABEL] = vgpu_config_name
    elif workload_type == "vm-vgpu" and vgpu_configs is not None:
        fallback = vgpu_config_default or VGPU_DEFAULT_CONFIG
        if fallback not in vgpu_configs:
            raise PlanError("a vm-vgpu node needs a vGPU config name (gpuops_vgpu_config_name): without one the vGPU "
                            "Device Manager applies the config %r, which its configuration does not have (it has: %s)"
                            % (fallback, ", ".join(sorted(vgpu_configs)) or "none"))
    if workload_type == "dra":
        for operand in DRA_DISABLED_OPERANDS:
            labels["nvidia.com/gpu.deploy.%s" % operand] = "false"
    return labels


# ---------------------------------------------------------------------------------------------
# The vGPU Manager image and the nodes' OS
# ---------------------------------------------------------------------------------------------

# Distributions whose image tag the GPU Operator builds from the major version only.
_MAJOR_ONLY = ("ol", "rocky", "rhel")


def operator_os_tag(os_id, version_id):
    """``<ID><VERSION_ID>`` as the GPU Operator builds it from a node's NFD os-release labels, or None."""
    if not os_id or not version_id:
        return None
    version = version_id.split(".")[0] if os_id in _MAJOR_ONLY else version_id
    return "%s%s" % (os_id, version)


def vgpu_manager_os_problems(entries, built_os_tags):
    """What keeps the vGPU Manager image from fitting the vm-vgpu nodes; empty when it fits.

    ``entries`` as :func:`gpu_hosts` returns them, ``built_os_tags`` the OS tags the image was built for
    (``vgpu_manager_image_os_tag``). The operator runs one vgpu-manager DaemonSet whose image tag is the
    driver version plus ``-<ID><VERSION_ID>`` of one GPU node it lists, so every vm-vgpu node needs that
    tag to exist, and GPU nodes of several OSes make the tag depend on which node the operator reads.
    """
    vgpu = [e for e in entries if e.get("workload_type") == "vm-vgpu"]
    if not vgpu or not built_os_tags:
        return []
    problems = []
    built = sorted(set(built_os_tags))
    for entry in vgpu:
        if entry.get("os_tag") and entry["os_tag"] not in built:
            problems.append("host %s (vm-vgpu) runs %s, but the vGPU Manager image is built for %s only: the GPU Operator "
                            "would pull a tag ending in -%s, which does not exist; build the image for %s "
                            "(vgpu_manager_image_os_tag)" % (entry["host"], entry["os_tag"], ", ".join(built),
                                                             entry["os_tag"], entry["os_tag"]))
    tags = sorted(set(e["os_tag"] for e in entries if e.get("os_tag")))
    if len(tags) > 1:
        problems.append("the GPU nodes run several OSes (%s): the GPU Operator takes the OS of one GPU node for every "
                        "node's vgpu-manager image tag, so the vm-vgpu nodes may get an image of another OS; run the GPU "
                        "nodes on one OS release" % ", ".join("%s: %s" % (t, ", ".join(sorted(
                            e["host"] for e in entries if e.get("os_tag") == t))) for t in tags))
    return problems


def helm_foreign_objects(existing, rendered, release_name, release_namespace):
    """Names of the rendered objects that already exist and are not Helm's for this release.

    ``rendered`` are the documents of ``helm template`` (other values are skipped), ``existing`` the objects
    read from the cluster (``k8s_info`` resources). Helm refuses to install over an object that lacks its
    ownership marks (label ``app.kubernetes.io/managed-by=Helm``, annotations ``meta.helm.sh/release-name``
    and ``meta.helm.sh/release-namespace``) or carries another release's; such an object is returned as
    ``Kind/name`` (``Kind/namespace/name`` when namespaced), sorted.
    """
    def key(obj):
        meta = obj.get("metadata") or {}
        return (obj.get("kind"), meta.get("namespace") or "", meta.get("name"))

    wanted = set(key(d) for d in rendered or [] if isinstance(d, dict) and d.get("kind") and d.get("metadata"))
    foreign = []
    for obj in existing or []:
        if not isinstance(obj, dict) or key(obj) not in wanted:
            continue
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if (labels.get("app.kubernetes.io/managed-by") != "Helm"
                or annotations.get("meta.helm.sh/release-name") != release_name
                or annotations.get("meta.helm.sh/release-namespace") != release_namespace):
            kind, namespace, name = key(obj)
            foreign.append("/".join(p for p in (kind, namespace, name) if p))
    return sorted(foreign)


# ---------------------------------------------------------------------------------------------
# KubeVirt permittedHostDevices and feature gates
# ---------------------------------------------------------------------------------------------

def _type_selected(name, wanted, type_id=None):
    """Whether a vGPU type (its name, its id) is one of ``wanted`` (None: every type).

    A wanted entry matches the type id (``mtty-1``, ``nvidia-593``), the name (``NVIDIA A10-4Q``) or the
    name without the ``NVIDIA`` prefix (``A10-4Q``, as the vGPU Device Manager's config names types), like
    the host half's vGPU plan does.
    """
    if wanted is None:
        return True
    return any(t == name or "NVIDIA " + t == name or (type_id is not None and t == type_id) for t in wanted)


def _vendor_vgpu_catalogs(gpus):
    """Vendor-specific vGPU type catalogs per physical GPU: ``{pf_address: {type_id: name}}``.

    Type ids are unique only within one card, so the catalog of a VF is merged from every function of
    its own card (the PF and all its VFs): a configured VF often lists no creatable type any more.
    """
    catalogs = {}
    for gpu in gpus:
        vgpu = gpu.get("vgpu") or {}
        card = gpu.get("physfn") or gpu.get("address")
        for vtype in vgpu.get("creatable_types") or []:
            try:
                type_id = int(vtype.get("id"))
            except (TypeError, ValueError):
                continue
            if vtype.get("name"):
                catalogs.setdefault(card, {}).setdefault(type_id, vtype["name"])
    return catalogs


def _vendor_vgpu_entries(name, gpus, wanted, vendors, notes):
    """``pciHostDevices`` entries for NVIDIA vendor-specific vGPU VFs (no mdev bus).

    The sandbox device plugin hands such a VF to a VM as a PCI device, named after the vGPU profile
    configured on it (``current_vgpu_type`` resolved through its card's catalog). A configured VF gives an
    entry for its profile (when the profile is wanted); a VF without a type yet gives an entry for each
    wanted profile its card can create, since the host half configures it next.
    """
    catalogs = _vendor_vgpu_catalogs(gpus)
    entries = []
    for gpu in gpus:
        vgpu = gpu.get("vgpu")
        if not vgpu or not gpu.get("is_vf") or (gpu.get("vendor") or "").lower() not in vendors:
            continue
        catalog = catalogs.get(gpu.get("physfn") or gpu.get("address")) or {}
        selector = "%s:%s" % (gpu["vendor"].upper(), gpu["device"].upper())
        current = vgpu.get("current_type")
        if current:
            profile = catalog.get(current)
            if profile is None:
                notes.append("host %s: VF %s has vGPU type %s, which no function of its GPU lists; it is left out"
                             % (name, gpu.get("address"), current))
                continue
            profiles = [profile] if _type_selected(profile, wanted) else []
        elif wanted is not None:
            profiles = [p for p in sorted(set(catalog.values())) if _type_selected(p, wanted)]
        else:
            profiles = []
        for profile in profiles:
            entries.append({"pciVendorSelector": selector, "resourceName": vgpu_profile_resource_name(profile),
                            "externalResourceProvider": True})
    return entries


def _passthrough_name(device, resource_names, plugin_pci_ids):
    try:
        return passthrough_resource_name(device, overrides=resource_names, pci_ids=plugin_pci_ids)
    except PluginNameError as exc:
        raise PlanError(exc.msg)


def desired_host_devices(hosts, pci_vendor_ids=("10de",), resource_names=None, plugin_pci_ids=None):
    """permittedHostDevices entries for the hosts' facts: ``(pci, mdev, needs_dra, needs_vgpu, notes)``.

    Each host is ``{name, workload_type, gpus, mdev_parents, vgpu_type_names}`` (gpus and
    mdev_parents as M(gpuops.sandbox.gpu_facts) returns them). vm-passthrough hosts contribute one
    PCI entry per device ID of their GPUs, named as the sandbox device plugin version the GPU Operator
    deploys names it (its own pci.ids, never the host's: see ``_plugin_names``), unless
    ``resource_names`` (``{"10de:2330": "nvidia.com/..."}``) or ``plugin_pci_ids`` (the text of the
    plugin image's pci.ids) say otherwise. vm-vgpu hosts contribute one mediated entry per mdev type
    and one PCI entry per vendor-specific vGPU profile of their VFs (only the types named in
    ``vgpu_type_names`` when it is given).
    """
    vendors = set(v.lower() for v in pci_vendor_ids)
    pci, mdev, notes = {}, {}, []
    needs_dra = needs_vgpu = False
    for host in hosts:
        name = host.get("name") or "?"
        wtype = host.get("workload_type")
        if wtype not in WORKLOAD_TYPES:
            raise PlanError("host %s: workload type %r is not one of %s" % (name, wtype, ", ".join(WORKLOAD_TYPES)))
        gpus = host.get("gpus") or []
        if wtype == "dra":
            needs_dra = True
        elif wtype == "vm-passthrough":
            found = 0
            for gpu in gpus:
                if (gpu.get("vendor") or "").lower() not in vendors or gpu.get("is_vf"):
                    continue
                selector = "%s:%s" % (gpu["vendor"].upper(), gpu["device"].upper())
                resource = _passthrough_name(gpu["device"], resource_names, plugin_pci_ids)
                pci[(selector, resource)] = {"pciVendorSelector": selector, "resourceName": resource,
                                             "externalResourceProvider": True}
                found += 1
            if not found:
                notes.append("host %s (vm-passthrough) has no GPU of vendor %s" % (name, "/".join(sorted(vendors))))
        elif wtype == "vm-vgpu":
            needs_vgpu = True
            wanted = host.get("vgpu_type_names")
            types = []
            for gpu in gpus:
                types.extend(gpu.get("mdev_types") or [])
            for parent in host.get("mdev_parents") or []:
                types.extend(parent.get("types") or [])
            found = 0
            for mtype in types:
                tname = mtype.get("name")
                if not tname or not _type_selected(tname, wanted, mtype.get("id")):
                    continue
                resource = mtype.get("resource_name") or vgpu_resource_name(tname)
                mdev[(tname, resource)] = {"mdevNameSelector": tname, "resourceName": resource,
                                           "externalResourceProvider": True}
                found += 1
            for entry in _vendor_vgpu_entries(name, gpus, wanted, vendors, notes):
                pci[(entry["pciVendorSelector"], entry["resourceName"])] = entry
                found += 1
            if not found:
                notes.append("host %s (vm-vgpu) offers no vGPU type (mdev or vendor-specific)%s" % (
                    name, " named %s" % ", ".join(wanted) if wanted is not None else ""))
    pci_list = [pci[k] for k in sorted(pci)]
    mdev_list = [mdev[k] for k in sorted(mdev)]
    return pci_list, mdev_list, needs_dra, needs_vgpu, notes


def _norm(selector):
    return (selector or "").strip().upper()


def merge_entries(existing, desired, owned, selector_key, kind, prune=True):
    """Merge ``desired`` entries into ``existing`` (a permittedHostDevices list).

    Entries of anybody else are kept untouched. ``owned`` holds ``(selector, resourceName)`` of the
    entries this collection added earlier; with ``prune`` those no longer desired are removed.
    Returns ``(new_list, added, removed, conflicts, now_owned)``.
    """
    desired_ids = set((_norm(d[selector_key]), d["resourceName"]) for d in desired)
    owned = set((_norm(s), r) for s, r in owned)
    conflicts = []
    new, removed = [], []
    present_ids = set()
    for entry in existing:
        eid = (_norm(entry.get(selector_key)), entry.get("resourceName"))
        if eid in owned and eid not in desired_ids and prune:
            removed.append(entry)
            continue
        new.append(entry)
        present_ids.add(eid)
        if eid in owned:
            continue
        for want in desired:
            wid = (_norm(want[selector_key]), want["resourceName"])
            if eid == wid:
                if entry.get("externalResourceProvider") is not True:
                    conflicts.append("%s entry %s has externalResourceProvider %s, but the NVIDIA sandbox device "
                                     "plugin provides %s" % (kind, json.dumps(entry, sort_keys=True),
                                                             entry.get("externalResourceProvider"), want["resourceName"]))
            elif eid[1] == wid[1] and eid not in desired_ids:
                conflicts.append("%s entry %s has resourceName %s with %s %s, but the hosts need %s %s for it"
                                 % (kind, json.dumps(entry, sort_keys=True), wid[1], selector_key, entry.get(selector_key),
                                    selector_key, want[selector_key]))
            elif eid[0] == wid[0] and eid not in desired_ids:
                conflicts.append("%s entry %s gives %s %s the resourceName %s, but the sandbox device plugin "
                                 "advertises it as %s" % (kind, json.dumps(entry, sort_keys=True), selector_key,
                                                          entry.get(selector_key), eid[1], wid[1]))
    added = [d for d in desired if (_norm(d[selector_key]), d["resourceName"]) not in present_ids]
    new.extend(copy.deepcopy(added))
    now_owned = sorted((owned & present_ids & desired_ids) | set((_norm(d[selector_key]), d["resourceName"]) for d in added))
    return new, added, removed, conflicts, now_owned


# KubeVirt from v1.8 turns its own mdev handling off through this field; DisableMDEVConfiguration is deprecated.
MDEV_FIELD_VERSION = (1, 8)


def mdev_configuration_by_field(version):
    """Whether KubeVirt ``version`` takes ``mediatedDevicesConfiguration.enabled`` (else the gate); unknown: no."""
    parsed = parse_version(version)
    return parsed is not None and parsed[:2] >= MDEV_FIELD_VERSION


def needed_feature_gates(version, needs_devices, needs_vgpu, needs_dra, disable_mdev_configuration=True, extra=()):
    """The feature gates KubeVirt ``version`` needs for what the hosts use; PlanError when it cannot.

    KubeVirt's own mdev handling is turned off with the DisableMDEVConfiguration gate only where the
    version has no ``mediatedDevicesConfiguration.enabled`` field (before v1.8, or when the version is
    unknown); see :func:`plan_kubevirt`.
    """
    gates = []
    if needs_devices or needs_vgpu or needs_dra:
        gates.extend(["GPU", "HostDevices"])
    if needs_vgpu and disable_mdev_configuration and not mdev_configuration_by_field(version):
        gates.append("DisableMDEVConfiguration")
    if needs_dra:
        parsed = parse_version(version)
        if parsed is None:
            raise PlanError("cannot tell which KubeVirt version runs (status.observedKubeVirtVersion is %r): "
                            "DRA hosts need GPUsWithDRA on v1.8.x only; give kubevirt_version" % (version,))
        if parsed[:2] < (1, 8):
            raise PlanError("KubeVirt %s cannot attach GPUs through DRA (GPUsWithDRA needs v1.8 or later); "
                            "upgrade KubeVirt or do not use the dra workload type" % version)
        if parsed[:2] == (1, 8):
            gates.append("GPUsWithDRA")
    for gate in extra:
        if gate not in gates:
            gates.append(gate)
    return gates


def _rename(entries, renames):
    """Entries with their resourceName replaced where ``renames`` (old name -> new name) says so."""
    if not renames:
        return entries
    return [dict(e, resourceName=renames.get(e["resourceName"], e["resourceName"])) for e in entries]


def plan_kubevirt(cr, hosts, pci_vendor_ids=("10de",), kubevirt_version=None, disable_mdev_configuration=True,
                  extra_feature_gates=(), prune=True, resource_names=None, plugin_pci_ids=None, renames=None):
    """The merge patch for the KubeVirt CR ``cr``; raises PlanError listing every conflict.

    Returns a dict with ``patch`` (None when nothing changes), ``before``/``after`` (the managed
    parts of the CR), ``added``, ``removed``, ``feature_gates_added``, ``version`` and ``notes``.
    ``renames`` (resource name -> name the nodes really advertise, see :func:`advertised_names`)
    replaces generated names. On KubeVirt v1.8 and later, vGPU hosts turn KubeVirt's own mdev handling
    off through ``mediatedDevicesConfiguration.enabled: false`` instead of the deprecated gate; a value
    somebody already set there is kept (and a ``true`` is reported in the notes).
    """
    metadata = cr.get("metadata") or {}
    configuration = (cr.get("spec") or {}).get("configuration") or {}
    phd = configuration.get("permittedHostDevices") or {}
    dev = configuration.get("developerConfiguration") or {}
    mdev_conf = configuration.get("mediatedDevicesConfiguration") or {}
    version = kubevirt_version or (cr.get("status") or {}).get("observedKubeVirtVersion")
    pci, mdev, needs_dra, needs_vgpu, notes = desired_host_devices(hosts, pci_vendor_ids, resource_names, plugin_pci_ids)
    pci, mdev = _rename(pci, renames), _rename(mdev, renames)
    try:
        owned = json.loads((metadata.get("annotations") or {}).get(OWNED_ANNOTATION) or "{}")
    except (ValueError, RecursionError):
        owned = {}
    new_pci, pci_added, pci_removed, pci_conflicts, pci_owned = merge_entries(
        phd.get("pciHostDevices") or [], pci, owned.get("pciHostDevices") or [], "pciVendorSelector",
        "pciHostDevices", prune)
    new_mdev, mdev_added, mdev_removed, mdev_conflicts, mdev_owned = merge_entries(
        phd.get("mediatedDevices") or [], mdev, owned.get("mediatedDevices") or [], "mdevNameSelector",
        "mediatedDevices", prune)
    conflicts = pci_conflicts + mdev_conflicts
    gates = needed_feature_gates(version, bool(pci or mdev), needs_vgpu, needs_dra, disable_mdev_configuration,
                                 extra_feature_gates)
    disabled = dev.get("disabledFeatureGates") or []
    for gate in gates:
        if gate in disabled:
            conflicts.append("feature gate %s is listed in spec.configuration.developerConfiguration."
                             "disabledFeatureGates, but the GPU hosts need it" % gate)
    if conflicts:
        raise PlanError("the KubeVirt CR %s/%s conflicts with what the GPU hosts need; resolve these, nothing was "
                        "changed: %s" % (metadata.get("namespace"), metadata.get("name"), "; ".join(conflicts)))
    mdev_enabled_after = mdev_conf.get("enabled")
    if needs_vgpu and disable_mdev_configuration and mdev_configuration_by_field(version):
        if "enabled" not in mdev_conf:
            mdev_enabled_after = False
        elif mdev_conf.get("enabled") is not False:
            notes.append("KubeVirt's own mdev handling is on (spec.configuration.mediatedDevicesConfiguration.enabled "
                         "is %s, set by somebody else, kept): it may remove or recreate the vGPUs the vGPU Device "
                         "Manager creates; set it to false" % json.dumps(mdev_conf.get("enabled")))
    current_gates = dev.get("featureGates") or []
    gates_added = [g for g in gates if g not in current_gates]
    new_owned = {"pciHostDevices": [list(x) for x in pci_owned], "mediatedDevices": [list(x) for x in mdev_owned]}
    owned_text = json.dumps(new_owned, sort_keys=True, separators=(",", ":"))
    before = {"permittedHostDevices": {"pciHostDevices": phd.get("pciHostDevices") or [],
                                       "mediatedDevices": phd.get("mediatedDevices") or []},
              "featureGates": current_gates}
    after = {"permittedHostDevices": {"pciHostDevices": new_pci, "mediatedDevices": new_mdev},
             "featureGates": current_gates + gates_added}
    if "enabled" in mdev_conf or mdev_enabled_after is not None:
        before["mediatedDevicesConfiguration"] = {"enabled": mdev_conf.get("enabled")}
        after["mediatedDevicesConfiguration"] = {"enabled": mdev_enabled_after}
    patch = None
    if before != after or (metadata.get("annotations") or {}).get(OWNED_ANNOTATION) != owned_text:
        patch_phd = {"pciHostDevices": new_pci}
        if new_mdev or "mediatedDevices" in phd:
            patch_phd["mediatedDevices"] = new_mdev
        patch_conf = {"permittedHostDevices": patch_phd}
        if gates_added:
            patch_conf["developerConfiguration"] = {"featureGates": current_gates + gates_added}
        if mdev_enabled_after is not None and mdev_enabled_after != mdev_conf.get("enabled"):
            # A merge patch of this one key keeps the rest of mediatedDevicesConfiguration.
            patch_conf["mediatedDevicesConfiguration"] = {"enabled": mdev_enabled_after}
        # The lists are replaced whole: the resourceVersion makes the API server refuse the patch when
        # somebody changed the CR since it was read, instead of losing their change.
        patch = {"metadata": {"resourceVersion": metadata.get("resourceVersion"),
                              "annotations": {OWNED_ANNOTATION: owned_text}},
                 "spec": {"configuration": patch_conf}}
    return {"patch": patch, "before": before, "after": after, "added": pci_added + mdev_added,
            "removed": pci_removed + mdev_removed, "feature_gates_added": gates_added, "version": version,
            "notes": notes}


# ---------------------------------------------------------------------------------------------
# What the nodes really advertise
# ---------------------------------------------------------------------------------------------

# Resources of the (container) NVIDIA device plugin, never of the sandbox device plugin.
CONTAINER_RESOURCES = ("nvidia.com/gpu",)


def _sandbox_resources(node):
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return set(k for k in allocatable if k.startswith(RESOURCE_PREFIX) and k not in CONTAINER_RESOURCES
               and not k.startswith(RESOURCE_PREFIX + "mig-"))


def advertised_names(hosts, nodes, entries, pci_vendor_ids=("10de",), resource_names=None, plugin_pci_ids=None):
    """Compare the permitted resource names with what the nodes advertise in ``status.allocatable``.

    ``hosts`` as for :func:`desired_host_devices` (``name`` is the node name), ``nodes`` the cluster's
    Node objects, ``entries`` every permittedHostDevices entry (after the change). Only nodes of VM
    hosts whose sandbox device plugin advertises anything are judged: before the plugin runs nothing
    is known. Returns ``{"checked_nodes", "unadvertised", "unpermitted", "renames", "notes"}``:
    ``unadvertised`` are entries whose resourceName no node advertises; ``unpermitted`` the
    ``(node, resource)`` pairs a node advertises that no entry permits; ``renames`` maps a generated
    name to the one the node advertises where that is unambiguous (the host's only missing name and
    the node's only unexplained one), for the caller to apply.
    """
    by_name = dict(((n.get("metadata") or {}).get("name"), n) for n in nodes)
    advertised_anywhere = set()
    for node in nodes:
        advertised_anywhere |= _sandbox_resources(node)
    permitted = set(e.get("resourceName") for e in entries)
    checked, unpermitted, notes = [], [], []
    renames, candidates = {}, {}
    for host in hosts:
        if host.get("workload_type") not in HOST_DEVICE_WORKLOAD_TYPES:
            continue
        node = by_name.get(host.get("name"))
        if node is None:
            notes.append("node %s of a %s host does not exist (yet)" % (host.get("name"), host.get("workload_type")))
            continue
        offered = _sandbox_resources(node)
        if not offered:
            continue
        checked.append(host["name"])
        pci, mdev = desired_host_devices([host], pci_vendor_ids, resource_names, plugin_pci_ids)[:2]
        wanted = set(e["resourceName"] for e in pci + mdev)
        for resource in sorted(offered - permitted):
            unpermitted.append({"node": host["name"], "resourceName": resource})
        missing = wanted - offered
        unexplained = offered - wanted
        if len(missing) == 1 and len(unexplained) == 1:
            candidates.setdefault(missing.pop(), set()).add(unexplained.pop())
    for old, new in candidates.items():
        if len(new) == 1:
            renames[old] = new.pop()
        else:
            notes.append("nodes advertise different names (%s) where %s was expected; not renamed"
                         % (", ".join(sorted(new)), old))
    unadvertised = []
    if checked:
        unadvertised = [e for e in entries if (e.get("resourceName") or "").startswith(RESOURCE_PREFIX)
                        and e.get("resourceName") not in advertised_anywhere]
    return {"checked_nodes": checked, "unadvertised": unadvertised, "unpermitted": unpermitted,
            "renames": renames, "notes": notes}


# ---------------------------------------------------------------------------------------------
# DRA nodes: what the DRA driver publishes for them
# ---------------------------------------------------------------------------------------------

DRA_DRIVER = "gpu.nvidia.com"


def _device_attribute(device, driver, name):
    """A device attribute of a ResourceSlice (unqualified or qualified by the driver's domain), as a plain value."""
    attributes = device.get("attributes") or {}
    value = attributes.get(name, attributes.get("%s/%s" % (driver, name)))
    if isinstance(value, dict):
        for kind in ("string", "int", "bool", "version"):
            if kind in value:
                return value[kind]
    return None


def dra_node_problems(entries, slices, device_classes, driver=DRA_DRIVER, device_types=("vfio", "gpu"),
                      wanted_classes=("vfio.gpu.nvidia.com",)):
    """``{node: [what it lacks]}`` for every DRA entry of :func:`gpu_hosts`; an empty list means ready.

    ``slices`` and ``device_classes`` are the ResourceSlices and DeviceClasses read from the cluster. A DRA node
    is ready when the classes in ``wanted_classes`` exist and the driver has published a ResourceSlice for the
    node (``spec.nodeName``) with a device whose ``type`` attribute is one of ``device_types`` (the attribute the
    chart's DeviceClasses select on: ``gpu`` for containers, ``vfio`` for passthrough to VMs).
    """
    have = set(((c or {}).get("metadata") or {}).get("name") for c in device_classes or [])
    lacking_classes = ["DeviceClass %s" % c for c in wanted_classes if c not in have]
    problems = {}
    for entry in entries or []:
        if entry.get("workload_type") != "dra":
            continue
        devices = []
        for item in slices or []:
            spec = (item or {}).get("spec") or {}
            if spec.get("driver") == driver and spec.get("nodeName") == entry.get("name"):
                devices.extend(spec.get("devices") or [])
        lacks = list(lacking_classes)
        if not devices:
            lacks.append("a ResourceSlice of %s with devices" % driver)
        elif device_types:
            types = sorted(set(str(t) for t in (_device_attribute(d, driver, "type") for d in devices) if t is not None))
            if not set(types) & set(device_types):
                lacks.append("a %s device of type %s in its ResourceSlices (they offer %s)"
                             % (driver, " or ".join(device_types), ", ".join(types) or "devices without a type"))
        problems[entry.get("name")] = lacks
    return problems
