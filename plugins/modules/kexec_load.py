#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kexec_load
short_description: Load the kernel the boot loader boots next with kexec, for a reboot without firmware POST
version_added: 1.0.0
description:
  - Works out, without changing anything, the boot entry the boot loader boots next (its kernel, initramfs and
    command line, as the boot configuration now holds them), and loads it with C(kexec --load), so that
    C(systemctl kexec) starts it without going through the firmware. On GPU servers the firmware's POST takes
    minutes.
  - Never reboots. Use RV(loadable) to choose the reboot, for example C(systemctl kexec) as the
    C(reboot_command) of M(ansible.builtin.reboot) when it is true, a full reboot otherwise.
  - "When the entry cannot be loaded, the module does not fail: it returns O(state=loaded) with
    RV(loadable=false) and RV(reason), changing nothing, for the caller to fall back to a full reboot. That is
    the case when C(kexec) (kexec-tools) is not installed, when the kernel has no kexec
    (no C(/sys/kernel/kexec_loaded)), when the next entry cannot be worked out for sure, or when the kernel
    refuses the image: with Secure Boot the kernel refuses C(kexec_load) (C(Operation not permitted)); the
    module then tries once more with C(--kexec-file-syscall), which a signed kernel needs, and reports
    RV(loadable=false) when that fails as well."
  - "Backend V(grub) (Debian, Ubuntu) reads C(/boot/grub/grub.cfg) as C(grub-mkconfig) writes it. The entry
    booted next is the one C(set default) names: V(0), no default, the title or id of the first top-level
    menuentry, or C(${saved_entry}) (C(GRUB_DEFAULT=saved)) and C(${next_entry}) (C(grub-reboot)) looked up in
    C(/boot/grub/grubenv). Only the first top-level menuentry is loaded: any other default (another number, an
    entry of the C(Advanced options) submenu, a name that matches no entry) is not loadable. Its C(linux) (or
    C(linux16), C(linuxefi)) line gives the kernel and the arguments; its C(initrd) line the initramfs. A word of
    the C(linux) line that is only a grub variable (Ubuntu's C($vt_handoff)) has no value in C(grub.cfg): it is
    dropped, with a warning."
  - Backend V(grubby) (RHEL 8/9) runs C(grubby --info=DEFAULT) and takes C(kernel), C(root) and C(args) (the
    command line is C(root=<root>) followed by C(args)), and C(initrd).
  - "Backend V(bls) reads the Boot Loader Specification entries C(/boot/loader/entries/*.conf) (systemd-boot,
    C(kernel-install), grub with C(blscfg) without grubby): keys C(linux), C(initrd) and C(options). The entry
    booted next is, with a C(loader.conf) (systemd-boot; in C(/boot/loader), C(/efi/loader) or
    C(/boot/efi/loader)), the one the EFI variable C(LoaderEntryOneShot) or C(LoaderEntryDefault) names, else
    the C(default) glob of C(loader.conf); without one (grub), C(next_entry) or C(saved_entry) of the grubenv;
    when none is set, or several entries match the glob, the newest version."
  - Paths are relative to the partition the boot loader reads them from. A path such as C(/vmlinuz-6.1.0-18-amd64)
    (a separate C(/boot) partition) is looked for as it is, then under C(/boot); under C(/boot) first when C(/boot)
    is a mount point.
  - "The command line is the entry's arguments as they are. The C(BOOT_IMAGE=) argument the boot loader adds by
    itself is not part of the entry and is not added."
  - "The image is loaded only when it is not loaded already: the module keeps a record of what it loaded in
    C(/run/gpuops/kexec.json) (cleared at boot with C(/run)): kernel, initramfs and command line, the size and
    modification time of both files (a rebuilt initramfs is loaded again) and the boot id. An image counts as
    loaded when C(/sys/kernel/kexec_loaded) is C(1) and the record matches."
  - "When the entry is not loadable while a kexec image is loaded (an older one of this module, or anyone's),
    that image is unloaded (C(kexec --unload)), so that the full reboot of the caller does not start it (some
    systemd versions kexec on C(systemctl reboot) when an image is loaded): that is a change, and a warning
    says so."
  - V(unloaded) unloads a loaded image (C(kexec --unload), again with C(--kexec-file-syscall) when the kernel
    refuses C(kexec_load)) and removes the record.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  state:
    description:
      - V(loaded) loads the next boot entry with kexec, or reports why it cannot.
      - V(unloaded) unloads any loaded kexec image.
    type: str
    choices: [loaded, unloaded]
    default: loaded
  backend:
    description:
      - "Where the next boot entry is read from. V(auto) picks the boot configuration the way
        M(gpuops.sandbox.kernel_cmdline) does: V(grubby) when C(grubby) is installed, then V(grub) when
        C(/etc/default/grub) exists with C(update-grub) or C(grub-mkconfig), then V(bls) when it exists with
        C(grub2-mkconfig) (the BLS entries of grub's C(blscfg)), then V(bls) when C(/etc/kernel/cmdline),
        C(/boot/loader/entries), C(kernel-install) or C(bootctl) exists. When none fits, the entry is not
        loadable."
      - Not used with O(state=unloaded).
    type: str
    choices: [auto, grub, grubby, bls]
    default: auto
  command_timeout:
    description:
      - Seconds each command (C(grubby), C(kexec)) may run before it is stopped and counted as failed. Uses
        C(timeout) from coreutils when installed.
      - A whole number from V(1) to V(3600); booleans are refused.
    type: int
    default: 120
notes:
  - Root privileges are needed to load an image and to run C(grubby).
  - Only one initramfs file can be loaded; an entry with several (C(initrd) lines or files) is not loadable.
  - "Run it after the last change to the boot configuration and the initramfs (M(gpuops.sandbox.kernel_cmdline),
    M(gpuops.sandbox.kernel_modules)): it loads what is configured at that moment."
  - "A kexec boot skips the firmware: device firmware state (GPU, NIC) is not reset by a POST, and firmware
    settings changed for the next boot do not apply. Reboot through the firmware when those matter."
  - Only Linux hosts.
