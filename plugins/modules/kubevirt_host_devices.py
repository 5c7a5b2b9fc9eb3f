#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kubevirt_host_devices
short_description: Permit the GPUs the hosts have in the KubeVirt CR and turn on the feature gates they need
version_added: 1.0.0
description:
  - Builds C(spec.configuration.permittedHostDevices) of the KubeVirt CR from the facts
    M(gpuops.sandbox.gpu_facts) gathered on the GPU hosts, instead of looking PCI IDs up by hand.
    C(vm-passthrough) hosts give one C(pciHostDevices) entry per GPU device ID (C(pciVendorSelector)
    C(VVVV:DDDD) and the C(resourceName) the NVIDIA sandbox device plugin advertises); C(vm-vgpu) hosts
    give one C(mediatedDevices) entry per mdev type (C(mdevNameSelector) and its resource name). Every
    entry has C(externalResourceProvider=true).
  - Merges with the entries already in the CR and never drops an entry somebody else added. The
    entries this module added are recorded in the annotation C(gpuops.sandbox/permitted-host-devices)
    so that, with O(prune), the ones no host needs any more are removed.
  - C(vm-vgpu) hosts whose GPUs use NVIDIA's vendor-specific vGPU (Ada, Hopper, Blackwell; SR-IOV VFs with
    C(nvidia/current_vgpu_type), no mdev bus) give one C(pciHostDevices) entry per vGPU profile, with the VF's
    C(VVVV:DDDD) and C(nvidia.com/) plus the profile name with whitespace turned into C(_) (C(NVIDIA L40S-8Q)
    gives C(nvidia.com/NVIDIA_L40S-8Q)), which is how the sandbox device plugin's vendor-specific vGPU
    support names them.
  - Passthrough resource names come from the pci.ids inside the sandbox device plugin image the GPU Operator
    deploys (the collection carries the table of names it gives), never from the host's own pci.ids, which
    names many GPUs otherwise. O(resource_names) and O(plugin_pci_ids) override it.
  - Adds the feature gates the KubeVirt version needs (C(GPU), C(HostDevices), C(GPUsWithDRA) on v1.8.x for DRA
    hosts). For vGPU hosts it turns KubeVirt's own mdev handling off, with
    C(spec.configuration.mediatedDevicesConfiguration.enabled=false) on KubeVirt v1.8 and later, with the
    deprecated C(DisableMDEVConfiguration) gate before (or when the version is unknown); a value somebody already
    set in that field is kept. It never removes a feature gate.
  - A conflict (an existing entry with the same resource name and another selector, the same selector
    under another resource name, C(externalResourceProvider) not true, or a needed gate listed in
    C(disabledFeatureGates)) fails with every conflict named, and nothing is changed.
  - The patch carries the CR's C(resourceVersion), so a change made by somebody else meanwhile is
    never overwritten.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  hosts:
    description:
      - The GPU hosts, each with its workload type and its facts from M(gpuops.sandbox.gpu_facts).
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Host (or node) name, for messages.
        type: str
        required: true
      workload_type:
        description: Workload type of the host.
        type: str
        required: true
        choices: [container, vm-passthrough, vm-vgpu, dra]
      gpus:
        description:
          - The host's C(gpu_facts_gpus) fact.
          - Every entry needs C(vendor) and C(device), each 4 hex digits; C(is_vf) is a boolean, C(address) and
            C(physfn) strings, C(mdev_types) a list of mappings, C(vgpu) a mapping, as M(gpuops.sandbox.gpu_facts)
            returns them. An entry otherwise fails, naming it, before the first request.
        type: list
        elements: dict
        default: []
      mdev_parents:
        description:
          - The host's C(gpu_facts_mdev_parents) fact (mdev parents that are not PCI functions).
          - The C(types) of an entry is a list of mappings, as M(gpuops.sandbox.gpu_facts) returns it.
        type: list
        elements: dict
        default: []
      vgpu_type_names:
        description:
          - Permit only these vGPU types of a C(vm-vgpu) host, by mdev type name or by the vGPU Device
            Manager's type name (C(A10-4Q) matches C(NVIDIA A10-4Q)).
          - When omitted, every mdev type of the host is permitted.
        type: list
        elements: str
  namespace:
    description:
      - Namespace of the KubeVirt CR; an empty string searches every namespace.
    type: str
    default: kubevirt
  name:
    description:
      - Name of the KubeVirt CR; may be omitted when the namespace holds exactly one.
    type: str
  pci_vendor_ids:
    description:
      - Vendor IDs (4 hex digits, such as C(10de), without C(0x)) of the GPUs that go into C(pciHostDevices).
    type: list
    elements: str
    default: ["10de"]
  kubevirt_version:
    description:
      - KubeVirt version to choose feature gates for, such as C(v1.8.2).
      - When omitted, the CR's C(status.observedKubeVirtVersion) is used.
    type: str
  disable_mdev_configuration:
    description:
      - Add the C(DisableMDEVConfiguration) gate when there are vGPU hosts, so KubeVirt leaves mdev
        creation to the NVIDIA vGPU Device Manager.
    type: bool
    default: true
  feature_gates:
    description:
      - More feature gates to make sure are on.
    type: list
    elements: str
    default: []
  prune:
    description:
      - Remove the entries this module added earlier that no host needs any more.
    type: bool
    default: true
  resource_names:
    description:
      - Resource names of passthrough GPUs by device ID (C(10de:2330) or C(2330)), for a sandbox device
        plugin that names them otherwise than the plugin version the GPU Operator deploys.
      - Device IDs not listed here are named from O(plugin_pci_ids) when it is given, else from the
        collection's naming table of that plugin version (see the README).
    type: dict
    default: {}
  plugin_pci_ids:
    description:
      - Path, on the controller, of the C(pci.ids) file inside the sandbox device plugin image in use, to name
        passthrough GPUs from it instead of the collection's naming table.
    type: path
  check_advertised:
    description:
      - Read the nodes' C(status.allocatable) and report (RV(advertised)) every entry naming a resource no node
        advertises and every sandbox resource a node advertises that no entry permits. Nodes whose sandbox
        device plugin advertises nothing yet are not judged.
    type: bool
    default: true
  use_advertised_names:
    description:
      - Where a host's node advertises a name other than the generated one and the pairing is unambiguous (the
        host's only missing name, the node's only unexplained one), use the advertised name in the CR.
    type: bool
    default: false
