#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Time each module on a lab host for 1 and for all stand-in devices; print a table. Measures only.

The host (default lab-modules, the spare host) is reset to the pristine image and started, then one small playbook turns
the IOMMU on (gpuops.sandbox.kernel_cmdline with intel_iommu=on iommu=pt, then ansible.builtin.reboot).
Each cell is the wall time of one ad-hoc call, `ansible -i inventories/lab/ HOST -m MODULE -a JSON`,
and whether it reported a change: a first run, then the same call again (a no-op re-run).

  ping           ansible.builtin.ping, the per-call cost (controller start, SSH, Python on the VM)
  gpu_facts      one edu by address / both edus by vendor and class (read-only)
  iommu_check    the same selections (read-only)
  vfio_bind      the lone edu / both edus with include_group (takes the HDA function too)
  mdev_create    one mtty-1 on parent mtty / twelve mtty-2 (every port of the mtty parent)
  sriov_vfs      the nvme PF to 1 VF / to 4 VFs (autoprobe false, so the VFs stay driverless)
  kernel_cmdline the prepare step's arguments again (re-run only, host-wide)

Changes are undone after each size (state absent, or 0 VFs); those calls are timed in a second table.
Run with the .venv python. --skip-prepare reuses a host already prepared; --keep leaves it running,
otherwise it ends with `gpulab reset --no-start HOST`. The lab runs under software emulation and the
machine may be busy, so expect noise of a second or more per call.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.join(TOP, ".venv", "bin")
PYTHON = os.path.join(VENV_BIN, "python") if os.path.exists(os.path.join(VENV_BIN, "python")) else sys.executable
LAB = [PYTHON, os.path.join(TOP, "lab", "gpulab.py")]
INVENTORY = "inventories/lab/"
EDU = "1234:11e8"
EDU_CLASS = "00ff00"
GROUPED_EDU = "0000:00:03.0"
NVME_PF = "0x1b36 0x0010"
IOMMU_ARGS = ["intel_iommu=on", "iommu=pt"]
PREPARE = """---
- name: Turn the IOMMU on for the module benchmark
  hosts: %(host)s
  gather_facts: false
  tasks:
    - name: Put the IOMMU arguments on the kernel command line
      gpuops.sandbox.kernel_cmdline:
        arguments: %(arguments)s
      register: bench_iommu
    - name: Reboot into the new command line
      ansible.builtin.reboot:
        reboot_timeout: 1200
      when: bench_iommu.reboot_required
    - name: The IOMMU is on
      gpuops.sandbox.iommu_check:
        require_iommu: true
"""
# Prints the address of every PCI function whose "vendor device" matches $1 (and that has sriov_totalvfs
# when $2 is set).
FIND_PCI = ('for d in /sys/bus/pci/devices/*; do '
            'if [ "$(cat $d/vendor) $(cat $d/device)" = "%s" ]%s; then echo "${d##*/}"; fi; done')


def ansible_env():
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_CONFIG"] = os.path.join(TOP, "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def log(msg):
    print("bench-modules: " + msg, flush=True)


def run(cmd, timeout=3600):
    """Run cmd in TOP; return (seconds, returncode, combined output)."""
    started = time.time()
    try:
        proc = subprocess.run(cmd, cwd=TOP, env=ansible_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, check=False, timeout=timeout)
        code, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        code, out = -1, "timed out after %ss\n%s" % (timeout, exc.output or "")
    return time.time() - started, code, out


def tail(text, lines=15):
    return "\n".join(text.strip().splitlines()[-lines:])


def lab(*args):
    elapsed, code, out = run(LAB + list(args))
    log("gpulab %s: %.1f s, rc=%d" % (" ".join(args), elapsed, code))
    if code != 0:
        raise SystemExit("gpulab %s failed:\n%s" % (" ".join(args), tail(out)))
    return elapsed


