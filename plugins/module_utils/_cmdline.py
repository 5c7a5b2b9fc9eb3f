# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private helpers for the kernel command line: argument validation, merging, and the files that hold one.

This is the one tokenizer of kernel command lines in the collection (split_cmdline, kernel_param,
parse_cmdline); _iommu reads /proc/cmdline through it. The shell of the grub defaults files is read and
written by _shellvars.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
Everything here is plain Python that raises CmdlineError; only the module turns errors into
``fail_json``. Every function that reads the filesystem takes the root as an argument (default ``/``)
so unit tests can build a fake tree under a temporary directory.

Vocabulary:
  token   one word of an existing command line, kept byte for byte (``console=ttyS0,115200``)
  arg     a validated request (``KernelArg``) coming from the user
  segment a list of tokens; the grub backend works on two (GRUB_CMDLINE_LINUX, then _DEFAULT)
"""

from __future__ import annotations

import glob
import json
import os
import re
import unicodedata

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import host_path, read_file

GRUB_DEFAULTS = "/etc/default/grub"
GRUB_DROPIN_DIR = "/etc/default/grub.d"
KERNEL_CMDLINE_FILE = "/etc/kernel/cmdline"
PROC_CMDLINE = "/proc/cmdline"
BLS_ENTRIES_DIR = "/boot/loader/entries"

GRUB_LINUX = "GRUB_CMDLINE_LINUX"
GRUB_LINUX_DEFAULT = "GRUB_CMDLINE_LINUX_DEFAULT"
GRUB_VARS = (GRUB_LINUX, GRUB_LINUX_DEFAULT)

# Whole-string patterns (used with fullmatch): "$" would also match before a trailing newline.
KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
KEY_CHAR_RE = re.compile(r"[A-Za-z0-9_.-]")
VALUE_RE = re.compile(r"[A-Za-z0-9_.,:=/+@%~-]+")
ACCEPTED_TEXT = (
    "a string KEY or KEY=VALUE, where KEY is ASCII letters, digits, '_', '-' and '.' (not starting with '-' or '.') "
    "and VALUE is ASCII letters, digits and any of _ . , : = / + @ % ~ -, with no whitespace or control characters"
)
# Tokens the boot loader adds by itself and which never belong in a configuration file.
LOADER_TOKENS = ("BOOT_IMAGE", "initrd")


class CmdlineError(GpuopsError):
    """Bad input, an unreadable boot file, or a configuration this code refuses to guess about.

    ``path`` names the file involved, when there is one.
    """

    def __init__(self, msg, path=None):
        super().__init__(msg)
        self.msg = msg
        self.path = path


# ---------------------------------------------------------------------------------------------
# Arguments and tokens
# ---------------------------------------------------------------------------------------------

def normalize_key(key):
    """The kernel treats '-' and '_' alike in parameter names (``parameq``); compare keys that way."""
    return key.replace("-", "_")


def split_token(token):
    """Return ``(normalized key, value or None)`` of one command-line token."""
    key, sep, value = token.partition("=")
    return normalize_key(key), (value if sep else None)


class KernelArg:
    """One validated argument: ``text`` as given, its normalized ``key`` and ``value`` (None if bare)."""

    def __init__(self, text):
        self.text = text
        self.key, self.value = split_token(text)

    def same_key(self, token):
        return split_token(token)[0] == self.key

    def equals(self, token):
        return split_token(token) == (self.key, self.value)

    def __repr__(self):
        return "KernelArg(%r)" % self.text


def _describe(value):
    kind = {bool: "a boolean", type(None): "null", int: "an integer", float: "a number",
            dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)
    return kind


def _bad_characters(text, char_re):
    """The characters of ``text`` that ``char_re`` does not accept, shown one by one (repr), sorted."""
    bad = sorted(set(ch for ch in text if not char_re.fullmatch(ch)))
    shown = ", ".join(repr(ch) for ch in bad)
    if any(unicodedata.category(ch).startswith("C") for ch in bad):
        shown += "; control and invisible characters (a newline, a tab, ...) are never part of a kernel argument"
    return shown


def parse_arg(item):
    """Validate one user argument and return a KernelArg; raise CmdlineError naming the bad value.

    The text ends up inside a shell-sourced grub defaults file and on boot loader command lines, so
    only a conservative character set is accepted (the whole text: a trailing newline is refused too);
    quoting is never attempted.
    """
    if not isinstance(item, str):
        hint = ""
        if isinstance(item, bool) or item is None:
            hint = " (YAML turns unquoted on/off/yes/no/true/false/~/null into booleans or null; quote it)"
        raise CmdlineError("kernel argument %r is %s, not a string%s; accepted: %s"
                           % (item, _describe(item), hint, ACCEPTED_TEXT))
    if item == "":
        raise CmdlineError("kernel argument '' is empty; accepted: %s" % ACCEPTED_TEXT)
    key, sep, value = item.partition("=")
    if not KEY_RE.fullmatch(key):
        bad = _bad_characters(key, KEY_CHAR_RE)
        raise CmdlineError("kernel argument %r has an unsafe or invalid key %r%s; accepted: %s"
                           % (item, key, " (characters not accepted: %s)" % bad if bad else "", ACCEPTED_TEXT))
    if sep and not value:
        raise CmdlineError("kernel argument %r has '=' but no value; give KEY=VALUE, or KEY alone for a flag"
                           % (item,))
    if sep and not VALUE_RE.fullmatch(value):
        raise CmdlineError("kernel argument %r contains characters that are not accepted (%s); accepted: %s"
                           % (item, _bad_characters(value, VALUE_RE), ACCEPTED_TEXT))
    return KernelArg(item)


def parse_args(items, state, replace_values=True):
    """Validate the whole request before anything is read or written.

    Exact repeats are merged. With ``state=present`` and ``replace_values``, two different values
    for one key are a contradiction and are refused rather than resolved silently.
    """
    if not isinstance(items, list) or not items:
        raise CmdlineError("args must be a non-empty list of kernel arguments; accepted items: %s" % ACCEPTED_TEXT)
    result = []
    for item in items:
        arg = parse_arg(item)
        if any(prev.equals(arg.text) for prev in result):
            continue
        if state == "present" and replace_values:
            clash = [prev.text for prev in result if prev.key == arg.key]
            if clash:
                raise CmdlineError(
                    "args ask for %s and %r at the same time; with replace_values=true a key keeps one value. "
                    "Set replace_values=false for keys that may repeat (such as console)"
                    % (", ".join(repr(c) for c in clash), arg.text))
        result.append(arg)
    return result


def split_cmdline(text):
    """Split a command line into tokens the way the kernel does (whitespace, double quotes group).

    Tokens keep their original text, quotes included, so unrelated arguments are written back unchanged;
    kernel_param tells what the kernel makes of one token.
    """
    tokens = []
    current = []
    in_quote = False
    for ch in text or "":
        if ch == '"':
            in_quote = not in_quote
            current.append(ch)
        elif ch.isspace() and not in_quote:
            if current:
                tokens.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        tokens.append("".join(current))
    return tokens


def kernel_param(token):
    """Return ``(key, value or None)`` of one token of split_cmdline as the kernel reads it (``next_arg``).

    The kernel removes only these double quotes: the first character of a token that starts with ``"``,
    the first character of a value that starts with ``"``, and in both cases the token's last character
    when it is a ``"``. Any other ``"`` stays (``key=a"b c"d`` has the value ``a"b c"d``). The key ends at
    the first ``=`` after its first character.
    """
    quoted = token.startswith('"')
    body = token[1:] if quoted else token
    equals = body.find("=", 1)
    if equals == -1:
        key, value = body, None
    else:
        key, value = body[:equals], body[equals + 1:]
        if value.startswith('"'):
            # The token's last character goes when it is a quote; the check below then finds it gone.
            value = value[1:]
            return key, (value[:-1] if value.endswith('"') else value)
    if quoted and body.endswith('"'):
        if value is None:
            key = key[:-1]
        else:
            value = value[:-1]
    return key, value


def parse_cmdline(text):
    """Split a kernel command line into ``[(key, value_or_None)]`` as the kernel reads it, keeping order and repeats.

    Double quotes group a value containing spaces (``key="a b"`` is ``("key", "a b")``); see kernel_param for
    which quotes the kernel removes. A bare ``--`` ends the kernel's arguments (the rest is for init) and the list.
    """
    result = []
    for token in split_cmdline(text):
        key, value = kernel_param(token)
        if key == "--" and value is None:
            break
        result.append((key, value))
    return result


def removes(arg, token):
    """True when the absent request ``arg`` takes ``token`` away (a bare KEY: every value; KEY=VALUE: that value)."""
    return arg.same_key(token) if arg.value is None else arg.equals(token)


def apply_args(segments, args, state, replace_values=True, target=0, restore=None):
    """Return new copies of ``segments`` (lists of tokens) with the request applied.

    present, replace_values: the first token with the key is replaced in place, other tokens with that
      key (duplicates included) are removed; when the key is missing the arg is appended to
      ``segments[target]``.
    present, not replace_values: unless the exact token exists, inserted after the last token with the
      same key (so a new console= comes last, as the kernel expects), or appended to ``segments[target]``.
    absent KEY: every token with that key goes, whatever its value. absent KEY=VALUE: only that value.
      ``restore`` maps a normalized key to the tokens to give back (see plan_restore): once per key, they
      take the place of the first token the request removed; when nothing of that key is removed, nothing
      is given back.
    Tokens not named by the request keep their text and order.
    """
    segs = [list(seg) for seg in segments]
    given = set()
    for arg in args:
        if state == "absent":
            first = None
            new_segs = []
            for si, seg in enumerate(segs):
                kept = []
                for tok in seg:
                    if removes(arg, tok):
                        if first is None:
                            first = (si, len(kept))
                        continue
                    kept.append(tok)
                new_segs.append(kept)
            segs = new_segs
            back = (restore or {}).get(arg.key)
            if back and first is not None and arg.key not in given:
                segs[first[0]][first[1]:first[1]] = list(back)
                given.add(arg.key)
            continue
        if not replace_values:
            if not any(arg.equals(t) for seg in segs for t in seg):
                last = [(si, ti) for si, seg in enumerate(segs) for ti, t in enumerate(seg) if arg.same_key(t)]
                if last:
                    segs[last[-1][0]].insert(last[-1][1] + 1, arg.text)
                else:
                    segs[target].append(arg.text)
            continue
        placed = False
        new_segs = []
        for seg in segs:
            new_seg = []
            for tok in seg:
                if arg.same_key(tok):
                    if not placed:
                        new_seg.append(arg.text if not arg.equals(tok) else tok)
                        placed = True
                    continue
                new_seg.append(tok)
            new_segs.append(new_seg)
        segs = new_segs
        if not placed:
            segs[target].append(arg.text)
    return segs


def satisfies(tokens, args, state, replace_values=True):
    """True when ``tokens`` (one command line) already has the wanted state for every arg."""
    for arg in args:
        same = [t for t in tokens if arg.same_key(t)]
        if state == "absent":
            if arg.value is None and same:
                return False
            if arg.value is not None and any(arg.equals(t) for t in same):
                return False
        elif replace_values:
            if not same or not all(arg.equals(t) for t in same):
                return False
        elif not any(arg.equals(t) for t in same):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# The record of what the module replaced, so that state=absent can give it back
# ---------------------------------------------------------------------------------------------

RECORD_FILE = "/var/lib/gpuops/kernel_cmdline.json"
RECORD_VERSION = 1


def record_token_ok(key, token):
    """True when ``token`` can be kept in the record and given back: one command-line word of key ``key``.

    Anything read from the record ends up in boot configuration files (one a shell sources, quoted); a
    token that would split into several words, holds a control character or names another key is refused.
    """
    return (isinstance(token, str) and token != "" and split_cmdline(token) == [token]
            and not any(unicodedata.category(ch).startswith("C") for ch in token)
            and split_token(token)[0] == key)


def load_record(text, path=RECORD_FILE):
    """Parse the record file's text (None: no file) into ``{key: {"original": [...], "set": [...]}}``.

    Raises CmdlineError naming the file when it is not a record this code wrote: guessing what to give back
    could boot the host with a line nobody asked for.
    """
    if text is None:
        return {}

    def bad(why):
        return CmdlineError("%s is not a valid record of kernel_cmdline (%s); fix it, or delete it to give "
                            "nothing back" % (path, why), path=path)

    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise bad("not JSON: %s" % exc) from exc
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION or not isinstance(data.get("keys"), dict):
        raise bad("expected an object with version %d and keys" % RECORD_VERSION)
    keys = {}
    for key, entry in data["keys"].items():
        if not KEY_RE.fullmatch(key) or normalize_key(key) != key:
            raise bad("key %r is not a normalized kernel argument name" % key)
        if not isinstance(entry, dict) or set(entry) != {"original", "set"}:
            raise bad("the entry of %r must have exactly original and set" % key)
        for field in ("original", "set"):
            tokens = entry[field]
            if not isinstance(tokens, list) or not all(record_token_ok(key, t) for t in tokens):
                raise bad("%s of %r must be a list of single arguments of that key, got %r" % (field, key, tokens))
        if not entry["set"]:
            raise bad("set of %r is empty" % key)
        keys[key] = {"original": list(entry["original"]), "set": list(entry["set"])}
    return keys


def render_record(keys):
    """Text of the record file for ``keys``, or None when there is nothing left to record (no file)."""
    if not keys:
        return None
    return json.dumps({"version": RECORD_VERSION, "keys": keys}, indent=2, sort_keys=True) + "\n"


def record_present(keys, old_tokens, new_tokens, args, replace_values=True):
    """Return ``(new keys, tokens left out)`` after state=present changed ``old_tokens`` into ``new_tokens``.

    For each key whose tokens changed, the record keeps the tokens the key had before the module first
    changed it (``original``; empty when the module added the key) and the value(s) the module set. A key
    already recorded keeps its first ``original``. With ``replace_values=false`` nothing is replaced, so a
    key is only recorded when the module added it. Original tokens that cannot be kept safely (see
    record_token_ok) are left out and returned: they will not be given back.
    """
    keys = dict((key, {"original": list(e["original"]), "set": list(e["set"])}) for key, e in keys.items())
    left_out = []
    for arg in args:
        old = [t for t in old_tokens if arg.same_key(t)]
        new = [t for t in new_tokens if arg.same_key(t)]
        if old == new:
            continue
        entry = keys.get(arg.key)
        if entry is not None:
            if replace_values:
                entry["set"] = [arg.text]
            elif not any(arg.equals(t) for t in entry["set"]):
                entry["set"].append(arg.text)
        elif replace_values or not old:
            original = [t for t in old if record_token_ok(arg.key, t)]
            left_out.extend(t for t in old if t not in original)
            keys[arg.key] = {"original": original, "set": [arg.text]}
    return keys, left_out


def _same_values(tokens, others):
    def values(items):
        result = {}
        for item in items:
            result[split_token(item)] = result.get(split_token(item), 0) + 1
        return result
    return values(tokens) == values(others)


def plan_restore(keys, tokens, args, restore=True):
    """Return ``(restore map, new keys)`` for a state=absent request on the command line ``tokens``.

    For each recorded key the request names:
      - when the key's current value is no longer what the module set, the user changed it: their setting
        wins, nothing is given back and the entry goes;
      - when the request removes the module's value(s) and none is left, the entry goes and (with
        ``restore``) the original tokens are given back, but never a token the request itself removes
        (so ``absent`` of a bare KEY gives nothing back);
      - when some of the module's values stay, the entry keeps them;
      - when the request removes none of them, the entry stays as it is.
    The restore map (``{key: [tokens]}``) is what apply_args puts back.
    """
    keys = dict((key, {"original": list(e["original"]), "set": list(e["set"])}) for key, e in keys.items())
    give_back = {}
    for key in dict.fromkeys(arg.key for arg in args):
        entry = keys.get(key)
        if entry is None:
            continue
        current = [t for t in tokens if split_token(t)[0] == key]
        if not _same_values(current, entry["set"]):
            del keys[key]
            continue
        remaining = [t for t in current if not any(removes(arg, t) for arg in args)]
        if len(remaining) == len(current):
            continue
        if remaining:
            entry["set"] = remaining
            continue
        del keys[key]
        back = [t for t in entry["original"] if not any(removes(arg, t) for arg in args)]
        if restore and back:
            give_back[key] = back
    return give_back, keys


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

def read_text(path, missing=None):
    """Read a text file; return ``missing`` when it does not exist (``missing=None`` still means absent)."""
    try:
        text = read_file(path, errors="surrogateescape")
    except (IOError, OSError) as exc:
        raise CmdlineError("cannot read %s: %s" % (path, exc.strerror or exc), path=path)
    return missing if text is None else text


def _read_tokens(path):
    """The tokens of the file ``path`` (all lines joined), or None when it does not exist."""
    text = read_text(path)
    if text is None:
        return None
    return split_cmdline(text)


def read_proc_cmdline(root="/"):
    """Tokens of the running kernel's command line, or None when /proc/cmdline is missing."""
    return _read_tokens(host_path(root, PROC_CMDLINE))


