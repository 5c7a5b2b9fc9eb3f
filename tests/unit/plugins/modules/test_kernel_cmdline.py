# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Unit tests for kernel_cmdline on fake trees under tmp_path.

Commands are real executables: small scripts written into a fake bin directory, so the module's
run_command path runs for real. ``AnsibleModule.get_bin_path`` is limited to that directory so the
test host's own update-grub or grubby is never found.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ansible_collections.gpuops.sandbox.plugins.module_utils import _persist
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import TIMEOUT_RC
from ansible_collections.gpuops.sandbox.plugins.modules import kernel_cmdline
from ansible_collections.gpuops.sandbox.tests.unit.fakes.command_host import CommandHost
from ansible_collections.gpuops.sandbox.tests.unit.fakes.grub_files import DEBIAN_GRUB
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import run_with_commands

UBUNTU_GRUB = (
    "GRUB_DEFAULT=0\nGRUB_TIMEOUT_STYLE=hidden\nGRUB_TIMEOUT=0\n"
    "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\nGRUB_CMDLINE_LINUX=""\n'
)
CLOUDIMG = (
    "# Cloud Image specific Grub settings for Generic Ubuntu Cloud Images\n"
    "# CLOUD_IMG: This file was created/modified by the Cloud Image build process\n\n"
    "# Set the recordfail timeout\nGRUB_RECORDFAIL_TIMEOUT=0\n\n"
    "# Do not wait on grub prompt\nGRUB_TIMEOUT=0\n\n"
    "# Set the default commandline\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0"\n\n'
    "# Set the grub console type\nGRUB_TERMINAL=console\n"
)
RHEL_GRUB = (
    'GRUB_TIMEOUT=5\nGRUB_DISTRIBUTOR="$(sed \'s, release .*$,,g\' /etc/system-release)"\n'
    'GRUB_DEFAULT=saved\nGRUB_DISABLE_SUBMENU=true\nGRUB_TERMINAL_OUTPUT="console"\n'
    'GRUB_CMDLINE_LINUX="crashkernel=1G-4G:192M,4G-64G:256M,64G-:512M resume=/dev/mapper/rhel-swap '
    'rd.lvm.lv=rhel/root intel_iommu=off rhgb quiet"\n'
    'GRUB_DISABLE_RECOVERY="true"\nGRUB_ENABLE_BLSCFG=true\n'
)
RHEL_OPTIONS = ("root=/dev/mapper/rhel-root ro crashkernel=1G-4G:192M,4G-64G:256M,64G-:512M "
                "resume=/dev/mapper/rhel-swap rd.lvm.lv=rhel/root intel_iommu=off rhgb quiet")

# Debian's grub-mkconfig sources /etc/default/grub then /etc/default/grub.d/*.cfg; so does this fake.
GENERATE = r"""
if [ -f "$ROOT/etc/default/grub" ]; then . "$ROOT/etc/default/grub"; fi
for x in "$ROOT"/etc/default/grub.d/*.cfg; do if [ -e "$x" ]; then . "$x"; fi; done
mkdir -p "$(dirname "$OUT")"
printf 'menuentry "Debian GNU/Linux" {\n\tlinux /boot/vmlinuz-6.1.0-18-amd64 root=UUID=1234 ro %s %s\n}\n' \
  "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT" > "$OUT.new"
mv "$OUT.new" "$OUT"
"""

FAKE_GRUBBY = r'''#!{python}
import glob, os, sys
ROOT = {root!r}
with open(os.path.join(ROOT, "calls.log"), "a") as log:
    log.write("grubby " + " ".join(sys.argv[1:]) + "\n")
entries = sorted(glob.glob(os.path.join(ROOT, "boot/loader/entries/*.conf")))


def load(path):
    with open(path) as handle:
        return handle.read().splitlines()


def options(lines):
    for line in lines:
        if line.startswith("options "):
            return line[len("options "):].split()
    return []


argv = sys.argv[1:]
if argv == ["--info=ALL"]:
    for idx, path in enumerate(entries):
        lines = load(path)
        kernel = [l.split()[1] for l in lines if l.startswith("linux ")][0]
        print("index=%d" % idx)
        print('kernel="/boot%s"' % kernel)
        print('args="%s"' % " ".join(t for t in options(lines) if not t.startswith("root=")))
        print('root="/dev/mapper/rhel-root"')
        print('title="Red Hat Enterprise Linux"')
    sys.exit(0)
if os.path.exists(os.path.join(ROOT, "grubby-fail")):
    sys.stderr.write("grubby: error writing /boot/loader/entries: No space left on device\n")
    sys.exit(1)
add, remove = [], []
for arg in argv:
    if arg.startswith("--args="):
        add = arg[len("--args="):].split()
    elif arg.startswith("--remove-args="):
        remove = arg[len("--remove-args="):].split()
    elif arg != "--update-kernel=ALL":
        sys.stderr.write("grubby: unknown option " + arg + "\n")
        sys.exit(2)
for path in entries:
    lines = load(path)
    opts = options(lines)
    for r in remove:
        opts = [t for t in opts if (t != r if "=" in r else t.split("=")[0] != r)]
    for a in add:
        same = [i for i, t in enumerate(opts) if t.split("=")[0] == a.split("=")[0]]
        if same:
            opts[same[0]] = a
        else:
            opts.append(a)
    lines = [("options " + " ".join(opts)) if l.startswith("options ") else l for l in lines]
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
'''

FAKE_GRUB2_MKCONFIG = r"""#!/bin/sh
ROOT='{root}'
echo "grub2-mkconfig $*" >> "$ROOT/calls.log"
. "$ROOT/etc/default/grub"
for f in "$ROOT"/boot/loader/entries/*.conf; do
  sed -i "s|^options .*|options root=/dev/mapper/rhel-root ro $GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT|" "$f"
done
"""