def adhoc(host, module, args=None):
    """One ad-hoc call; return (seconds, status, output), status being CHANGED, SUCCESS, FAILED! or UNREACHABLE!."""
    cmd = ["ansible", "-i", INVENTORY, host, "-m", module]
    if args is not None:
        cmd += ["-a", args if isinstance(args, str) else json.dumps(args)]
    elapsed, code, out = run(cmd, timeout=1800)
    match = re.search(r"^%s \| (CHANGED|SUCCESS|FAILED!|UNREACHABLE!)" % re.escape(host), out, re.M)
    status = match.group(1) if match else "rc=%d" % code
    if status not in ("CHANGED", "SUCCESS"):
        log("%s %s: %s\n%s" % (module, json.dumps(args), status, tail(out)))
    return elapsed, status, out


def cell(result):
    elapsed, status = result[0], result[1]
    word = {"CHANGED": "changed", "SUCCESS": "not changed"}.get(status, "FAILED (%s)" % status.rstrip("!"))
    return "%.1f, %s" % (elapsed, word)


def lookup(host, script):
    """Run a shell snippet on the host; return its stdout lines."""
    _elapsed, status, out = adhoc(host, "ansible.builtin.shell", script)
    if status not in ("CHANGED", "SUCCESS"):
        raise SystemExit("lookup failed on %s: %s" % (host, script))
    return [line.strip() for line in out.split(">>", 1)[-1].splitlines() if line.strip()]


def prepare(host):
    lab("reset", "--no-start", host)
    lab("start", host)
    with tempfile.TemporaryDirectory(prefix="bench-modules-") as tmp:
        playbook = os.path.join(tmp, "prepare.yml")
        with open(playbook, "w", encoding="utf-8") as handle:
            handle.write(PREPARE % {"host": host, "arguments": json.dumps(IOMMU_ARGS)})
        elapsed, code, out = run(["ansible-playbook", "-i", INVENTORY, playbook])
    log("prepare playbook (kernel_cmdline + reboot): %.1f s, rc=%d" % (elapsed, code))
    if code != 0:
        raise SystemExit("preparing %s failed:\n%s" % (host, tail(out, 30)))


def cases(lone_edu, nvme_pf):
    """(module, devices label, present args, cleanup args or None) for each row, in order."""
    both = {"vendors": [EDU], "classes": [EDU_CLASS]}
    return [
        ("ansible.builtin.ping", "- (baseline)", None, None),
        ("gpuops.sandbox.gpu_facts", "1 (%s)" % GROUPED_EDU, {"addresses": [GROUPED_EDU]}, None),
        ("gpuops.sandbox.gpu_facts", "all: 2 edus (vendor/class)", both, None),
        ("gpuops.sandbox.iommu_check", "1 (%s)" % GROUPED_EDU, {"addresses": [GROUPED_EDU]}, None),
        ("gpuops.sandbox.iommu_check", "all: 2 edus (vendor/class)", both, None),
        ("gpuops.sandbox.vfio_bind", "1 (lone edu %s)" % lone_edu, {"addresses": [lone_edu]},
         {"addresses": [lone_edu], "state": "absent"}),
        ("gpuops.sandbox.vfio_bind", "all: 2 edus + HDA (include_group)", dict(both, include_group=True),
         dict(both, include_group=True, state="absent")),
        ("gpuops.sandbox.mdev_create", "1 mtty-1 on mtty", {"type": "mtty-1", "parents": ["mtty"], "count": 1},
         {"type": "mtty-1", "parents": ["mtty"], "state": "absent"}),
        ("gpuops.sandbox.mdev_create", "all: 12 mtty-2 on mtty", {"type": "mtty-2", "parents": ["mtty"], "count": 12},
         {"type": "mtty-2", "parents": ["mtty"], "state": "absent"}),
        ("gpuops.sandbox.sriov_vfs", "1 VF on %s" % nvme_pf, {"pf": nvme_pf, "count": 1, "autoprobe": False},
         {"pf": nvme_pf, "count": 0}),
        ("gpuops.sandbox.sriov_vfs", "all: 4 VFs on %s" % nvme_pf, {"pf": nvme_pf, "count": 4, "autoprobe": False},
         {"pf": nvme_pf, "count": 0, "autoprobe": True}),
    ]


