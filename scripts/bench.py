#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Measure the lab and the test ladder; print a table. Measures only: it asserts nothing.

  image-cold     build the image with an empty cache (downloads every package again)
  image-rebuild  rebuild it with the package and mtty caches warm
  image-warm     `gpulab image` when a valid image is cached (the check only)
  boot-to-ssh    reset one lab host and start it: QEMU launch to SSH answering
  tier-*         wall time of each tier of `make test` (lint, sanity, unit, integration)

Run through `make bench` (or with the .venv python). --only picks measurements, e.g.
`--only boot-to-ssh,tier-unit`. The cold build uses a temporary cache, so the real one is untouched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB = [sys.executable, os.path.join(TOP, "lab", "gpulab.py")]
ALL = ["image-cold", "image-rebuild", "image-warm", "boot-to-ssh",
       "tier-lint", "tier-sanity", "tier-unit", "tier-integration"]


def timed(cmd, env=None):
    full_env = dict(os.environ)
    full_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full_env.get("PATH", "")
    full_env.update(env or {})
    started = time.time()
    proc = subprocess.run(cmd, cwd=TOP, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    elapsed = time.time() - started
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-10:])
        return elapsed, "failed (rc=%d): %s" % (proc.returncode, tail)
    return elapsed, "ok"


def measure(name, host):
    if name == "image-cold":
        cache = tempfile.mkdtemp(prefix="gpulab-cold-")
        try:
            return timed(LAB + ["image"], env={"GPUOPS_LAB_CACHE": cache})
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    if name == "image-rebuild":
        return timed(LAB + ["image", "--rebuild"])
    if name == "image-warm":
        return timed(LAB + ["image"])
    if name == "boot-to-ssh":
        result = timed(LAB + ["reset", "--no-start", host])
        if result[1] != "ok":
            return result
        return timed(LAB + ["start", host])
    if name.startswith("tier-"):
        return timed(["make", "--no-print-directory", name[len("tier-"):]])
    raise SystemExit("unknown measurement %s; known: %s" % (name, ", ".join(ALL)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--only", default=",".join(ALL), help="comma-separated measurements (default: all)")
    parser.add_argument("--host", default="lab-container", help="lab host for boot-to-ssh")
    args = parser.parse_args()
    rows = []
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        print("bench: %s ..." % name, flush=True)
        elapsed, status = measure(name, args.host)
        rows.append((name, "%.1f s" % elapsed, status))
        print("bench: %s %.1f s %s" % (name, elapsed, status), flush=True)
    width = max(len(r[0]) for r in rows)
    print("\n| measurement | wall time | result |\n|---|---|---|")
    for name, elapsed, status in rows:
        print("| %s | %s | %s |" % (name.ljust(width), elapsed, status.splitlines()[0]))


if __name__ == "__main__":
    main()