class Host(CommandHost):
    """A fake host: a root tree, a bin directory of fake commands, and a log of the commands run."""

    def calls(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as handle:
            return handle.read().splitlines()

    def snapshot(self):
        """Every file under the root (but the call log) with its bytes."""
        result = {}
        for top, _dirs, files in os.walk(self.root):
            for name in files:
                full = os.path.join(top, name)
                if full != self.log:
                    with open(full, "rb") as handle:
                        result[os.path.relpath(full, self.root)] = handle.read()
        return result

    # --- fake commands ---------------------------------------------------------------------------
    def update_grub(self, fail=False):
        body = "#!/bin/sh\nROOT='%s'\nOUT=\"$ROOT/boot/grub/grub.cfg\"\necho \"update-grub $*\" >> \"$ROOT/calls.log\"\n" % self.root
        if fail:
            body += ("echo 'Generating grub configuration file ...'\n"
                     "echo '/usr/sbin/grub-probe: error: failed to get canonical path of /dev/root.' >&2\nexit 1\n")
        else:
            body += GENERATE
        return self.script("update-grub", body)

    def grub_mkconfig(self, debian=True):
        body = "#!/bin/sh\nROOT='%s'\necho \"grub-mkconfig $*\" >> \"$ROOT/calls.log\"\n" % self.root
        body += 'OUT="$2"\n' + (GENERATE if debian else "echo upstream > \"$OUT\"\n")
        if not debian:
            body = body.replace("grub.d", "grub-d")
        return self.script("grub-mkconfig", body)

    def grubby(self):
        return self.script("grubby", FAKE_GRUBBY.format(python=sys.executable, root=self.root))

    def grub2_mkconfig(self):
        return self.script("grub2-mkconfig", FAKE_GRUB2_MKCONFIG.format(root=self.root))

    def grub_cfg(self):
        return self.read("/boot/grub/grub.cfg")


def debian_host(base, proc="BOOT_IMAGE=/boot/vmlinuz-6.1.0-18-amd64 root=UUID=1234 ro console=ttyS0,115200 "
                           "intel_iommu=off"):
    host = Host(base)
    host.write("/etc/default/grub", DEBIAN_GRUB)
    host.write("/proc/cmdline", proc + "\n")
    host.update_grub()
    host.grub_mkconfig()
    return host


def rhel_host(base, with_grubby=True):
    host = Host(base)
    host.write("/etc/default/grub", RHEL_GRUB)
    host.write("/proc/cmdline", "BOOT_IMAGE=(hd0,gpt2)/vmlinuz-5.14.0-427.el9.x86_64 " + RHEL_OPTIONS + "\n")
    for version in ("5.14.0-427.el9.x86_64", "5.14.0-362.el9.x86_64"):
        host.write("/boot/loader/entries/abc-%s.conf" % version,
                   "title Red Hat Enterprise Linux (%s)\nversion %s\nlinux /vmlinuz-%s\n"
                   "initrd /initramfs-%s.img\noptions %s\ngrub_users $grub_users\n"
                   % (version, version, version, version, RHEL_OPTIONS))
    host.write("/boot/grub2/grubenv", "# GRUB Environment Block\nsaved_entry=abc\n" + "#" * 900)
    if with_grubby:
        host.grubby()
    else:
        host.grub2_mkconfig()
    return host


def run(host, check=False, diff=False, **params):
    return run_with_commands(kernel_cmdline, host, params, check=check, diff=diff)


def refused(host, fragments, **params):
    """Run the module; it fails with every one of ``fragments`` in its message and the host is left as it was
    (refused, or rolled back)."""
    snap = host.snapshot()
    result = run(host, **params)
    assert result["failed"] is True
    assert all(fragment in result["msg"] for fragment in fragments), result["msg"]
    assert host.snapshot() == snap
    return result


DROPIN = "/etc/default/grub.d/99-gpuops-sandbox.cfg"
IOMMU = ["intel_iommu=on", "iommu=pt"]
BACKUPS = "/var/lib/gpuops/backups"
KEPT = 3  # the backups of each file the module keeps, as documented


def backup_prefix(host, path):
    """The start of the path of every backup of ``path`` on ``host``."""
    return host.path(BACKUPS) + "/" + path.lstrip("/").replace("/", "%2F") + "."


def backups_of(host, path):
    """The backups of ``path`` left on ``host``, oldest first."""
    directory = host.path(BACKUPS)
    if not os.path.isdir(directory):
        return []
    prefix = backup_prefix(host, path)
    return [p for p in sorted(os.path.join(directory, n) for n in os.listdir(directory))
            if p.startswith(prefix) and "%2F" not in p[len(prefix):]]


# --- grub (Debian / Ubuntu) ---------------------------------------------------------------------

def test_debian_conflict_replaced_and_grub_cfg_regenerated(tmp_path):
    host = debian_host(tmp_path)
    before = host.read("/etc/default/grub")
    result = run(host, arguments=IOMMU)
    assert not result.get("failed"), result
    assert result["changed"] is True
    assert result["backend"] == "grub"
    assert result["reboot_required"] is True
    assert result["cmdline_args"] == ["iommu=pt", "console=ttyS0,115200", "intel_iommu=on"]
    dropin = host.read(DROPIN)
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in dropin  # added to the files' value, not a copy of it
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0,115200 intel_iommu=on"' in dropin
    assert stat.S_IMODE(os.stat(host.path(DROPIN)).st_mode) == 0o644
    assert host.read("/etc/default/grub") == before
    cfg = host.grub_cfg()
    assert "intel_iommu=on" in cfg and "iommu=pt" in cfg
    assert "intel_iommu=off" not in cfg
    assert "console=ttyS0,115200" in cfg
    assert host.calls() == ["update-grub "]
    assert "backup_file" not in result  # the drop-in is new: nothing to back up

    again = run(host, arguments=IOMMU)
    assert again["changed"] is False
    assert again["reboot_required"] is True  # the running kernel still has intel_iommu=off
    assert host.calls() == ["update-grub "]


def test_debian_check_mode_then_real_then_idempotent(tmp_path):
    host = debian_host(tmp_path)
    snap = host.snapshot()
    check = run(host, check=True, diff=True, arguments=IOMMU)
    assert check["changed"] is True
    assert host.snapshot() == snap
    assert host.calls() == []
    assert "would change" in check["msg"]
    file_diff = check["diff"][0]
    assert file_diff["before_header"] == DROPIN
    assert file_diff["before"] == ""
    assert "intel_iommu=on" in file_diff["after"]
    effective = check["diff"][1]
    assert "intel_iommu=off" in effective["before"] and "intel_iommu=on" in effective["after"]

    assert run(host, arguments=IOMMU)["changed"] is True
    after = host.snapshot()
    check2 = run(host, check=True, arguments=IOMMU)
    assert check2["changed"] is False
    assert run(host, arguments=IOMMU)["changed"] is False
    assert host.snapshot() == after


def test_reboot_not_required_when_running_kernel_has_args(tmp_path):
    host = debian_host(tmp_path, proc="BOOT_IMAGE=/vmlinuz root=UUID=1 ro iommu=pt intel_iommu=on")
    result = run(host, arguments=IOMMU)
    assert result["changed"] is True
    assert result["reboot_required"] is False
    assert "reboot required" not in result["msg"]


def test_missing_proc_cmdline_warns(tmp_path):
    host = debian_host(tmp_path)
    os.unlink(host.path("/proc/cmdline"))
    result = run(host, arguments=IOMMU)
    assert result["reboot_required"] is True
    assert any("/proc/cmdline" in w for w in result.get("warnings", []))


def test_ubuntu_cloudimg_dropin_is_accounted_for(tmp_path):
    host = Host(tmp_path)
    host.write("/etc/default/grub", UBUNTU_GRUB)
    host.write("/etc/default/grub.d/50-cloudimg-settings.cfg", CLOUDIMG)
    host.write("/etc/default/grub.d/40-force-partuuid.cfg", "GRUB_FORCE_PARTUUID=1234-abcd\n")
    host.write("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=PARTUUID=1234 ro console=tty1 console=ttyS0\n")
    host.update_grub()
    result = run(host, arguments=["iommu=pt"])
    assert result["changed"] is True
    dropin = host.read(DROPIN)
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in dropin  # added to the files' value, not a copy of it
    assert "GRUB_CMDLINE_LINUX_DEFAULT" not in dropin  # not changed, so not in the drop-in
    assert "console=tty1 console=ttyS0" in host.grub_cfg()
    assert "quiet splash" not in host.grub_cfg()  # the cloudimg drop-in wins, as on a real host

    # A second console, without replacing the first
    result = run(host, arguments=["console=ttyS1,115200"], replace_values=False)
    assert result["changed"] is True
    assert "console=tty1 console=ttyS0 console=ttyS1,115200" in host.grub_cfg()
    # Only one value removed: taken out of the cloudimg file where it is written (backed up, the owner told), so
    # the drop-in still only adds to that file's value
    result = run(host, arguments=["console=tty1"], state="absent")
    assert result["changed"] is True
    assert result["backup_file"].startswith(backup_prefix(host, "/etc/default/grub.d/50-cloudimg-settings.cfg"))
    with open(result["backup_file"]) as handle:
        assert handle.read() == CLOUDIMG
    assert host.read("/etc/default/grub.d/50-cloudimg-settings.cfg") == CLOUDIMG.replace("console=tty1 ", "")
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} console=ttyS1,115200"' in host.read(DROPIN)
    assert any("took console=tty1 (GRUB_CMDLINE_LINUX_DEFAULT) out of /etc/default/grub.d/50-cloudimg-settings.cfg"
               in w for w in result["warnings"]), result["warnings"]
    cfg = host.grub_cfg()
    assert "console=tty1 " not in cfg and "console=ttyS0 console=ttyS1,115200" in cfg
    assert result["reboot_required"] is True


def test_absent_by_key_removes_every_value_and_dropin_goes_when_back_to_base(tmp_path):
    host = debian_host(tmp_path)
    assert run(host, arguments=["iommu=pt"])["changed"] is True
    assert host.exists(DROPIN)
    result = run(host, arguments=["iommu"], state="absent")
    assert result["changed"] is True
    assert not host.exists(DROPIN)  # back to what /etc/default/grub says: nothing to pin
    assert result["backup_file"].startswith(backup_prefix(host, DROPIN))
    assert "iommu=pt" not in host.grub_cfg()

    result = run(host, arguments=["intel_iommu"], state="absent")
    assert result["changed"] is True
    assert result["reboot_required"] is True
    assert "intel_iommu" not in host.grub_cfg()
    assert "console=ttyS0,115200" in host.grub_cfg()
    # the owner's intel_iommu=off is taken out where it is written, so no drop-in is needed to keep it off
    assert host.read("/etc/default/grub") == DEBIAN_GRUB.replace(" intel_iommu=off", "")
    assert not host.exists(DROPIN)
    # absent KEY=VALUE with another value present changes nothing
    host.write("/etc/default/grub", DEBIAN_GRUB)
    assert run(host, arguments=["intel_iommu=on"], state="absent")["changed"] is False


def test_unrelated_args_keep_order(tmp_path):
    host = debian_host(tmp_path)
    host.write("/etc/default/grub", DEBIAN_GRUB.replace(
        'GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="b=1 a intel_iommu=off z=9 intel_iommu=off"'))
    result = run(host, arguments=["intel_iommu=on", "new=1"])
    assert result["cmdline_args"] == ["b=1", "a", "intel_iommu=on", "z=9", "new=1", "console=ttyS0,115200"]


@pytest.mark.parametrize("bad", ["foo=$(id)", "a b", 'x="y"', "x='y'", "a=1;reboot", "a=`id`", "a=b\\c",
                                 "a=b\nc", "", True, None, 3, "iommu=", "iommu=pt\n", "quiet\n", "a=b\x00",
                                 "a=\x1b[1m", "a\tb", "iommu=p\u00e9"])
def test_unsafe_args_rejected_nothing_changed(tmp_path, bad):
    host = debian_host(tmp_path)
    snap = host.snapshot()
    result = run(host, arguments=["iommu=pt", bad])
    assert result["failed"] is True
    assert repr(bad) in result["msg"]
    assert host.snapshot() == snap
    assert host.calls() == []
    assert "Traceback" not in result["msg"]


