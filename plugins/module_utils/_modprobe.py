# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""modprobe.d, modules-load.d and the initramfs: the one owner of their directories and files.

This file is private to the gpuops.sandbox collection: its interface may change at any time.

What is here: the directories modprobe and systemd-modules-load read and the ones an initramfs generator takes
module lists from; the files of a named set of kernel module settings (kernel_modules writes them, gpu_facts finds
them, the host plan names them); the rule a set name must follow; reading modprobe.d as modprobe does and editing
the values of an ``options`` line; which initramfs generator a host has and the commands that rebuild its images;
and which modules are loaded now (``/sys/module``).

The set names are the callers': the roles choose them (``gpuops_module_files``) and pass them to the host plan,
kernel_modules and gpu_facts. ``DEFAULT_SETS`` is only what those options default to.

Every function that reads the host takes its filesystem root (default ``/``), so unit tests can point it at a fake
tree; the readers never raise on a file they cannot read.
"""

from __future__ import annotations

import functools
import os
import re

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError
from ansible_collections.gpuops.sandbox.plugins.module_utils._persist import read_text
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path

# Where kernel_modules writes a set's files: modprobe.d (blacklist, options, softdep lines), modules-load.d (loaded at
# boot), and the module lists of the initramfs generators (initramfs-tools, dracut). An initramfs carries all four.
MODPROBE_DIR = "/etc/modprobe.d"
LOAD_DIR = "/etc/modules-load.d"
INITRAMFS_TOOLS_DIR = "/usr/share/initramfs-tools/modules.d"
DRACUT_DIR = "/etc/dracut.conf.d"
INITRAMFS_SOURCE_DIRS = (MODPROBE_DIR, LOAD_DIR, INITRAMFS_TOOLS_DIR, DRACUT_DIR)
# The prefix of this collection's files in those directories (the default set names have it).
OWN_PREFIX = "gpuops-"
# The directories modprobe reads its configuration from, in its order.
MODPROBE_DIRS = (MODPROBE_DIR, "/run/modprobe.d", "/usr/local/lib/modprobe.d", "/usr/lib/modprobe.d",
                 "/lib/modprobe.d")
# The module and initramfs configuration a GPU node's boot depends on, as (directory, name pattern), in the order
# gpu_facts' boot fingerprint reads them.
CONFIG_FILES = (
    (MODPROBE_DIR, "*"),
    (LOAD_DIR, "*"),
    ("/etc", "modules"),
    ("/etc/initramfs-tools", "modules"),
    ("/etc/initramfs-tools", "initramfs.conf"),
    ("/etc/initramfs-tools/conf.d", "*"),
    (DRACUT_DIR, "*"),
)
SYS_MODULE_DIR = "/sys/module"

# The sets the host preparation writes, by what they are for, and the names the roles give them by default.
SET_KINDS = ("nouveau", "vfio")
DEFAULT_SETS = {"nouveau": "gpuops-nouveau", "vfio": "gpuops-vfio"}
# A set name is the stem of its file names. Used with fullmatch (and anchored with \A and \Z): ^ and $ with .match
# would let a trailing newline through.
SET_NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]*\Z")
# The stem of a file name (255 bytes at most); a sane length for a set name.
MAX_SET_NAME_LENGTH = 64
SET_NAME_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit"

# The initramfs generators and their commands.
TOOLS = {"initramfs-tools": "update-initramfs", "dracut": "dracut"}
TOOL_DIRS = ("/usr/sbin", "/sbin", "/usr/bin")


class ModprobeError(GpuopsError):
    """A module setting or initramfs problem, with a message for the user."""


def _shown(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else "%s... (%d characters)" % (text[:limit - 10], len(str(value)))


# ---------------------------------------------------------------------------------------------
# Sets of module files
# ---------------------------------------------------------------------------------------------

def set_name_problem(name):
    """Why ``name`` cannot be a set name (the stem of its file names), or None when it can."""
    if not isinstance(name, str) or not SET_NAME_RE.fullmatch(name):
        return "%s is not valid: use %s" % (_shown(name), SET_NAME_RULE)
    if len(name) > MAX_SET_NAME_LENGTH:
        return "%s is not valid: it has %d characters, at most %d are allowed (it is the stem of the file names)" % (
            _shown(name), len(name), MAX_SET_NAME_LENGTH)
    return None


def sets_problem(sets):
    """Why ``sets`` cannot name the host preparation's sets (a mapping of each of SET_KINDS to a set name, two
    different names), or None when it can."""
    if not isinstance(sets, dict):
        return "%s is not a mapping of %s to set names" % (_shown(sets), " and ".join(SET_KINDS))
    unknown = sorted(str(key) for key in sets if key not in SET_KINDS)
    missing = [kind for kind in SET_KINDS if kind not in sets]
    if unknown or missing:
        return "%s must name the sets %s, no more and no fewer (%s)" % (
            _shown(sets), " and ".join(SET_KINDS), "; ".join(
                (["unknown: %s" % ", ".join(unknown)] if unknown else [])
                + (["missing: %s" % ", ".join(missing)] if missing else [])))
    for kind in SET_KINDS:
        problem = set_name_problem(sets[kind])
        if problem:
            return "%s: name %s" % (kind, problem)
    if len(set(sets[kind] for kind in SET_KINDS)) < len(SET_KINDS):
        return "%s names one set twice; each set needs files of its own" % _shown(sets)
    return None


def set_files(name):
    """The paths of the files of the set ``name``, by kind: ``modprobe``, ``load``, ``initramfs_tools``, ``dracut``."""
    return {"modprobe": "%s/%s.conf" % (MODPROBE_DIR, name), "load": "%s/%s.conf" % (LOAD_DIR, name),
            "initramfs_tools": "%s/%s" % (INITRAMFS_TOOLS_DIR, name), "dracut": "%s/%s.conf" % (DRACUT_DIR, name)}


def own_files(root="/"):
    """The paths of this collection's files (OWN_PREFIX) in INITRAMFS_SOURCE_DIRS, those an initramfs carries."""
    found = []
    for directory in INITRAMFS_SOURCE_DIRS:
        try:
            names = os.listdir(host_path(root, directory))
        except (IOError, OSError):
            continue
        found.extend("%s/%s" % (directory, name) for name in names if name.startswith(OWN_PREFIX))
    return found


