# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU sharing on container nodes as the GPU Operator does it, checked before anything changes.

- MIG: the MIG Manager applies a mig-parted configuration, chosen per node by the ``nvidia.com/mig.config`` label,
  from its ConfigMap (``migManager.config``). :func:`check_mig_config` checks a node's choice against the GPUs its
  facts found: every profile must exist on the GPU it applies to, and the instances must fit.
- Time-slicing and MPS: the device plugin's configurations (``devicePlugin.config``), chosen per node by the
  ``nvidia.com/device-plugin.config`` label; :func:`check_plugin_config` checks one.
- The driver's upgrade policy (``driver.upgradePolicy``): :func:`check_upgrade_policy`.

Each check returns a list of problems (sentences); empty means fine. Nothing here talks to a host or a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
DRIVER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.driver"
MIG_STRATEGIES = ("single", "mixed")
# The MIG config of a node the MIG Manager gets no other for (the chart's migManager.config.default).
MIG_DISABLED = "all-disabled"
NVIDIA = "10de"

# MIG-capable GPUs by PCI device ID: (model, compute slices, memory slices, profiles). A profile is
# (name, instances at most, compute slices, memory slices); a "+me" profile carries the GPU's media engines and
# exists once. Figures from NVIDIA's MIG user guide; tests check them against the GPU Operator's own default
# mig-parted configuration. Other GPUs are described with gpuops_mig_profiles (:func:`profile_table`).


def _family(model, compute, memory, profiles):
    """A GPU model's table entry; the first of ``profiles`` (the smallest) also comes with the media engines (+me)."""
    smallest, _count, c_me, m_me = profiles[0]
    return {"model": model, "compute": compute, "memory": memory,
            "profiles": {name: {"max": count, "compute": c, "memory": m}
                         for name, count, c, m in [(smallest + "+me", 1, c_me, m_me)] + list(profiles)}}


def _seven(model, mem1, mem1x2, mem2, mem3, mem4, mem7):
    """The seven-slice family (A100, H100, H200, B200): the profiles are the same shapes with other memory sizes."""
    return _family(model, 7, 8, [
        ("1g.%dgb" % mem1, 7, 1, 1), ("1g.%dgb" % mem1x2, 4, 1, 2), ("2g.%dgb" % mem2, 3, 2, 2),
        ("3g.%dgb" % mem3, 2, 3, 4), ("4g.%dgb" % mem4, 1, 4, 4), ("7g.%dgb" % mem7, 1, 7, 8)])


_A100_40 = _seven("A100-40GB", 5, 10, 10, 20, 20, 40)
_A100_80 = _seven("A100-80GB / H100-80GB", 10, 20, 20, 40, 40, 80)
_H100_NVL = _seven("H100 NVL", 12, 24, 24, 47, 47, 94)
_H100_96 = _seven("H100-96GB / GH200", 12, 24, 24, 48, 48, 96)
_H200 = _seven("H200-141GB", 18, 35, 35, 71, 71, 141)
_GH200_144 = _seven("GH200 144G HBM3e", 18, 36, 36, 72, 72, 144)
_B200 = _seven("B200", 23, 45, 45, 90, 90, 180)
_GB200 = _seven("GB200", 23, 47, 47, 93, 93, 186)
_A30 = _family("A30-24GB", 4, 4, [("1g.6gb", 4, 1, 1), ("2g.12gb", 2, 2, 2), ("4g.24gb", 1, 4, 4)])
_A30["profiles"]["2g.12gb+me"] = {"max": 1, "compute": 2, "memory": 2}

MIG_GPUS = {}
for _ids, _family_table in (
        (("20b0", "20b1", "20f1", "20f6"), _A100_40),
        (("20b2", "20b5", "20f3", "20f5", "2330", "2331", "2322", "2324"), _A100_80),
        (("2321", "233a"), _H100_NVL),
        (("2342", "233d", "20b6", "2329"), _H100_96),
        (("2335", "233b"), _H200),
        (("2348",), _GH200_144),
        (("2901",), _B200),
        (("2941",), _GB200),
        (("20b7",), _A30)):
    for _id in _ids:
        MIG_GPUS["%s:%s" % (NVIDIA, _id)] = _family_table