def start_clean(host, lone_edu, nvme_pf):
    """With --skip-prepare, undo what an earlier run may have left (not timed)."""
    for module, args in (
            ("gpuops.sandbox.vfio_bind", {"addresses": [lone_edu, GROUPED_EDU], "include_group": True,
                                          "state": "absent"}),
            ("gpuops.sandbox.mdev_create", {"type": "mtty-1", "parents": ["mtty"], "state": "absent"}),
            ("gpuops.sandbox.mdev_create", {"type": "mtty-2", "parents": ["mtty"], "state": "absent"}),
            ("gpuops.sandbox.sriov_vfs", {"pf": nvme_pf, "count": 0, "autoprobe": True, "force": True})):
        adhoc(host, module, args)


def short(module):
    return module.rsplit(".", 1)[-1]


def print_table(title, header, rows):
    print("\n%s\n" % title)
    print("| %s |" % " | ".join(header))
    print("|%s|" % "|".join(["---"] * len(header)))
    for row in rows:
        print("| %s |" % " | ".join(row))


def lab_host_parser(doc, more=()):
    """The arguments of a benchmark on a lab host: --host, then ``more`` ((flags, keywords) pairs), --skip-prepare
    and --keep; the description is the first paragraph of ``doc``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--host", default="lab-modules", help="lab host to use (default: lab-modules, the spare host)")
    for flags, keywords in more:
        parser.add_argument(*flags, **keywords)
    parser.add_argument("--skip-prepare", action="store_true",
                        help="reuse a running host whose IOMMU is already on (no reset, start or reboot)")
    parser.add_argument("--keep", action="store_true", help="leave the host as it is at the end (no reset)")
    return parser


def main():
    args = lab_host_parser(__doc__).parse_args()
    host = args.host
    started = time.time()
    rows, cleanups = [], []
    try:
        if not args.skip_prepare:
            prepare(host)
        edus = lookup(host, FIND_PCI % ("0x1234 0x11e8", ""))
        lone = [a for a in edus if a != GROUPED_EDU]
        pfs = lookup(host, FIND_PCI % (NVME_PF, ' && [ -e "$d/sriov_totalvfs" ]'))
        if len(lone) != 1 or len(pfs) != 1:
            raise SystemExit("expected one lone edu and one nvme PF on %s, found %s and %s" % (host, lone, pfs))
        log("lone edu %s, nvme PF %s" % (lone[0], pfs[0]))
        if args.skip_prepare:
            start_clean(host, lone[0], pfs[0])
        for module, devices, present, cleanup in cases(lone[0], pfs[0]):
            first = adhoc(host, module, present)
            again = adhoc(host, module, present)
            log("%s %s: first %s; re-run %s" % (short(module), devices, cell(first), cell(again)))
            rows.append((short(module), devices, cell(first), cell(again)))
            if cleanup is not None:
                undo = adhoc(host, module, cleanup)
                log("%s %s cleanup: %s" % (short(module), devices, cell(undo)))
                cleanups.append((short(module), devices, json.dumps(cleanup), cell(undo)))
        rerun = adhoc(host, "gpuops.sandbox.kernel_cmdline", {"arguments": IOMMU_ARGS})
        rows.append(("kernel_cmdline", "- (host-wide; one size, re-run only)", "- (done by the prepare playbook)",
                     cell(rerun)))
    finally:
        if not args.keep:
            lab("reset", "--no-start", host)
    print_table("Wall time of one `ansible %s -m MODULE -a JSON` call on %s (seconds, changed?)" % (host, host),
                ["module", "devices", "first run (s, changed?)", "re-run (s, changed?)"], rows)
    print_table("Cleanup after each size (one call each)", ["module", "devices", "cleanup arguments", "time (s, changed?)"],
                cleanups)
    print("\nTotal %.0f s. Software emulation (TCG) and a busy machine: a second or more of noise per call."
          % (time.time() - started))


if __name__ == "__main__":
    main()