attributes:
  check_mode:
    support: full
    description: Works out the entry and reports what would be loaded or unloaded; runs no C(kexec) and writes no
      record (C(grubby --info) only reads, and runs).
  diff_mode:
    support: full
    description: Shows the loaded image (kernel, initramfs, command line) before and after.
  idempotent:
    support: full
    description: A second call loads nothing when the same kernel, initramfs and command line are loaded.
seealso:
  - module: gpuops.sandbox.kernel_cmdline
  - module: ansible.builtin.reboot
"""

EXAMPLES = r"""
- name: Load the next boot entry with kexec
  gpuops.sandbox.kexec_load:
  register: kexec

- name: Reboot, with kexec when the entry is loaded, through the firmware otherwise
  ansible.builtin.reboot:
    reboot_command: "{{ 'systemctl kexec' if kexec.loadable else omit }}"

- name: Say why a full reboot was needed
  ansible.builtin.debug:
    msg: "full reboot: {{ kexec.reason }}"
  when: not kexec.loadable

- name: Drop a loaded image (the next reboot goes through the firmware)
  gpuops.sandbox.kexec_load:
    state: unloaded
"""

RETURN = r"""
loadable:
  description: Whether the next boot entry is loaded (in check mode, could be loaded) with kexec.
  returned: with O(state=loaded)
  type: bool
  sample: true
reason:
  description: Why the entry cannot be loaded with kexec, in words.
  returned: when RV(loadable) is false
  type: str
  sample: "kexec is not installed (package kexec-tools)"
backend:
  description: The backend used, chosen or detected (null when none could be detected).
  returned: with O(state=loaded)
  type: str
  sample: grub
entry:
  description: The title of the boot entry booted next (null when it was not worked out).
  returned: with O(state=loaded)
  type: str
  sample: Debian GNU/Linux