# MIG GPUs the GPU Operator's default mig-parted configuration has (by device-filter) whose profiles the table does
# not describe: RTX PRO 6000 Blackwell Server Edition, B300 and GB300. Any other GPU has no MIG as far as the
# collection and the operator know (L40S, L4, A10, ...).
MIG_UNDESCRIBED = ("10de:2bb5", "10de:3182", "10de:31c2")

PROFILE_RE = re.compile(r"^[1-9][0-9]?g\.[1-9][0-9]*gb(\+[a-z]+(\.[a-z]+)?|-[a-z]+)?$")


def profile_table(extra=None):
    """:data:`MIG_GPUS` with ``extra`` (gpuops_mig_profiles: device ID -> model, compute, memory, profiles) on top.

    Returns ``(table, problems)``; a malformed ``extra`` entry is a problem and is left out.
    """
    table = dict(MIG_GPUS)
    problems = []
    for device, spec in (extra or {}).items():
        key = str(device).lower()
        key = key if ":" in key else "%s:%s" % (NVIDIA, key)
        where = "gpuops_mig_profiles[%r]" % device
        if not re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{4}", key):
            problems.append("%s: the key must be a PCI ID such as 10de:2335 (or a device ID of vendor 10de, 2335)"
                            % where)
            continue
        if not isinstance(spec, dict) or not isinstance(spec.get("profiles"), dict) or not spec["profiles"]:
            problems.append("%s must be a mapping with model, compute, memory and a non-empty profiles mapping" % where)
            continue
        bad = _bad_counts(spec, ("compute", "memory"), where)
        profiles = {}
        for name, shape in spec["profiles"].items():
            if not isinstance(name, str) or not PROFILE_RE.match(name) or not isinstance(shape, dict):
                bad.append("%s: profile %r must be named like 1g.18gb and map to max, compute and memory" % (where, name))
                continue
            bad.extend(_bad_counts(shape, ("max", "compute", "memory"), "%s profile %s" % (where, name)))
            profiles[name] = {k: shape.get(k) for k in ("max", "compute", "memory")}
        if bad:
            problems.extend(bad)
            continue
        table[key] = {"model": str(spec.get("model") or key), "compute": spec["compute"], "memory": spec["memory"],
                      "profiles": profiles}
    return table, problems


def _bad_counts(spec, keys, where):
    return ["%s: %s must be a whole number from 1 to 64 (got %r)" % (where, k, spec.get(k))
            for k in keys if isinstance(spec.get(k), bool) or not isinstance(spec.get(k), int) or not 1 <= spec[k] <= 64]


def _config_key(profile):
    """The name the operator's default configuration gives a profile's config: all-1g.18gb.me for 1g.18gb+me."""
    return "all-" + profile.replace("+", ".")


def default_mig_configs(table):
    """The config names of the GPU Operator's default mig-parted configuration that a model of ``table`` supports,
    as ``{name: {device: {profile: count}}}`` (all-disabled and all-enabled: no profile; all-balanced: the model's
    balanced split; all-<profile>: the most instances of that profile)."""
    configs = {"all-disabled": {}, "all-enabled": {}, "all-balanced": {}}
    for device, gpu in table.items():
        configs["all-disabled"][device] = {}
        configs["all-enabled"][device] = {}
        balanced = _balanced(gpu)
        if balanced:
            configs["all-balanced"][device] = balanced
        for name, shape in gpu["profiles"].items():
            configs.setdefault(_config_key(name), {})[device] = {name: shape["max"]}
    return configs


