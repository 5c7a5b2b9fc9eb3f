#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Host preparation per workload type on the lab: reboots, tasks and wall time; prints a table. Measures only.

For each lab host (one per workload type), from the pristine image:
  1. the first converge: `ansible-playbook playbooks/prepare_hosts.yml --limit HOST` (reboots allowed),
     the three hosts at the same time;
  2. the no-op re-run: the same command again;
  3. a play that only gathers facts (`gather_facts: true`, no task) on the same host.
Runs 2 and 3 are timed one at a time (one host, one play: nothing else competes for the emulated CPUs),
alternating, --repeat times each; their medians are reported. Reported per host: reboots (reboot tasks
that ran) and tasks (ok in the PLAY RECAP, which counts the tasks that ran, skipped ones apart) of runs 1
and 2, their wall times, and run 2 / run 3 (goal: <= 2).

Run with the .venv python (`make bench-hosts`). --hosts picks hosts; --prepared skips the reset and the
first converge (hosts already prepared, e.g. as the tests leave them); --keep leaves them running as
prepared, otherwise they are reset to the pristine image at the end. Software emulation makes the
numbers noisy: compare runs made on the same machine at the same time, with nothing else running.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import statistics
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


def measured(name, cmd, host):
    proc, seconds = timed(cmd)
    result = recap(proc.stdout, host)
    if proc.returncode != 0 or result is None or result["failed"]:
        raise RuntimeError("%s run failed (rc=%s):\n%s" % (name, proc.returncode, proc.stdout[-3000:]))
    result.update(seconds=seconds, reboots=len(REBOOT_RE.findall(proc.stdout)))
    return result


def prepare_cmd(host):
    return ["ansible-playbook", "playbooks/prepare_hosts.yml", "-i", "inventories/lab/", "--limit", host]


def first_converge(host):
    try:
        return host, measured("first", prepare_cmd(host), host)
    except RuntimeError as exc:
        return host, {"error": str(exc)}


def quiet_runs(host, facts_file, repeat):
    """The no-op re-run and the facts-only play, alternating, one at a time; the median of each."""
    noops, facts = [], []
    try:
        for _attempt in range(repeat):
            noops.append(measured("noop", prepare_cmd(host), host))
            facts.append(measured("facts", ["ansible-playbook", facts_file, "-i", "inventories/lab/", "--limit", host], host))
    except RuntimeError as exc:
        return {"error": str(exc)}
    noop = dict(noops[-1], seconds=statistics.median(r["seconds"] for r in noops),
                reboots=max(r["reboots"] for r in noops), changed=max(r["changed"] for r in noops),
                spread=(min(r["seconds"] for r in noops), max(r["seconds"] for r in noops)))
    fact = dict(facts[-1], seconds=statistics.median(r["seconds"] for r in facts),
                spread=(min(r["seconds"] for r in facts), max(r["seconds"] for r in facts)))
    return {"noop": noop, "facts": fact}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", nargs="*", default=list(HOSTS), choices=list(HOSTS))
    parser.add_argument("--keep", action="store_true", help="leave the hosts running as prepared")
    parser.add_argument("--prepared", action="store_true",
                        help="the hosts are already prepared: no reset, no first converge (implies --keep)")
    parser.add_argument("--repeat", type=int, default=3, help="timed no-op and facts-only runs per host (median)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1, got %d" % args.repeat)
    if not args.prepared:
        for host in args.hosts:
            subprocess.run(LAB + ["reset", "--no-start", host], cwd=TOP, check=True)
    subprocess.run(LAB + ["start"] + args.hosts, cwd=TOP, check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as handle:
        handle.write(FACTS_PLAY)
        facts_file = handle.name
    results = {host: {} for host in args.hosts}
    try:
        if not args.prepared:
            with concurrent.futures.ThreadPoolExecutor(len(args.hosts)) as pool:
                for host, first in pool.map(first_converge, args.hosts):
                    results[host] = {"error": first["error"]} if "error" in first else {"first": first}
        for host in args.hosts:
            if "error" not in results[host]:
                results[host].update(quiet_runs(host, facts_file, args.repeat))
    finally:
        os.unlink(facts_file)
        if not (args.keep or args.prepared):
            for host in args.hosts:
                subprocess.run(LAB + ["reset", "--no-start", host], cwd=TOP, check=False)
    print("%-16s %-15s %8s %8s %9s %8s %8s %9s %8s %7s  %s" % (
        "HOST", "TYPE", "REBOOTS1", "TASKS1", "TIME1(s)", "REBOOTS2", "TASKS2", "TIME2(s)", "FACTS(s)", "RATIO",
        "SPREAD2/FACTS(s)"))
    status = 0
    for host in args.hosts:
        runs = results[host]
        if "error" in runs:
            print("%-16s %-15s %s" % (host, HOSTS[host], runs["error"]))
            status = 1
            continue
        first, noop, facts = runs.get("first"), runs["noop"], runs["facts"]
        print("%-16s %-15s %8s %8s %9s %8d %8d %9.1f %8.1f %7.2f  %.1f-%.1f / %.1f-%.1f" % (
            host, HOSTS[host], first["reboots"] if first else "-", first["ok"] if first else "-",
            "%.0f" % first["seconds"] if first else "-",
            noop["reboots"], noop["ok"], noop["seconds"], facts["seconds"], noop["seconds"] / facts["seconds"],
            noop["spread"][0], noop["spread"][1], facts["spread"][0], facts["spread"][1]))
    print("TASKS: tasks that ran (ok in the PLAY RECAP, which includes changed ones); TIME2, FACTS: medians of %d runs "
          "one at a time; RATIO: no-op re-run / facts-only play (goal <= 2); the no-op runs reported changed=%s." % (
              args.repeat, ",".join(str(results[h]["noop"]["changed"]) for h in args.hosts if "error" not in results[h])))
    return status


if __name__ == "__main__":
    sys.exit(main())