@pytest.mark.parametrize("backend", ["grub", "kernel_cmdline_file", "auto"])
@pytest.mark.parametrize("bad", ["iommu=pt\n", "quiet\n", "iommu=pt\r\n", "intel_iommu=on\x0b"])
def test_trailing_newline_refused_by_every_backend(tmp_path, backend, bad):
    """A trailing newline passed ``re.match(...$)``: the file backend wrote it into /etc/kernel/cmdline and then
    reported a change on every run; the grub backend refused it with an unrelated reason."""
    host = debian_host(tmp_path)
    host.write("/etc/kernel/cmdline", "root=UUID=1 ro\n")
    snap = host.snapshot()
    result = run(host, arguments=[bad], backend=backend)
    assert result["failed"] is True and result["changed"] is False
    assert "kernel argument %r" % bad in result["msg"]
    assert "control and invisible characters" in result["msg"] and "accepted: a string KEY or KEY=VALUE" in result["msg"]
    assert host.snapshot() == snap
    assert host.calls() == []


def test_contradicting_request_rejected(tmp_path):
    host = debian_host(tmp_path)
    refused(host, ["'intel_iommu=on'", "'intel_iommu=off'"], arguments=["intel_iommu=on", "intel_iommu=off"])


def test_empty_list_rejected(tmp_path):
    host = debian_host(tmp_path)
    result = run(host, arguments=[])
    assert result["failed"] is True and "non-empty" in result["msg"]


def test_update_grub_failure_rolls_back_existing_dropin(tmp_path):
    host = debian_host(tmp_path)
    assert run(host, arguments=["iommu=pt"])["changed"] is True
    good_dropin = host.read(DROPIN)
    good_cfg = host.grub_cfg()
    host.update_grub(fail=True)
    result = run(host, arguments=["intel_iommu=on"])
    assert result["failed"] is True
    assert result["changed"] is False
    assert "rc=1" in result["msg"]
    assert "failed to get canonical path" in result["msg"]
    assert "Generating grub configuration file" in result["msg"]
    assert "Rolled back" in result["msg"] and "restored %s" % host.path(DROPIN) in result["msg"]
    assert result["rolled_back"] is True
    assert result["rc"] == 1
    assert host.read(DROPIN) == good_dropin
    assert host.grub_cfg() == good_cfg
    assert len(result["backup_files"]) == 1 and os.path.exists(result["backup_files"][0])


# --- backups: in the collection's state directory, the newest few of each file (issue 26, item 9) -------------

def test_backup_goes_to_the_state_directory_not_next_to_the_file(tmp_path):
    host = debian_host(tmp_path)
    assert run(host, arguments=["iommu=pt"])["changed"] is True
    before = host.read(DROPIN)
    result = run(host, arguments=["intel_iommu=on"])
    assert result["changed"] is True, result
    # grub-mkconfig reads /etc/default/grub.d: only the drop-in is there, no backup beside it
    assert os.listdir(host.path("/etc/default/grub.d")) == ["99-gpuops-sandbox.cfg"]
    assert sorted(os.listdir(host.path("/etc/default"))) == ["grub", "grub.d"]
    assert backups_of(host, DROPIN) == [result["backup_file"]]
    assert result["backup_files"] == [result["backup_file"]]
    with open(result["backup_file"]) as handle:
        assert handle.read() == before


def test_only_the_newest_backups_of_a_file_are_kept(tmp_path):
    host = debian_host(tmp_path)
    assert run(host, arguments=["iommu=pt"])["changed"] is True
    made = []
    for count in range(1, 6):
        before = host.read(DROPIN)
        result = run(host, arguments=["hugepages=%d" % count])
        assert result["changed"] is True, result
        made.append((result["backup_file"], before))
    kept = made[-KEPT:]
    assert backups_of(host, DROPIN) == [backup for backup, _text in kept]
    for backup, text in kept:
        with open(backup) as handle:
            assert handle.read() == text
    assert os.listdir(host.path("/etc/default/grub.d")) == ["99-gpuops-sandbox.cfg"]


def test_a_failed_update_grub_restores_the_dropin_from_the_state_directory(tmp_path):
    host = debian_host(tmp_path)
    for count in range(1, 5):
        assert run(host, arguments=["hugepages=%d" % count])["changed"] is True
    good = host.read(DROPIN)
    good_cfg = host.grub_cfg()
    host.update_grub(fail=True)
    result = run(host, arguments=["intel_iommu=on"])
    assert result["failed"] is True and result["rolled_back"] is True, result
    backup = result["backup_files"][0]
    assert backup.startswith(backup_prefix(host, DROPIN))
    assert "restored %s from %s" % (host.path(DROPIN), backup) in result["msg"]
    assert host.read(DROPIN) == good and host.grub_cfg() == good_cfg
    left = backups_of(host, DROPIN)
    assert len(left) == KEPT and left[-1] == backup
    assert os.listdir(host.path("/etc/default/grub.d")) == ["99-gpuops-sandbox.cfg"]


def test_grub_mkconfig_used_when_update_grub_missing(tmp_path):
    host = debian_host(tmp_path)
    os.unlink(os.path.join(host.bin, "update-grub"))
    result = run(host, arguments=IOMMU)
    assert result["changed"] is True
    assert host.calls() == ["grub-mkconfig -o %s" % host.path("/boot/grub/grub.cfg")]
    assert "intel_iommu=on" in host.grub_cfg()


def test_grub_mkconfig_without_dropin_support_refused(tmp_path):
    host = debian_host(tmp_path)
    host.grub_mkconfig(debian=False)
    refused(host, ["does not read /etc/default/grub.d"], arguments=IOMMU, backend="grub")