def _balanced(gpu):
    """The operator's all-balanced split of a seven-slice GPU (two of the smallest, one 2g, one 3g); A30: two 1g, one 2g."""
    by_shape = {}
    for name, shape in gpu["profiles"].items():
        if "+" in name or "-" in name:
            continue
        key = (shape["compute"], shape["memory"])
        by_shape.setdefault(key, name)
    if gpu["compute"] == 7:
        wanted = [((1, 1), 2), ((2, 2), 1), ((3, 4), 1)]
    elif gpu["compute"] == 4:
        wanted = [((1, 1), 2), ((2, 2), 1)]
    else:
        return None
    if any(shape not in by_shape for shape, _n in wanted):
        return None
    return {by_shape[shape]: count for shape, count in wanted}


def _filter_ids(entry):
    """The ``vendor:device`` IDs (lower case) of an entry's device-filter, or None without a filter."""
    value = entry.get("device-filter")
    if value is None:
        return None
    ids = []
    for item in value if isinstance(value, list) else [value]:
        text = str(item).lower()
        text = text[2:] if text.startswith("0x") else text
        # mig-parted writes <device><vendor>, e.g. 0x233510DE
        ids.append("%s:%s" % (text[4:], text[:4]))
    return ids


def _applies(entry, index, pci_id):
    devices = entry.get("devices", "all")
    if devices != "all" and (not isinstance(devices, list) or index not in devices):
        return False
    ids = _filter_ids(entry)
    return ids is None or pci_id in ids


def _describe_gpu(gpu, index):
    return "GPU %d (%s:%s%s at %s)" % (index, gpu.get("vendor"), gpu.get("device"),
                                       ", " + gpu["device_name"] if gpu.get("device_name") else "", gpu.get("address"))


def _what_fits(model):
    return ", ".join("%s (up to %d)" % (name, shape["max"]) for name, shape in sorted(
        model["profiles"].items(), key=lambda kv: (kv[1]["compute"], kv[1]["memory"], kv[0])))


def check_profiles(model, devices, what):
    """Problems of asking ``devices`` ({profile: count}) of one GPU of ``model``; ``what`` names the GPU."""
    problems = []
    compute = memory = 0
    for name, count in devices.items():
        shape = model["profiles"].get(name)
        if shape is None:
            problems.append("%s, a %s, has no MIG profile %s; its profiles: %s"
                            % (what, model["model"], name, _what_fits(model)))
            continue
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            problems.append("%s: the count of %s must be a whole number, not %r" % (what, name, count))
            continue
        if count > shape["max"]:
            problems.append("%s, a %s, fits at most %d instances of %s, not %d"
                            % (what, model["model"], shape["max"], name, count))
        compute += count * shape["compute"]
        memory += count * shape["memory"]
    if not problems and (compute > model["compute"] or memory > model["memory"]):
        asked = ", ".join("%s x%d" % (n, c) for n, c in devices.items())
        problems.append("%s, a %s, has %d compute and %d memory slices; %s needs %d and %d, which do not fit"
                        % (what, model["model"], model["compute"], model["memory"], asked, compute, memory))
    return problems


def mig_gpus(gpus):
    """The GPUs among a host's ``gpu_facts_gpus`` (the functions its GPU selectors chose; bridges left out), in the
    order nvidia-smi numbers them (PCI address)."""
    return sorted([g for g in gpus or [] if isinstance(g, Mapping) and not g.get("is_bridge")],
                  key=lambda g: g.get("address", ""))


def _unknown_gpu(what, node, device, table):
    """Why a GPU the table lacks takes no MIG config: a MIG GPU whose profiles the user can describe, or one without
    MIG at all, whose sharing is the device plugin's."""
    if device in MIG_UNDESCRIBED:
        return ("%s is a MIG GPU whose profiles the collection does not know (it knows %s); describe it in "
                "gpuops_mig_profiles" % (what, ", ".join(sorted({m["model"] for m in table.values()}))))
    return ("%s has no MIG (neither the collection nor the GPU Operator's default MIG configuration knows MIG profiles "
            "for it), so no MIG config can partition it: give node %s no gpuops_mig_config (or %s), and to share the "
            "GPU use time-slicing or MPS (gpuops_device_plugin_config)" % (what, node, MIG_DISABLED))