kernel:
  description:
    - The kernel loaded (would be loaded) as a path on the host; with O(state=unloaded), the one unloaded when
      this module had loaded it. Null when not known.
  returned: success
  type: str
  sample: /boot/vmlinuz-6.1.0-18-amd64
initrd:
  description: The initramfs, as RV(kernel); null when the entry has none.
  returned: success
  type: str
  sample: /boot/initrd.img-6.1.0-18-amd64
cmdline:
  description: The kernel command line, as RV(kernel).
  returned: success
  type: str
  sample: root=UUID=0f8b6e1c-3a5d-4f2e-9c7b-1d2e3f4a5b6c ro quiet intel_iommu=on iommu=pt
msg:
  description: What was done, in words.
  returned: always
  type: str
  sample: loaded /boot/vmlinuz-6.1.0-18-amd64 with kexec; systemctl kexec boots it
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils import _kexec, _persist
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    check_timeout,
    create_module,
    run_module,
    run_timed,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path

# The filesystem root the module works on; unit tests point it at a fake tree.
ROOT = "/"

MAX_TIMEOUT = 3600
NOT_PERMITTED = "Operation not permitted"
UNKNOWN_IMAGE = "a kexec image this module did not load (unknown kernel)\n"


def failure(argv, rc, out, err):
    return "%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or out).strip()[-2000:] or "(no output)")


def detect_backend(module, root):
    """The backend kernel_cmdline would pick, mapped to the readers of this module; NotLoadable when none fits."""
    if module.get_bin_path("grubby"):
        return "grubby"
    has_defaults = os.path.isfile(host_path(root, "/etc/default/grub"))
    if has_defaults and (module.get_bin_path("update-grub") or module.get_bin_path("grub-mkconfig")):
        return "grub"
    if has_defaults and module.get_bin_path("grub2-mkconfig"):
        return "bls"
    if (os.path.isfile(host_path(root, "/etc/kernel/cmdline")) or os.path.isdir(host_path(root, _kexec.BLS_ENTRIES_DIR))
            or module.get_bin_path("kernel-install") or module.get_bin_path("bootctl")):
        return "bls"
    raise _kexec.NotLoadable("cannot tell how this host boots: no grubby, no /etc/default/grub with update-grub, "
                             "grub-mkconfig or grub2-mkconfig, no BLS entries; set backend")


def read_entry(module, root, backend, warnings):
    """The next boot entry of ``backend``; NotLoadable when it cannot be worked out for sure."""
    if backend == "grub":
        return _kexec.grub_entry(root, warnings)
    if backend == "grubby":
        grubby = module.get_bin_path("grubby")
        if not grubby:
            raise _kexec.NotLoadable("backend grubby: grubby is not installed")
        return _kexec.grubby_entry(root, lambda argv: run_timed(module, argv, module.params["command_timeout"]),
                                   grubby, warnings)
    return _kexec.bls_entry(root, warnings)


def kexec_run(module, argv):
    """Run a kexec command; on "Operation not permitted" (Secure Boot refuses kexec_load) run it once more with
    --kexec-file-syscall. Returns ``(file_syscall, None)`` on success, else ``(None, (attempts))`` where each
    attempt is ``(argv, rc, out, err)``; the second attempt is there only after a refusal."""
    timeout = module.params["command_timeout"]
    rc, out, err = run_timed(module, argv, timeout)
    if rc == 0:
        return False, None
    first = (argv, rc, out, err)
    if NOT_PERMITTED not in err + out:
        return None, (first,)
    retry = argv[:1] + ["--kexec-file-syscall"] + argv[1:]
    rc, out, err = run_timed(module, retry, timeout)
    if rc == 0:
        return True, None
    return None, (first, (retry, rc, out, err))


def load_argv(kexec, root, image):
    argv = [kexec, "--load", host_path(root, image["kernel"])]
    if image["initrd"]:
        argv.append("--initrd=" + host_path(root, image["initrd"]))
    argv.append("--command-line=" + image["cmdline"])
    return argv