# ---------------------------------------------------------------------------------------------
# modprobe.d as modprobe reads it
# ---------------------------------------------------------------------------------------------

def modprobe_files(root="/"):
    """``[(path, text)]`` of the modprobe.d files modprobe reads, in its order; an earlier directory's file hides a
    later one of the same name."""
    files = []
    seen = set()
    for directory in MODPROBE_DIRS:
        try:
            names = sorted(os.listdir(host_path(root, directory)))
        except (IOError, OSError):
            continue
        for name in names:
            if not name.endswith(".conf") or name in seen:
                continue
            seen.add(name)
            path = directory + "/" + name
            files.append((path, read_text(root, path) or ""))
    return files


def is_modprobe_path(path):
    """Whether ``path`` is in one of the directories modprobe reads."""
    return any(path.startswith(directory + "/") for directory in MODPROBE_DIRS)


def conf_lines(text):
    """``text`` cut into the lines modprobe reads, each with its ``\\`` continuations and its newline, as written."""
    lines, current = [], []
    for line in text.splitlines(True):
        current.append(line)
        if not line.rstrip("\r\n").endswith("\\"):
            lines.append("".join(current))
            current = []
    if current:
        lines.append("".join(current))
    return lines


def logical(line):
    """One line of :func:`conf_lines` as modprobe reads it: continuations joined, newline dropped."""
    return line.rstrip("\r\n").replace("\\\r\n", " ").replace("\\\n", " ")