def check_mig_config(node, gpus, config_name, user_configs, table, strategy):
    """Problems of giving node ``node`` (its GPUs: ``gpus``, facts) the MIG config ``config_name``.

    ``user_configs`` are the user's mig-parted ``mig-configs`` (None: the operator's defaults, known from
    ``table``). Returns ``(problems, summary)``; ``summary`` maps each GPU's address to the profiles it gets.
    """
    gpus = mig_gpus(gpus)
    summary = {}
    if user_configs is not None:
        if config_name not in user_configs:
            return (["node %s: MIG config %r is not in gpuops_mig_configs (it has: %s)"
                     % (node, config_name, ", ".join(sorted(user_configs)) or "none")], summary)
        entries = user_configs[config_name]
    else:
        defaults = default_mig_configs(table)
        if config_name not in defaults:
            return (["node %s: MIG config %r is not one of the GPU Operator's default configurations the collection "
                     "knows (%s); give your own in gpuops_mig_configs" % (node, config_name, ", ".join(sorted(defaults)))],
                    summary)
        entries = [{"device-filter": ["0x%s%s" % (pci_id[5:].upper(), pci_id[:4].upper())], "devices": "all",
                    "mig-enabled": config_name != "all-disabled", "mig-devices": devices}
                   for pci_id, devices in defaults[config_name].items()]
    if not gpus:
        return (["node %s: MIG config %r asked, but its facts found no GPU (gather the GPU facts first, or check "
                 "the GPU selectors)" % (node, config_name)], summary)
    problems = []
    types = set()
    for index, gpu in enumerate(gpus):
        what = "node %s %s" % (node, _describe_gpu(gpu, index))
        device = "%s:%s" % (str(gpu.get("vendor", "")).lower(), str(gpu.get("device", "")).lower())
        applying = [e for e in entries if isinstance(e, dict) and _applies(e, index, device)]
        if not applying:
            if user_configs is not None:
                problems.append("%s: no entry of MIG config %s applies to it (devices and device-filter)"
                                % (what, config_name))
            elif device not in table and config_name != MIG_DISABLED:
                problems.append(_unknown_gpu(what, node, device, table))
            elif config_name != MIG_DISABLED:
                known = sorted({table[d]["model"] for d in default_mig_configs(table)[config_name] if d in table})
                problems.append("%s: MIG config %s is for %s only" % (what, config_name, ", ".join(known)))
            continue
        enabled = any(e.get("mig-enabled") for e in applying)
        model = table.get(device)
        if enabled and model is None:
            problems.append(_unknown_gpu(what, node, device, table))
            continue
        wanted = {}
        for entry in applying:
            for name, count in (entry.get("mig-devices") or {}).items():
                wanted[name] = wanted.get(name, 0) + count if isinstance(count, int) else count
        if wanted and not enabled:
            problems.append("%s: MIG config %s lists MIG devices with mig-enabled false" % (what, config_name))
            continue
        if enabled:
            problems.extend(check_profiles(model, wanted, what))
        summary[gpu.get("address")] = {n: c for n, c in wanted.items() if c}
        types.update(n for n, c in wanted.items() if c)
    if strategy == "single" and len(types) > 1:
        problems.append("node %s: MIG config %s creates %s, but the single MIG strategy exposes one MIG device type per "
                        "node; set gpuops_mig_strategy to mixed or choose a config with one profile"
                        % (node, config_name, ", ".join(sorted(types))))
    return problems, summary


