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
version_added: 0.1.0
description:
  - Adds, replaces or removes kernel arguments such as C(intel_iommu=on), C(iommu=pt) or
    C(vfio-pci.ids=10de:2236) in the persistent boot configuration, then regenerates it.
  - Backends. C(grub) (Debian, Ubuntu) computes the command line that C(grub-mkconfig) sees after
    C(/etc/default/grub) and every C(/etc/default/grub.d/*.cfg) drop-in, and writes the result into a
    drop-in of its own, C(/etc/default/grub.d/99-gpuops-sandbox.cfg), which sets the full value of
    C(GRUB_CMDLINE_LINUX) and/or C(GRUB_CMDLINE_LINUX_DEFAULT) (only the variables whose value it had to
    change); then it runs C(update-grub), or C(grub-mkconfig -o /boot/grub/grub.cfg) when C(update-grub)
    is missing.
  - C(grubby) (RHEL 8/9 family) changes every boot entry with C(grubby --update-kernel=ALL), reads the
    result back with C(grubby --info=ALL), and keeps C(GRUB_CMDLINE_LINUX) of C(/etc/default/grub) in sync.
  - C(grub2_mkconfig) (RHEL 9.3 and later without grubby) edits C(GRUB_CMDLINE_LINUX) in
    C(/etc/default/grub) and runs C(grub2-mkconfig -o /boot/grub2/grub.cfg --update-bls-cmdline).
  - C(kernel_cmdline_file) (systemd-boot and other C(kernel-install) hosts) edits C(/etc/kernel/cmdline).
    No command is run; entries already installed keep their command line until C(kernel-install) next
    writes them (for example on the next kernel update, or with C(kernel-install add)).
  - Reports whether a reboot is needed by comparing the requested state with C(/proc/cmdline). Never
    reboots.
  - Every boot configuration file is backed up (C(<file>.<pid>.<timestamp>~)) before it changes. When
    the regeneration command fails, the files are restored from those backups and the failure says so.
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
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details:
      - Shows the boot configuration files before and after, the effective command line, and the record
        C(/var/lib/gpuops/kernel_cmdline.json) when it changes.
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
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
  sample: /etc/default/grub.d/99-gpuops-sandbox.cfg.4242.2025-01-31@12:00:00~
backup_files:
  description: Every backup made, including boot entries backed up before C(grubby) or C(grub2-mkconfig) ran.
  returned: success
  type: list
  elements: str
  sample: [/etc/default/grub.4242.2025-01-31@12:00:00~]
msg:
  description: What was done, in words.
  returned: always
  type: str
  sample: wrote /etc/default/grub.d/99-gpuops-sandbox.cfg and ran update-grub; reboot required
"""

import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._cmdline import (
    BLS_ENTRIES_DIR,
    GRUB_DEFAULTS,
    GRUB_DROPIN_DIR,
    GRUB_VARS,
    KERNEL_CMDLINE_FILE,
    RECORD_FILE,
    apply_args,
    bls_entry_files,
    host_path,
    load_record,
    parse_args,
    parse_grubby_info,
    plan_restore,
    read_bls_options,
    read_kernel_cmdline_file,
    read_proc_cmdline,
    read_text,
    record_present,
    render_kernel_cmdline_file,
    render_record,
    satisfies,
    split_cmdline,
    strip_loader_tokens,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._shellvars import (
    evaluate_grub_defaults,
    grub_defaults_chain,
    grub_mkconfig_reads_dropins,
    parse_grub_defaults,
    render_grub_dropin,
    set_grub_variables,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils import _persist
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    TIMEOUT_RC,
    GpuopsError,
    check_range,
    create_module,
    run_module,
)

# Host root for every file this module touches. Only unit tests point it elsewhere.
HOST_ROOT = "/"
DROPIN_NAME = "99-gpuops-sandbox.cfg"
ORIGIN = "gpuops.sandbox.kernel_cmdline"
# Files regenerated by grubby / grub2-mkconfig; backed up before those commands run.
GRUB2_GENERATED = ("/boot/grub2/grubenv", "/boot/grub2/grub.cfg", KERNEL_CMDLINE_FILE)


# timeout(1) exits with TIMEOUT_RC when the command ran out of time, and with 128 + SIGKILL (137) when the
# command also ignored SIGTERM and was killed --kill-after seconds later.
KILLED_AFTER_TIMEOUT_RC = 137
MAX_COMMAND_TIMEOUT = 86400

# The failures of this module: GpuopsError, whose ``extra`` holds further result keys (rc, rolled_back, ...).
ModuleFailure = GpuopsError


class Plan:
    """What a backend wants done: files to write, files to back up, commands, and the outcome."""

    def __init__(self):
        self.files = []  # (path, before text or None, after text or None); None means absent
        self.backup_only = []  # paths changed by a command, backed up before it runs
        self.commands = []  # argv lists, run in order after the files are written
        self.needs_change = False
        self.cmdline_args = []
        self.entries = None
        self.verify = None  # callable returning an error text or None, run after the commands
        self.diff = []
        self.note = ""
        self.record = None  # (before text or None, after text or None) of RECORD_FILE when it changes


class Context:
    """The validated request and the module, passed to every backend."""

    def __init__(self, module, root):
        self.module = module
        self.root = root
        params = module.params
        self.state = params["state"]
        self.replace_values = params["replace_values"]
        self.timeout = params["command_timeout"]
        self.restore = params["restore"]
        self.args = parse_args(params["arguments"], self.state, self.replace_values)
        # The record of what the module replaced (RECORD_FILE), read and checked before anything changes.
        self.record_text = read_text(self.path(RECORD_FILE))
        self.record = load_record(self.record_text, RECORD_FILE)
        self.new_record = self.record
        self.give_back = {}  # normalized key -> tokens state=absent puts back

    def prepare(self, tokens):
        """Decide, from ``tokens`` (the effective command line before the change), what to give back and record.

        Each backend calls it once, before it applies the request anywhere.
        """
        if self.state == "absent":
            self.give_back, self.new_record = plan_restore(self.record, tokens, self.args, self.restore)
            return
        new = apply_args([tokens], self.args, self.state, self.replace_values)[0]
        self.new_record, left_out = record_present(self.record, tokens, new, self.args, self.replace_values)
        if left_out:
            self.module.warn("%s cannot be kept in %s (not a single plain argument) and will not be given back by "
                             "state=absent" % (", ".join(repr(t) for t in left_out), RECORD_FILE))

    @property
    def restored(self):
        """The tokens state=absent gives back, in the order of the request."""
        return [tok for key in dict.fromkeys(arg.key for arg in self.args) for tok in self.give_back.get(key, [])]

    def record_after(self):
        """The record file's text after the run (None: no file); the same text when nothing in it changes."""
        if self.new_record == self.record:
            return self.record_text
        return render_record(self.new_record)

    def apply(self, segments, target=0):
        return apply_args(segments, self.args, self.state, self.replace_values, target=target, restore=self.give_back)

    def satisfied(self, tokens):
        return satisfies(tokens, self.args, self.state, self.replace_values)

    def path(self, host_file):
        return host_path(self.root, host_file)

    def shown(self, path):
        """The path as it is on the host (without the test root)."""
        root = os.path.abspath(self.root)
        if root != "/" and path.startswith(root + os.sep):
            return path[len(root):]
        return path

    def which(self, name, required=False):
        """The path of command ``name``, or None; with ``required``, a missing command is a failure."""
        path = self.module.get_bin_path(name)
        if required and not path:
            raise ModuleFailure("%s is needed but not installed (not found in PATH or the sbin directories); "
                                "nothing changed" % name)
        return path


def run(ctx, argv):
    """Run a command from a list with LC_ALL=C and a time limit; return (rc, stdout, stderr)."""
    full = list(argv)
    timeout_bin = ctx.which("timeout") if ctx.timeout > 0 else None
    if timeout_bin:
        full = [timeout_bin, "--kill-after=10", str(ctx.timeout)] + full
    rc, out, err = ctx.module.run_command(full, environ_update={"LC_ALL": "C"}, expand_user_and_vars=False)
    if timeout_bin and rc in (TIMEOUT_RC, KILLED_AFTER_TIMEOUT_RC):
        err = (err or "") + "\n%s did not finish within %d seconds (command_timeout)" % (argv[0], ctx.timeout)
    return rc, out, err


def command_failure(argv, rc, out, err):
    return "%s failed (rc=%s); stdout: %s; stderr: %s" % (
        " ".join(argv), rc, (out or "").strip() or "(empty)", (err or "").strip() or "(empty)")


# ---------------------------------------------------------------------------------------------
# File changes with backups and rollback
# ---------------------------------------------------------------------------------------------

def write_file(module, path, text):
    """Write ``text`` to ``path`` through a temp file in the same directory, then root:root 0644."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        module.atomic_move(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    os.chmod(path, 0o644)
    if os.geteuid() == 0:
        os.chown(path, 0, 0)


def restore_file(module, backup, path):
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        shutil.copy2(backup, tmp)
        module.atomic_move(tmp, path, keep_dest_attrs=False)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class Transaction:
    """Backs up each file before it changes and can put every one of them back."""

    def __init__(self, module):
        self.module = module
        self.records = []  # (path, backup path or None when the file did not exist)
        self.saved = []  # (root, host path, text or None): files put back from memory (the module's record)
        self.created_dirs = []

    @property
    def backups(self):
        return [backup for _path, backup in self.records if backup]

    def backup(self, path):
        if any(path == recorded for recorded, _backup in self.records):
            return None
        backup = None
        if os.path.exists(path):
            try:
                backup = self.module.backup_local(path) or None
            except Exception as exc:  # backup_local raises a bare Exception
                raise ModuleFailure("could not back up %s, nothing changed: %s" % (path, exc))
        self.records.append((path, backup))
        return backup

    def make_dirs(self, directory):
        """Create ``directory`` and its missing parents (0755), each recorded so that rollback removes it."""
        missing = []
        while directory and not os.path.isdir(directory) and directory != os.path.dirname(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for path in reversed(missing):
            os.mkdir(path, 0o755)
            self.created_dirs.append(path)

    def write(self, path, text):
        self.make_dirs(os.path.dirname(path))
        self.backup(path)
        write_file(self.module, path, text)

    def write_record(self, root, host_file, before, after):
        """Write the module's record (``after``; None removes it) through _persist; ``before`` is put back on rollback."""
        if not any(saved_file == host_file for _root, saved_file, _text in self.saved):
            self.saved.append((root, host_file, before))
        if after is None:
            _persist.remove_file(root, host_file)
        else:
            self.make_dirs(os.path.dirname(host_path(root, host_file)))
            _persist.write_text(self.module, root, host_file, after)

    def remove(self, path):
        self.backup(path)
        if os.path.exists(path):
            os.unlink(path)

    def rollback(self):
        """Restore every recorded file; return (list of actions, list of errors)."""
        done, errors = [], []
        for root, host_file, text in reversed(self.saved):
            path = host_path(root, host_file)
            problems = _persist.restore(self.module, root, {host_file: text})
            if problems:
                errors.extend("could not restore %s" % problem for problem in problems)
            elif text is None:
                done.append("removed %s (it did not exist before)" % path)
            else:
                done.append("restored %s" % path)
        for path, backup in reversed(self.records):
            try:
                if backup:
                    restore_file(self.module, backup, path)
                    done.append("restored %s from %s" % (path, backup))
                elif os.path.exists(path):
                    os.unlink(path)
                    done.append("removed %s (it did not exist before)" % path)
            except (OSError, IOError, shutil.Error) as exc:
                errors.append("could not restore %s: %s" % (path, exc))
        for directory in reversed(self.created_dirs):
            try:
                os.rmdir(directory)
            except OSError:
                pass
        return done, errors


# ---------------------------------------------------------------------------------------------
# Backends: each returns a Plan and changes nothing
# ---------------------------------------------------------------------------------------------

def plan_grub(ctx):
    plan = Plan()
    update_grub = ctx.which("update-grub")
    mkconfig = ctx.which("grub-mkconfig")
    if not update_grub and not mkconfig:
        raise ModuleFailure("backend grub needs update-grub or grub-mkconfig, and neither is installed")
    if mkconfig and grub_mkconfig_reads_dropins(mkconfig) is False:
        raise ModuleFailure("%s does not read /etc/default/grub.d/*.cfg (not a Debian/Ubuntu grub); "
                            "use backend grub2_mkconfig or grubby instead" % mkconfig)
    dropin = ctx.path(GRUB_DROPIN_DIR + "/" + DROPIN_NAME)
    current, _assignments = evaluate_grub_defaults(ctx.root)
    base, _assignments = evaluate_grub_defaults(ctx.root, {dropin: None})
    old_segments = [split_cmdline(current[name]) for name in GRUB_VARS]
    ctx.prepare(old_segments[0] + old_segments[1])
    new_segments = ctx.apply(old_segments)
    # Only the variables whose result differs from what the other files give are pinned: once nothing
    # differs (for example after state=absent gave the distribution's values back), the drop-in goes.
    wanted = {}
    for name, old, new in zip(GRUB_VARS, old_segments, new_segments):
        if split_cmdline(base[name]) != new:
            wanted[name] = current[name] if old == new else " ".join(new)
    new_text = render_grub_dropin(wanted, ORIGIN) if wanted else None
    old_text = read_text(dropin)

    trial, _assignments = evaluate_grub_defaults(ctx.root, {dropin: new_text})
    if [split_cmdline(trial[name]) for name in GRUB_VARS] != new_segments:
        later = [ctx.shown(p) for p in grub_defaults_chain(ctx.root) if os.path.basename(p) > DROPIN_NAME
                 and os.path.dirname(p) == os.path.dirname(dropin)]
        raise ModuleFailure("a drop-in read after %s overrides GRUB_CMDLINE_LINUX(_DEFAULT), so the change "
                            "would not take effect: %s; nothing changed"
                            % (ctx.shown(dropin), ", ".join(later) or "(unknown)"))

    plan.cmdline_args = new_segments[0] + new_segments[1]
    if new_text != old_text:
        plan.needs_change = True
        plan.files.append((dropin, old_text, new_text))
        if update_grub:
            plan.commands.append([update_grub])
        else:
            plan.commands.append([mkconfig, "-o", ctx.path("/boot/grub/grub.cfg")])
    plan.diff.append({
        "before_header": "effective %s + %s" % GRUB_VARS,
        "after_header": "effective %s + %s" % GRUB_VARS,
        "before": " ".join(old_segments[0] + old_segments[1]) + "\n",
        "after": " ".join(plan.cmdline_args) + "\n",
    })
    return plan


def read_default_grub(ctx, required):
    """``(path, text, segments)`` of /etc/default/grub itself, or None when it does not exist (and is not required)."""
    path = ctx.path(GRUB_DEFAULTS)
    text = read_text(path)
    if text is None:
        if required:
            raise ModuleFailure("%s does not exist; backend grub2_mkconfig needs it" % GRUB_DEFAULTS)
        return None
    env = {}
    parse_grub_defaults(text, path, env, {})
    segments = [split_cmdline(env.get(name, "")) if isinstance(env.get(name, ""), str) else [] for name in GRUB_VARS]
    return path, text, segments


def plan_default_grub_sync(ctx, plan, defaults):
    """Plan the edit of /etc/default/grub itself (RHEL: no drop-ins); new arguments go to GRUB_CMDLINE_LINUX.

    ``defaults`` is what read_default_grub returned; None (no file) plans nothing.
    """
    if defaults is None:
        return None
    path, text, old_segments = defaults
    new_segments = ctx.apply(old_segments)
    changes = {name: " ".join(new) for name, old, new in zip(GRUB_VARS, old_segments, new_segments) if old != new}
    if changes:
        new_text = set_grub_variables(text, path, changes)
        plan.files.append((path, text, new_text))
        plan.needs_change = True
    return new_segments


def backup_generated(ctx, plan):
    plan.backup_only.extend(bls_entry_files(ctx.root))
    plan.backup_only.extend(p for p in (ctx.path(f) for f in GRUB2_GENERATED) if os.path.exists(p))


def grubby_entries(ctx, grubby):
    argv = [grubby, "--info=ALL"]
    rc, out, err = run(ctx, argv)
    if rc != 0:
        raise ModuleFailure(command_failure(argv, rc, out, err), rc=rc, stdout=out, stderr=err)
    entries = parse_grubby_info(out)
    if not entries:
        raise ModuleFailure("grubby --info=ALL lists no Linux boot entry; stdout: %s" % out.strip())
    return entries


def plan_grubby(ctx):
    plan = Plan()
    grubby = ctx.which("grubby", required=True)
    entries = grubby_entries(ctx, grubby)
    ctx.prepare(entries[0]["args"])
    remove, add = [], []
    before_lines, after_lines = [], []
    for entry in entries:
        old = entry["args"]
        new = ctx.apply([old])[0]
        before_lines.append("%s: %s" % (entry["kernel"], " ".join(old)))
        after_lines.append("%s: %s" % (entry["kernel"], " ".join(new)))
        if new == old:
            continue
        plan.needs_change = True
        gone = [tok for tok in dict.fromkeys(old) if old.count(tok) > new.count(tok)]
        remove.extend(tok for tok in gone if tok not in remove)
        add.extend(tok for tok in new if (tok in gone or tok not in old) and tok not in add)
    plan.cmdline_args = ctx.apply([entries[0]["args"]])[0]
    plan.entries = [{"kernel": e["kernel"], "args": " ".join(ctx.apply([e["args"]])[0])} for e in entries]
    plan_default_grub_sync(ctx, plan, read_default_grub(ctx, required=False))
    if plan.needs_change:
        backup_generated(ctx, plan)
        if remove:
            plan.commands.append([grubby, "--update-kernel=ALL", "--remove-args=" + " ".join(remove)])
        if add:
            plan.commands.append([grubby, "--update-kernel=ALL", "--args=" + " ".join(add)])

        def verify():
            after = grubby_entries(ctx, grubby)
            bad = [e["kernel"] for e in after if not ctx.satisfied(e["args"])]
            plan.entries = [{"kernel": e["kernel"], "args": " ".join(e["args"])} for e in after]
            plan.cmdline_args = after[0]["args"]
            if bad:
                return "grubby reported success but these entries still lack the requested state: %s" % ", ".join(bad)
            return None
        plan.verify = verify
    plan.diff.append({"before_header": "grubby --info=ALL", "after_header": "grubby --info=ALL",
                      "before": "\n".join(before_lines) + "\n", "after": "\n".join(after_lines) + "\n"})
    return plan


def plan_grub2_mkconfig(ctx):
    plan = Plan()
    mkconfig = ctx.which("grub2-mkconfig", required=True)
    defaults = read_default_grub(ctx, required=True)
    options_of = [(path, read_bls_options(path)) for path in bls_entry_files(ctx.root)]
    options_of = [(path, options) for path, options in options_of if options is not None]
    # The effective command line is the first boot entry's (what cmdline reports), else /etc/default/grub's.
    ctx.prepare(options_of[0][1] if options_of else defaults[2][0] + defaults[2][1])
    segments = plan_default_grub_sync(ctx, plan, defaults)
    stale = []
    entries = []
    for path, options in options_of:
        entries.append({"kernel": ctx.shown(path), "args": " ".join(ctx.apply([options])[0])})
        if ctx.apply([options])[0] != options:
            stale.append(path)
    plan.entries = entries
    plan.cmdline_args = split_cmdline(entries[0]["args"]) if entries else segments[0] + segments[1]
    if stale:
        plan.needs_change = True
    if plan.needs_change:
        backup_generated(ctx, plan)
        plan.commands.append([mkconfig, "-o", ctx.path("/boot/grub2/grub.cfg"), "--update-bls-cmdline"])

        def verify():
            bad = [ctx.shown(p) for p in bls_entry_files(ctx.root)
                   if read_bls_options(p) is not None and not ctx.satisfied(read_bls_options(p))]
            if bad:
                return "grub2-mkconfig succeeded but these boot entries lack the requested state: %s" % ", ".join(bad)
            return None
        plan.verify = verify
    return plan


def plan_kernel_cmdline_file(ctx):
    plan = Plan()
    path = ctx.path(KERNEL_CMDLINE_FILE)
    tokens = read_kernel_cmdline_file(ctx.root)
    old_text = read_text(path)
    if tokens is None:
        # kernel-install falls back to the running command line when the file is missing
        tokens = strip_loader_tokens(read_proc_cmdline(ctx.root) or [])
    ctx.prepare(tokens)
    new = ctx.apply([tokens])[0]
    plan.cmdline_args = new
    if new != tokens:
        plan.needs_change = True
        plan.files.append((path, old_text, render_kernel_cmdline_file(new)))
    plan.note = ("boot entries already installed keep their command line until kernel-install writes them again "
                 "(kernel update or 'kernel-install add')")
    return plan


BACKENDS = {
    "grub": plan_grub,
    "grubby": plan_grubby,
    "grub2_mkconfig": plan_grub2_mkconfig,
    "kernel_cmdline_file": plan_kernel_cmdline_file,
}


def detect_backend(ctx):
    if ctx.which("grubby"):
        return "grubby"
    has_defaults = os.path.isfile(ctx.path(GRUB_DEFAULTS))
    if has_defaults and (ctx.which("update-grub") or ctx.which("grub-mkconfig")):
        return "grub"
    if has_defaults and ctx.which("grub2-mkconfig"):
        return "grub2_mkconfig"
    if (os.path.isfile(ctx.path(KERNEL_CMDLINE_FILE)) or os.path.isdir(ctx.path(BLS_ENTRIES_DIR))
            or ctx.which("kernel-install") or ctx.which("bootctl")):
        return "kernel_cmdline_file"
    raise ModuleFailure("cannot tell how this host boots: no grubby, no /etc/default/grub with update-grub, "
                        "grub-mkconfig or grub2-mkconfig, no /etc/kernel/cmdline; set backend explicitly")


# ---------------------------------------------------------------------------------------------
# Applying a plan
# ---------------------------------------------------------------------------------------------

def execute(ctx, plan):
    """Write the files and the record, run the commands, verify; on any failure put every file back and fail."""
    txn = Transaction(ctx.module)
    try:
        for path in plan.backup_only:
            txn.backup(path)
        for path, _before, after in plan.files:
            if after is None:
                txn.remove(path)
            else:
                txn.write(path, after)
        if plan.record is not None:
            txn.write_record(ctx.root, RECORD_FILE, plan.record[0], plan.record[1])
    except (OSError, IOError, ModuleFailure) as exc:
        done, errors = txn.rollback()
        raise ModuleFailure("writing the boot configuration failed: %s; rolled back (%s)%s"
                            % (getattr(exc, "msg", exc), "; ".join(done) or "nothing to restore",
                               "; ROLLBACK ERRORS: " + "; ".join(errors) if errors else ""),
                            backup_files=txn.backups)
    for argv in plan.commands:
        rc, out, err = run(ctx, argv)
        if rc != 0:
            done, errors = txn.rollback()
            raise ModuleFailure(
                "%s. Rolled back the boot configuration: %s%s. The boot configuration is as it was before"
                % (command_failure(argv, rc, out, err), "; ".join(done) or "nothing to restore",
                   "; ROLLBACK ERRORS: " + "; ".join(errors) if errors else ""),
                rc=rc, stdout=out, stderr=err, cmd=argv, rolled_back=not errors, backup_files=txn.backups)
    if plan.verify:
        try:
            problem = plan.verify()
        except ModuleFailure as exc:
            problem = "reading the result back failed: %s" % exc.msg
        if problem:
            done, errors = txn.rollback()
            raise ModuleFailure("%s. Rolled back: %s%s" % (problem, "; ".join(done) or "nothing to restore",
                                                           "; ROLLBACK ERRORS: " + "; ".join(errors) if errors else ""),
                                rolled_back=not errors, backup_files=txn.backups)
    return txn.backups


def reboot_required(ctx, changed):
    running = read_proc_cmdline(ctx.root)
    if running is None:
        ctx.module.warn("cannot read /proc/cmdline; reboot_required only says whether the configuration changed")
        return changed
    return not ctx.satisfied(running)


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
    backups = []
    if changed and not module.check_mode:
        backups = execute(ctx, plan)
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
        match = [b for b in backups if b.startswith(path + ".")]
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
    run_module(build_module, ensure, HOST_ROOT)


if __name__ == "__main__":
    main()
