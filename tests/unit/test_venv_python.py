# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""scripts/venv-python.sh: which interpreter `make venv` builds the environment from."""

import os
import subprocess
import sys

TOP = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(TOP, "scripts", "venv-python.sh")


def pick(env_extra):
    env = {k: v for k, v in os.environ.items() if k != "GPUOPS_PYTHON_CANDIDATES"}
    env.update(env_extra)
    done = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def stand_in(tmp_path, name, usable=True):
    """An interpreter that answers the script's check as a real one would: exit 0 only when it is 3.11 or newer
    with venv and ensurepip."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\nexit %d\n" % (0 if usable else 1))
    path.chmod(0o755)
    return str(path)


def test_the_first_usable_distribution_interpreter_is_taken(tmp_path):
    old = stand_in(tmp_path, "python-old", usable=False)
    novenv = stand_in(tmp_path, "python-novenv", usable=False)
    good = stand_in(tmp_path, "python-good")
    later = stand_in(tmp_path, "python-later")
    assert pick({"GPUOPS_PYTHON_CANDIDATES": " ".join([old, novenv, good, later])}) == good


def test_without_a_usable_candidate_the_first_python3_on_path_is_used(tmp_path):
    old = stand_in(tmp_path, "python-old", usable=False)
    missing = str(tmp_path / "absent")
    assert pick({"GPUOPS_PYTHON_CANDIDATES": " ".join([old, missing])}) == "python3"


def test_an_interpreter_named_by_the_user_is_taken_as_is():
    """PY in the environment (as `make PY=...`) is what the Makefile builds the environment from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    env["PY"] = "/opt/py/bin/python3.12"
    done = subprocess.run(["make", "-s", "-C", TOP, "--eval", "print-py: ; @echo $(PY)", "print-py"], env=env,
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "/opt/py/bin/python3.12"


def test_the_check_runs_the_candidate_itself():
    """The real interpreter running these tests (3.11 or newer, with venv) passes the script's own check."""
    assert sys.version_info >= (3, 11)
    assert pick({"GPUOPS_PYTHON_CANDIDATES": sys.executable}) == sys.executable