def check_mig_configs(configs):
    """Problems of the user's own mig-parted ``mig-configs`` mapping, by their shape alone."""
    if not isinstance(configs, dict) or not configs:
        return ["gpuops_mig_configs must be a mapping of config names to lists of entries (mig-parted's mig-configs)"]
    problems = []
    for name, entries in configs.items():
        where = "gpuops_mig_configs[%r]" % name
        if not isinstance(entries, list) or not entries:
            problems.append("%s must be a non-empty list of entries" % where)
            continue
        for number, entry in enumerate(entries):
            here = "%s entry %d" % (where, number)
            if not isinstance(entry, dict):
                problems.append("%s must be a mapping" % here)
                continue
            unknown = sorted(set(entry) - {"devices", "device-filter", "mig-enabled", "mig-devices"})
            if unknown:
                problems.append("%s has %s; accepted: devices, device-filter, mig-enabled, mig-devices"
                                % (here, ", ".join(unknown)))
            devices = entry.get("devices")
            if devices != "all" and not (isinstance(devices, list) and devices
                                         and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)):
                problems.append("%s: devices must be all or a list of GPU indexes, not %r" % (here, devices))
            if not isinstance(entry.get("mig-enabled"), bool):
                problems.append("%s: mig-enabled must be true or false" % here)
            mig_devices = entry.get("mig-devices", {})
            if not isinstance(mig_devices, dict):
                problems.append("%s: mig-devices must map profiles to counts" % here)
                continue
            for profile, count in mig_devices.items():
                if not isinstance(profile, str) or not PROFILE_RE.match(profile):
                    problems.append("%s: %r is not a MIG profile name (like 1g.18gb or 1g.18gb+me)" % (here, profile))
                if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                    problems.append("%s: the count of %s must be a whole number, not %r" % (here, profile, count))
    return problems


# ---------------------------------------------------------------------------------------------
# The device plugin's configurations: time-slicing and MPS
# ---------------------------------------------------------------------------------------------

_SHARING_KEYS = {"timeSlicing": {"renameByDefault", "failRequestsGreaterThanOne", "resources"},
                 "mps": {"renameByDefault", "resources"}}
_RESOURCE_KEYS = {"name", "rename", "devices", "replicas"}
_RESOURCE_RE = re.compile(r"^nvidia\.com/(gpu|mig-[1-9][0-9]?g\.[1-9][0-9]*gb(\.[a-z]+)*)$")


def check_plugin_config(name, config):
    """Problems of one device plugin configuration (``gpuops_device_plugin_configs[name]``)."""
    where = "gpuops_device_plugin_configs[%r]" % name
    if not isinstance(config, dict):
        return ["%s must be a mapping (the device plugin's config file: version, flags, sharing)" % where]
    problems = []
    if config.get("version", "v1") != "v1":
        problems.append("%s: version must be v1, not %r" % (where, config.get("version")))
    unknown = sorted(set(config) - {"version", "flags", "sharing", "resources"})
    if unknown:
        problems.append("%s has %s; accepted: version, flags, sharing, resources" % (where, ", ".join(unknown)))
    sharing = config.get("sharing")
    if sharing is None:
        return problems
    if not isinstance(sharing, dict) or len(sharing) != 1 or next(iter(sharing)) not in _SHARING_KEYS:
        problems.append("%s: sharing must hold exactly one of timeSlicing and mps" % where)
        return problems
    kind, body = next(iter(sharing.items()))
    here = "%s sharing.%s" % (where, kind)
    if not isinstance(body, dict):
        return problems + ["%s must be a mapping" % here]
    unknown = sorted(set(body) - _SHARING_KEYS[kind])
    if unknown:
        problems.append("%s has %s; accepted: %s" % (here, ", ".join(unknown), ", ".join(sorted(_SHARING_KEYS[kind]))))
    for flag in ("renameByDefault", "failRequestsGreaterThanOne"):
        if flag in body and not isinstance(body[flag], bool):
            problems.append("%s: %s must be true or false, not %r" % (here, flag, body[flag]))
    resources = body.get("resources")
    if not isinstance(resources, list) or not resources:
        return problems + ["%s: resources must be a non-empty list of {name, replicas}" % here]
    for number, resource in enumerate(resources):
        at = "%s resources[%d]" % (here, number)
        if not isinstance(resource, dict):
            problems.append("%s must be a mapping with name and replicas" % at)
            continue
        unknown = sorted(set(resource) - _RESOURCE_KEYS)
        if unknown:
            problems.append("%s has %s; accepted: %s" % (at, ", ".join(unknown), ", ".join(sorted(_RESOURCE_KEYS))))
        rname = resource.get("name")
        if not isinstance(rname, str) or not _RESOURCE_RE.match(rname):
            problems.append("%s: name %r is not a resource the device plugin shares (nvidia.com/gpu, or "
                            "nvidia.com/mig-<profile> with the mixed MIG strategy)" % (at, rname))
        elif kind == "mps" and rname != "nvidia.com/gpu":
            problems.append("%s: the device plugin shares only full GPUs (nvidia.com/gpu) through MPS, not %s"
                            % (at, rname))
        replicas = resource.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 2 <= replicas <= 1024:
            problems.append("%s: replicas must be a whole number from 2 to 1024 (sharing by one is no sharing), not %r"
                            % (at, replicas))
    return problems


