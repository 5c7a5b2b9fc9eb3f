#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where a test run's CPU time went: each lab host's QEMU, the API server, Ansible on the controller, ...

    cpu_share.py OUTPUT -- COMMAND...

runs COMMAND, samples every process's CPU time from /proc every few seconds while it runs, and then prints (and
writes to OUTPUT as JSON) the CPU seconds of each kind of process, the wall time, and how busy the machine's
cores were. A process that ends between two samples loses at most its last interval. Exits with COMMAND's code.
"""

import json
import os
import re
import subprocess
import sys
import time

INTERVAL = 3.0
TICKS = os.sysconf("SC_CLK_TCK")
SHORT = "shorter than a sample (Ansible workers, kubectl...)"
KINDS = [
    # (kind, pattern on the command line); the first match names the process.
    ("qemu", re.compile(r"qemu-system\S*\s.*-name\s+(\S+)")),
    ("kube-apiserver", re.compile(r"kube-apiserver")),
    ("etcd", re.compile(r"\betcd\b")),
    ("gpu-operator", re.compile(r"gpu-operator|operatorlab")),
    ("go build", re.compile(r"(/go\b|\bgo |/compile |/link |/asm |cgo)")),
    ("molecule", re.compile(r"\bmolecule\b")),
    ("ansible module run (controller)", re.compile(r"AnsiballZ|ansible_\w+_payload|ansible-tmp")),
    ("ansible-playbook", re.compile(r"ansible-playbook|ansible-runner|/bin/ansible\b|ansible-galaxy|ansible-builder")),
    ("ansible-lint, yamllint, sanity", re.compile(r"ansible-lint|yamllint|ansible-test|pylint|pycodestyle")),
    ("helm, kubectl", re.compile(r"/helm\b|\bhelm |kubectl")),
    ("ssh", re.compile(r"^(ssh|sshd|scp)\b|/ssh\b")),
    ("image builds (podman, buildah, registry)", re.compile(r"podman|buildah|docker-registry|registry serve")),
    ("debootstrap, mkfs, apt", re.compile(r"debootstrap|mkfs|apt-get|dpkg")),
    ("docs (sphinx, antsibull)", re.compile(r"sphinx|antsibull|galaxy-importer|importer")),
    ("pytest", re.compile(r"pytest")),
]


def command_line(pid):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def cpu_ticks(pid):
    try:
        with open("/proc/%s/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def kind_of(cmdline):
    for kind, pattern in KINDS:
        match = pattern.search(cmdline)
        if match:
            return "qemu " + match.group(1) if kind == "qemu" else kind
    return "other" if cmdline else "kernel threads"


def machine_ticks():
    with open("/proc/stat") as handle:
        fields = handle.readline().split()[1:]
    values = [int(value) for value in fields]
    return sum(values), values[3] + values[4]


class Sampler:
    def __init__(self):
        self.seen = {}      # pid -> (kind, ticks at the last sample)
        self.totals = {}
        self.start_total, self.start_idle = machine_ticks()

    def sample(self, baseline=False):
        """Add each process's CPU time since the last sample; with ``baseline``, only note where each stands."""
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            ticks = cpu_ticks(name)
            if ticks is None:
                continue
            known = self.seen.get(name)
            if known is None:
                # A process that existed before the run counts only its CPU from now on.
                known = (kind_of(command_line(name)), ticks if baseline else 0)
            kind, last = known
            if ticks > last:
                self.totals[kind] = self.totals.get(kind, 0) + ticks - last
            self.seen[name] = (kind, ticks)

    def report(self, wall):
        total, idle = machine_ticks()
        busy = (total - self.start_total) - (idle - self.start_idle)
        cores = os.cpu_count() or 1
        rows = sorted(self.totals.items(), key=lambda item: -item[1])
        summary = {
            "wall_seconds": round(wall, 1), "cores": cores,
            "busy_core_seconds": round(busy / TICKS, 1),
            "busy_share": round(busy / max(total - self.start_total, 1), 3),
            "kinds": {kind: round(ticks / TICKS, 1) for kind, ticks in rows},
        }
        lines = ["cpu_share: %.0f s wall, cores busy %.0f%% (%.0f core-seconds of %.0f)" % (
            wall, 100 * summary["busy_share"], summary["busy_core_seconds"], wall * cores)]
        # Processes that began and ended between two samples (Ansible's workers and module runs, kubectl,
        # ssh...) are in the machine's busy time but in no row above.
        unseen = max(busy - sum(row[1] for row in rows), 0)
        summary["kinds"][SHORT] = round(unseen / TICKS, 1)
        rows = sorted(rows + [(SHORT, unseen)], key=lambda item: -item[1])
        for kind, ticks in rows:
            if ticks / TICKS >= 1:
                lines.append("  %-48s %8.0f s  %5.1f%%" % (kind, ticks / TICKS, 100.0 * ticks / max(busy, 1)))
        return summary, "\n".join(lines)


def write_report(output, summary):
    try:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2)
        os.replace(output + ".tmp", output)
    except OSError as exc:
        print("cpu_share: could not write %s: %s" % (output, exc), file=sys.stderr)


def main(argv):
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: cpu_share.py OUTPUT -- COMMAND...\n")
        return 2
    output, command = argv[0], argv[2:]
    sampler = Sampler()
    sampler.sample(baseline=True)
    started = time.monotonic()
    timeline = []
    proc = subprocess.Popen(command)  # pylint: disable=consider-using-with
    try:
        while proc.poll() is None:
            time.sleep(INTERVAL)
            sampler.sample()
            # Every minute the report so far, with the totals at each minute: a run stopped from outside (a
            # CI time limit) still leaves where its time went up to then.
            elapsed = time.monotonic() - started
            if elapsed >= 60 * (len(timeline) + 1):
                summary = sampler.report(elapsed)[0]
                timeline.append({"at": round(elapsed), "busy": summary["busy_core_seconds"], "kinds": summary["kinds"]})
                summary["timeline"], summary["returncode"] = timeline, None
                write_report(output, summary)
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
    sampler.sample()
    summary, text = sampler.report(time.monotonic() - started)
    summary["returncode"], summary["timeline"] = proc.returncode, timeline
    print(text, flush=True)
    write_report(output, summary)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
