#!/usr/bin/env bash
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Print the Python interpreter `make venv` builds the environment from: the distribution's own python3 when it is
# 3.11 or newer and can make a virtual environment with pip (venv and ensurepip), else the first python3 on PATH.
#
# Why the distribution's first: Debian (and Fedora, Ubuntu) build CPython with profile-guided optimisation and link
# its executable statically against libpython, where a pyenv build (often the first python3 on PATH) has neither
# by default (`--enable-shared`: every call into the interpreter goes through the shared library's PLT).
# On the same 2-core machine (2026-11-29): unit tests that run playbooks took 24-25.5 CPU-seconds from Debian's
# 3.11.2 against 29-30 from pyenv's 3.11.7, a pure-Python loop 3.7 s against 4.5 s. Ansible on the controller is
# about 40 % of the integration tier's CPU, so the interpreter is a large part of the test command's time.
# `make PY=...` (or PY in the environment) names another interpreter; this script is not run then.
# GPUOPS_PYTHON_CANDIDATES replaces the list of distribution interpreters tried (the unit tests give it stand-ins).
set -euo pipefail

usable() {  # usable PYTHON: 3.11 or newer, with venv and ensurepip
    "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1
}

for candidate in ${GPUOPS_PYTHON_CANDIDATES-/usr/bin/python3 /usr/local/bin/python3}; do
    if [ -x "$candidate" ] && usable "$candidate"; then
        echo "$candidate"
        exit 0
    fi
done
echo python3