# ---------------------------------------------------------------------------------------------
# The driver's upgrade policy
# ---------------------------------------------------------------------------------------------

UPGRADE_POLICY_KEYS = {
    "autoUpgrade": "bool", "maxParallelUpgrades": "count", "maxUnavailable": "count_or_percent",
    "waitForCompletion": {"timeoutSeconds": "seconds_or_zero", "podSelector": "str"},
    "gpuPodDeletion": {"force": "bool", "timeoutSeconds": "seconds", "deleteEmptyDir": "bool"},
    "drain": {"enable": "bool", "force": "bool", "podSelector": "str", "timeoutSeconds": "seconds",
              "deleteEmptyDir": "bool"},
}
_PERCENT_RE = re.compile(r"^(100|[1-9]?[0-9])%$")


def _check_value(kind, value, where):
    if kind == "bool":
        ok, want = isinstance(value, bool), "true or false"
    elif kind == "str":
        ok, want = isinstance(value, str), "a label selector string"
    elif kind == "count":
        ok, want = isinstance(value, int) and not isinstance(value, bool) and value >= 0, "a whole number, 0 or more"
    elif kind == "count_or_percent":
        ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or \
            (isinstance(value, str) and bool(_PERCENT_RE.match(value)))
        want = "a count (0 or more) or a percentage from 0% to 100%"
    elif kind == "seconds_or_zero":
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 86400
        want = "seconds from 0 (no limit) to 86400"
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 86400
        want = "seconds from 1 to 86400"
    return [] if ok else ["%s must be %s, not %r" % (where, want, value)]


def check_upgrade_policy(policy, where="gpuops_driver_upgrade_policy"):
    """Problems of the driver upgrade policy (the chart's ``driver.upgradePolicy`` keys; unset keys keep the
    operator's defaults)."""
    if not isinstance(policy, dict):
        return ["%s must be a mapping of driver.upgradePolicy keys" % where]
    problems = []
    for key, value in policy.items():
        kind = UPGRADE_POLICY_KEYS.get(key)
        if kind is None:
            problems.append("%s has %s; accepted: %s" % (where, key, ", ".join(sorted(UPGRADE_POLICY_KEYS))))
        elif isinstance(kind, dict):
            if not isinstance(value, dict):
                problems.append("%s.%s must be a mapping of %s" % (where, key, ", ".join(sorted(kind))))
                continue
            for sub, subvalue in value.items():
                if sub not in kind:
                    problems.append("%s.%s has %s; accepted: %s" % (where, key, sub, ", ".join(sorted(kind))))
                else:
                    problems.extend(_check_value(kind[sub], subvalue, "%s.%s.%s" % (where, key, sub)))
        else:
            problems.extend(_check_value(kind, value, "%s.%s" % (where, key)))
    return problems
