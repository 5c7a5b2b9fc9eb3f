#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_modules
short_description: Keep kernel module configuration for boot (blacklists, options, softdeps, initramfs)
version_added: 1.0.0
description:
  - Manages one named set of kernel module settings that take effect at boot, in files of its own
    (never editing files it does not own).
  - C(/etc/modprobe.d/<name>.conf) holds the C(blacklist), C(options) and C(softdep) lines;
    C(/etc/modules-load.d/<name>.conf) the modules loaded at boot; the modules to place in the initramfs go
    to C(/usr/share/initramfs-tools/modules.d/<name>) (initramfs-tools) or
    C(/etc/dracut.conf.d/<name>.conf) as C(force_drivers) (dracut).
  - The initramfs is rebuilt (C(update-initramfs -u -k all) or C(dracut -f --regenerate-all)) only when
    one of the files changed, since modprobe.d files are copied into it. If the rebuild fails, the files are
    put back as they were and the failure names the command and its output.
  - If writing one of the files fails, the files already written are put back as they were too.
  - Before it writes, a record that the initramfs is due goes to C(/var/lib/gpuops/pending/initramfs.json)
    (synced to disk), and it goes once the rebuild succeeded. A run cut short in between (a power loss, a
    killed controller) leaves the record, and the next run rebuilds the initramfs although the files already
    hold what they should, and says why in RV(rebuild_reason).
  - Every value is checked before anything is written; kernel module names are letters, digits, C(_) and
    C(-), at most 55 characters (the kernel's limit).
  - Nothing is loaded or unloaded now; the result says when a reboot is needed for the settings to apply.
  - With O(rebuild_kernels), the initramfs of every other installed kernel that lacks the collection's files is
    rebuilt too, one kernel at a time.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  name:
    description:
      - Name of the settings set; the stem of the files written. Letters, digits, C(.), C(_) and C(-), starting
        with a letter or digit, at most 64 characters.
    type: str
    required: true
  blacklist:
    description:
      - Modules that must not be loaded automatically (C(blacklist <module>) lines).
    type: list
    elements: str
    default: []
  options:
    description:
      - Module parameters, as module name to parameter string (C(options <module> <parameters>) lines).
      - A parameter string is one line of printable characters without C(#), not starting with a space and
        not ending in a backslash (modprobe would join the next line to it).
    type: dict
    default: {}
  softdeps:
    description:
      - "Modules to load before a module, as module name to list of modules (C(softdep <module> pre: ...))."
    type: dict
    default: {}
  load:
    description:
      - Modules loaded at boot by C(systemd-modules-load).
    type: list
    elements: str
    default: []
  initramfs:
    description:
      - Modules placed in the initramfs so that they are loaded before the root file system is mounted.
    type: list
    elements: str
    default: []
  state:
    description:
      - V(present) writes the files (a file with nothing to hold is removed); V(absent) removes every file
        of this O(name).
    type: str
    choices: [present, absent]
    default: present
  initramfs_tool:
    description:
      - The initramfs generator. V(auto) picks C(update-initramfs) when present, else C(dracut).
      - V(none) writes the files but never rebuilds (the result then says a rebuild is pending).
    type: str
    choices: [auto, initramfs-tools, dracut, none]
    default: auto
  rebuild:
    description:
      - When to rebuild the initramfs. V(changed) rebuilds when a file of this set changed; V(always) rebuilds
        even when nothing changed; V(never) writes the files only and says in RV(initramfs_pending) that a rebuild
        is due. With V(changed), a rebuild that an earlier call left due (another set written with V(never), or a
        run cut short before its rebuild finished) is done too.
    type: str
    choices: [changed, always, never]
    default: changed
  timeout:
    description:
      - Seconds the initramfs rebuild may take before it is stopped and the files are rolled back.
      - A whole number from V(1) to V(86400).
    type: int
    default: 900
  rebuild_kernels:
    description:
      - After this set's own work, give each installed kernel (a C(/lib/modules/<version>) directory with a
        C(/boot/vmlinuz-<version>)) whose initramfs is missing, or older than one of this collection's files an
        initramfs carries (C(gpuops-*) in C(/etc/modprobe.d), C(/etc/modules-load.d),
        C(/usr/share/initramfs-tools/modules.d), C(/etc/dracut.conf.d), and this set's files), a rebuild of its
        own - C(update-initramfs -u -k <version>) (C(-c) when it has none) or C(dracut -f --kver <version>). This
        catches a kernel the distribution installed after the files were written, whose initramfs was built
        without them. Ages are compared by modification time; images are not unpacked.
      - A kernel the set's own rebuild covers is not rebuilt twice (C(update-initramfs -u -k all) updates every
        existing image, C(dracut --regenerate-all) builds every kernel's).
      - Nothing is rebuilt with O(rebuild=never) or without a generator. A kernel removed while it is rebuilt is
        skipped, not an error. Nothing is recorded as pending, since an image left older than the files by a run cut
        short is found again by the next run.
      - RV(reboot_required) is true only when the running kernel's initramfs is rebuilt this way.
      - A kernel whose boot entry on the EFI system partition boots a copy of the initramfs older than these files
        (systemd-boot) counts as such a kernel too; see RV(esp_copies).
      - A failed rebuild stops there and names the kernels already rebuilt; the set's files, written and built
        before, stay.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reports the files that would change and whether the initramfs would be rebuilt.
  diff_mode:
    support: full
    description: Shows every file before and after.
  idempotent:
    support: full
    description: Files are written, and the initramfs rebuilt, only when their content differs (or, with
      O(rebuild_kernels), a kernel's image is missing or older than them).
notes:
  - Root privileges are needed. Files are written atomically, root:root 0644.
  - A module built into the kernel ignores modprobe.d; use kernel command line arguments for those
    (M(gpuops.sandbox.kernel_cmdline)).
seealso:
  - module: gpuops.sandbox.kernel_cmdline
  - module: gpuops.sandbox.vfio_bind
"""

EXAMPLES = r"""
- name: Keep nouveau off every GPU node
  gpuops.sandbox.kernel_modules:
    name: gpuops-nouveau
    blacklist: [nouveau]
    options:
      nouveau: modeset=0

- name: Load vfio-pci early, before the GPU drivers can claim the devices
  gpuops.sandbox.kernel_modules:
    name: gpuops-vfio
    load: [vfio, vfio_iommu_type1, vfio_pci]
    initramfs: [vfio, vfio_iommu_type1, vfio_pci]
    softdeps:
      nvidia: [vfio-pci]
      nouveau: [vfio-pci]

- name: Keep nouveau off, and rebuild the initramfs of each installed kernel built before the settings
  gpuops.sandbox.kernel_modules:
    name: gpuops-nouveau
    blacklist: [nouveau]
    options:
      nouveau: modeset=0
    rebuild_kernels: true
  register: nouveau_kernels

- name: Remove the vfio settings when the node becomes a container node
  gpuops.sandbox.kernel_modules:
    name: gpuops-vfio
    state: absent
"""

RETURN = r"""
files:
  description: The files of this set, what each should be and whether it changed.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Path on the host.
      type: str
    state:
      description: V(present) or V(absent) after the run.
      type: str
    changed:
      description: Whether the run (would) change this file.
      type: bool
  sample: [{"path": "/etc/modprobe.d/gpuops-nouveau.conf", "state": "present", "changed": true}]
initramfs_tool:
  description: The initramfs generator used (or that would be used), or V(none).
  returned: always
  type: str
  sample: initramfs-tools
initramfs_rebuilt:
  description: Whether the initramfs was (or in check mode would be) rebuilt.
  returned: always
  type: bool
initramfs_pending:
  description:
    - True when the initramfs is due for a rebuild that did not happen (files changed with O(rebuild=never) or no
      generator, or such a rebuild was already due from an earlier call).
  returned: always
  type: bool
rebuild_reason:
  description: Why the initramfs was (or would be) rebuilt; empty when it was not.
  returned: always
  type: str
  sample: an earlier run changed gpuops-nouveau and did not finish (since 2026-11-24T09:30:00Z)
reboot_required:
  description:
    - True when the settings changed (they apply at the next boot), or when a blacklisted module is loaded now.
  returned: always
  type: bool
loaded_blacklisted:
  description: Blacklisted modules that are loaded at the moment (a reboot unloads them).
  returned: always
  type: list
  elements: str
  sample: [nouveau]
kernels_rebuilt:
  description:
    - With O(rebuild_kernels), each kernel whose initramfs was (in check mode, would be) rebuilt on its own, with
      C(kernel) (its version), C(running) (the running kernel), C(reason) (what was wrong) and C(command).
  returned: always
  type: list
  elements: dict
  sample:
    - kernel: 6.1.0-50-amd64
      running: false
      reason: initramfs /boot/initrd.img-6.1.0-50-amd64 is older than /etc/modprobe.d/gpuops-nouveau.conf
      command: [/usr/sbin/update-initramfs, -u, -k, 6.1.0-50-amd64]
esp_copies:
  description:
    - With dracut on a host that boots through systemd-boot, the kernels whose rebuilt initramfs was copied again to
      the EFI system partition with C(kernel-install add) (systemd-boot boots that copy, which dracut does not
      refresh; Debian's initramfs-tools does it through its own hook).
  returned: when the module changed something
  type: list
  elements: str
  sample: [6.1.0-50-amd64]
"""

import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils import _kernels, _modprobe, _persist
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    GpuopsError,
    check_timeout,
    create_module,
    run_module,
    run_timed,
)

# The filesystem root the module works on; unit tests point it at a fake tree.
ROOT = "/"

# Used with fullmatch (and anchored with \A and \Z): ^ and $ with .match would let a trailing newline through.
MODULE_RE = re.compile(r"\A[A-Za-z0-9_-]+\Z")
# Option strings end up on a modprobe.d line: no comment sign, not starting with a space; further checks in
# check_option (printable characters only, no trailing backslash).
OPTION_RE = re.compile(r"\A[^\s#][^#]*\Z")
# The kernel's MODULE_NAME_LEN is 64 - sizeof(unsigned long), with the terminating NUL.
MAX_MODULE_LENGTH = 55
MAX_TIMEOUT = 86400

# The set's files, their directories, the initramfs generators and their commands are _modprobe's, the one owner of
# modprobe.d and the initramfs; so are the errors they raise.
MODPROBE_DIR = _modprobe.MODPROBE_DIR
LOAD_DIR = _modprobe.LOAD_DIR
ModulesError = _modprobe.ModprobeError
# The pending record (see _persist.mark_pending) of an initramfs rebuild that has not finished.
PENDING = _persist.PENDING_INITRAMFS


def _shown(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else "%s... (%d characters)" % (text[:limit - 10], len(str(value)))


def _check_modules(option, names):
    for name in names:
        if not isinstance(name, str) or not MODULE_RE.fullmatch(name):
            raise ModulesError("%s: %s is not a kernel module name (letters, digits, '_' and '-' only)"
                               % (option, _shown(name)))
        if len(name) > MAX_MODULE_LENGTH:
            raise ModulesError("%s: %s is not a kernel module name: it has %d characters, the kernel allows at "
                               "most %d" % (option, _shown(name), len(name), MAX_MODULE_LENGTH))


def check_option(module, value):
    """Raise ModulesError unless ``value`` can be the parameters of one ``options`` line of modprobe.d."""
    if not isinstance(value, str) or not OPTION_RE.fullmatch(value) or not value.isprintable():
        raise ModulesError("options for %s: %s is not a parameter string (one line of printable characters, "
                           "no '#', not empty, not starting with a space)" % (module, _shown(value)))
    if value.endswith("\\"):
        raise ModulesError("options for %s: %s is not a parameter string: it ends in a backslash, which modprobe "
                           "reads as a line continuation (the next line would be joined to it)"
                           % (module, _shown(value)))


def validate(params):
    """Raise ModulesError naming the first bad value; return nothing. Runs before anything is read or written."""
    problem = _modprobe.set_name_problem(params["name"])
    if problem:
        raise ModulesError("name %s" % problem)
    _check_modules("blacklist", params["blacklist"])
    _check_modules("load", params["load"])
    _check_modules("initramfs", params["initramfs"])
    _check_modules("options", list(params["options"]))
    for module, value in params["options"].items():
        check_option(module, value)
    _check_modules("softdeps", list(params["softdeps"]))
    for module, before in params["softdeps"].items():
        if not isinstance(before, list) or not before:
            raise ModulesError("softdeps for %s: expected a non-empty list of module names, got %s"
                               % (module, _shown(before)))
        _check_modules("softdeps for %s" % module, before)
    check_timeout(params["timeout"], 1, MAX_TIMEOUT, ModulesError)


def _header(name):
    return "# Managed by gpuops.sandbox (kernel_modules, set %s); changes here are overwritten.\n" % name


def render_modprobe(params):
    lines = ["blacklist %s\n" % m for m in params["blacklist"]]
    lines += ["options %s %s\n" % (m, params["options"][m]) for m in sorted(params["options"])]
    lines += ["softdep %s pre: %s\n" % (m, " ".join(params["softdeps"][m])) for m in sorted(params["softdeps"])]
    return _header(params["name"]) + "".join(lines) if lines else None


def render_list(params, key):
    if not params[key]:
        return None
    return _header(params["name"]) + "".join("%s\n" % m for m in params[key])


def render_dracut(params):
    if not params["initramfs"]:
        return None
    return _header(params["name"]) + 'force_drivers+=" %s "\n' % " ".join(params["initramfs"])


def wanted_files(params, tool):
    """Return ``{path: text_or_None}`` for every file of the set (None: the file must not exist)."""
    paths = _modprobe.set_files(params["name"])
    present = params["state"] == "present"
    files = {
        paths["modprobe"]: render_modprobe(params) if present else None,
        paths["load"]: render_list(params, "load") if present else None,
        paths["initramfs_tools"]: None,
        paths["dracut"]: None,
    }
    if present and tool in ("initramfs-tools", "none"):
        files[paths["initramfs_tools"]] = render_list(params, "initramfs")
    if present and tool == "dracut":
        files[paths["dracut"]] = render_dracut(params)
    return files


def plan_kernels(module, root, tool, wanted, set_rebuild):
    """The kernels whose initramfs gets a rebuild of its own: ``[{"kernel", "running", "reason", "command"}]``.

    Read before anything is written, with this set's files as they will be; a kernel the set's own rebuild covers
    (every existing image with update-initramfs, every kernel with dracut) is left to it.
    """
    if tool == "dracut" and set_rebuild:
        return []
    own = [path for path, text in sorted(wanted.items()) if text is not None]
    plan = []
    for kernel in _kernels.installed_kernels(root, extra_sources=own):
        if not kernel["initramfs_stale"] or (set_rebuild and kernel["initramfs"] is not None):
            continue
        # Its image's problems (/boot's, or the copy an ESP entry boots), not its entries' missing arguments.
        reason = [p for p in kernel["problems"] if " lacks " not in p]
        plan.append({"kernel": kernel["version"], "running": kernel["running"],
                     "reason": "; ".join(reason) or "initramfs older than this set's files",
                     "command": _modprobe.kernel_command(module, tool, kernel)})
    return plan


def rebuild_kernels(module, root, plan, timeout):
    """Rebuild each planned kernel's initramfs in turn; skip a kernel removed meanwhile; raise on a failure."""
    done = []
    for item in plan:
        rc, out, err = run_timed(module, item["command"], timeout, option="timeout", kill_after=30)
        if rc != 0:
            if not _kernels.kernel_present(root, item["kernel"]):
                module.warn("kernel %s was removed while its initramfs was rebuilt; skipped" % item["kernel"])
                continue
            raise ModulesError("%s failed (rc=%s): %s; the initramfs of kernel %s is as it was (%s)" % (
                " ".join(item["command"]), rc, (err or out).strip()[-2000:], item["kernel"],
                "rebuilt before it: %s" % ", ".join(done) if done else "no other kernel was rebuilt"))
        done.append(item["kernel"])


def install_esp_copies(module, root, versions, timeout):
    """systemd-boot boots a copy of each kernel's initramfs on the ESP, which dracut does not refresh (Debian's
    initramfs-tools does, through its post-update hook): ``kernel-install add`` copies each rebuilt one again.
    Returns the kernels done; raises naming the first that failed."""
    installer = module.get_bin_path("kernel-install", required=False)
    if not installer or not versions:
        return []
    done = []
    for version in versions:
        argv = [installer, "add", version, host_path(root, "/boot/vmlinuz-%s" % version)]
        rc, out, err = run_timed(module, argv, timeout, option="timeout", kill_after=30)
        if rc != 0:
            raise ModulesError("%s failed (rc=%s): %s; the rebuilt initramfs of kernel %s is not yet on the ESP, "
                               "which systemd-boot boots (copied again for: %s); run the preparation again" % (
                                   " ".join(argv), rc, (err or out).strip()[-2000:], version,
                                   ", ".join(done) or "no kernel"))
        done.append(version)
    return done


def run(module, root):
    """The body of :func:`main` for ``run_module``: returns the result dict or raises, never exits."""
    params = module.params
    validate(params)
    tool = _modprobe.detect_tool(module, params["initramfs_tool"], root)
    wanted = wanted_files(params, tool)
    changes = _persist.changed_files(root, wanted)
    earlier = _persist.read_pending(root, PENDING)
    reason = ""
    if tool != "none" and params["rebuild"] == "always":
        reason = "requested (rebuild=always)"
    elif tool != "none" and params["rebuild"] == "changed" and changes:
        reason = "files of set %s changed" % params["name"]
    elif tool != "none" and params["rebuild"] == "changed" and earlier is not None:
        reason = _persist.describe_pending(earlier)
    rebuild = bool(reason)
    kernels = []
    if params["rebuild_kernels"] and tool != "none" and params["rebuild"] != "never":
        kernels = plan_kernels(module, root, tool, wanted, rebuild)
    loaded = _modprobe.loaded_modules(root, params["blacklist"]) if params["state"] == "present" else []
    result = {
        "changed": bool(changes) or rebuild or bool(kernels),
        "files": [{"path": path, "state": "absent" if wanted[path] is None else "present",
                   "changed": path in changes} for path in sorted(wanted)
                  if wanted[path] is not None or path in changes],
        "initramfs_tool": tool,
        "initramfs_rebuilt": rebuild,
        "initramfs_pending": (bool(changes) or earlier is not None) and not rebuild,
        "rebuild_reason": reason,
        # An initramfs an earlier run left due may be the one the host booted with: it needs the reboot too.
        # The running kernel's initramfs rebuilt on its own was built without the files it boots with now.
        "reboot_required": (bool(changes) or bool(loaded) or (rebuild and earlier is not None)
                            or any(k["running"] for k in kernels)),
        "loaded_blacklisted": loaded,
        "kernels_rebuilt": kernels,
    }
    if module._diff:
        result["diff"] = [{"before_header": path, "after_header": path,
                           "before": _persist.read_text(root, path) or "", "after": text or ""}
                          for path, text in sorted(changes.items())]
        result["diff"] += [{"before_header": "initramfs of kernel %s" % k["kernel"],
                            "after_header": "initramfs of kernel %s" % k["kernel"],
                            "before": k["reason"] + "\n", "after": "rebuilt: %s\n" % " ".join(k["command"])}
                           for k in kernels]
    if tool == "none" and changes and params["initramfs"]:
        module.warn("no initramfs generator was found or initramfs_tool=none: rebuild the initramfs yourself "
                    "for the modules of set %s to be in it" % params["name"])
    if module.check_mode or not (changes or rebuild or kernels):
        return result
    esp = _kernels.esp_kernels(root) if tool == "dracut" else []
    one_by_one = [v for v in esp if v in [k["kernel"] for k in kernels]]
    if not (changes or rebuild):
        rebuild_kernels(module, root, kernels, params["timeout"])
        result["esp_copies"] = install_esp_copies(module, root, one_by_one, params["timeout"])
        return result

    # Find the generator before writing anything, so a missing one changes nothing.
    cmd = _modprobe.rebuild_command(module, tool) if rebuild else None
    saved = _persist.snapshot(root, list(changes) + [_persist.pending_path(PENDING)])
    created = []
    try:
        created = _persist.mark_pending(module, root, PENDING, params["name"]) if changes else []
        _persist.apply_files(module, root, changes)
    except Exception as exc:  # pylint: disable=broad-exception-caught
        # PersistError (any failed write) or a failed removal; anything else must not skip the rollback either.
        errors = _persist.restore(module, root, saved)
        if earlier is None:
            _persist.clear_pending(root, PENDING, created)
        reason = exc if isinstance(exc, (GpuopsError, IOError, OSError)) else "%s: %s" % (type(exc).__name__, exc)
        raise ModulesError("writing the module settings failed (%s); %s" % (
            reason, "rollback failed: %s" % "; ".join(errors) if errors else "the files were put back as they were"))
    if cmd:
        rc, out, err = run_timed(module, cmd, params["timeout"], option="timeout", kill_after=30)
        if rc != 0:
            errors = _persist.restore(module, root, saved)
            if earlier is None:
                _persist.clear_pending(root, PENDING, created)
            rollback = ("rollback failed: %s" % "; ".join(errors) if errors else
                        "the module files were put back as they were; the initramfs may need `%s` again"
                        % " ".join(cmd))
            raise ModulesError("%s failed (rc=%s): %s; %s" % (
                " ".join(cmd), rc, (err or out).strip()[-2000:], rollback))
        _persist.clear_pending(root, PENDING)
    rebuild_kernels(module, root, kernels, params["timeout"])
    # dracut --regenerate-all rebuilt every kernel's image; the per-kernel rebuilds theirs.
    result["esp_copies"] = install_esp_copies(module, root, esp if cmd else one_by_one, params["timeout"])
    return result


def build_module():
    return create_module(
        AnsibleModule,
        argument_spec=dict(
            name=dict(type="str", required=True),
            blacklist=dict(type="list", elements="str", default=[]),
            options=dict(type="dict", default={}),
            softdeps=dict(type="dict", default={}),
            load=dict(type="list", elements="str", default=[]),
            initramfs=dict(type="list", elements="str", default=[]),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            initramfs_tool=dict(type="str", choices=["auto", "initramfs-tools", "dracut", "none"], default="auto"),
            rebuild=dict(type="str", choices=["changed", "always", "never"], default="changed"),
            timeout=dict(type="int", default=900),
            rebuild_kernels=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )


def main():
    run_module(build_module, run, ROOT)


if __name__ == "__main__":
    main()
