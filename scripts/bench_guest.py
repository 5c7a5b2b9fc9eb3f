#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Time guest_attach_probe on a lab host: a paused guest and a full boot with the stand-in devices. Measures only.

The host (default lab-modules, the spare host) is reset to the pristine image and started, then one small playbook
turns the IOMMU on (gpuops.sandbox.kernel_cmdline with intel_iommu=on iommu=pt, then ansible.builtin.reboot).
A second playbook binds the edu at 0000:00:03.0 and its HDA sibling to vfio-pci (vfio_bind, include_group),
creates one mtty-1 mediated device, then starts guests with the three passed through:

  paused     --repeat times (default 3): QEMU -S, asked over QMP (query-pci), then quit
  boot       once, accel auto (KVM when the lab VM's /dev/kvm creates VMs, else software emulation)
  boot tcg   once, accel tcg: software emulation inside the software-emulated lab VM (--no-tcg-boot leaves it out)

and gives everything back. For each it prints the task's wall time (the Ansible task: SSH, the module's start-up and
the guest) and the module's own `seconds` (QEMU's start until it was gone). Run with the .venv python.
--skip-prepare reuses a running host whose IOMMU is already on; --keep leaves the host as it is at the end,
otherwise it ends with `gpulab reset --no-start HOST`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime

# The lab paths and the IOMMU play are bench_modules.py's (beside this script).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_modules import INVENTORY, IOMMU_ARGS, LAB, PREPARE, TOP, VENV_BIN, lab_host_parser  # noqa: E402  pylint: disable=wrong-import-position

EDU = "0000:00:03.0"
HDA = "0000:00:03.1"
GUESTS = """---
- name: Start guests with the stand-in devices
  hosts: %(host)s
  gather_facts: false
  tasks:
    - name: Bind the edu and its HDA sibling to vfio-pci
      gpuops.sandbox.vfio_bind:
        addresses: ["%(edu)s"]
        include_group: true
    - name: Create one mtty device
      gpuops.sandbox.mdev_create:
        type: mtty-1
        parents: [mtty]
        count: 1
      register: bench_mdev
    - name: Start the guests
      block:
%(probes)s
      always:
        - name: Remove the mtty devices
          gpuops.sandbox.mdev_create:
            type: mtty-1
            parents: [mtty]
            state: absent
        - name: Give the edu and the HDA function back
          gpuops.sandbox.vfio_bind:
            addresses: ["%(edu)s"]
            include_group: true
            state: absent
"""
PROBE = """        - name: "bench %(label)s"
          gpuops.sandbox.guest_attach_probe:
            devices: ["%(edu)s", "%(hda)s"]
            mdevs: ["{{ bench_mdev.devices[0].uuid }}"]
            mode: %(mode)s
            accel: %(accel)s
            timeout: %(timeout)d
            fail_on_problem: false
"""


def ansible_env(json_output=False):
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_CONFIG"] = os.path.join(TOP, "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    if json_output:
        env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    return env


def log(msg):
    print("bench-guest: " + msg, flush=True)


def run(cmd, timeout=3600, json_output=False):
    """Run cmd in TOP; return (seconds, returncode, stdout, stderr)."""
    started = time.time()
    try:
        proc = subprocess.run(cmd, cwd=TOP, env=ansible_env(json_output), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False, timeout=timeout)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = -1, exc.stdout or "", "timed out after %ss" % timeout
    return time.time() - started, code, out if isinstance(out, str) else out.decode(), err or ""


def tail(text, lines=20):
    return "\n".join(text.strip().splitlines()[-lines:])


def lab(*args):
    elapsed, code, out, err = run(LAB + list(args))
    log("gpulab %s: %.1f s, rc=%d" % (" ".join(args), elapsed, code))
    if code != 0:
        raise SystemExit("gpulab %s failed:\n%s" % (" ".join(args), tail(out + err)))