def test_later_dropin_overriding_is_refused(tmp_path):
    host = debian_host(tmp_path)
    host.write("/etc/default/grub.d/99-zz-local.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=off"\n')
    refused(host, ["99-zz-local.cfg", "nothing changed"], arguments=IOMMU)


def test_unevaluable_grub_defaults_refused(tmp_path):
    host = debian_host(tmp_path)
    host.write("/etc/default/grub.d/10-dyn.cfg", 'GRUB_CMDLINE_LINUX="$(cat /etc/extra-args)"\n')
    refused(host, ["10-dyn.cfg", "command substitution"], arguments=IOMMU)


def test_timeout_stops_a_hanging_command(tmp_path):
    host = debian_host(tmp_path)
    host.script("update-grub", "#!/bin/sh\nsleep 30\n")
    result = run(host, arguments=IOMMU, command_timeout=1)
    assert result["failed"] is True
    assert "within 1 seconds" in result["msg"] and "Rolled back" in result["msg"]
    assert not host.exists(DROPIN)


def test_negative_timeout_rejected(tmp_path):
    host = debian_host(tmp_path)
    result = run(host, arguments=IOMMU, command_timeout=-1)
    assert result["failed"] is True and "command_timeout" in result["msg"]


@pytest.mark.parametrize("timeout, fragment", [
    (-1, "got -1"), (86401, "got 86401"), (True, "got True"), ("1e400", "0 to 86400"), ("9" * 40, "0 to 86400"),
    ("inf", "'inf'"), ("-Infinity", "'-Infinity'"), ("nan", "'nan'"), (float("inf"), "inf"), (2.5, "2.5"),
])
def test_bad_timeout_rejected_before_anything_changes(tmp_path, timeout, fragment):
    host = debian_host(tmp_path)
    snap = host.snapshot()
    result = run(host, arguments=IOMMU, command_timeout=timeout)
    assert result["failed"] is True and result.get("changed", False) is False
    assert "command_timeout" in result["msg"] and fragment in result["msg"], result["msg"]
    assert host.snapshot() == snap
    assert host.calls() == []


def test_timeout_rc_comes_from_the_shared_constant(tmp_path):
    host = debian_host(tmp_path)
    host.script("update-grub", "#!/bin/sh\nexit %d\n" % TIMEOUT_RC)
    result = run(host, arguments=IOMMU, command_timeout=5)
    assert result["failed"] is True and result["rc"] == 124
    assert "did not finish within 5 seconds" in result["msg"] and "Rolled back" in result["msg"]
    host.script("update-grub", "#!/bin/sh\nexit 137\n")  # killed with SIGKILL after --kill-after
    result = run(host, arguments=IOMMU, command_timeout=5)
    assert "did not finish within 5 seconds" in result["msg"]
    host.script("update-grub", "#!/bin/sh\nexit 1\n")
    result = run(host, arguments=IOMMU, command_timeout=5)
    assert result["rc"] == 1 and "did not finish" not in result["msg"]


def test_bad_option_values_rejected_by_spec(tmp_path):
    host = debian_host(tmp_path)
    assert run(host, arguments=IOMMU, state="enabled")["failed"] is True
    assert run(host, arguments=IOMMU, backend="lilo")["failed"] is True
    assert run(host)["failed"] is True


# --- grubby / grub2-mkconfig (RHEL) -------------------------------------------------------------

def entries_options(host):
    result = []
    for name in sorted(os.listdir(host.path("/boot/loader/entries"))):
        if name.endswith(".conf"):
            for line in host.read("/boot/loader/entries/" + name).splitlines():
                if line.startswith("options "):
                    result.append(line[len("options "):])
    return result


def test_grubby_replaces_conflict_and_syncs_default_grub(tmp_path):
    host = rhel_host(tmp_path)
    result = run(host, diff=True, arguments=IOMMU)
    assert not result.get("failed"), result
    assert result["backend"] == "grubby"
    assert result["changed"] is True
    assert result["reboot_required"] is True
    for options in entries_options(host):
        assert "intel_iommu=on" in options.split() and "iommu=pt" in options.split()
        assert "intel_iommu=off" not in options
    assert host.calls() == ["grubby --info=ALL", "grubby --update-kernel=ALL --remove-args=intel_iommu=off",
                            "grubby --update-kernel=ALL --args=intel_iommu=on iommu=pt", "grubby --info=ALL"]
    grub = host.read("/etc/default/grub")
    assert ('GRUB_CMDLINE_LINUX="crashkernel=1G-4G:192M,4G-64G:256M,64G-:512M resume=/dev/mapper/rhel-swap '
            'rd.lvm.lv=rhel/root intel_iommu=on rhgb quiet iommu=pt"') in grub
    assert grub.replace(grub.splitlines()[5], "") == RHEL_GRUB.replace(RHEL_GRUB.splitlines()[5], "")
    assert result["backup_file"].startswith(backup_prefix(host, "/etc/default/grub"))
    with open(result["backup_file"]) as handle:
        assert handle.read() == RHEL_GRUB
    assert len(result["backup_files"]) == 4  # /etc/default/grub, 2 entries, grubenv
    assert len(result["entries"]) == 2
    assert any(d["before_header"] == "grubby --info=ALL" for d in result["diff"])

    calls = len(host.calls())
    again = run(host, arguments=IOMMU)
    assert again["changed"] is False
    assert host.calls()[calls:] == ["grubby --info=ALL"]


def test_grubby_check_mode_changes_nothing(tmp_path):
    host = rhel_host(tmp_path)
    snap = host.snapshot()
    result = run(host, check=True, arguments=IOMMU)
    assert result["changed"] is True
    assert host.snapshot() == snap
    assert host.calls() == ["grubby --info=ALL"]
    assert "intel_iommu=on" in result["cmdline"]


def test_grubby_failure_restores_default_grub(tmp_path):
    host = rhel_host(tmp_path)
    host.write("/grubby-fail", "")
    snap = host.snapshot()
    result = run(host, arguments=IOMMU)
    assert result["failed"] is True
    assert "No space left on device" in result["msg"] and "rc=1" in result["msg"]
    assert "Rolled back" in result["msg"]
    now = host.snapshot()
    backups = [k for k in now if k not in snap]
    assert backups and all(k.startswith(BACKUPS.lstrip("/") + "/") for k in backups)
    assert {k: v for k, v in now.items() if k in snap} == snap


def test_grubby_absent(tmp_path):
    host = rhel_host(tmp_path)
    result = run(host, arguments=["rhgb", "quiet", "intel_iommu"], state="absent")
    assert result["changed"] is True
    for options in entries_options(host):
        assert options == ("root=/dev/mapper/rhel-root ro crashkernel=1G-4G:192M,4G-64G:256M,64G-:512M "
                           "resume=/dev/mapper/rhel-swap rd.lvm.lv=rhel/root")
    assert 'rd.lvm.lv=rhel/root"' in host.read("/etc/default/grub")


def test_grub2_mkconfig_backend(tmp_path):
    host = rhel_host(tmp_path, with_grubby=False)
    result = run(host, arguments=IOMMU)
    assert not result.get("failed"), result
    assert result["backend"] == "grub2_mkconfig"
    assert result["changed"] is True
    assert host.calls() == ["grub2-mkconfig -o %s --update-bls-cmdline" % host.path("/boot/grub2/grub.cfg")]
    for options in entries_options(host):
        assert "intel_iommu=on" in options and "iommu=pt" in options and "intel_iommu=off" not in options
    assert run(host, arguments=IOMMU)["changed"] is False


# --- /etc/kernel/cmdline (systemd-boot) ---------------------------------------------------------

def test_kernel_cmdline_file(tmp_path):
    host = Host(tmp_path)
    host.write("/etc/kernel/cmdline", "root=UUID=1 rw quiet intel_iommu=off\n")
    host.write("/proc/cmdline", "initrd=\\initrd root=UUID=1 rw quiet intel_iommu=off\n")
    result = run(host, diff=True, arguments=IOMMU)
    assert result["backend"] == "kernel_cmdline_file"
    assert result["changed"] is True
    assert host.read("/etc/kernel/cmdline") == "root=UUID=1 rw quiet intel_iommu=on iommu=pt\n"
    assert result["reboot_required"] is True
    assert "kernel-install" in result["msg"]
    with open(result["backup_file"]) as handle:
        assert handle.read() == "root=UUID=1 rw quiet intel_iommu=off\n"
    assert result["diff"][0]["after"] == "root=UUID=1 rw quiet intel_iommu=on iommu=pt\n"
    assert run(host, arguments=IOMMU)["changed"] is False


def test_kernel_cmdline_file_created_from_proc(tmp_path):
    host = Host(tmp_path)
    host.write("/proc/cmdline", "initrd=\\initrd BOOT_IMAGE=x root=UUID=1 rw\n")
    host.script("kernel-install", "#!/bin/sh\nexit 0\n")
    check = run(host, check=True, arguments=["iommu=pt"])
    assert check["changed"] is True and not host.exists("/etc/kernel/cmdline")
    result = run(host, arguments=["iommu=pt"])
    assert result["changed"] is True
    assert host.read("/etc/kernel/cmdline") == "root=UUID=1 rw iommu=pt\n"
    assert "backup_file" not in result


# Debian's systemd-boot as a lab host showed it (2026-11-28): kernel-install's 90-loaderentry writes the entry on the
# ESP from /etc/kernel/cmdline, under the entry token "debian", with the kernel and its initramfs copied beside it.
FAKE_KERNEL_INSTALL = r"""#!/bin/sh
ROOT='{root}'
echo "kernel-install $*" >> "$ROOT/calls.log"
[ "$1" = add ] || exit 1
[ -n '{fail}' ] && {{ echo "kernel-install: {fail}" >&2; exit 1; }}
mkdir -p "$ROOT/boot/efi/debian/$2"
printf 'title      Debian GNU/Linux 12 (bookworm)\nversion    %s\noptions    %s\nlinux      /debian/%s/linux\n' \
  "$2" "$(cat "$ROOT/etc/kernel/cmdline")" "$2" > "$ROOT/boot/efi/loader/entries/debian-$2.conf"
"""
ESP_KERNELS = ("6.1.0-50-amd64", "6.1.0-56-amd64")


def systemd_boot_host(base, fail=""):
    """Debian booting through systemd-boot: /etc/kernel/cmdline, two kernels, each with its entry on the ESP."""
    host = Host(base)
    host.write("/etc/kernel/cmdline", "root=LABEL=r ro intel_iommu=off\n")
    host.write("/proc/cmdline", "initrd=\\debian\\6.1.0-50-amd64\\initrd.img root=LABEL=r ro intel_iommu=off\n")
    host.write("/boot/efi/loader/entries/.keep", "")
    host.script("kernel-install", FAKE_KERNEL_INSTALL.format(root=host.root, fail=""))
    for version in ESP_KERNELS:
        host.write("/lib/modules/%s/modules.dep" % version, "")
        host.write("/boot/vmlinuz-%s" % version, "kernel")
        subprocess.run([os.path.join(host.bin, "kernel-install"),
                        "add", version, host.path("/boot/vmlinuz-%s" % version)], check=True)
    os.unlink(host.log)
    if fail:
        host.script("kernel-install", FAKE_KERNEL_INSTALL.format(root=host.root, fail=fail))
    return host


def esp_options(host):
    return [host.read("/boot/efi/loader/entries/debian-%s.conf" % v).split("options    ")[1].split("\n")[0]
            for v in ESP_KERNELS]


def test_kernel_cmdline_file_writes_every_installed_kernels_entry_again(tmp_path):
    host = systemd_boot_host(tmp_path)
    check = run(host, check=True, arguments=IOMMU)
    assert check["changed"] is True and host.calls() == [] and esp_options(host) == ["root=LABEL=r ro intel_iommu=off"] * 2
    result = run(host, arguments=IOMMU)
    assert result["backend"] == "kernel_cmdline_file" and result["changed"] is True
    assert host.calls() == ["kernel-install add %s %s" % (v, host.path("/boot/vmlinuz-%s" % v)) for v in ESP_KERNELS]
    assert esp_options(host) == ["root=LABEL=r ro intel_iommu=on iommu=pt"] * 2
    again = run(host, arguments=IOMMU)
    assert again["changed"] is False and len(host.calls()) == 2


def test_an_entry_left_without_the_request_is_written_again(tmp_path):
    """The file is right but an entry is not (written before the file changed, by hand, by an older run)."""
    host = systemd_boot_host(tmp_path)
    host.write("/etc/kernel/cmdline", "root=LABEL=r ro intel_iommu=on iommu=pt\n")
    entry = "/boot/efi/loader/entries/debian-6.1.0-56-amd64.conf"
    host.write(entry, host.read(entry).replace("intel_iommu=off", "intel_iommu=on iommu=pt"))
    result = run(host, arguments=IOMMU)
    assert result["changed"] is True and "the boot entry of 6.1.0-50-amd64" in result["msg"]
    assert host.calls() == ["kernel-install add 6.1.0-50-amd64 %s" % host.path("/boot/vmlinuz-6.1.0-50-amd64")]
    assert esp_options(host) == ["root=LABEL=r ro intel_iommu=on iommu=pt"] * 2


def test_a_failed_kernel_install_puts_the_file_and_the_entries_back(tmp_path):
    host = systemd_boot_host(tmp_path, fail="no space left on /boot/efi")
    before = {p: host.read(p) for p in ["/etc/kernel/cmdline"] + [
        "/boot/efi/loader/entries/debian-%s.conf" % v for v in ESP_KERNELS]}
    result = run(host, arguments=IOMMU)
    assert result["failed"] is True and "no space left on /boot/efi" in result["msg"]
    assert "Rolled back" in result["msg"] and "Traceback" not in result["msg"]
    assert {p: host.read(p) for p in before} == before


@pytest.mark.parametrize("backend, command", [("grubby", "grubby"), ("grub2_mkconfig", "grub2-mkconfig")])
def test_missing_command_of_a_forced_backend_is_a_clean_failure(tmp_path, backend, command):
    host = debian_host(tmp_path)
    snap = host.snapshot()
    result = run(host, arguments=IOMMU, backend=backend)
    assert result["failed"] is True and result["changed"] is False
    assert result["msg"] == ("%s is needed but not installed (not found in PATH or the sbin directories); "
                             "nothing changed" % command)
    assert host.snapshot() == snap


def test_no_backend_detected(tmp_path):
    host = Host(tmp_path)
    result = run(host, arguments=IOMMU)
    assert result["failed"] is True and "set backend explicitly" in result["msg"]


# --- fuzz ---------------------------------------------------------------------------------------

HOSTILE = ["inf", "-inf", "nan", "Infinity", "1e400", "9" * 40, "-" + "9" * 30, "iommu=pt\n", "quiet\n", "\n",
           "intel_iommu=on\r\n", "a=b\x00", "caf\u00e9=1", "iommu=p\u00e9", "\u2028", "on", "yes", "~"]
ITEM = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"\A[a-z_][a-z0-9_.-]{0,8}(=[a-z0-9,:=/.-]{1,8})?\Z"),
    st.sampled_from(HOSTILE),
    st.booleans(), st.none(), st.integers(), st.integers(min_value=10 ** 30), st.floats(allow_nan=True),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
    st.lists(st.text(max_size=3), max_size=2),
)
TIMEOUT = st.one_of(st.sampled_from(HOSTILE + [True, False, None, -1, 0, 5, 86400, 86401, 2.5, 10 ** 40]),
                    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))