def modprobe_logical_lines(text):
    """The lines of a modprobe.d file as modprobe reads them: continuations joined, newlines dropped."""
    return [logical(line) for line in conf_lines(text)]


@functools.lru_cache(maxsize=None)
def _options_re(module):
    # modprobe takes '-' and '_' in a module name for the same character.
    return re.compile(r"\A\s*options\s+%s\s+(.*)\Z" % "[-_]".join(re.escape(part) for part in re.split("[-_]", module)))


def option_values(line, module, option):
    """The comma-separated values of ``<option>=`` on an ``options <module>`` line (a logical line, see
    :func:`logical`), or None for any other line."""
    match = _options_re(module).fullmatch(line.split("#", 1)[0])
    if not match:
        return None
    found = []
    prefix = option + "="
    for word in match.group(1).split():
        if word.startswith(prefix):
            found.extend(item for item in word[len(prefix):].split(",") if item)
    return found


def keep_option_values(text, module, option, keep):
    """``text`` of a modprobe.d file without the values of ``<option>=`` on ``options <module>`` lines for which
    ``keep(value)`` is false; the other values and options of the line stay, and the line goes only when nothing is
    left on it (its comment with it). A line that changes is written as one line with single spaces; the others as
    they were."""
    out = []
    prefix = option + "="
    for line in conf_lines(text):
        read = logical(line)
        values = option_values(read, module, option)
        if not values or all(keep(value) for value in values):
            out.append(line)
            continue
        body, hash_mark, comment = read.partition("#")
        words = body.split()
        kept = []
        for word in words[2:]:
            if word.startswith(prefix):
                left = [value for value in word[len(prefix):].split(",") if value and keep(value)]
                if left:
                    kept.append(prefix + ",".join(left))
                continue
            kept.append(word)
        if kept:
            ending = line[len(line.rstrip("\r\n")):]
            out.append(" ".join(words[:2] + kept) + (" #" + comment if hash_mark else "") + ending)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# The initramfs generator and the modules loaded now
# ---------------------------------------------------------------------------------------------

def detect_tool(module, wanted, root):
    """The initramfs generator: ``wanted`` unless it is ``auto``, else ``initramfs-tools`` when update-initramfs is
    installed, else ``dracut`` when dracut is, else ``none``. On a fake root the usual directories are looked in."""
    if wanted != "auto":
        return wanted
    if root == "/":
        if module.get_bin_path("update-initramfs"):
            return "initramfs-tools"
        if module.get_bin_path("dracut"):
            return "dracut"
        return "none"
    for tool, binary in (("initramfs-tools", "update-initramfs"), ("dracut", "dracut")):
        for sbin in TOOL_DIRS:
            if os.path.exists(host_path(root, os.path.join(sbin, binary))):
                return tool
    return "none"


def rebuild_command(module, tool):
    """The command that rebuilds every initramfs with ``tool``; raises ModprobeError when it is not installed."""
    if tool == "initramfs-tools":
        binary = module.get_bin_path("update-initramfs", required=False)
        args = ["-u", "-k", "all"]
    else:
        binary = module.get_bin_path("dracut", required=False)
        args = ["-f", "--regenerate-all"]
    if not binary:
        raise ModprobeError("the initramfs generator %s is not installed; install it or set initramfs_tool"
                            % TOOLS[tool])
    return [binary] + args


def kernel_command(module, tool, kernel):
    """The command that rebuilds (or creates) the initramfs of one kernel (an entry of _kernels.installed_kernels)."""
    base = rebuild_command(module, tool)[0]
    if tool == "initramfs-tools":
        return [base, "-c" if kernel["initramfs"] is None else "-u", "-k", kernel["version"]]
    return [base, "-f", "--kver", kernel["version"]]


def loaded_modules(root, names):
    """The modules of ``names`` that are loaded now (have a ``/sys/module`` directory)."""
    return [m for m in names if os.path.isdir(host_path(root, "%s/%s" % (SYS_MODULE_DIR, m.replace("-", "_"))))]
