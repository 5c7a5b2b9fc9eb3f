#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Host preparation per workload type on the lab: reboots, tasks and wall time; prints a table. Measures only.

For each lab host (one per workload type; the three run at the same time), from the pristine image:
  1. the first converge: `ansible-playbook playbooks/prepare_hosts.yml --limit HOST` (reboots allowed);
  2. the no-op re-run: the same command again;
  3. a play that only gathers facts (`gather_facts: true`, no task) on the same host.
Reported per host: reboots (reboot tasks that ran) and tasks (ok in the PLAY RECAP, which counts
the tasks that ran, skipped ones apart) of runs 1 and 2, their wall times, and run 2 / run 3 (goal: <= 2).

Run with the .venv python (`make bench-hosts`). --hosts picks hosts; --keep leaves them running as prepared,
otherwise they are reset to the pristine image at the end. Software emulation and a busy machine make the
numbers noisy: compare runs made on the same machine at the same time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
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
HOSTS = {"lab-container": "container", "lab-passthrough": "vm-passthrough", "lab-vgpu": "vm-vgpu"}
REBOOT_RE = re.compile(r"TASK \[[^\]]*Reboot once[^\]]*\][^\n]*\n(?:(?![^\n]*TASK \[)[^\n]*\n)*?[^\n]*changed: ")
FACTS_PLAY = "- name: Gather facts only\n  hosts: all\n  gather_facts: true\n  tasks: []\n"


def env():
    full = dict(os.environ)
    full["PATH"] = VENV_BIN + os.pathsep + full.get("PATH", "")
    full.setdefault("ANSIBLE_CONFIG", os.path.join(TOP, "ansible.cfg"))
    full["ANSIBLE_FORCE_COLOR"] = "0"
    return full


def timed(cmd):
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=TOP, env=env(), text=True, check=False, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - started


def recap(out, host):
    line = re.search(r"^%s\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(host),
                     out, re.M)
    if not line:
        return None
    ok, changed, unreachable, failed = (int(x) for x in line.groups())
    return {"ok": ok, "changed": changed, "failed": failed + unreachable}


def bench_host(host, facts_file):
    prepare = ["ansible-playbook", "playbooks/prepare_hosts.yml", "-i", "inventories/lab/", "--limit", host]
    runs = {}
    for name, cmd in (("first", prepare), ("noop", prepare),
                      ("facts", ["ansible-playbook", facts_file, "-i", "inventories/lab/", "--limit", host])):
        proc, seconds = timed(cmd)
        result = recap(proc.stdout, host)
        if proc.returncode != 0 or result is None or result["failed"]:
            return host, {"error": "%s run failed (rc=%s):\n%s" % (name, proc.returncode, proc.stdout[-3000:])}
        result.update(seconds=seconds, reboots=len(REBOOT_RE.findall(proc.stdout)))
        runs[name] = result
    return host, runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", nargs="*", default=list(HOSTS), choices=list(HOSTS))
    parser.add_argument("--keep", action="store_true", help="leave the hosts running as prepared")
    args = parser.parse_args()
    for host in args.hosts:
        subprocess.run(LAB + ["reset", "--no-start", host], cwd=TOP, check=True)
    subprocess.run(LAB + ["start"] + args.hosts, cwd=TOP, check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as handle:
        handle.write(FACTS_PLAY)
        facts_file = handle.name
    try:
        with concurrent.futures.ThreadPoolExecutor(len(args.hosts)) as pool:
            results = dict(pool.map(lambda h: bench_host(h, facts_file), args.hosts))
    finally:
        os.unlink(facts_file)
        if not args.keep:
            for host in args.hosts:
                subprocess.run(LAB + ["reset", "--no-start", host], cwd=TOP, check=False)
    print("%-16s %-15s %8s %8s %9s %8s %8s %9s %8s %7s" % (
        "HOST", "TYPE", "REBOOTS1", "TASKS1", "TIME1(s)", "REBOOTS2", "TASKS2", "TIME2(s)", "FACTS(s)", "RATIO"))
    status = 0
    for host in args.hosts:
        runs = results[host]
        if "error" in runs:
            print("%-16s %-15s %s" % (host, HOSTS[host], runs["error"]))
            status = 1
            continue
        first, noop, facts = runs["first"], runs["noop"], runs["facts"]
        print("%-16s %-15s %8d %8d %9.0f %8d %8d %9.1f %8.1f %7.2f" % (
            host, HOSTS[host], first["reboots"], first["ok"], first["seconds"],
            noop["reboots"], noop["ok"], noop["seconds"], facts["seconds"],
            noop["seconds"] / facts["seconds"]))
    print("TASKS: tasks that ran (ok in the PLAY RECAP, which includes changed ones); RATIO: no-op re-run time / facts-only play time "
          "(goal <= 2); the no-op run also reported changed=%s." % ",".join(
              str(results[h]["noop"]["changed"]) for h in args.hosts if "error" not in results[h]))
    return status


if __name__ == "__main__":
    sys.exit(main())