def playbook(text, name, json_output=False, timeout=3600):
    with tempfile.TemporaryDirectory(prefix="bench-guest-") as tmp:
        path = os.path.join(tmp, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return run(["ansible-playbook", "-i", INVENTORY, path], timeout=timeout, json_output=json_output)


def prepare(host):
    lab("reset", "--no-start", host)
    lab("start", host)
    elapsed, code, out, err = playbook(PREPARE % {"host": host, "arguments": json.dumps(IOMMU_ARGS)}, "prepare.yml")
    log("prepare playbook (kernel_cmdline + reboot): %.1f s, rc=%d" % (elapsed, code))
    if code != 0:
        raise SystemExit("preparing %s failed:\n%s" % (host, tail(out + err, 30)))


def seconds_between(start, end):
    """Seconds between two times of the JSON callback (ISO 8601 with a Z)."""
    return (datetime.fromisoformat(end.rstrip("Z")) - datetime.fromisoformat(start.rstrip("Z"))).total_seconds()


def probes(repeat, tcg_boot):
    """(label, mode, accel, timeout) of each guest, in order."""
    rows = [("paused #%d" % (n + 1), "paused", "auto", 300) for n in range(repeat)]
    rows.append(("boot", "boot", "auto", 900))
    if tcg_boot:
        rows.append(("boot tcg", "boot", "tcg", 900))
    return rows


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main():
    args = lab_host_parser(__doc__, (
        (("--repeat",), {"type": int, "default": 3, "help": "paused guests to time (default 3)"}),
        (("--no-tcg-boot",), {"action": "store_true", "help": "leave out the boot under software emulation"}),
    )).parse_args()
    host = args.host
    started = time.time()
    rows = []
    try:
        if not args.skip_prepare:
            prepare(host)
        plan = probes(max(args.repeat, 1), not args.no_tcg_boot)
        text = GUESTS % {"host": host, "edu": EDU, "probes": "".join(
            PROBE % {"label": label, "edu": EDU, "hda": HDA, "mode": mode, "accel": accel, "timeout": timeout}
            for label, mode, accel, timeout in plan)}
        elapsed, code, out, err = playbook(text, "guests.yml", json_output=True, timeout=7200)
        log("guests playbook: %.1f s, rc=%d" % (elapsed, code))
        try:
            report = json.loads(out)
        except ValueError:
            raise SystemExit("the guests playbook gave no JSON report (rc=%d):\n%s" % (code, tail(out + err, 30)))
        for task in report["plays"][0]["tasks"]:
            name = task["task"]["name"]
            if not name.startswith("bench "):
                continue
            result = task["hosts"].get(host, {})
            wall = seconds_between(task["task"]["duration"]["start"], task["task"]["duration"]["end"])
            seen = sum(1 for dev in result.get("devices", []) if dev.get("seen"))
            rows.append((name[len("bench "):], result.get("accel", "?"), wall, result.get("seconds"),
                         "%d of %d" % (seen, len(result.get("devices", []))),
                         result.get("qemu_end") or result.get("msg", "")[:80]))
            log("%s (%s): task %.1f s, QEMU %s s, %s seen, %s" % rows[-1])
        if code != 0:
            raise SystemExit("the guests playbook failed (rc=%d):\n%s" % (code, tail(err, 30)))
    finally:
        if not args.keep:
            lab("reset", "--no-start", host)
    print("\nguest_attach_probe on %s: the edu, its HDA sibling and one mtty device passed through\n" % host)
    print("| guest | accel | task wall time (s) | QEMU start to gone (s) | devices seen | QEMU ended |")
    print("|---|---|---|---|---|---|")
    for label, accel, wall, qemu_seconds, seen, end in rows:
        print("| %s | %s | %.1f | %s | %s | %s |" % (label, accel, wall, qemu_seconds, seen, end))
    paused = [row for row in rows if row[0].startswith("paused")]
    if paused:
        print("\npaused: median task %.1f s, median QEMU %.2f s" % (
            median([row[2] for row in paused]), median([row[3] or 0 for row in paused])))
    print("Total %.0f s. The lab runs under software emulation on a possibly busy machine: expect noise."
          % (time.time() - started))


if __name__ == "__main__":
    main()