extends_documentation_fragment:
  - gpuops.sandbox.kube_auth
  - gpuops.sandbox.attributes
attributes:
  diff_mode:
    support: full
seealso:
  - module: gpuops.sandbox.gpu_facts
  - module: gpuops.sandbox.node_labels
"""

EXAMPLES = r"""
- name: Gather the GPUs of the hosts
  gpuops.sandbox.gpu_facts:
  delegate_to: "{{ item }}"
  delegate_facts: true
  loop: "{{ groups['gpu_nodes'] }}"

- name: Permit the hosts' GPUs and vGPU types in the KubeVirt CR
  gpuops.sandbox.kubevirt_host_devices:
    kubeconfig: /etc/kubernetes/admin.conf
    hosts:
      - name: gpu-node-2
        workload_type: vm-passthrough
        gpus: "{{ hostvars['gpu-node-2'].gpu_facts_gpus }}"
      - name: gpu-node-3
        workload_type: vm-vgpu
        gpus: "{{ hostvars['gpu-node-3'].gpu_facts_gpus }}"
        vgpu_type_names: [A10-4Q]

- name: Turn on DRA GPUs for a KubeVirt not yet reporting its version
  gpuops.sandbox.kubevirt_host_devices:
    namespace: kubevirt
    name: kubevirt
    kubevirt_version: v1.8.2
    hosts:
      - name: gpu-node-5
        workload_type: dra
"""

RETURN = r"""
kubevirt:
  description: The KubeVirt CR acted on and the version the feature gates were chosen for.
  returned: success
  type: dict
  sample: {namespace: kubevirt, name: kubevirt, version: v1.8.2}
permitted_host_devices:
  description: C(pciHostDevices) and C(mediatedDevices) of the CR after the change (in check mode, as they would be).
  returned: success
  type: dict
  sample:
    pciHostDevices:
      - {pciVendorSelector: "10DE:2236", resourceName: nvidia.com/GA102GL_A10, externalResourceProvider: true}
    mediatedDevices:
      - {mdevNameSelector: NVIDIA A10-4Q, resourceName: nvidia.com/NVIDIA_A10-4Q, externalResourceProvider: true}
