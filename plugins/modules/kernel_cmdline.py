#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_cmdline
short_description: Ensure kernel command-line arguments are present or absent in the boot configuration
version_added: 1.0.0
description:
  - Adds, replaces or removes kernel arguments such as C(intel_iommu=on), C(iommu=pt) or
    C(vfio-pci.ids=10de:2236) in the persistent boot configuration, then regenerates it.
  - Backends. C(grub) (Debian, Ubuntu) computes the command line that C(grub-mkconfig) sees after
    C(/etc/default/grub) and every C(/etc/default/grub.d/*.cfg) drop-in, and writes the result into a
    drop-in of its own, C(/etc/default/grub.d/99-gpuops-sandbox.cfg), for C(GRUB_CMDLINE_LINUX) and/or
    C(GRUB_CMDLINE_LINUX_DEFAULT) (only the variables whose value it had to change); then it runs
    C(update-grub), or C(grub-mkconfig -o /boot/grub/grub.cfg) when C(update-grub) is missing. A record that
    C(grub.cfg) is due, C(/var/lib/gpuops/pending/bootloader.json), is synced to disk before the drop-in is
    written and removed once the command succeeded; a run cut short in between (a power loss, a killed
    controller) leaves it, and the next run generates C(grub.cfg) again although the drop-in already holds the
    requested line.
  - When the change only adds arguments to what the other files give a variable, the drop-in appends them to
    that value (C(GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt")), so the arguments written by hand in
    C(/etc/default/grub) (say a C(vfio-pci.ids=) claim) stay there, where their author edits or removes them,
    and are not copied into this module's file. An argument of those files that the change takes off for good
    (not one the record keeps to give back, so a C(vfio-pci.ids=) claim O(state=absent) removes, or an original
    given up with O(restore=false)) is taken out of the file where it is written, that token alone, with the
    file backed up and a warning naming it, the variable and the backup; so the drop-in still only adds to that
    value, and what
    the owner writes there later (a C(quiet)) takes effect. A drop-in that an earlier version set to a full value
    this way is mended on the next run. Only a value replaced (with the record to give the original back), or an
    argument the files do not spell out (it comes from another variable), sets the variable's full value in the
    drop-in; the latter with a warning that later edits of that variable then do not take effect.
  - C(grubby) (RHEL 8/9 family) changes every boot entry with C(grubby --update-kernel=ALL), reads the
    result back with C(grubby --info=ALL), and keeps C(GRUB_CMDLINE_LINUX) of C(/etc/default/grub) in sync.
  - C(grub2_mkconfig) (RHEL 9.3 and later without grubby) edits C(GRUB_CMDLINE_LINUX) in
    C(/etc/default/grub) and runs C(grub2-mkconfig -o /boot/grub2/grub.cfg --update-bls-cmdline).
  - C(kernel_cmdline_file) (systemd-boot and other C(kernel-install) hosts) edits C(/etc/kernel/cmdline), then
    writes the BLS entry of each installed kernel again with C(kernel-install add <version> /boot/vmlinuz-<version>)
    (entries in C(/boot/loader/entries) or in C(loader/entries) of an ESP mounted at C(/efi) or C(/boot/efi)), since
    C(kernel-install) copies the file into an entry only when it installs the kernel. An entry that lacks the request
    although the file is right is written again the same way. The entries are backed up first and put back on
    failure.
  - Reports whether a reboot is needed by comparing the requested state with C(/proc/cmdline). Never
    reboots.
  - Every boot configuration file is backed up before it changes, into C(/var/lib/gpuops/backups), never next
    to the file (so nothing is left in C(/etc/default/grub.d) or C(/boot)). A backup is named after the file's
    path with C(%) written C(%25) and C(/) written C(%2F), then its time in UTC, for example
    C(etc%2Fdefault%2Fgrub.d%2F99-gpuops-sandbox.cfg.20250131T120000.123456Z); the newest 3 of each file are
    kept, older ones are removed. When a write, the regeneration command or the check afterwards fails, the
    files are restored from those backups and the failure says so.
  - Arguments not named in O(arguments) are kept, with their text and order unchanged.
  - Keeps a record, C(/var/lib/gpuops/kernel_cmdline.json), of what it replaced, so that O(state=absent)
    can give it back (see O(restore) and the notes).
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  arguments:
    description:
      - Kernel arguments, each a string C(KEY) (a flag such as C(quiet)) or C(KEY=VALUE).
      - "C(KEY) may hold letters, digits, C(_), C(-) and C(.), and may not start with C(-) or C(.);
        C(VALUE) may hold letters, digits and C(_ . , : = / + @ % ~ -) (ASCII only). Anything else
        (whitespace including a trailing newline, control characters, quotes, C($), backticks, C(;),
        backslashes, non-ASCII letters, an empty string, a YAML boolean or null) is refused before any
        file is read or written, because the text ends up in a file a shell sources."
      - Keys are compared the way the kernel compares them, with C(-) and C(_) equal.
      - The list may not be empty. Exact repeats are merged.
      - Items are typed C(raw) on purpose so that an unquoted YAML C(on), C(yes) or C(~) is reported as
        an error instead of being turned into the text C(True) or C(None).
    type: list
    elements: raw
    required: true
  state:
    description:
      - V(present) makes every argument present. With O(replace_values=true), any other value of the same
        key is removed, the first occurrence is replaced in place and repeats are dropped; a key that is
        not there yet is appended.
      - V(absent) with C(KEY) removes every occurrence of that key whatever its value; with C(KEY=VALUE)
        only that value is removed.
    type: str
    choices: [present, absent]
    default: present
  replace_values:
    description:
      - With O(state=present), whether a C(KEY=VALUE) replaces the other values of C(KEY).
      - Set to V(false) for keys the kernel accepts several times, such as C(console); the argument is
        then only added when that exact C(KEY=VALUE) is missing.
      - With V(true), asking for two different values of one key in O(arguments) is an error.
    type: bool
    default: true
  restore:
    description:
      - With O(state=absent), whether to give back what this module replaced when it set the value being
        removed, for example C(intel_iommu=off) when removing the C(intel_iommu=on) it put in its place.
        See the notes for what is given back and when.
      - With V(false), the value is only removed; the record of that key is dropped all the same.
      - Not used with O(state=present), which always keeps the record.
    type: bool
    default: true
  backend:
    description:
      - Which boot configuration to change. V(auto) picks V(grubby) when C(grubby) is installed, then
        V(grub) when C(/etc/default/grub) exists with C(update-grub) or C(grub-mkconfig), then
        V(grub2_mkconfig) when it exists with C(grub2-mkconfig), then V(kernel_cmdline_file) when
        C(/etc/kernel/cmdline), C(kernel-install) or C(bootctl) exists.
    type: str
    choices: [auto, grub, grubby, grub2_mkconfig, kernel_cmdline_file]
    default: auto
  command_timeout:
    description:
      - Seconds each command (C(grubby), C(update-grub), C(grub-mkconfig), C(grub2-mkconfig)) may run
        before it is stopped and treated as failed. Uses C(timeout) from coreutils when installed.
      - V(0) means no limit; at most V(86400) (one day). Booleans are refused.
    type: int
    default: 300
notes:
  - With the V(grub) backend, once the module owns a variable in its drop-in, later edits of that variable in
    C(/etc/default/grub) are overridden by the drop-in; change it through this module, or delete
    C(/etc/default/grub.d/99-gpuops-sandbox.cfg) and run C(update-grub). Conflicting values found in
    C(/etc/default/grub) or in an earlier drop-in disappear from the generated C(grub.cfg), but their text
    stays in those files.
  - The V(grub) backend refuses to guess. It fails, changing nothing, when a C(grub.d) drop-in sorting
    after C(99-gpuops-sandbox.cfg) overrides the variables, when a file sets them with shell code
    it cannot evaluate (command substitution, conditionals, C(eval)), or when the installed
    C(grub-mkconfig) does not read C(/etc/default/grub.d).
  - New arguments go to C(GRUB_CMDLINE_LINUX), which applies to every menu entry including recovery ones;
    an argument already in C(GRUB_CMDLINE_LINUX_DEFAULT) is replaced where it is.
  - "What is recorded. When O(state=present) replaces or removes other values of a key (C(intel_iommu=off) becomes
    C(intel_iommu=on)), or adds a key that was not there, the module records in
    C(/var/lib/gpuops/kernel_cmdline.json), per key, the tokens the key had in the effective command line
    before the module first changed it (empty for a key it added) and the value it set. A later run that
    changes the key again keeps the first original. With O(replace_values=false) only keys the module added
    are recorded."
  - "O(state=absent) with O(restore=true) gives the original tokens back, in the place of the value it removes,
    when it removes the value the module set and no other value of that key is left; the record entry then goes,
    and the file goes when it is empty. Nothing is given back for a key the module added, nor a token the
    request itself removes (so O(state=absent) with a bare C(KEY) removes every value and gives nothing back)."
  - "When the key's value is no longer the one the module set (someone changed the same setting since),
    that setting wins: nothing is given back for that key and its record entry is dropped."
  - Hosts changed before the record existed have no record; nothing is given back there.
  - "The effective command line is, for V(grub), C(GRUB_CMDLINE_LINUX) and C(GRUB_CMDLINE_LINUX_DEFAULT) after
    every file (the module's drop-in included); for V(grubby), the first boot entry; for V(grub2_mkconfig), the
    first boot entry (else C(/etc/default/grub)); for V(kernel_cmdline_file), C(/etc/kernel/cmdline)."
  - With the V(grub) backend, once the drop-in no longer changes anything (the other files give the same
    command line, for example after the distribution's value was given back), the drop-in is deleted, so the
    distribution's files take effect again, and C(grub.cfg) is regenerated.
  - The kernel's command line is limited in length (2048 bytes on x86); the module does not check it.
  - A reboot is needed for the change to take effect; use RV(reboot_required).
extends_documentation_fragment:
  - gpuops.sandbox.attributes
attributes:
  diff_mode:
    support: full
    details:
      - Shows the boot configuration files before and after, the effective command line, and the record
        C(/var/lib/gpuops/kernel_cmdline.json) when it changes.
"""

EXAMPLES = r"""
- name: Enable the Intel IOMMU in passthrough mode (replaces intel_iommu=off if set)
  gpuops.sandbox.kernel_cmdline:
    arguments:
      - intel_iommu=on
      - iommu=pt
    state: present
  register: iommu_args

- name: Reboot once when the running kernel does not have the arguments yet
  ansible.builtin.reboot:
  when: iommu_args.reboot_required

- name: Reserve NVIDIA GPUs for vfio-pci at boot (vfio-pci built into the kernel ignores modprobe.d)
  gpuops.sandbox.kernel_cmdline:
    arguments:
      - vfio-pci.ids=10de:2236,10de:1aef

- name: Add a second console without removing the existing console= argument
  gpuops.sandbox.kernel_cmdline:
    arguments:
      - console=ttyS0,115200
    replace_values: false

- name: Remove nomodeset whatever its value, and only the iommu=soft value of iommu
  gpuops.sandbox.kernel_cmdline:
    arguments:
      - nomodeset
      - iommu=soft
    state: absent

- name: Leave passthrough - remove the IOMMU arguments and give back what they replaced (intel_iommu=off)
  gpuops.sandbox.kernel_cmdline:
    arguments:
      - intel_iommu=on
      - iommu=pt
    state: absent
  register: iommu_removed

- name: Remove iommu=pt only, without giving back what it replaced
  gpuops.sandbox.kernel_cmdline:
    arguments:
      - iommu=pt
    state: absent
    restore: false

- name: Force the systemd-boot backend (/etc/kernel/cmdline)
  gpuops.sandbox.kernel_cmdline:
    arguments:
      - iommu=pt
    backend: kernel_cmdline_file
"""

RETURN = r"""
backend:
  description: The backend used, chosen or detected.
  returned: success
  type: str
  sample: grub
cmdline:
  description:
    - The kernel arguments the boot configuration now holds (in check mode, would hold), as one string.
    - V(grub) backend, C(GRUB_CMDLINE_LINUX) followed by C(GRUB_CMDLINE_LINUX_DEFAULT) (the normal menu
      entry, without the C(BOOT_IMAGE) and C(root) grub adds); V(grubby) and V(grub2_mkconfig), the
      first boot entry; V(kernel_cmdline_file), the file.
  returned: success
  type: str
  sample: console=ttyS0,115200 intel_iommu=on iommu=pt
cmdline_args:
  description: RV(cmdline) split into arguments.
  returned: success
  type: list
  elements: str
  sample: ["console=ttyS0,115200", "intel_iommu=on", "iommu=pt"]
entries:
  description: For V(grubby) and V(grub2_mkconfig), each boot entry and its arguments afterwards.
  returned: success, with the grubby and grub2_mkconfig backends
  type: list
  elements: dict
  sample: [{kernel: /boot/vmlinuz-5.14.0-427.el9.x86_64, args: "ro crashkernel=auto intel_iommu=on"}]
restored:
  description:
    - The tokens O(state=absent) gave back (in check mode, would give back) from the record of what the
      module replaced, in the place of the values it removed. Empty when nothing was given back.
  returned: success
  type: list
  elements: str
  sample: ["intel_iommu=off"]
reboot_required:
  description:
    - True when C(/proc/cmdline) of the running kernel does not have the requested state, so the
      host has to boot again for it to apply. Stays true, run after run, until that reboot.
    - When C(/proc/cmdline) cannot be read, equal to C(changed) and a warning says so.
  returned: success
  type: bool
  sample: true
backup_file:
  description: The backup of the main file changed (drop-in, C(/etc/default/grub) or C(/etc/kernel/cmdline)).
  returned: when a file that already existed was changed
  type: str
  sample: /var/lib/gpuops/backups/etc%2Fdefault%2Fgrub.d%2F99-gpuops-sandbox.cfg.20250131T120000.123456Z
backup_files:
  description: Every backup made, including boot entries backed up before C(grubby) or C(grub2-mkconfig) ran.
  returned: success
  type: list
  elements: str
  sample: [/var/lib/gpuops/backups/etc%2Fdefault%2Fgrub.20250131T120000.123456Z]
msg:
  description: What was done, in words.
  returned: always
  type: str
  sample: wrote /etc/default/grub.d/99-gpuops-sandbox.cfg and ran update-grub; reboot required
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._bootloader import (
    BACKENDS,
    DROPIN_NAME,
    Context,
    detect_backend,
    execute,
    reboot_required,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._cmdline import GRUB_DROPIN_DIR, RECORD_FILE
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    check_range,
    create_module,
    run_module,
)

# Host root for every file this module touches. Only unit tests point it elsewhere.
ROOT = "/"
MAX_COMMAND_TIMEOUT = 86400


def ensure(module, root="/"):
    """The module's body: return the result, or raise GpuopsError (files already rolled back)."""
    check_range("command_timeout", module.params["command_timeout"], 0, MAX_COMMAND_TIMEOUT, "seconds (0 for no limit)")
    ctx = Context(module, root)
    backend = module.params["backend"]
    if backend == "auto":
        backend = detect_backend(ctx)
    plan = BACKENDS[backend](ctx)
    record_after = ctx.record_after()
    if record_after != ctx.record_text:
        plan.record = (ctx.record_text, record_after)
    file_diffs = [{"before_header": ctx.shown(path), "after_header": ctx.shown(path),
                   "before": before or "", "after": after or ""} for path, before, after in plan.files]
    changed = plan.needs_change or plan.record is not None
    backed_up = []
    if changed and not module.check_mode:
        backed_up = execute(ctx, plan)
    backups = [backup for _path, backup in backed_up]
    for path, tokens in plan.owner_edits:
        backup = [ctx.shown(saved) for backed, saved in backed_up if backed == path]
        module.warn("%s %s out of %s, where it is written, so that %s/%s only adds to those variables and later "
                    "edits of them in %s still take effect%s"
                    % ("would take" if module.check_mode else "took",
                       ", ".join("%s (%s)" % (token, name) for name, token in tokens), ctx.shown(path),
                       GRUB_DROPIN_DIR, DROPIN_NAME, ctx.shown(path),
                       "; the file as it was is in %s" % backup[0] if backup else ""))
    restored = ctx.restored if plan.needs_change else []
    result = {
        "changed": changed,
        "backend": backend,
        "cmdline": " ".join(plan.cmdline_args),
        "cmdline_args": list(plan.cmdline_args),
        "reboot_required": reboot_required(ctx, changed),
        "backup_files": backups,
        "restored": restored,
    }
    main_files = [path for path, _b, _a in plan.files]
    for path in main_files:
        match = [backup for backed, backup in backed_up if backed == path]
        if match:
            result["backup_file"] = match[0]
            break
    if plan.entries is not None:
        result["entries"] = plan.entries
    if module._diff:
        record_diff = []
        if plan.record is not None:
            record_diff.append({"before_header": RECORD_FILE, "after_header": RECORD_FILE,
                                "before": plan.record[0] or "", "after": plan.record[1] or ""})
        result["diff"] = file_diffs + plan.diff + record_diff
    verb = "would change" if module.check_mode else "changed"
    if changed:
        done = [ctx.shown(p) for p in main_files] or (["the boot entries"] if plan.needs_change else [])
        if plan.record is not None:
            done.append(RECORD_FILE)
        ran = "; ran " + ", ".join(os.path.basename(c[0]) for c in plan.commands) if plan.commands else ""
        if module.check_mode:
            ran = ran.replace("ran", "would run")
        msg = "%s %s%s" % (verb, ", ".join(done), ran)
        if restored:
            msg += "; %s %s back" % ("would give" if module.check_mode else "gave", " ".join(restored))
    else:
        msg = "boot configuration already has the requested kernel arguments"
    if result["reboot_required"]:
        msg += "; reboot required for the running kernel to get them"
    if plan.note and changed:
        msg += "; " + plan.note
    result["msg"] = msg
    return result


def build_module():
    return create_module(
        AnsibleModule,
        argument_spec=dict(
            arguments=dict(type="list", elements="raw", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            replace_values=dict(type="bool", default=True),
            restore=dict(type="bool", default=True),
            backend=dict(type="str", choices=["auto", "grub", "grubby", "grub2_mkconfig", "kernel_cmdline_file"],
                         default="auto"),
            command_timeout=dict(type="int", default=300),
        ),
        supports_check_mode=True,
    )


def main():
    run_module(build_module, ensure, ROOT)


if __name__ == "__main__":
    main()