def unload(module, root, kexec):
    """Unload the kexec image and the record; KexecError when kexec fails."""
    file_syscall, attempts = kexec_run(module, [kexec, "--unload"])
    if attempts:
        raise _kexec.KexecError("unloading the kexec image failed: %s" % "; then ".join(
            failure(*attempt) for attempt in attempts), cmd=attempts[-1][0], rc=attempts[-1][1],
            stderr=attempts[-1][3])
    _persist.remove_file(root, _kexec.MARKER)
    return file_syscall


def wanted_image(module, root, backend, warnings, info):
    """The image to load, as the record keeps it; fills ``info`` (entry, kernel, initrd, cmdline) as it goes."""
    entry = read_entry(module, root, backend, warnings)
    info.update(entry=entry.title, kernel=entry.kernel, cmdline=entry.cmdline,
                initrd=entry.initrds[0] if entry.initrds else None)
    if len(entry.initrds) > 1:
        raise _kexec.NotLoadable("the entry %s has %d initramfs files (%s); kexec loads one"
                                 % (_kexec.shown(entry.title), len(entry.initrds), " ".join(entry.initrds)))
    kernel = _kexec.resolve_boot_path(root, entry.kernel, "kernel")
    info["kernel"] = kernel
    initrd = _kexec.resolve_boot_path(root, entry.initrds[0], "initramfs") if entry.initrds else None
    info["initrd"] = initrd
    return {
        "kernel": kernel,
        "initrd": initrd,
        "cmdline": entry.cmdline,
        "kernel_file": _kexec.file_id(root, kernel),
        "initrd_file": _kexec.file_id(root, initrd) if initrd else None,
        "boot_id": _kexec.read_boot_id(root),
    }


def ensure_loaded(module, root, loaded, marker, before_text, warnings):
    params = module.params
    info = {"entry": None, "kernel": None, "initrd": None, "cmdline": None}
    backend = params["backend"]
    image = None
    reason = None
    kexec = module.get_bin_path("kexec")
    try:
        if backend == "auto":
            backend = detect_backend(module, root)
        image = wanted_image(module, root, backend, warnings, info)
        if not kexec:
            raise _kexec.NotLoadable("kexec is not installed (package kexec-tools)")
        if loaded is None:
            raise _kexec.NotLoadable("%s does not exist: the running kernel has no kexec" % _kexec.KEXEC_LOADED)
    except _kexec.NotLoadable as exc:
        reason = exc.msg
        backend = None if backend == "auto" else backend

    changed = False
    after_text = before_text
    notes = []
    if reason is None:
        if loaded and _kexec.same_image(marker, image):
            msg = "%s is already loaded with kexec" % image["kernel"]
        elif module.check_mode:
            changed = True
            after_text = _kexec.describe(image)
            msg = "would load %s with kexec" % image["kernel"]
        else:
            argv = load_argv(kexec, root, image)
            file_syscall, attempts = kexec_run(module, argv)
            if attempts and len(attempts) == 2:
                reason = ("the kernel refuses kexec_load (%s) and kexec_file_load as well (%s); with Secure Boot "
                          "only a kernel signed with a key the running kernel trusts can be loaded"
                          % (failure(*attempts[0]), failure(*attempts[1])))
            elif attempts:
                note = ""
                if loaded:
                    try:
                        note = "; " + drop_stale(module, root, kexec, warnings)
                    except _kexec.KexecError as exc:
                        note = "; " + exc.msg
                raise _kexec.KexecError(failure(*attempts[0]) + note, cmd=attempts[0][0], rc=attempts[0][1],
                                        stderr=attempts[0][3])
            else:
                if _kexec.read_loaded(root) is False:
                    raise _kexec.KexecError("%s reported success but %s is still 0" % (" ".join(argv),
                                                                                       _kexec.KEXEC_LOADED))
                try:
                    _persist.write_text(module, root, _kexec.MARKER,
                                        _kexec.render_marker(dict(image, file_syscall=file_syscall)))
                except _persist.PersistError as exc:
                    raise _kexec.KexecError("loaded %s with kexec, but %s; the next run loads it again"
                                            % (image["kernel"], exc.msg)) from exc
                changed = True
                after_text = _kexec.describe(image)
                msg = "loaded %s with kexec%s; systemctl kexec boots it" % (
                    image["kernel"], " (kexec_file_load: kexec_load is not permitted)" if file_syscall else "")
    if reason is not None:
        msg = "not loadable with kexec: %s; reboot through the firmware" % reason
        if loaded:
            changed = True
            after_text = ""
            if not kexec:
                changed = False
                after_text = before_text
                warnings.append("a kexec image is loaded and kexec is not installed to unload it; a reboot may "
                                "start that image instead of going through the firmware")
            elif module.check_mode:
                notes.append("would unload the kexec image loaded before")
            else:
                notes.append(drop_stale(module, root, kexec, warnings))
        msg += "".join("; " + note for note in notes)
    result = dict(info, changed=changed, loadable=reason is None, backend=backend, msg=msg)
    if reason is not None:
        result["reason"] = reason
    return result, after_text


