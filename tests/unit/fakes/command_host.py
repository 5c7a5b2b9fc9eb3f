# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A fake host for the modules that run commands (kernel_cmdline, kexec_load): a root tree under a temporary
directory and a bin directory of fake commands, small scripts that log their calls to ``calls.log`` at the
root. module_harness.run_with_commands runs a module on it with ``get_bin_path`` limited to that bin
directory, so the module's run_command path runs for real and the test machine's own tools are never found.
"""

from __future__ import annotations

import os
import sys

# The start of a fake command in Python (see CommandHost.python_script): log the call, then the command's body.
PYTHON_COMMAND_HEAD = r'''#!{python}
import os, sys
ROOT = {root!r}
argv = sys.argv[1:]
with open(os.path.join(ROOT, "calls.log"), "a") as log:
    log.write({name!r} + "\t" + "\t".join(argv) + "\n")
'''


class CommandHost:
    """A root tree, a bin directory of fake commands (``timeout`` is the real one) and the log of their calls."""

    def __init__(self, base):
        self.root = os.path.join(str(base), "root")
        self.bin = os.path.join(str(base), "bin")
        os.makedirs(self.root)
        os.makedirs(self.bin)
        os.symlink("/usr/bin/timeout", os.path.join(self.bin, "timeout"))
        self.log = os.path.join(self.root, "calls.log")

    def path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def write(self, path, text, mode=0o644):
        """Write ``text`` (str or bytes) to ``path`` under the root, making its directories; return the real path."""
        full = self.path(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w" if isinstance(text, str) else "wb") as handle:
            handle.write(text)
        os.chmod(full, mode)
        return full

    def read(self, path):
        with open(self.path(path)) as handle:
            return handle.read()

    def exists(self, path):
        return os.path.exists(self.path(path))

    def script(self, name, body):
        """Install the fake command ``name`` with the script ``body``; return its path."""
        full = os.path.join(self.bin, name)
        with open(full, "w") as handle:
            handle.write(body)
        os.chmod(full, 0o755)
        return full

    def python_script(self, name, body):
        """Install the fake command ``name``, a Python script that logs its call to ``calls.log`` (its name and
        arguments, tab separated) and then runs ``body``, with ``os`` and ``sys`` imported, ``ROOT`` the root
        and ``argv`` its arguments; return its path."""
        return self.script(name, PYTHON_COMMAND_HEAD.format(python=sys.executable, root=self.root, name=name) + body)
