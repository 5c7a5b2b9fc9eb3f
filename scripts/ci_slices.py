#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which deep slices CI runs beside the landing tier (.ci/run), and the record of what ran.

    ci_slices.py pick     the slices for the checkout's HEAD, comma-separated on stdout; why, on stderr
    ci_slices.py record   --slices a,b --rc N --seconds S: what a CI run did, into the machine's record (with how
                          the integration tier itself ended, from .build/integration.result when it ran)

The slices and their recorded costs are tests/integration/tiers.py. A slice is picked, in this order of priority:
  1. overdue: the record of this machine's CI runs has two passed runs since it last passed in one (so every deep
     claim runs at least every third landing on a machine that keeps its record, as long as the budget admits
     the overdue slices together); the longest overdue first;
  2. changed: a path it proves changed since the last passed run recorded here (its commit an ancestor of HEAD); with
     no such run, in the last CHANGED_WINDOW commits;
  3. rotation: the slice at index (the number of commits in HEAD's history) modulo the number of slices;
  4. room: every other slice, from the rotation's on, while the budget has room for it (so a machine whose record
     was lost, or a landing with none of the above, still runs every slice the budget holds).
The record is this machine's runs with, before them, the landings the project keeps in .ci/landings.json (the same
format; a developer adds CI's run of each landing from what CI reported), so a new machine, or one whose cache was
emptied, still finds the slices overdue.
Each is admitted only while the predicted time of the whole run (the quick tiers, the landing tier and the slices
admitted so far, in recorded core-seconds over the machine's cores, scaled by how the last passed run's time
compared with its own prediction) stays within the budget (GPUOPS_CI_BUDGET_MINUTES, 55 by default: CI's limit is
90, and a landing should take 60 minutes or less). The same HEAD and record give the same slices: the decision is
printed with its reasons.

A run whose integration tier passed counts as passed for the slices and the scale even when a quick tier beside it
failed (the lab's work ran to its end, so its slices were proven and its time is the tier's): the record keeps the
integration tier's own exit status beside the run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TOP, "tests", "integration"))
import tiers  # noqa: E402  pylint: disable=wrong-import-position

BUDGET_MINUTES = 55.0
CHANGED_WINDOW = 20
OVERDUE_AFTER = 2
KEEP_RUNS = 30
# How far the last run's own time may move the prediction (a slow hour, a faster machine).
SCALE_LIMITS = (0.8, 1.6)
# The landings CI ran, kept in the tree (CI's record on a machine is lost with the machine).
LANDINGS = os.path.join(TOP, ".ci", "landings.json")
# Written by the Makefile's integration recipe when the tier ends: {"rc": N, "seconds": S}.
INTEGRATION_RESULT = os.path.join(TOP, ".build", "integration.result")


def state_file(environ=None):
    environ = os.environ if environ is None else environ
    if environ.get("GPUOPS_CI_STATE"):
        return environ["GPUOPS_CI_STATE"]
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "gpuops-sandbox", "ci", "history.json")


def read_history(path):
    """The recorded runs, oldest first; [] when there is no record or it cannot be read (said on stderr)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return []
    except (OSError, ValueError, RecursionError) as exc:
        print("ci_slices: the record %s is unreadable (%s); going by the commit alone" % (path, exc), file=sys.stderr)
        return []
    runs = data.get("runs") if isinstance(data, dict) else None
    return [run for run in runs if isinstance(run, dict)] if isinstance(runs, list) else []


def merged_history(landings, machine):
    """The landings the tree keeps that this machine's record lacks (older: they were recorded before it, or on another
    machine), then the machine's own runs."""
    known = {run.get("commit") for run in machine}
    return [run for run in landings if run.get("commit") not in known] + list(machine)


def git(*args):
    return subprocess.run(["git"] + list(args), cwd=TOP, check=True, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL).stdout


def is_ancestor(commit):
    return subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=TOP, check=False,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def integration_passed(run):
    """Whether a recorded run's integration tier, with its slices, passed (the whole run, or the tier alone)."""
    return run.get("rc") == 0 or run.get("integration_rc") == 0


def changed_paths(history):
    """(the paths changed since the base, a description of the base)."""
    passed = [run for run in history if integration_passed(run) and run.get("commit")]
    for run in reversed(passed):
        if is_ancestor(run["commit"]):
            return git("diff", "--name-only", run["commit"], "HEAD").split(), "the last passed run (%s)" % (
                run["commit"][:12])
    count = int(git("rev-list", "--count", "HEAD").strip())
    if count > CHANGED_WINDOW:
        base = "HEAD~%d" % CHANGED_WINDOW
        why = "the last %d commits (no passed run recorded here is in HEAD's history)" % CHANGED_WINDOW
        return git("diff", "--name-only", base, "HEAD").split(), why
    return git("ls-files").split(), "the whole tree (a history of %d commits)" % count


def scale_of(history, cores=None):
    """How the last passed run's seconds compared with its prediction, within SCALE_LIMITS (1.0 without one).

    With ``cores``, the prediction is the one today's recorded costs (tests/integration/tiers.py) make for that run's
    slices, not the one stored when it ran: once the costs are refitted to that run, its scale is 1 again instead
    of correcting the refitted costs a second time."""
    for run in reversed(history):
        if integration_passed(run) and run.get("predicted_seconds") and run.get("seconds"):
            predicted = float(run["predicted_seconds"])
            if cores and isinstance(run.get("slices"), list) and all(n in tiers.SLICES for n in run["slices"]):
                predicted = predicted_seconds(run["slices"], cores)
            ratio = float(run["seconds"]) / predicted
            return min(max(ratio, SCALE_LIMITS[0]), SCALE_LIMITS[1])
    return 1.0