def _fuzz_params(items, state, replace, backend, timeout):
    params = dict(arguments=items, state=state, replace_values=replace, backend=backend)
    if timeout != "(unset)":
        params["command_timeout"] = timeout
    return params


@settings(max_examples=160, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.one_of(st.lists(ITEM, max_size=5), ITEM), state=st.sampled_from(["present", "absent", "x"]),
       replace=st.one_of(st.booleans(), st.sampled_from(["yes", "nan", 1, 2.5])), check=st.booleans(),
       backend=st.sampled_from(["auto", "grub", "kernel_cmdline_file"]), timeout=st.one_of(st.just("(unset)"), TIMEOUT))
def test_fuzz_ends_in_exit_or_fail(items, state, replace, check, backend, timeout):
    with tempfile.TemporaryDirectory() as base:
        host = debian_host(base)
        host.write("/etc/kernel/cmdline", "root=UUID=1 ro\n")
        snap = host.snapshot()
        result = run(host, check=check, **_fuzz_params(items, state, replace, backend, timeout))
        assert isinstance(result.get("msg", ""), str)
        assert "unexpectedly" not in result.get("msg", "")
        assert "Traceback" not in result.get("msg", "")
        if result.get("failed"):
            assert result["msg"] and result.get("changed", False) is False
        if result.get("failed") or check:
            assert host.snapshot() == snap
        else:
            assert "\n" not in host.read("/etc/kernel/cmdline").rstrip("\n")
            second = run(host, **_fuzz_params(items, state, replace, backend, timeout))
            assert second["changed"] is False, (items, second)


def test_write_failure_rolls_back_earlier_files(tmp_path):
    host = rhel_host(tmp_path, with_grubby=False)
    snap = host.snapshot()

    def refuse(src, dest, **_kwargs):
        raise OSError(28, "No space left on device")

    with mock.patch.object(_persist.shutil, "copy2", refuse):
        result = run(host, arguments=IOMMU)
    assert result["failed"] is True
    assert "could not back up" in result["msg"] and "No space left on device" in result["msg"]
    assert host.snapshot() == snap
    assert host.calls() == []
    assert not os.path.exists(host.path("/var"))  # the backup directory made for it is gone too


# --- restore: giving back what the module replaced (issue 17) -----------------------------------

RECORD = "/var/lib/gpuops/kernel_cmdline.json"
LEAVE = ["intel_iommu=on", "amd_iommu=on", "iommu=pt"]  # what host_prepare removes on a container node
BACKENDS = ["grub", "grubby", "grub2_mkconfig", "kernel_cmdline_file"]


def file_host(base):
    host = Host(base)
    host.write("/etc/kernel/cmdline", "root=UUID=1 rw quiet intel_iommu=off\n")
    host.write("/proc/cmdline", "initrd=\\initrd root=UUID=1 rw quiet intel_iommu=off\n")
    host.script("kernel-install", "#!/bin/sh\nexit 0\n")
    return host


def host_for(backend, base):
    if backend == "grub":
        return debian_host(base)
    if backend == "kernel_cmdline_file":
        return file_host(base)
    return rhel_host(base, with_grubby=backend == "grubby")


def booted(host, backend):
    """The command line each boot entry gets, as a list of token lists (what the host boots with)."""
    if backend == "grub":
        return [line.split()[4:] for line in host.grub_cfg().splitlines() if line.strip().startswith("linux ")]
    if backend == "kernel_cmdline_file":
        return [host.read("/etc/kernel/cmdline").split()]
    return [options.split()[2:] for options in entries_options(host)]  # without root= and ro


def record(host):
    if not host.exists(RECORD):
        return None
    return json.loads(host.read(RECORD))["keys"]


def user_sets(host, old, new):
    """Someone changes the setting by hand in every file that holds it (drop-in, defaults, entries, cmdline)."""
    paths = [DROPIN, "/etc/default/grub", "/etc/kernel/cmdline"]
    if os.path.isdir(host.path("/boot/loader/entries")):
        paths += ["/boot/loader/entries/" + n for n in os.listdir(host.path("/boot/loader/entries"))]
    for path in paths:
        if host.exists(path):
            host.write(path, host.read(path).replace(old, new))


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_gives_intel_iommu_off_back(tmp_path, backend):
    host = host_for(backend, tmp_path)
    # the command line the host boots with before the module (grub.cfg is only written by update-grub)
    original = booted(host, backend) if backend != "grub" else [["console=ttyS0,115200", "intel_iommu=off"]]
    present = run(host, backend=backend, arguments=IOMMU)
    assert present["changed"] is True and present["restored"] == []
    assert all("intel_iommu=on" in line and "intel_iommu=off" not in line for line in booted(host, backend))
    assert record(host) == {"intel_iommu": {"original": ["intel_iommu=off"], "set": ["intel_iommu=on"]},
                            "iommu": {"original": [], "set": ["iommu=pt"]}}
    assert stat.S_IMODE(os.stat(host.path(RECORD)).st_mode) == 0o644

    absent = run(host, backend=backend, arguments=LEAVE, state="absent")
    assert not absent.get("failed"), absent
    assert absent["changed"] is True
    assert absent["restored"] == ["intel_iommu=off"]
    assert "gave intel_iommu=off back" in absent["msg"]
    assert "intel_iommu=off" in absent["cmdline_args"] and "iommu=pt" not in absent["cmdline_args"]
    for line in booted(host, backend):
        assert "intel_iommu=off" in line and "intel_iommu=on" not in line and "iommu=pt" not in line
    assert sorted(map(sorted, booted(host, backend))) == sorted(map(sorted, original))
    assert not host.exists(RECORD)  # every entry given back or dropped: no file left
    assert os.path.isdir(host.path("/var/lib/gpuops"))

    snap = host.snapshot()
    again = run(host, backend=backend, arguments=LEAVE, state="absent")
    assert again["changed"] is False and again["restored"] == []
    assert host.snapshot() == snap


def test_grub_round_trip_deletes_dropin_and_regenerates(tmp_path):
    host = debian_host(tmp_path)
    grub_before = host.read("/etc/default/grub")
    assert run(host, arguments=IOMMU)["changed"] is True
    assert host.exists(DROPIN)
    result = run(host, arguments=LEAVE, state="absent")
    assert result["changed"] is True
    assert not host.exists(DROPIN)  # the drop-in changes nothing any more: /etc/default/grub rules again
    assert host.calls() == ["update-grub ", "update-grub "]
    assert "console=ttyS0,115200 intel_iommu=off" in host.grub_cfg()
    assert host.read("/etc/default/grub") == grub_before


