# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Installed into the lab's guest image only (lab/gpulab.py): a bytecode cache for code imported from zip files.

Every Ansible task that reaches a host runs a module payload: a zip file Python imports with zipimport, which
compiles every source file in it on each run (a zip cannot hold the bytecode Python would otherwise keep).
Under software emulation that compile was about 2.4 of a task's 6-8 seconds on a lab host, measured per
gpu_facts call. This keeps the compiled code of each zipped source, keyed by its path inside the zip and a
hash of its text, so the second task with the same module_utils compiles nothing. What runs is the same
code: the same source, compiled by the same Python, renamed to the file it came from this time.

A `.pth` file in the image calls install() at every start of the guest's Python.
"""

import hashlib
import marshal
import os
import zipimport

CACHE = "/var/cache/gpulab-pycache"
CODE = type(compile("", "", "exec"))


def renamed(code, filename):
    """`code` and every code object inside it, with co_filename set to `filename`."""
    consts = tuple(renamed(const, filename) if isinstance(const, CODE) else const for const in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def cache_key(pathname, source):
    """The cache file's name: the path inside the zip (not the zip's own temporary path) and the source."""
    inner = pathname.replace("\\", "/").rsplit(".zip/", 1)[-1]
    if isinstance(source, str):
        source = source.encode("utf-8")
    return hashlib.sha256(inner.encode("utf-8") + b"\0" + source).hexdigest()


def cached_compiler(compile_source, cache=CACHE):
    """A drop-in for zipimport's compile step that reads and writes `cache`; any cache fault compiles."""

    def compile_cached(pathname, source):
        path = os.path.join(cache, cache_key(pathname, source))
        try:
            with open(path, "rb") as handle:
                code = marshal.load(handle)
            if isinstance(code, CODE):
                return renamed(code, pathname)
        except (OSError, EOFError, ValueError, TypeError):
            pass
        code = compile_source(pathname, source)
        try:
            os.makedirs(cache, exist_ok=True)
            partial = "%s.%d" % (path, os.getpid())
            with open(partial, "wb") as handle:
                marshal.dump(code, handle)
            os.replace(partial, path)
        except (OSError, ValueError):
            pass
        return code

    compile_cached.original = compile_source
    return compile_cached


def install(cache=CACHE):
    """Route zipimport's compile step through the cache (once per interpreter)."""
    current = getattr(zipimport, "_compile_source", None)
    if current is None or hasattr(current, "original"):
        return
    zipimport._compile_source = cached_compiler(current, cache)  # pylint: disable=protected-access