feature_gates:
  description: C(developerConfiguration.featureGates) after the change.
  returned: success
  type: list
  elements: str
  sample: [GPU, HostDevices, DisableMDEVConfiguration]
added:
  description: Entries added to the CR.
  returned: success
  type: list
  elements: dict
  sample: []
removed:
  description: Entries this module had added and no host needs any more, removed (with O(prune)).
  returned: success
  type: list
  elements: dict
  sample: []
feature_gates_added:
  description: Feature gates turned on.
  returned: success
  type: list
  elements: str
  sample: [GPU]
advertised:
  description:
    - What the nodes advertise against the entries (with O(check_advertised)); empty lists when no node's
      sandbox device plugin advertises anything yet.
  returned: success
  type: dict
  contains:
    checked_nodes:
      description: Nodes of VM hosts whose sandbox device plugin advertises resources.
      type: list
      elements: str
    unadvertised:
      description: Entries (of the CR after the change) whose resource no node advertises.
      type: list
      elements: dict
    unpermitted:
      description: Sandbox resources a node advertises that no entry permits (C(node), C(resourceName)).
      type: list
      elements: dict
    renamed:
      description: Generated names replaced by the advertised ones (with O(use_advertised_names)).
      type: dict
  sample: {checked_nodes: [gpu-node-2], unadvertised: [], unpermitted: [], renamed: {}}
notes:
  description: Hosts that contributed nothing although their workload type expects devices.
  returned: success
  type: list
  elements: str
  sample: ["host gpu-node-3 (vm-vgpu) offers no mdev type named A10-4Q"]
api_requests:
  description: HTTP requests the module sent to the API server.
  returned: always
  type: int
  sample: 2