def test_grub_dropin_kept_while_it_still_carries_another_argument(tmp_path):
    host = debian_host(tmp_path)
    assert run(host, arguments=IOMMU)["changed"] is True
    result = run(host, arguments=["intel_iommu=on"], state="absent")
    assert result["restored"] == ["intel_iommu=off"]
    dropin = host.read(DROPIN)
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in dropin  # added to the files' value, not a copy of it
    assert "GRUB_CMDLINE_LINUX_DEFAULT" not in dropin  # back to what /etc/default/grub says: not in the drop-in
    assert "iommu=pt console=ttyS0,115200 intel_iommu=off" in host.grub_cfg()
    assert record(host) == {"iommu": {"original": [], "set": ["iommu=pt"]}}
    # and the last argument going takes the drop-in with it
    assert run(host, arguments=["iommu=pt"], state="absent")["restored"] == []
    assert not host.exists(DROPIN) and not host.exists(RECORD)


def test_hand_written_claim_stays_in_the_users_file(tmp_path):
    # A host prepared by hand before: GPUs claimed for vfio-pci with vfio-pci.ids in /etc/default/grub. Adding the
    # IOMMU arguments leaves the claim where its author wrote it (no copy in the drop-in), so their own edit of
    # /etc/default/grub still takes effect; taking the claim off (the switch with remove_claims) takes that token
    # out of their file, and the drop-in still only adds to their value.
    host = Host(tmp_path)
    host.write("/etc/default/grub", DEBIAN_GRUB.replace('GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="vfio-pci.ids=1234:11e8"'))
    host.write("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=UUID=1 ro vfio-pci.ids=1234:11e8 console=ttyS0,115200\n")
    host.update_grub()
    assert run(host, arguments=IOMMU)["changed"] is True
    dropin = host.read(DROPIN)
    assert "vfio-pci.ids" not in dropin, dropin
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in dropin
    assert "ro vfio-pci.ids=1234:11e8 iommu=pt console=ttyS0,115200 intel_iommu=on" in host.grub_cfg()
    assert run(host, arguments=IOMMU)["changed"] is False
    # the user drops the claim in their file: the next grub.cfg has it off and the collection's arguments on
    host.write("/etc/default/grub", DEBIAN_GRUB)
    subprocess.run([host.update_grub()], check=True)
    assert run(host, arguments=IOMMU)["changed"] is False
    linux = host.grub_cfg().split("\n")[1].split()
    assert linux[3:] == ["ro", "iommu=pt", "console=ttyS0,115200", "intel_iommu=on"], linux
    # with the claim back, taking it off through the module takes it out of the user's file, that token alone
    host.write("/etc/default/grub", DEBIAN_GRUB.replace('GRUB_CMDLINE_LINUX=""',
                                                        'GRUB_CMDLINE_LINUX="nosmt vfio-pci.ids=1234:11e8 quiet"'))
    result = run(host, arguments=["vfio-pci.ids=1234:11e8"], state="absent")
    assert result["changed"] is True, result
    assert host.read("/etc/default/grub") == DEBIAN_GRUB.replace('GRUB_CMDLINE_LINUX=""',
                                                                 'GRUB_CMDLINE_LINUX="nosmt quiet"')
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in host.read(DROPIN)
    assert "vfio-pci.ids" not in host.grub_cfg()
    assert "/etc/default/grub" in result["msg"]
    assert any(w.startswith("took vfio-pci.ids=1234:11e8 (GRUB_CMDLINE_LINUX) out of /etc/default/grub")
               and BACKUPS in w for w in result["warnings"]), result["warnings"]
    assert run(host, arguments=["vfio-pci.ids=1234:11e8"], state="absent")["changed"] is False


def effective_by_dash(host):
    """GRUB_CMDLINE_LINUX and _DEFAULT as grub-mkconfig's /bin/sh gets them: /etc/default/grub sourced, then each
    /etc/default/grub.d/*.cfg in the shell's glob order (as Debian's grub-mkconfig does)."""
    assert os.path.realpath("/bin/sh").endswith("dash"), "this test wants Debian's /bin/sh, dash"
    script = ('if [ -f etc/default/grub ]; then . ./etc/default/grub; fi\n'
              'for x in etc/default/grub.d/*.cfg; do if [ -e "$x" ]; then . "./$x"; fi; done\n'
              'printf "%s\\n%s\\n" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"\n')
    out = subprocess.run(["/bin/sh", "-c", script], cwd=host.root, check=True, capture_output=True, text=True).stdout
    linux, default = out.split("\n")[:2]
    return linux.split(), default.split()


def effective_by_the_module(host):
    """The same values as kernel_cmdline reads them (its reader of the files' shell)."""
    from ansible_collections.gpuops.sandbox.plugins.module_utils import _shellvars
    values, _assignments = _shellvars.evaluate_grub_defaults(host.root)
    return values["GRUB_CMDLINE_LINUX"].split(), values["GRUB_CMDLINE_LINUX_DEFAULT"].split()


def test_switch_takes_a_hand_written_claim_off_with_the_iommu_arguments_and_keeps_it_off(tmp_path):
    # The lab's switch scenario on a host claimed by hand: vm-passthrough, container (the IOMMU arguments and the
    # claim off in one change), vm-passthrough again (the claim stays off), then the owner edits their file.
    host = Host(tmp_path)
    claimed = DEBIAN_GRUB.replace('GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="vfio-pci.ids=1234:11e8 "')
    host.write("/etc/default/grub", claimed)
    host.write("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=UUID=1 ro console=ttyS0,115200 intel_iommu=off\n")
    host.update_grub()
    assert run(host, arguments=IOMMU)["changed"] is True
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in host.read(DROPIN)
    # the preparation's reboot: the claim and the collection's arguments in effect
    host.write("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=UUID=1 ro vfio-pci.ids=1234:11e8 iommu=pt "
                                "console=ttyS0,115200 intel_iommu=on\n")
    result = run(host, arguments=LEAVE + ["vfio-pci.ids=1234:11e8"], state="absent")
    assert result["changed"] is True and result["reboot_required"] is True, result
    linux = host.grub_cfg().split("\n")[1].split()
    assert linux[3:] == ["ro", "console=ttyS0,115200", "intel_iommu=off"], linux
    # the claim's token alone is out of the owner's file; no GRUB_CMDLINE_LINUX in the drop-in at all
    assert host.read("/etc/default/grub") == claimed.replace('"vfio-pci.ids=1234:11e8 "', '""')
    assert not host.exists(DROPIN) or "GRUB_CMDLINE_LINUX=" not in host.read(DROPIN)
    assert run(host, arguments=LEAVE + ["vfio-pci.ids=1234:11e8"], state="absent")["changed"] is False
    assert run(host, arguments=IOMMU)["changed"] is True
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in host.read(DROPIN).splitlines()
    assert "vfio-pci.ids" not in host.grub_cfg()
    # the owner adds quiet to their GRUB_CMDLINE_LINUX: it takes effect, for grub-mkconfig's shell and the module
    with open(host.path("/etc/default/grub")) as handle:
        owners = handle.read()
    host.write("/etc/default/grub", owners.replace('GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="quiet"'))
    for linux_args, _default in (effective_by_dash(host), effective_by_the_module(host)):
        assert "quiet" in linux_args and "iommu=pt" in linux_args, linux_args
        assert not any(arg.startswith("vfio-pci.ids") for arg in linux_args), linux_args
    assert effective_by_dash(host) == effective_by_the_module(host)
    subprocess.run([host.update_grub()], check=True)
    assert "quiet iommu=pt" in host.grub_cfg()
    assert run(host, arguments=IOMMU)["changed"] is False


def test_a_frozen_dropin_of_an_earlier_version_is_mended(tmp_path):
    # What the switch left before this was fixed: the owner's file still with the claim, the drop-in a full value.
    host = Host(tmp_path)
    claimed = DEBIAN_GRUB.replace('GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="vfio-pci.ids=1234:11e8"')
    host.write("/etc/default/grub", claimed)
    host.write(DROPIN, '# Managed by gpuops.sandbox.kernel_cmdline; edits here are overwritten.\n'
                       'GRUB_CMDLINE_LINUX="iommu=pt"\n'
                       'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} intel_iommu=on"\n')
    host.write("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=UUID=1 ro iommu=pt console=ttyS0,115200 intel_iommu=on\n")
    host.update_grub()
    assert effective_by_dash(host)[0] == ["iommu=pt"]
    result = run(host, arguments=IOMMU)
    assert result["changed"] is True and result["reboot_required"] is False, result
    assert host.read("/etc/default/grub") == DEBIAN_GRUB
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"' in host.read(DROPIN).splitlines()
    assert effective_by_dash(host) == effective_by_the_module(host) == (
        ["iommu=pt"], ["console=ttyS0,115200", "intel_iommu=on"])
    assert run(host, arguments=IOMMU)["changed"] is False