def drop_stale(module, root, kexec, warnings):
    """Unload the image loaded before, so a full reboot does not start it; return what was done, in words."""
    try:
        unload(module, root, kexec)
    except _kexec.KexecError as exc:
        raise _kexec.KexecError("%s; a reboot may start the kexec image loaded before" % exc.msg) from exc
    warnings.append("unloaded the kexec image loaded before, so that a full reboot does not start it")
    return "unloaded the kexec image loaded before"


def ensure_unloaded(module, root, loaded, marker, before_text):
    known = marker or {}
    result = {"kernel": known.get("kernel"), "initrd": known.get("initrd"), "cmdline": known.get("cmdline")}
    if not loaded:
        if marker is not None and not module.check_mode:
            _persist.remove_file(root, _kexec.MARKER)  # a stale record: nothing is loaded
        return dict(kernel=None, initrd=None, cmdline=None, changed=False, msg="no kexec image is loaded"), before_text
    kexec = module.get_bin_path("kexec")
    if not kexec:
        raise _kexec.KexecError("a kexec image is loaded (%s is 1) but kexec is not installed to unload it"
                                % _kexec.KEXEC_LOADED)
    if module.check_mode:
        return dict(result, changed=True, msg="would unload the kexec image"), ""
    unload(module, root, kexec)
    return dict(result, changed=True, msg="unloaded the kexec image"), ""


def run(module, root):
    """The body of :func:`main` for ``run_module``: returns the result dict or raises, never exits."""
    params = module.params
    check_timeout(params["command_timeout"], 1, MAX_TIMEOUT, _kexec.KexecError, name="command_timeout")
    loaded = _kexec.read_loaded(root)
    marker = _kexec.read_marker(root)
    before_text = (_kexec.describe(marker) if marker else UNKNOWN_IMAGE) if loaded else ""
    warnings = []
    if params["state"] == "unloaded":
        result, after_text = ensure_unloaded(module, root, loaded, marker, before_text)
    else:
        result, after_text = ensure_loaded(module, root, loaded, marker, before_text, warnings)
    for warning in warnings:
        module.warn(warning)
    if module._diff:
        result["diff"] = {"before_header": "kexec image", "after_header": "kexec image",
                          "before": before_text, "after": after_text}
    return result


def build_module():
    return create_module(
        AnsibleModule,
        argument_spec={
            "state": dict(type="str", choices=["loaded", "unloaded"], default="loaded"),
            "backend": dict(type="str", choices=["auto", "grub", "grubby", "bls"], default="auto"),
            "command_timeout": dict(type="int", default=120),
        },
        supports_check_mode=True,
    )


def main():
    run_module(build_module, run, ROOT)


if __name__ == "__main__":
    main()