"""

import json
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._kube import (
    AUTH_ARGUMENT_SPEC,
    KubeError,
    connect,
    open_api,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._cluster import (
    WORKLOAD_TYPES,
    PlanError,
    advertised_names,
    plan_kubevirt,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import create_module, run_module
from ansible_collections.gpuops.sandbox.plugins.module_utils._plugin_names import PluginNameError, parse_overrides, read_pci_ids

HEX4_RE = re.compile(r"\A[0-9a-fA-F]{4}\Z")
# The keys of a gpuops.sandbox.gpu_facts GPU (mdev type, vGPU state) this module reads, with the types their values
# may have; a key may also be absent or null. Other keys of the facts are not read, so not checked.
GPU_KEYS = dict(address=(str,), physfn=(str,), is_vf=(bool,), mdev_types=(list,), vgpu=(dict,))
MDEV_TYPE_KEYS = dict(id=(str, int), name=(str,), resource_name=(str,))
VGPU_KEYS = dict(creatable_types=(list,), current_type=(int,))
VGPU_TYPE_KEYS = dict(id=(str, int), name=(str,))
MAX_PROBLEMS = 8


def build_module():
    """Create the AnsibleModule; the argument spec does the validation it can."""
    return create_module(
        AnsibleModule,
        dict(
            **AUTH_ARGUMENT_SPEC,
            hosts=dict(type="list", elements="dict", required=True, options=dict(
                name=dict(type="str", required=True),
                workload_type=dict(type="str", required=True, choices=list(WORKLOAD_TYPES)),
                gpus=dict(type="list", elements="dict", default=[]),
                mdev_parents=dict(type="list", elements="dict", default=[]),
                vgpu_type_names=dict(type="list", elements="str"),
            )),
            namespace=dict(type="str", default="kubevirt"),
            name=dict(type="str"),
            pci_vendor_ids=dict(type="list", elements="str", default=["10de"]),
            kubevirt_version=dict(type="str"),
            disable_mdev_configuration=dict(type="bool", default=True),
            feature_gates=dict(type="list", elements="str", default=[]),
            prune=dict(type="bool", default=True),
            resource_names=dict(type="dict", default={}),
            plugin_pci_ids=dict(type="path"),
            check_advertised=dict(type="bool", default=True),
            use_advertised_names=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )


def _shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:50] + "... (%d characters)" % len(text)


def _kind(types):
    return " or ".join({str: "a string", int: "an integer", bool: "a boolean", list: "a list", dict: "a mapping"}[t]
                       for t in types)


def _check_keys(where, entry, keys, problems):
    """Append to ``problems`` every key of ``entry`` (a dict) in ``keys`` whose value has none of its types."""
    for key, types in sorted(keys.items()):
        value = entry.get(key)
        if value is None:
            continue
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            problems.append("%s.%s is %s, not %s" % (where, key, _shown(value), _kind(types)))


def _check_entries(where, entries, keys, problems):
    """Append to ``problems`` every entry of a list of mappings (mdev types, vGPU types) it cannot read."""
    for index, entry in enumerate(entries):
        here = "%s[%d]" % (where, index)
        if isinstance(entry, dict):
            _check_keys(here, entry, keys, problems)
        else:
            problems.append("%s is %s, not a mapping" % (here, _shown(entry)))


def check_hosts(hosts):
    """Raise PlanError naming every GPU or mdev parent entry of ``hosts`` this module cannot read.

    ``gpus`` and ``mdev_parents`` are the facts of gpuops.sandbox.gpu_facts, which carry many more keys than
    this module reads, so they have no sub-spec: the keys read are checked here, before any request.
    """
    problems = []
    for index, host in enumerate(hosts):
        label = "hosts[%d] (%s)" % (index, host.get("name"))
        for number, gpu in enumerate(host.get("gpus") or []):
            where = "%s gpus[%d]" % (label, number)
            for key in ("vendor", "device"):
                value = gpu.get(key)
                if value is None:
                    problems.append("%s has no %s" % (where, key))
                elif not isinstance(value, str) or not HEX4_RE.match(value):
                    problems.append("%s.%s is %s, not 4 hex digits" % (where, key, _shown(value)))
            _check_keys(where, gpu, GPU_KEYS, problems)
            if isinstance(gpu.get("mdev_types"), list):
                _check_entries(where + ".mdev_types", gpu["mdev_types"], MDEV_TYPE_KEYS, problems)
            if isinstance(gpu.get("vgpu"), dict):
                _check_keys(where + ".vgpu", gpu["vgpu"], VGPU_KEYS, problems)
                if isinstance(gpu["vgpu"].get("creatable_types"), list):
                    _check_entries(where + ".vgpu.creatable_types", gpu["vgpu"]["creatable_types"], VGPU_TYPE_KEYS,
                                   problems)
        for number, parent in enumerate(host.get("mdev_parents") or []):
            where = "%s mdev_parents[%d]" % (label, number)
            _check_keys(where, parent, dict(types=(list,)), problems)
            if isinstance(parent.get("types"), list):
                _check_entries(where + ".types", parent["types"], MDEV_TYPE_KEYS, problems)
    if problems:
        raise PlanError("%s%s; gpus and mdev_parents must be the host's gpu_facts_gpus and gpu_facts_mdev_parents facts from "
                        "gpuops.sandbox.gpu_facts (each GPU with vendor and device as 4 hex digits); nothing was changed"
                        % ("; ".join(problems[:MAX_PROBLEMS]),
                           " (and %d more)" % (len(problems) - MAX_PROBLEMS) if len(problems) > MAX_PROBLEMS else ""))


def check_inputs(params):
    """Every input the plan reads, checked before the first request."""
    check_hosts(params["hosts"])
    bad = [v for v in params["pci_vendor_ids"] if not HEX4_RE.match(v)]
    if bad:
        raise PlanError("pci_vendor_ids: %s is not a PCI vendor ID (4 hex digits, such as 10de); nothing was changed"
                        % ", ".join(_shown(v) for v in bad))
    parse_overrides(params["resource_names"])


def find_cr(api, namespace, name):
    items = api.list_kubevirts(namespace)
    where = "namespace %s" % namespace if namespace else "any namespace"
    if name:
        items = [i for i in items if i["metadata"]["name"] == name]
        if not items:
            raise KubeError("there is no KubeVirt CR named %s in %s (KubeVirt is not installed there); nothing was changed"
                            % (name, where))
    if not items:
        raise KubeError("there is no KubeVirt CR in %s: KubeVirt is not installed (deploy the KubeVirt operator and its "
                        "CR first); nothing was changed" % where)
    if len(items) > 1:
        raise KubeError("%s holds several KubeVirt CRs (%s); give name" % (
            where, ", ".join("%s/%s" % (i["metadata"]["namespace"], i["metadata"]["name"]) for i in items)))
    return items[0]


def read_plugin_pci_ids(path):
    """The text of the plugin image's pci.ids the user gave, or None."""
    try:
        return read_pci_ids(path)
    except PluginNameError as exc:
        raise PlanError(exc.msg)