def test_a_claim_the_files_do_not_spell_out_keeps_the_full_value_with_a_warning(tmp_path):
    host = Host(tmp_path)
    host.write("/etc/default/grub", DEBIAN_GRUB.replace('GRUB_CMDLINE_LINUX=""',
                                                        'CLAIM=vfio-pci.ids=1234:11e8\nGRUB_CMDLINE_LINUX="$CLAIM"'))
    host.write("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=UUID=1 ro vfio-pci.ids=1234:11e8 console=ttyS0,115200\n")
    host.update_grub()
    before = host.read("/etc/default/grub")
    result = run(host, arguments=["vfio-pci.ids=1234:11e8"], state="absent")
    assert result["changed"] is True
    assert host.read("/etc/default/grub") == before
    assert 'GRUB_CMDLINE_LINUX=""' in host.read(DROPIN).splitlines()
    assert any("vfio-pci.ids=1234:11e8 could not be taken out" in w for w in result["warnings"]), result
    assert effective_by_dash(host)[0] == []


def test_distribution_dropin_with_intel_iommu_off_takes_effect_again(tmp_path):
    host = Host(tmp_path)
    host.write("/etc/default/grub", UBUNTU_GRUB)
    host.write("/etc/default/grub.d/50-iommu.cfg",
               'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT intel_iommu=off"\n')
    host.write("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=UUID=1 ro quiet splash intel_iommu=off\n")
    host.update_grub()
    assert run(host, arguments=IOMMU)["changed"] is True
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash intel_iommu=on"' in host.read(DROPIN)
    assert "intel_iommu=off" not in host.grub_cfg()
    assert record(host)["intel_iommu"] == {"original": ["intel_iommu=off"], "set": ["intel_iommu=on"]}

    result = run(host, arguments=LEAVE, state="absent")
    assert result["changed"] is True and result["restored"] == ["intel_iommu=off"]
    assert not host.exists(DROPIN) and not host.exists(RECORD)
    assert "ro  quiet splash intel_iommu=off\n" in host.grub_cfg()
    assert host.read("/etc/default/grub.d/50-iommu.cfg").count("intel_iommu=off") == 1
    assert run(host, arguments=LEAVE, state="absent")["changed"] is False