def predicted_seconds(slices, cores, scale=1.0):
    core_seconds = tiers.COSTS["checks"]["core_seconds"] + tiers.COSTS[tiers.LANDING]["core_seconds"]
    core_seconds += sum(tiers.SLICES[name]["core_seconds"] for name in slices)
    return core_seconds / float(cores) * scale


def pick(count, changed, history, cores, budget_minutes=BUDGET_MINUTES):
    """(the slices to run, in tiers.SLICES order, and a list of (slice, verdict, reason) lines).

    `count`: the number of commits in HEAD's history; `changed`: the paths changed since the base (see
    changed_paths); `history`: the recorded runs, oldest first."""
    names = list(tiers.SLICES)
    wanted = []  # (slice, reason), by priority
    passed = [run for run in history if integration_passed(run)]
    if len(passed) >= OVERDUE_AFTER:
        overdue = []
        for name in names:
            since = 0
            for run in reversed(passed):
                if name in run.get("slices", []):
                    break
                since += 1
            if since >= OVERDUE_AFTER:
                overdue.append((since, name))
        # The longest overdue first: when the budget admits only some, the others are the first the next run takes.
        for since, name in sorted(overdue, key=lambda item: -item[0]):
            wanted.append((name, "overdue: not in the last %d passed runs on record" % since))
    for name in names:
        hits = tiers.paths_match(tiers.SLICES[name]["paths"], changed)
        if hits:
            wanted.append((name, "changed: %s%s" % (", ".join(hits[:4]), " and %d more" % (len(hits) - 4)
                                                    if len(hits) > 4 else "")))
    rotation = names[count % len(names)]
    wanted.append((rotation, "rotation: commit %d of the history, %d modulo %d slices" % (count, count % len(names),
                                                                                          len(names))))
    start = count % len(names)
    for name in names[start:] + names[:start]:
        wanted.append((name, "room: the budget holds it"))
    scale = scale_of(history, cores)
    budget = budget_minutes * 60
    chosen, lines = [], []
    for name, reason in wanted:
        if name in chosen:
            continue
        seconds = predicted_seconds(chosen + [name], cores, scale)
        if seconds <= budget:
            chosen.append(name)
            lines.append((name, "runs", "%s (run predicted at %.0f min)" % (reason, seconds / 60)))
        elif all(name != line[0] for line in lines):
            lines.append((name, "left out", "%s, but the run would be predicted at %.0f min, past the %.0f-min "
                                            "budget" % (reason, seconds / 60, budget_minutes)))
    return [name for name in names if name in chosen], lines


def cmd_pick(args):
    history = merged_history(read_history(args.landings), read_history(args.state))
    count = int(git("rev-list", "--count", "HEAD").strip())
    changed, base = changed_paths(history)
    cores = args.cores or os.cpu_count() or 2
    budget = float(os.environ.get("GPUOPS_CI_BUDGET_MINUTES") or BUDGET_MINUTES)
    chosen, lines = pick(count, changed, history, cores, budget)
    print("ci_slices: HEAD %s, %d commits; changes since %s; %d cores; prediction scale %.2f" % (
        git("rev-parse", "--short=12", "HEAD").strip(), count, base, cores, scale_of(history, cores)), file=sys.stderr)
    for name, verdict, reason in lines:
        print("ci_slices:   %-8s %-10s %s" % (name, verdict, reason), file=sys.stderr)
    print(",".join(chosen))
    return 0


def integration_result(path):
    """{"integration_rc": N, "integration_seconds": S} from the file the Makefile's integration recipe writes when
    the tier ends; {} when it did not run (or the file cannot be read, said on stderr)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return {"integration_rc": int(data["rc"]), "integration_seconds": round(float(data["seconds"]))}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print("ci_slices: the integration result %s is unreadable (%s); recording the run's status alone"
              % (path, exc), file=sys.stderr)
        return {}


def cmd_record(args):
    history = read_history(args.state)
    slices = tiers.parse_slices(args.slices)
    cores = args.cores or os.cpu_count() or 2
    run = {"commit": git("rev-parse", "HEAD").strip(), "slices": slices, "rc": args.rc,
           "seconds": round(args.seconds), "predicted_seconds": round(predicted_seconds(slices, cores)),
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    run.update(integration_result(args.integration_result))
    history.append(run)
    os.makedirs(os.path.dirname(args.state), exist_ok=True)
    temporary = args.state + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump({"runs": history[-KEEP_RUNS:]}, handle, indent=1)
    os.replace(temporary, args.state)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--state", default=state_file(), help="this machine's record of CI runs")
    parser.add_argument("--cores", type=int, default=0, help="the machine's cores (default: os.cpu_count())")
    parser.add_argument("--landings", default=LANDINGS, help="the landings the tree keeps (default: .ci/landings.json)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pick", help="the slices for HEAD")
    record = sub.add_parser("record", help="record what a CI run did")
    record.add_argument("--slices", default="")
    record.add_argument("--rc", type=int, required=True)
    record.add_argument("--seconds", type=float, required=True)
    record.add_argument("--integration-result", default=INTEGRATION_RESULT,
                        help="what the integration tier wrote when it ended (default: .build/integration.result)")
    args = parser.parse_args(argv)
    try:
        return cmd_pick(args) if args.command == "pick" else cmd_record(args)
    except (subprocess.CalledProcessError, ValueError, OSError) as exc:
        print("ci_slices: %s" % exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