def run(module, api):
    params = module.params
    cr = find_cr(api, params["namespace"], params["name"])
    meta = cr["metadata"]
    naming = dict(pci_vendor_ids=params["pci_vendor_ids"], resource_names=params["resource_names"],
                  plugin_pci_ids=read_plugin_pci_ids(params["plugin_pci_ids"]))
    options = dict(kubevirt_version=params["kubevirt_version"], disable_mdev_configuration=params["disable_mdev_configuration"],
                   extra_feature_gates=params["feature_gates"], prune=params["prune"], **naming)
    plan = plan_kubevirt(cr, params["hosts"], **options)
    advertised = {"checked_nodes": [], "unadvertised": [], "unpermitted": [], "renames": {}, "notes": []}
    if params["check_advertised"]:
        nodes = api.list_nodes()

        def entries(of_plan):
            phd = of_plan["after"]["permittedHostDevices"]
            return phd["pciHostDevices"] + phd["mediatedDevices"]

        advertised = advertised_names(params["hosts"], nodes, entries(plan), **naming)
        if params["use_advertised_names"] and advertised["renames"]:
            renames = advertised["renames"]
            plan = plan_kubevirt(cr, params["hosts"], renames=renames, **options)
            advertised = advertised_names(params["hosts"], nodes, entries(plan), **naming)
            advertised["renames"] = renames
        elif advertised["renames"]:
            advertised["notes"].append("the nodes advertise %s; use_advertised_names would use those names" % ", ".join(
                "%s instead of %s" % (new, old) for old, new in sorted(advertised["renames"].items())))
            advertised["renames"] = {}
        for entry in advertised["unadvertised"]:
            module.warn("permittedHostDevices entry %s names a resource no node advertises: KubeVirt will never offer "
                        "it to a VM" % json.dumps(entry, sort_keys=True))
        for item in advertised["unpermitted"]:
            module.warn("node %s advertises %s, which no permittedHostDevices entry permits" % (
                item["node"], item["resourceName"]))
        for note in advertised["notes"]:
            module.warn(note)
    result = dict(
        changed=plan["patch"] is not None,
        kubevirt=dict(namespace=meta.get("namespace"), name=meta["name"], version=plan["version"]),
        permitted_host_devices=plan["after"]["permittedHostDevices"],
        feature_gates=plan["after"]["featureGates"],
        added=plan["added"], removed=plan["removed"], feature_gates_added=plan["feature_gates_added"],
        notes=plan["notes"],
        advertised=dict(checked_nodes=advertised["checked_nodes"], unadvertised=advertised["unadvertised"],
                        unpermitted=advertised["unpermitted"], renamed=advertised["renames"]),
    )
    for note in plan["notes"]:
        module.warn(note)
    if module._diff and plan["before"] != plan["after"]:
        result["diff"] = dict(before=plan["before"], after=plan["after"])
    if plan["patch"] is not None and not module.check_mode:
        try:
            api.patch_kubevirt(meta["namespace"], meta["name"], plan["patch"])
        except KubeError as exc:
            if exc.status == 409:
                raise KubeError("the KubeVirt CR %s/%s changed while this module was merging it; run again (nothing was "
                                "changed)" % (meta["namespace"], meta["name"]), status=409)
            raise
    result["api_requests"] = api.requests
    return result


def permit_devices(module, api_factory=connect):
    """The module's work: check the inputs, connect, plan and patch; the result dict or a GpuopsError."""
    check_inputs(module.params)
    api = open_api(module, api_factory)
    return run(module, api)


def main(api_factory=connect):
    run_module(build_module, permit_devices, api_factory)


if __name__ == "__main__":
    main()