@pytest.mark.parametrize("backend", BACKENDS)
def test_added_key_is_just_removed(tmp_path, backend):
    host = host_for(backend, tmp_path)
    before = booted(host, backend) if backend != "grub" else [["console=ttyS0,115200", "intel_iommu=off"]]
    assert run(host, backend=backend, arguments=["iommu=pt"])["changed"] is True
    assert record(host) == {"iommu": {"original": [], "set": ["iommu=pt"]}}
    result = run(host, backend=backend, arguments=["iommu=pt"], state="absent")
    assert result["changed"] is True and result["restored"] == []
    assert not host.exists(RECORD)
    assert booted(host, backend) == before
    assert not host.exists(DROPIN)
    assert all("iommu=pt" not in line and "intel_iommu=off" in line for line in booted(host, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_changed_the_value_in_between_wins(tmp_path, backend):
    host = host_for(backend, tmp_path)
    assert run(host, backend=backend, arguments=IOMMU)["changed"] is True
    user_sets(host, "intel_iommu=on", "intel_iommu=igfx_off")
    result = run(host, backend=backend, arguments=LEAVE, state="absent")
    assert not result.get("failed"), result
    assert result["changed"] is True and result["restored"] == []
    for line in booted(host, backend):
        assert "intel_iommu=igfx_off" in line and "intel_iommu=off" not in line and "iommu=pt" not in line
    assert not host.exists(RECORD)  # the intel_iommu entry is dropped, iommu was added: nothing left


def test_user_changed_value_only_drops_the_record_entry(tmp_path):
    """Nothing to change in the boot configuration, but the stale entry must not outlive the user's change."""
    host = file_host(tmp_path)
    assert run(host, arguments=["intel_iommu=on"])["changed"] is True
    user_sets(host, "intel_iommu=on", "intel_iommu=igfx_off")
    snap_cmdline = host.read("/etc/kernel/cmdline")
    result = run(host, diff=True, arguments=["intel_iommu=on"], state="absent")
    assert result["changed"] is True and result["restored"] == []
    assert result["msg"].startswith("changed %s" % RECORD)
    assert host.read("/etc/kernel/cmdline") == snap_cmdline
    assert not host.exists(RECORD)
    assert result["diff"][-1]["before_header"] == RECORD and result["diff"][-1]["after"] == ""
    assert run(host, arguments=["intel_iommu=on"], state="absent")["changed"] is False


@pytest.mark.parametrize("backend", BACKENDS)
def test_restore_false_only_removes(tmp_path, backend):
    host = host_for(backend, tmp_path)
    assert run(host, backend=backend, arguments=IOMMU)["changed"] is True
    result = run(host, backend=backend, arguments=LEAVE, state="absent", restore=False)
    assert result["changed"] is True and result["restored"] == []
    assert "gave" not in result["msg"]
    assert all("intel_iommu" not in " ".join(line) for line in booted(host, backend))
    assert not host.exists(RECORD)  # the entries of the keys removed are dropped all the same
    assert run(host, backend=backend, arguments=LEAVE, state="absent")["changed"] is False


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_mode_writes_no_record_and_shows_it_in_the_diff(tmp_path, backend):
    host = host_for(backend, tmp_path)
    snap = host.snapshot()
    check = run(host, check=True, diff=True, backend=backend, arguments=IOMMU)
    assert check["changed"] is True
    assert host.snapshot() == snap and not os.path.exists(host.path("/var/lib/gpuops"))
    record_diff = check["diff"][-1]
    assert record_diff["before_header"] == RECORD and record_diff["before"] == ""
    assert '"original": [\n        "intel_iommu=off"\n      ]' in record_diff["after"]

    assert run(host, backend=backend, arguments=IOMMU)["changed"] is True
    snap = host.snapshot()
    calls = len(host.calls())
    check = run(host, check=True, diff=True, backend=backend, arguments=LEAVE, state="absent")
    assert check["changed"] is True and check["restored"] == ["intel_iommu=off"]
    assert "would give intel_iommu=off back" in check["msg"]
    assert "intel_iommu=off" in check["cmdline_args"]
    assert host.snapshot() == snap
    assert all(not c.startswith(("update-grub", "grub2-mkconfig", "grubby --update")) for c in host.calls()[calls:])
    record_diff = check["diff"][-1]
    assert record_diff["before_header"] == RECORD and "intel_iommu=off" in record_diff["before"]
    assert record_diff["after"] == ""


@pytest.mark.parametrize("backend", BACKENDS)
def test_later_replacement_keeps_the_first_original(tmp_path, backend):
    host = host_for(backend, tmp_path)
    assert run(host, backend=backend, arguments=["intel_iommu=on"])["changed"] is True
    assert run(host, backend=backend, arguments=["intel_iommu=on,sm_on"])["changed"] is True
    assert record(host) == {"intel_iommu": {"original": ["intel_iommu=off"], "set": ["intel_iommu=on,sm_on"]}}
    # Removing a value the module no longer holds gives nothing back, and the record stays
    assert run(host, backend=backend, arguments=["intel_iommu=on"], state="absent")["changed"] is False
    result = run(host, backend=backend, arguments=["intel_iommu=on,sm_on"], state="absent")
    assert result["restored"] == ["intel_iommu=off"]
    assert all("intel_iommu=off" in line for line in booted(host, backend))


def test_absent_of_a_bare_key_gives_nothing_back(tmp_path):
    host = debian_host(tmp_path)
    assert run(host, arguments=IOMMU)["changed"] is True
    result = run(host, arguments=["intel_iommu"], state="absent")
    assert result["changed"] is True and result["restored"] == []
    assert "intel_iommu" not in host.grub_cfg()
    assert record(host) == {"iommu": {"original": [], "set": ["iommu=pt"]}}


def test_update_grub_failure_rolls_the_record_back(tmp_path):
    host = debian_host(tmp_path)
    assert run(host, arguments=IOMMU)["changed"] is True
    snap = host.snapshot()
    host.update_grub(fail=True)
    result = run(host, arguments=LEAVE, state="absent")
    assert result["failed"] is True and result["rolled_back"] is True
    assert "restored %s" % host.path(RECORD) in result["msg"]
    assert {k: v for k, v in host.snapshot().items() if not k.startswith(BACKUPS.lstrip("/") + "/")} == snap


@pytest.mark.parametrize("created, directory", [(DROPIN, "/etc/default/grub.d"), (RECORD, "/var")],
                         ids=["removes_new_dropin", "leaves_no_record_or_directory"])
def test_update_grub_failure_on_a_fresh_host(tmp_path, created, directory):
    """What the run created (the drop-in, the record) is removed again, and so are the directories it made."""
    host = debian_host(tmp_path)
    host.update_grub(fail=True)
    refused(host, ["removed %s (it did not exist before)" % host.path(created)], arguments=IOMMU)
    assert not os.path.exists(host.path(directory))


def test_record_write_failure_rolls_back_the_boot_files(tmp_path):
    host = debian_host(tmp_path)
    snap = host.snapshot()
    real_write = _persist.write_text

    def write_text(module, root, path, *args, **kwargs):
        if path == RECORD:
            raise _persist.PersistError(RECORD, "No space left on device")
        return real_write(module, root, path, *args, **kwargs)

    with mock.patch.object(_persist, "write_text", side_effect=write_text):
        result = run(host, arguments=IOMMU)
    assert result["failed"] is True and "No space left on device" in result["msg"]
    assert "rolled back" in result["msg"] and "removed %s" % host.path(DROPIN) in result["msg"]
    assert host.snapshot() == snap and host.calls() == []
    assert not os.path.exists(host.path("/var")) and not os.path.exists(host.path("/etc/default/grub.d"))


def test_unreadable_record_path_refused_before_any_change(tmp_path):
    host = debian_host(tmp_path)
    host.write("/var/lib/gpuops", "not a directory\n")
    snap = host.snapshot()
    result = run(host, arguments=IOMMU)
    assert result["failed"] is True and "cannot read" in result["msg"] and RECORD in result["msg"]
    assert host.snapshot() == snap and host.calls() == []


@pytest.mark.parametrize("text, fragment", [
    ("{not json", "not JSON"),
    ('{"version": 2, "keys": {}}', "version 1"),
    ('{"version": 1, "keys": {"intel_iommu": {"original": ["intel_iommu=off quiet"], "set": ["intel_iommu=on"]}}}',
     "single arguments"),
    ('{"version": 1, "keys": {"intel_iommu": {"original": ["init=/bin/sh"], "set": ["intel_iommu=on"]}}}',
     "single arguments"),
    ('{"version": 1, "keys": {"intel_iommu": {"original": ["intel_iommu=off\\n"], "set": ["intel_iommu=on"]}}}',
     "single arguments"),
    ('{"version": 1, "keys": {"intel-iommu": {"original": [], "set": ["intel-iommu=on"]}}}', "normalized"),
    ('{"version": 1, "keys": {"iommu": {"original": [], "set": []}}}', "empty"),
    ('[]', "expected an object"),
])
def test_bad_record_refused_before_any_change(tmp_path, text, fragment):
    host = debian_host(tmp_path)
    host.write(RECORD, text)
    snap = host.snapshot()
    for state in ("present", "absent"):
        result = run(host, arguments=IOMMU, state=state)
        assert result["failed"] is True and result["changed"] is False
        assert RECORD in result["msg"] and fragment in result["msg"], result["msg"]
        assert host.snapshot() == snap and host.calls() == []


def test_bad_restore_value_refused(tmp_path):
    host = debian_host(tmp_path)
    snap = host.snapshot()
    result = run(host, arguments=IOMMU, state="absent", restore="sometimes")
    assert result["failed"] is True and "'restore'" in result["msg"] and "not a valid boolean" in result["msg"]
    assert host.snapshot() == snap


def test_replace_values_false_records_only_added_keys(tmp_path):
    host = Host(tmp_path)
    host.write("/etc/default/grub", UBUNTU_GRUB.replace('GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="console=tty0"'))
    host.write("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=UUID=1 ro console=tty0 quiet splash\n")
    host.update_grub()
    assert run(host, arguments=["console=ttyS0,115200", "hugepages=16"], replace_values=False)["changed"] is True
    assert record(host) == {"hugepages": {"original": [], "set": ["hugepages=16"]}}
    result = run(host, arguments=["console=ttyS0,115200", "hugepages=16"], state="absent")
    assert result["restored"] == [] and "console=tty0 " in host.grub_cfg()
    assert not host.exists(DROPIN) and not host.exists(RECORD)


# --- a run cut short between the drop-in and grub.cfg ---------------------------------------------

PENDING = "/var/lib/gpuops/pending/bootloader.json"


def test_grub_cfg_is_generated_under_a_pending_record_that_goes_after(tmp_path):
    host = debian_host(tmp_path)
    # update-grub shows what the record said while it ran.
    host.script("update-grub", "#!/bin/sh\nROOT='%s'\nOUT=\"$ROOT/boot/grub/grub.cfg\"\n"
                "cat \"$ROOT%s\" >> \"$ROOT/calls.log\"\n%s" % (host.root, PENDING, GENERATE))
    result = run(host, arguments=IOMMU)
    assert result["changed"] is True, result
    during = json.loads(host.calls()[0])
    assert during["changed"] == [DROPIN] and during["since"].endswith("Z")
    assert not host.exists(PENDING) and os.listdir(host.path("/var/lib/gpuops/pending")) == []


def test_a_run_cut_short_before_grub_cfg_was_generated_is_finished_by_the_next(tmp_path):
    host = debian_host(tmp_path)
    run(host, arguments=IOMMU)
    # The power went off in update-grub: the drop-in says intel_iommu=on, grub.cfg does not.
    host.write("/boot/grub/grub.cfg", "linux /vmlinuz root=UUID=1234 ro intel_iommu=off\n")
    host.write(PENDING, '{"changed": ["%s"], "since": "2026-11-24T09:30:00Z"}\n' % DROPIN)
    os.unlink(host.log)
    result = run(host, check=True, arguments=IOMMU)
    assert result["changed"] is True and host.calls() == [] and host.exists(PENDING)
    assert "would run update-grub" in result["msg"]
    result = run(host, arguments=IOMMU)
    assert result["changed"] is True and result["reboot_required"] is True, result
    assert host.calls() == ["update-grub "]
    assert ("an earlier run changed %s and did not finish (since 2026-11-24T09:30:00Z): grub.cfg is generated again"
            % DROPIN) in result["msg"]
    grub_cfg = host.read("/boot/grub/grub.cfg")
    assert "intel_iommu=on" in grub_cfg and "iommu=pt" in grub_cfg and not host.exists(PENDING)
    result = run(host, arguments=IOMMU)
    assert result["changed"] is False and host.calls() == ["update-grub "]


def test_a_failed_regeneration_keeps_the_pending_record(tmp_path):
    host = debian_host(tmp_path)
    run(host, arguments=IOMMU)
    text = '{"changed": ["%s"], "since": "2026-11-24T09:30:00Z"}\n' % DROPIN
    host.write(PENDING, text)
    host.update_grub(fail=True)
    result = run(host, arguments=IOMMU)
    assert result["failed"] is True and "update-grub failed" in result["msg"]
    assert host.read(PENDING) == text


# --- grub.cfg generated before the files said what they say now -------------------------------------------------

def test_a_grub_cfg_entry_without_the_arguments_is_generated_again(tmp_path):
    host = debian_host(tmp_path, proc="BOOT_IMAGE=/boot/vmlinuz-6.1.0-18-amd64 root=UUID=1234 ro console=ttyS0,115200 "
                                      "intel_iommu=on iommu=pt")
    assert not run(host, arguments=IOMMU).get("failed")
    good = host.grub_cfg()
    # A kernel installed since got its entry from a grub.cfg generated without the drop-in (by hand, or from a
    # grub.d the drop-in was not in yet): the drop-in is right, its entry is not.
    host.write("/boot/grub/grub.cfg", good + "menuentry 'Debian GNU/Linux, with Linux 6.1.0-20-amd64' {\n"
                                             "\tlinux /boot/vmlinuz-6.1.0-20-amd64 root=UUID=1234 ro quiet\n}\n")
    before = host.calls()
    result = run(host, arguments=IOMMU, check=True)
    assert result["changed"] is True and host.calls() == before
    assert "lacks the requested arguments on 'Debian GNU/Linux, with Linux 6.1.0-20-amd64'" in result["msg"]
    result = run(host, arguments=IOMMU)
    assert not result.get("failed"), result
    assert result["changed"] is True
    assert host.calls() == before + ["update-grub "]
    assert host.grub_cfg() == good
    # The running kernel has the arguments: the regeneration for another entry needs no reboot.
    assert result["reboot_required"] is False
    again = run(host, arguments=IOMMU)
    assert again["changed"] is False and host.calls() == before + ["update-grub "]


def test_a_recovery_entry_without_the_arguments_is_not_generated_again(tmp_path):
    host = debian_host(tmp_path)
    assert not run(host, arguments=IOMMU).get("failed")
    recovery = ("menuentry 'Debian GNU/Linux (recovery mode)' {\n"
                "\tlinux /boot/vmlinuz-6.1.0-18-amd64 root=UUID=1234 ro single\n}\n")
    host.write("/boot/grub/grub.cfg", host.grub_cfg() + recovery)
    calls = host.calls()
    assert run(host, arguments=IOMMU)["changed"] is False and host.calls() == calls


def test_a_grub_cfg_still_stale_after_generating_fails_and_says_so(tmp_path):
    host = debian_host(tmp_path)
    assert not run(host, arguments=IOMMU).get("failed")
    stale = host.grub_cfg().replace("iommu=pt", "")
    host.write("/boot/grub/grub.cfg", stale)
    host.script("update-grub", "#!/bin/sh\necho \"update-grub $*\" >> '%s/calls.log'\n" % host.root)
    result = run(host, arguments=IOMMU)
    assert result.get("failed") is True
    assert "was generated again but still lacks the requested arguments on 'Debian GNU/Linux'" in result["msg"]