def strip_loader_tokens(tokens):
    """Drop ``BOOT_IMAGE=`` and ``initrd=`` which the boot loader adds (as kernel-install does)."""
    return [t for t in tokens if t.partition("=")[0] not in LOADER_TOKENS]


def read_kernel_cmdline_file(root="/"):
    """Tokens of /etc/kernel/cmdline (all lines joined, as kernel-install reads it), or None if missing."""
    return _read_tokens(host_path(root, KERNEL_CMDLINE_FILE))


def render_kernel_cmdline_file(tokens):
    return " ".join(tokens) + "\n"


def bls_entry_files(root="/"):
    """BLS entry files (``/boot/loader/entries/*.conf``), sorted."""
    return sorted(glob.glob(os.path.join(host_path(root, BLS_ENTRIES_DIR), "*.conf")))


def read_bls_options(path):
    """Tokens of the ``options`` line of one BLS entry (None when the entry has no such line)."""
    text = read_text(path, missing="")
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("options") and (len(stripped) == 7 or stripped[7].isspace()):
            return split_cmdline(stripped[7:])
    return None


def grubby_info_entries(text):
    """Split ``grubby --info=...`` output into its entries, each a list of ``(key, value)`` in output order.

    An ``index=`` line starts an entry (key=value lines before the first one make an entry of their own);
    keys and values are stripped and double quotes around a value removed; lines without ``=`` are skipped.
    The one parser of that output (kernel_cmdline, kexec_load).
    """
    entries = []
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        key = key.strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if key == "index" or not entries:
            entries.append([])
        entries[-1].append((key, value))
    return entries


def parse_grubby_info(text):
    """Parse ``grubby --info=ALL`` output into a list of ``{"index", "kernel": str, "args": [tokens]}``.

    Entries that name no Linux kernel are left out.
    """
    result = []
    for pairs in grubby_info_entries(text):
        if pairs[0][0] != "index":
            continue   # lines before the first index=
        entry = {"index": pairs[0][1], "kernel": None, "args": []}
        for key, value in pairs[1:]:
            if key == "kernel":
                entry["kernel"] = value
            elif key == "args":
                entry["args"] = split_cmdline(value)
        result.append(entry)
    return [e for e in result if e["kernel"] and e["kernel"] != "non linux entry"]
