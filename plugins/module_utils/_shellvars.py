# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private helpers for the grub defaults files (``/etc/default/grub`` and ``grub.d/*.cfg``): shell variables.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
The grub defaults files are shell code that grub-mkconfig sources. This is a small, deliberately
incomplete reader of that shell (plain assignments, quotes, ``$NAME`` expansion; anything else that
touches GRUB_CMDLINE_LINUX(_DEFAULT) is refused with CmdlineError), the chain of files in the order
grub-mkconfig reads them, and the writers that set those variables again. The command lines inside
the values are the business of _cmdline.
"""

from __future__ import annotations

import glob
import os
import re

from ansible_collections.gpuops.sandbox.plugins.module_utils._cmdline import (
    GRUB_DEFAULTS,
    GRUB_DROPIN_DIR,
    GRUB_VARS,
    CmdlineError,
    read_text,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path


# ---------------------------------------------------------------------------------------------
# Grub defaults files: a small, deliberately incomplete reader of the shell they are written in
# ---------------------------------------------------------------------------------------------

class _Unknown:
    """A value the reader cannot know without running the shell (command substitution, ...)."""

    def __init__(self, why):
        self.why = why


_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN_RE = re.compile(r"(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)=")
_OPENERS = ("if", "case", "for", "while", "until", "{", "(")
_CLOSERS = ("fi", "esac", "done", "}", ")")
_CONTINUERS = ("then", "else", "elif", "do", "!")
_STATEMENT_END = "\n;&|"
_FIRST_WORD_RE = re.compile(r"[^\s;&|]+")
_FUNCTION_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*[ \t]*\([ \t]*\)")
_SOURCING = (".", "source", "eval")


class GrubAssignment:
    """Where a tracked variable was assigned: file, character span of the statement, raw value."""

    def __init__(self, path, start, end, value):
        self.path = path
        self.start = start
        self.end = end
        self.value = value


def _expand(text, pos, env, path):
    """Read the expansion at ``pos``, quoted or not: ``$NAME`` or ``${NAME}`` when ``pos`` is on a ``$``, a
    command substitution (unknown) when on a backquote; return (value or _Unknown, new pos)."""
    if text[pos] == "`":
        close = text.find("`", pos + 1)
        return _Unknown("command substitution `...`"), len(text) if close == -1 else close + 1
    nxt = text[pos + 1:pos + 2]
    if nxt == "{":
        close = text.find("}", pos + 2)
        name = text[pos + 2:close] if close != -1 else ""
        if close == -1 or not _NAME_RE.fullmatch(name):
            return _Unknown("parameter expansion %s" % text[pos:pos + 20].split("\n")[0]), _skip_braces(text, pos)
        end = close + 1
    else:
        match = _NAME_RE.match(text, pos + 1)
        if not match:
            if nxt == "(":
                return _Unknown("command substitution $(...)"), _skip_parens(text, pos + 1)
            # a lone '$' (or $1, $?, ...) is taken literally only when nothing follows that the shell expands
            if nxt and (nxt.isdigit() or nxt in "?#@*!$-"):
                return _Unknown("special parameter $%s" % nxt), pos + 2
            return "$", pos + 1
        name = match.group(0)
        end = match.end()
    value = env.get(name, "")
    return value, end


def _skip_braces(text, pos):
    close = text.find("}", pos)
    return len(text) if close == -1 else close + 1


def _skip_parens(text, pos):
    """``pos`` is on '('; return the index after the matching ')' (quotes ignored: good enough to skip)."""
    depth = 0
    for idx in range(pos, len(text)):
        if text[idx] == "(":
            depth += 1
        elif text[idx] == ")":
            depth -= 1
            if depth == 0:
                return idx + 1
    return len(text)


def _join(parts):
    for part in parts:
        if isinstance(part, _Unknown):
            return part
    return "".join(parts)


def _read_word(text, pos, env, path):
    """Read one shell word starting at ``pos``; return (value or _Unknown, position after it)."""
    parts = []
    n = len(text)
    while pos < n:
        ch = text[pos]
        if ch in " \t" or ch in _STATEMENT_END:
            break
        if ch == "\\":
            if pos + 1 < n and text[pos + 1] == "\n":
                pos += 2
                continue
            parts.append(text[pos + 1:pos + 2])
            pos += 2
        elif ch == "'":
            close = text.find("'", pos + 1)
            if close == -1:
                raise CmdlineError("%s: unterminated single quote" % path, path=path)
            parts.append(text[pos + 1:close])
            pos = close + 1
        elif ch == '"':
            pos += 1
            while True:
                if pos >= n:
                    raise CmdlineError("%s: unterminated double quote" % path, path=path)
                ch = text[pos]
                if ch == '"':
                    pos += 1
                    break
                if ch == "\\" and pos + 1 < n and text[pos + 1] in '$`"\\\n':
                    if text[pos + 1] != "\n":
                        parts.append(text[pos + 1])
                    pos += 2
                elif ch in "$`":
                    value, pos = _expand(text, pos, env, path)
                    parts.append(value)
                else:
                    parts.append(ch)
                    pos += 1
        elif ch in "$`":
            value, pos = _expand(text, pos, env, path)
            parts.append(value)
        elif ch in "()<>":
            parts.append(_Unknown("shell syntax %r" % ch))
            pos += 1
        else:
            parts.append(ch)
            pos += 1
    return _join(parts), pos


def _skip_statement(text, pos, env, path):
    """Skip the rest of a statement (words until an unquoted newline, ';', '&' or '|'); return its end."""
    n = len(text)
    while pos < n and text[pos] not in _STATEMENT_END:
        if text[pos] in " \t":
            pos += 1
            continue
        if text[pos] == "#":
            while pos < n and text[pos] != "\n":
                pos += 1
            break
        _value, new_pos = _read_word(text, pos, env, path)
        pos = new_pos if new_pos > pos else pos + 1
    return pos


def parse_grub_defaults(text, path, env, assignments):
    """Evaluate the simple assignments of one grub defaults file into ``env`` (updated in place).

    Only what grub-mkconfig's ``. file`` would do to GRUB_CMDLINE_LINUX(_DEFAULT) matters. Plain
    ``NAME=word`` statements at the top level are evaluated (quotes, ``$NAME``/``${NAME}``); values
    that need a shell (command substitution, ...) become unknown, which is only an error if a tracked
    variable depends on them. A tracked variable touched in any other way (inside if/case/loops, by a
    command, via eval/source) raises CmdlineError: guessing could boot the host with the wrong line.
    ``assignments`` maps each tracked variable to the list of its GrubAssignment, in order.
    """
    pos = 0
    n = len(text)
    depth = 0
    while pos < n:
        ch = text[pos]
        if ch in " \t\n;&|":
            pos += 1
            continue
        if ch == "\\" and text[pos + 1:pos + 2] == "\n":
            pos += 2
            continue
        if ch == "#":
            while pos < n and text[pos] != "\n":
                pos += 1
            continue
        start = pos
        function = _FUNCTION_RE.match(text, pos)
        if function:
            pos = function.end()
            continue
        word_match = _FIRST_WORD_RE.match(text, pos)
        first = word_match.group(0) if word_match else ""
        if first in _OPENERS or first in _CLOSERS or first in _CONTINUERS:
            if first in _OPENERS:
                depth += 1
            elif first in _CLOSERS:
                depth = max(0, depth - 1)
            pos = word_match.end()
            if first in ("case", "for"):
                pos = _skip_statement(text, pos, env, path)
            continue
        assign = _ASSIGN_RE.match(text, pos)
        if assign:
            name = assign.group(1)
            value, pos = _read_word(text, assign.end(), env, path)
            rest = pos
            while rest < n and text[rest] in " \t":
                rest += 1
            is_command_prefix = rest < n and text[rest] not in "\n;&|#"
            if name in GRUB_VARS:
                if depth:
                    raise CmdlineError("%s: %s is assigned inside a shell block (if/case/loop/function); "
                                       "cannot tell which value grub-mkconfig uses" % (path, name), path=path)
                if is_command_prefix:
                    raise CmdlineError("%s: %s is set only for a command's environment; not supported"
                                       % (path, name), path=path)
                if isinstance(value, _Unknown):
                    raise CmdlineError("%s: the value of %s uses %s; cannot evaluate it without running the shell"
                                       % (path, name, value.why), path=path)
            if is_command_prefix:
                pos = _skip_statement(text, rest, env, path)
                continue
            if depth and name not in GRUB_VARS:
                env[name] = _Unknown("a value assigned inside a shell block")
            else:
                env[name] = value
            if name in GRUB_VARS:
                assignments.setdefault(name, []).append(GrubAssignment(path, start, pos, value))
            continue
        end = _skip_statement(text, pos, env, path)
        statement = text[start:end]
        if first in _SOURCING:
            raise CmdlineError("%s: the statement %r runs or sources other shell code; cannot tell what it does "
                               "to the kernel command line" % (path, statement.strip()[:80]), path=path)
        for name in GRUB_VARS:
            if re.search(r"\b%s\+?=" % name, statement) or re.match(r"(unset|read)\b.*\b%s\b" % name, statement):
                raise CmdlineError("%s: %s is changed by the shell statement %r; only plain NAME=\"...\" "
                                   "assignments are supported" % (path, name, statement.strip()[:80]), path=path)
        pos = end if end > pos else pos + 1
    return env


def grub_defaults_chain(root="/"):
    """The files grub-mkconfig sources, in order: /etc/default/grub, then grub.d/*.cfg sorted."""
    files = []
    main = host_path(root, GRUB_DEFAULTS)
    if os.path.isfile(main):
        files.append(main)
    files.extend(sorted(p for p in glob.glob(os.path.join(host_path(root, GRUB_DROPIN_DIR), "*.cfg"))
                        if os.path.isfile(p)))
    return files


def evaluate_grub_defaults(root="/", override=None):
    """Return ``(values, assignments)`` for GRUB_CMDLINE_LINUX and _DEFAULT after the whole chain.

    ``override`` maps a host path (under root) to replacement text, or to None to leave the file out;
    a path not in the chain is added at its sorted place (used to try out a drop-in before writing it).
    ``values`` holds "" for a variable never set. ``assignments`` is as in parse_grub_defaults.
    """
    override = override or {}
    files = grub_defaults_chain(root)
    main = host_path(root, GRUB_DEFAULTS)
    for path in override:
        if path not in files and override[path] is not None:
            files.append(path)
    dropins = sorted(p for p in files if p != main)
    ordered = ([main] if main in files else []) + dropins
    env = {}
    assignments = {}
    for path in ordered:
        if path in override:
            text = override[path]
            if text is None:
                continue
        else:
            text = read_text(path, missing="")
        parse_grub_defaults(text, path, env, assignments)
    values = {}
    for name in GRUB_VARS:
        value = env.get(name, "")
        values[name] = value if isinstance(value, str) else ""
    return values, assignments


def shell_quote(value):
    """Quote ``value`` for a double-quoted shell assignment (escapes \\ " $ and `)."""
    return '"' + re.sub(r'([\\"$`])', r"\\\1", value) + '"'


def set_grub_variables(text, path, new_values):
    """Return ``text`` of one grub defaults file with each variable in ``new_values`` set.

    The last top-level assignment of the variable is rewritten in place (``NAME="value"``); earlier
    ones are left alone since the last one wins. A variable not assigned in the file is appended.
    """
    env = {}
    assignments = {}
    parse_grub_defaults(text, path, env, assignments)
    edits = []
    appended = []
    for name, value in new_values.items():
        line = "%s=%s" % (name, shell_quote(value))
        if assignments.get(name):
            last = assignments[name][-1]
            prefix = text[last.start:last.end]
            keep_export = "export " if prefix.startswith("export") else ""
            edits.append((last.start, last.end, keep_export + line))
        else:
            appended.append(line)
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    if appended:
        if text and not text.endswith("\n"):
            text += "\n"
        text += "\n".join(appended) + "\n"
    return text


def render_grub_dropin(values, origin, extends=None):
    """Text of the module's own drop-in: a header, then one assignment per variable in ``values`` or ``extends``.

    A variable in ``values`` is set to that full value (an argument taken off the files before stays off); one in
    ``extends`` keeps what the files before give it and has that text appended (``NAME="${NAME} text"``), so an
    argument the user wrote there stays theirs: edited or removed where they wrote it, never frozen in a copy.
    """
    extends = extends or {}
    lines = [
        "# Managed by %s; edits here are overwritten." % origin,
        "# Sourced by grub-mkconfig after /etc/default/grub and the earlier grub.d/*.cfg files. A variable below",
        "# that starts with its own value only adds arguments to it; one set to a full value also takes arguments",
        "# off what the files before it say.",
    ]
    for name in GRUB_VARS:
        if name in extends:
            lines.append('%s="${%s} %s' % (name, name, shell_quote(extends[name])[1:]))
        elif name in values:
            lines.append("%s=%s" % (name, shell_quote(values[name])))
    return "\n".join(lines) + "\n"


def grub_mkconfig_reads_dropins(script_path):
    """True when the grub-mkconfig script sources /etc/default/grub.d (Debian/Ubuntu patch); None if unknown."""
    try:
        with open(script_path, "rb") as handle:
            data = handle.read(1 << 20)
    except (IOError, OSError):
        return None
    if data[:2] != b"#!":
        return None
    return b"default/grub.d" in data
