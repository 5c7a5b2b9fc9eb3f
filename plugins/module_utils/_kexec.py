# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private helpers of kexec_load: which kernel, initramfs and command line the boot loader boots next.

This file is private to the gpuops.sandbox collection: its interface may change at any time.

Everything here only reads. Each reader returns an :class:`Entry` or raises :class:`NotLoadable` with the
reason in words: the module then reports ``loadable: false`` and its caller reboots through the firmware.
Readers never guess: an entry that is not certainly the one the boot loader boots next is not loadable.

- grub (Debian, Ubuntu): ``/boot/grub/grub.cfg`` as grub-mkconfig writes it, read with a small lexer of grub's
  script language (words, quotes, ``$variables``, ``{ }`` blocks); ``/boot/grub/grubenv`` for ``saved_entry`` and
  ``next_entry``.
- grubby (RHEL 8/9): the output of ``grubby --info=DEFAULT``.
- bls: ``/boot/loader/entries/*.conf`` with the default of systemd-boot (``LoaderEntryOneShot``,
  ``LoaderEntryDefault``, ``loader.conf``) or of grub's blscfg (``grubenv``), else the newest version.

Every function that reads the filesystem takes the root (``/`` on a host, a temp dir in unit tests) and host paths.
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import json
import os
import re

from ansible_collections.gpuops.sandbox.plugins.module_utils._cmdline import grubby_info_entries, split_cmdline
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError, shown as _module_shown
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import FileTooLarge, host_path, read_file

GRUB_CFG = "/boot/grub/grub.cfg"
GRUB_ENVS = ("/boot/grub/grubenv", "/boot/grub2/grubenv")
BLS_ENTRIES_DIR = "/boot/loader/entries"
LOADER_CONFS = ("/boot/loader/loader.conf", "/efi/loader/loader.conf", "/boot/efi/loader/loader.conf")
EFIVARS_DIR = "/sys/firmware/efi/efivars"
LOADER_GUID = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
KEXEC_LOADED = "/sys/kernel/kexec_loaded"
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
MARKER = "/run/gpuops/kexec.json"
MARKER_VERSION = 1

LINUX_COMMANDS = ("linux", "linux16", "linuxefi")
INITRD_COMMANDS = ("initrd", "initrd16", "initrdefi")
# Words that open and close a compound command of grub's script language (blocks use { }).
_OPENERS = ("if", "while", "until", "for")
_CLOSERS = ("fi", "done")
_LEADERS = ("then", "else", "do")
# Options of menuentry/submenu that take a value; the other option words take none.
_ENTRY_VALUE_OPTIONS = ("--class", "--users", "--hotkey", "--id")
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[?#*@]")
_MAX_FILE = 4 * 1024 * 1024


class KexecError(GpuopsError):
    """A failure of kexec_load (bad input, a kexec command that failed for another reason than permission)."""


class NotLoadable(KexecError):
    """The next boot entry cannot be loaded with kexec; ``msg`` says why. Not a failure of the module."""


class Entry:
    """The boot entry the boot loader boots next: what kexec has to load."""

    def __init__(self, title, kernel, initrds, args, source):
        self.title = title
        self.kernel = kernel  # the path as the boot loader configuration names it
        self.initrds = list(initrds)  # the same, for each initramfs file
        self.args = list(args)  # the arguments, each one word of the kernel's command line
        self.source = source  # the file or command the entry was read from (for messages)

    @property
    def cmdline(self):
        return " ".join(self.args)


def shown(value, limit=80):
    return _module_shown(value, limit)


def read_text(root, path, limit=_MAX_FILE):
    """The text of host file ``path``, or None when it does not exist; NotLoadable when it cannot be read."""
    try:
        return read_file(host_path(root, path), limit=limit)
    except FileTooLarge as exc:
        raise NotLoadable("%s is larger than %d bytes; not a boot loader file this module reads" % (path, limit)) from exc
    except (IOError, OSError) as exc:
        raise NotLoadable("cannot read %s: %s" % (path, exc.strerror or exc)) from exc


# ---------------------------------------------------------------------------------------------
# grub's script language, as much of it as grub.cfg from grub-mkconfig uses
# ---------------------------------------------------------------------------------------------

class GrubWord:
    """One word of grub script: text and ``$variable`` parts; ``quoted`` when any of it was quoted or escaped."""

    def __init__(self):
        self.parts = []  # (is_variable, text)
        self.quoted = False

    def add_text(self, text):
        if self.parts and not self.parts[-1][0]:
            self.parts[-1] = (False, self.parts[-1][1] + text)
        else:
            self.parts.append((False, text))

    def add_variable(self, name):
        self.parts.append((True, name))

    @property
    def literal(self):
        """The text of the word when it holds no variable, else None."""
        if any(is_var for is_var, _text in self.parts):
            return None
        return "".join(text for _is_var, text in self.parts)

    @property
    def only_variable(self):
        """The variable's name when the word is one variable reference and nothing else, else None."""
        if len(self.parts) == 1 and self.parts[0][0]:
            return self.parts[0][1]
        return None

    @property
    def bare(self):
        """The literal text of an unquoted word (a keyword, a brace), else None."""
        return None if self.quoted else self.literal

    def __str__(self):
        return "".join("${%s}" % text if is_var else text for is_var, text in self.parts)


_SEPARATOR = object()


def _variable(text, pos, word):
    """``text[pos]`` is ``$``: add the variable to ``word`` and return the position after it."""
    if text[pos + 1:pos + 2] == "{":
        close = text.find("}", pos + 2)
        if close == -1:
            raise NotLoadable("unterminated ${ in grub script: %s" % shown(text[pos:pos + 40]))
        word.add_variable(text[pos + 2:close])
        return close + 1
    match = _VAR_NAME_RE.match(text, pos + 1)
    if not match:
        word.add_text("$")
        return pos + 1
    word.add_variable(match.group(0))
    return match.end()


def lex_grub(text):
    """Split grub script into GrubWord objects and separators (newline, ``;``)."""
    tokens = []
    word = None
    pos = 0
    size = len(text)

    def current():
        return word if word is not None else GrubWord()

    while pos < size:
        char = text[pos]
        if char == "\\":
            if text[pos + 1:pos + 2] == "\n":
                pos += 2
                continue
            word = current()
            word.quoted = True
            word.add_text(text[pos + 1:pos + 2])
            pos += 2
        elif char in " \t\r\f\v":
            if word is not None:
                tokens.append(word)
                word = None
            pos += 1
        elif char in "\n;":
            if word is not None:
                tokens.append(word)
                word = None
            tokens.append(_SEPARATOR)
            pos += 1
        elif char == "#" and word is None:
            end = text.find("\n", pos)
            pos = size if end == -1 else end
        elif char == "'":
            close = text.find("'", pos + 1)
            if close == -1:
                raise NotLoadable("unterminated single quote in grub script: %s" % shown(text[pos:pos + 40]))
            word = current()
            word.quoted = True
            word.add_text(text[pos + 1:close])
            pos = close + 1
        elif char == '"':
            word = current()
            word.quoted = True
            pos += 1
            while True:
                if pos >= size:
                    raise NotLoadable("unterminated double quote in grub script")
                char = text[pos]
                if char == '"':
                    pos += 1
                    break
                if char == "\\" and text[pos + 1:pos + 2] in ("$", '"', "\\", "\n"):
                    if text[pos + 1] != "\n":
                        word.add_text(text[pos + 1])
                    pos += 2
                elif char == "$":
                    pos = _variable(text, pos, word)
                else:
                    word.add_text(char)
                    pos += 1
        elif char == "$":
            word = current()
            pos = _variable(text, pos, word)
        else:
            word = current()
            word.add_text(char)
            pos += 1
    if word is not None:
        tokens.append(word)
    return tokens


class GrubBlock:
    """A ``{ }`` block of grub script: its header words (``menuentry 'x' --class y``) and its items."""

    def __init__(self, header, depth=0):
        self.header = header
        self.depth = depth  # how many if/while/for the block is inside, in its parent
        self.items = []  # GrubBlock or list of GrubWord (a command)

    @property
    def kind(self):
        return self.header[0].bare if self.header else None


def _strip_leaders(words):
    """Drop the then/else/do that start a command; return the rest."""
    while words and words[0].bare in _LEADERS:
        words = words[1:]
    return words


def _depth_change(words):
    first = words[0].bare if words else None
    if first in _OPENERS:
        return 1
    if first in _CLOSERS:
        return -1
    return 0


def parse_grub(text):
    """The block tree of a grub script; NotLoadable for unbalanced braces or quotes."""
    top = GrubBlock([])
    stack = [top]
    depths = [0]
    command = []

    def flush():
        if command:
            words = _strip_leaders(list(command))
            if words:
                stack[-1].items.append(words)
                depths[-1] = max(0, depths[-1] + _depth_change(words))
            del command[:]

    for token in lex_grub(text):
        if token is _SEPARATOR:
            flush()
        elif token.bare == "{":
            header = _strip_leaders(list(command))
            del command[:]
            block = GrubBlock(header, depths[-1])
            stack[-1].items.append(block)
            stack.append(block)
            depths.append(0)
        elif token.bare == "}":
            flush()
            if len(stack) == 1:
                raise NotLoadable("unbalanced '}' in grub script")
            stack.pop()
            depths.pop()
        else:
            command.append(token)
    flush()
    if len(stack) != 1:
        raise NotLoadable("a '{' block is not closed in grub script (menuentry %s)"
                          % shown(str(stack[-1].header[1]) if len(stack[-1].header) > 1 else "?"))
    return top


class MenuItem:
    """A top-level menuentry or submenu of grub.cfg."""

    def __init__(self, block):
        self.block = block
        self.kind = block.kind
        self.title = None
        self.id = None
        words = block.header[1:]
        idx = 0
        while idx < len(words):
            word = words[idx]
            if word.only_variable == "menuentry_id_option" or word.bare == "--id":
                if idx + 1 < len(words):
                    self.id = words[idx + 1].literal
                idx += 2
                continue
            if word.bare in _ENTRY_VALUE_OPTIONS:
                idx += 2
                continue
            if word.bare is not None and word.bare.startswith("--"):
                idx += 1
                continue
            if self.title is None:
                self.title = word.literal if word.literal is not None else str(word)
            idx += 1

    @property
    def label(self):
        return "%s %s" % (self.kind, shown(self.title))


def grub_menu(top):
    """``(items, defaults)``: the top-level menu items in order and the words of every top-level
    ``set default=...``; NotLoadable when the first item is inside a condition."""
    items = []
    defaults = []
    for item in top.items:
        if isinstance(item, GrubBlock):
            if item.kind in ("menuentry", "submenu"):
                if not items and item.depth:
                    raise NotLoadable("the first menu entry of grub.cfg (%s) is inside an if/while block: cannot "
                                      "tell whether grub creates it" % MenuItem(item).label)
                items.append(MenuItem(item))
            continue
        if item[0].bare == "set" and len(item) == 2:
            word = item[1]
            first = word.parts[0] if word.parts else (True, "")
            if not first[0] and first[1].startswith("default="):
                value = GrubWord()
                value.quoted = word.quoted
                rest = first[1][len("default="):]
                if rest:
                    value.add_text(rest)
                for part in word.parts[1:]:
                    if part[0]:
                        value.add_variable(part[1])
                    else:
                        value.add_text(part[1])
                defaults.append(value)
    return items, defaults


def parse_grubenv(text):
    """Variables of a grubenv block (``name=value`` lines; the ``#`` padding and comments skipped)."""
    env = {}
    for line in (text or "").splitlines():
        if line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if sep and name:
            env[name] = value
    return env


def read_grubenv(root, paths=GRUB_ENVS):
    """``(path, variables)`` of the first grubenv file found, or ``(None, {})``."""
    for path in paths:
        text = read_text(root, path)
        if text is not None:
            return path, parse_grubenv(text)
    return None, {}


def grub_default(defaults, env, env_path):
    """``(target, origin)``: the value of ``default`` grub will use, and where it comes from, in words."""
    next_entry = env.get("next_entry", "")
    plain = []
    for word in defaults:
        if word.only_variable == "next_entry":
            if next_entry:
                return next_entry, "next_entry=%s in %s (a one-time boot set with grub-reboot)" % (
                    shown(next_entry), env_path)
            continue
        if not any(str(word) == str(other) for other in plain):
            plain.append(word)
    if not plain:
        return "0", "no 'set default' in grub.cfg"
    if len(plain) > 1:
        raise NotLoadable("grub.cfg sets default in several ways (%s): cannot tell which applies"
                          % ", ".join(shown(str(w)) for w in plain))
    word = plain[0]
    if word.literal is not None:
        return word.literal, "set default=%s in grub.cfg" % shown(word.literal)
    name = word.only_variable
    if name == "saved_entry":
        value = env.get("saved_entry", "")
        where = env_path or "grubenv (there is none)"
        return value, "saved_entry=%s in %s (GRUB_DEFAULT=saved)" % (shown(value), where)
    raise NotLoadable("grub.cfg sets default=%s, which this module cannot resolve" % shown(str(word)))


def _default_index(items, target, origin):
    """The index of the top-level item ``target`` names; NotLoadable when it names none or a nested entry."""
    if target == "":
        return 0  # grub boots the first entry when default names nothing
    if target.isdigit():
        index = int(target)
        if index >= len(items):
            raise NotLoadable("the default entry is number %d (%s) but grub.cfg has only %d top-level entries"
                              % (index, origin, len(items)))
        return index
    if ">" in target:
        raise NotLoadable("the default entry is %s (%s), an entry inside a submenu, not the first entry; only "
                          "the first entry is loaded with kexec" % (shown(target), origin))
    for index, item in enumerate(items):
        if target in (item.title, item.id):
            return index
    raise NotLoadable("the default entry %s (%s) names no top-level entry of grub.cfg" % (shown(target), origin))


def _body_commands(block):
    """``(linux commands, initrd commands)`` of a menuentry body: each ``(depth, argument words)``."""
    linux, initrd = [], []
    depth = 0
    for item in block.items:
        if isinstance(item, GrubBlock):
            continue
        first = item[0].bare
        if first in LINUX_COMMANDS:
            linux.append((depth, first, item[1:]))
        elif first in INITRD_COMMANDS:
            initrd.append((depth, first, item[1:]))
        depth = max(0, depth + _depth_change(item))
    return linux, initrd


def grub_args(words, what, warnings):
    """Literal texts of ``words``; a word that is only a variable is dropped with a warning, any other
    word with a variable makes the entry not loadable."""
    result = []
    for word in words:
        if word.literal is not None:
            result.append(word.literal)
        elif word.only_variable is not None:
            warnings.append("dropped %s from the %s: a grub variable set only while grub runs (its value is not in "
                            "grub.cfg)" % (str(word), what))
        else:
            raise NotLoadable("the %s has %s, a word with a grub variable in it: cannot tell its value"
                              % (what, shown(str(word))))
    return result


def grub_quote(arg):
    """One argument as grub puts it on the kernel's command line: backslash, quotes escaped, a space quoted."""
    text = re.sub(r'([\\\'"])', r"\\\1", arg)
    return '"%s"' % text if " " in arg else text


def grub_entry(root, warnings):
    """The entry grub boots next, from grub.cfg (and grubenv)."""
    text = read_text(root, GRUB_CFG)
    if text is None:
        raise NotLoadable("%s does not exist" % GRUB_CFG)
    items, defaults = grub_menu(parse_grub(text))
    if not items:
        hint = ""
        if re.search(r"^\s*blscfg\b", text, re.M):
            hint = " (it reads the BLS entries with blscfg: use backend bls or grubby)"
        raise NotLoadable("%s has no menuentry%s" % (GRUB_CFG, hint))
    env_path, env = read_grubenv(root, (os.path.join(os.path.dirname(GRUB_CFG), "grubenv"),))
    target, origin = grub_default(defaults, env, env_path)
    index = _default_index(items, target, origin)
    item = items[index]
    if index != 0:
        raise NotLoadable("the default entry is %s, number %d (%s), not the first entry; only the first entry is "
                          "loaded with kexec" % (item.label, index, origin))
    if item.kind != "menuentry":
        raise NotLoadable("the first entry of grub.cfg is %s, not a menuentry" % item.label)
    linux, initrd = _body_commands(item.block)
    what = "menuentry %s" % shown(item.title)
    if not linux:
        raise NotLoadable("%s has no linux line (not a Linux entry)" % what)
    if len(linux) > 1:
        raise NotLoadable("%s has %d linux lines: cannot tell which one grub runs" % (what, len(linux)))
    if linux[0][0] or any(depth for depth, _cmd, _words in initrd):
        raise NotLoadable("the linux or initrd line of %s is inside an if/while block: cannot tell whether grub "
                          "runs it" % what)
    if len(initrd) > 1:
        raise NotLoadable("%s has %d initrd lines; kexec loads one initramfs" % (what, len(initrd)))
    words = grub_args(linux[0][2], "linux line of %s" % what, warnings)
    if not words:
        raise NotLoadable("the linux line of %s names no kernel" % what)
    initrds = grub_args(initrd[0][2], "initrd line of %s" % what, warnings) if initrd else []
    args = [grub_quote(arg) for arg in words[1:]]
    return Entry(item.title, words[0], initrds, args, GRUB_CFG)


# ---------------------------------------------------------------------------------------------
# grubby
# ---------------------------------------------------------------------------------------------

def parse_grubby(text):
    """The first entry of ``grubby --info=...`` output as ``{key: value}``, the first value of a key counting
    (see :func:`_cmdline.grubby_info_entries`)."""
    entries = grubby_info_entries(text)
    entry = {}
    for key, value in entries[0] if entries else ():
        entry.setdefault(key, value)
    return entry


def expand_variables(words, env, what, warnings):
    """Replace each word that is only a grub variable (``$tuned_params``) by its value in grubenv, or drop it
    with a warning when grubenv does not set it (grub expands it to nothing)."""
    result = []
    for word in words:
        match = re.fullmatch(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))", word)
        if not match:
            result.append(word)
            continue
        name = match.group(1) or match.group(2)
        if env.get(name):
            result.extend(split_cmdline(env[name]))
        else:
            warnings.append("dropped %s from the %s: grubenv does not set it" % (word, what))
    return result


def grubby_entry(root, run, grubby, warnings):
    """The default entry per ``grubby --info=DEFAULT``; ``run(argv)`` returns ``(rc, stdout, stderr)``."""
    argv = [grubby, "--info=DEFAULT"]
    rc, out, err = run(argv)
    if rc != 0:
        raise NotLoadable("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or out or "").strip()[-500:]
                                                     or "(no output)"))
    info = parse_grubby(out)
    kernel = info.get("kernel")
    if not kernel or kernel == "non linux entry":
        raise NotLoadable("grubby --info=DEFAULT names no Linux kernel: %s" % shown((out or "").strip(), 200))
    _env_path, env = read_grubenv(root)
    args = expand_variables(split_cmdline(info.get("args", "")), env, "grubby args", warnings)
    root_dev = info.get("root")
    if root_dev and not any(w.startswith("root=") for w in args):
        args.insert(0, "root=" + root_dev)
    initrds = expand_variables(split_cmdline(info.get("initrd", "")), env, "grubby initrd", warnings)
    return Entry(info.get("title") or kernel, kernel, initrds, args, "grubby --info=DEFAULT")


# ---------------------------------------------------------------------------------------------
# Boot Loader Specification entries (systemd-boot, kernel-install, grub's blscfg)
# ---------------------------------------------------------------------------------------------

def vercmp(left, right):
    """Compare two version strings the way rpm and systemd do: digit runs as numbers, newer than letters;
    ``~`` sorts before anything, the end included."""
    if left == right:
        return 0
    a = re.findall(r"~|[0-9]+|[A-Za-z]+", left)
    b = re.findall(r"~|[0-9]+|[A-Za-z]+", right)
    for idx in range(max(len(a), len(b))):
        x = a[idx] if idx < len(a) else None
        y = b[idx] if idx < len(b) else None
        if x == "~" or y == "~":
            if x != y:
                return -1 if x == "~" else 1
            continue
        if x is None or y is None:
            return -1 if x is None else 1
        if x.isdigit() and y.isdigit():
            diff = int(x) - int(y)
            if diff:
                return -1 if diff < 0 else 1
            continue
        if x.isdigit() != y.isdigit():
            return 1 if x.isdigit() else -1
        if x != y:
            return -1 if x < y else 1
    return (left > right) - (left < right)


class BlsEntry:
    def __init__(self, path, text):
        self.path = path
        self.name = os.path.basename(path)
        self.id = self.name[:-len(".conf")]
        self.keys = {}
        self.initrds = []
        options = []
        for line in text.splitlines():
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            fields = stripped.split(None, 1)
            key, value = fields[0], (fields[1].strip() if len(fields) > 1 else "")
            if key == "initrd":
                self.initrds.extend(value.split())
            elif key == "options":
                options.append(value)
            else:
                self.keys.setdefault(key, value)
        self.options = " ".join(options)

    @property
    def version(self):
        return self.keys.get("version") or self.id

    @property
    def title(self):
        return self.keys.get("title") or self.id


def _newest(entries):
    def compare(x, y):
        return vercmp(x.version, y.version) or vercmp(x.id, y.id)
    return max(entries, key=functools.cmp_to_key(compare))


def read_efivar(root, name):
    """The UTF-16 string of a systemd-boot EFI variable, or None when it is not set."""
    path = host_path(root, "%s/%s-%s" % (EFIVARS_DIR, name, LOADER_GUID))
    try:
        with open(path, "rb") as handle:
            data = handle.read(4096)
    except (IOError, OSError):
        return None
    text = data[4:].decode("utf-16-le", errors="replace").split("\x00")[0].strip()
    return text or None


def bls_entries(root):
    entries = []
    for path in sorted(glob.glob(os.path.join(host_path(root, BLS_ENTRIES_DIR), "*.conf"))):
        text = read_text(root, BLS_ENTRIES_DIR + "/" + os.path.basename(path))
        if text is not None:
            entries.append(BlsEntry(BLS_ENTRIES_DIR + "/" + os.path.basename(path), text))
    return entries


def _loader_conf_default(root):
    """``(path, default glob or None)`` of the first loader.conf found, or ``(None, None)``."""
    for path in LOADER_CONFS:
        text = read_text(root, path)
        if text is None:
            continue
        default = None
        for line in text.splitlines():
            fields = line.split(None, 1)
            if len(fields) == 2 and fields[0] == "default" and not fields[1].startswith("#"):
                default = fields[1].strip()
        return path, default
    return None, None


def bls_default(root, entries):
    """``(entry, origin)`` of the entry booted next; NotLoadable when the configured default names none."""
    conf_path, conf_default = _loader_conf_default(root)
    env_path, env = read_grubenv(root)
    choices = []
    if conf_path is not None:
        for name in ("LoaderEntryOneShot", "LoaderEntryDefault"):
            value = read_efivar(root, name)
            if value:
                choices.append((value, "the EFI variable %s" % name, True))
        if conf_default:
            choices.append((conf_default, "default in %s" % conf_path, True))
    else:
        for name in ("next_entry", "saved_entry"):
            if env.get(name):
                choices.append((env[name], "%s in %s" % (name, env_path), False))
    if not choices:
        return _newest(entries), "the newest version (no default is set)"
    pattern, origin, is_glob = choices[0]
    if pattern.startswith("@"):
        raise NotLoadable("the default entry is %s (%s): this module does not resolve it" % (shown(pattern), origin))
    if not is_glob and pattern.isdigit():
        ordered = sorted(entries, key=functools.cmp_to_key(
            lambda x, y: vercmp(y.version, x.version) or vercmp(y.id, x.id)))
        if int(pattern) >= len(ordered):
            raise NotLoadable("the default entry is number %s (%s) but there are %d entries"
                              % (pattern, origin, len(ordered)))
        return ordered[int(pattern)], origin
    if is_glob:
        matches = [e for e in entries if fnmatch.fnmatchcase(e.name, pattern) or fnmatch.fnmatchcase(e.id, pattern)]
    else:
        matches = [e for e in entries if pattern in (e.id, e.name, e.title)]
    if not matches:
        raise NotLoadable("the default entry %s (%s) names none of the entries in %s"
                          % (shown(pattern), origin, BLS_ENTRIES_DIR))
    return _newest(matches), origin


def bls_entry(root, warnings):
    """The entry booted next among the BLS entries."""
    entries = bls_entries(root)
    if not entries:
        raise NotLoadable("there is no boot entry in %s" % BLS_ENTRIES_DIR)
    entry, origin = bls_default(root, entries)
    if not entry.keys.get("linux"):
        raise NotLoadable("the default entry %s (%s) has no linux key (not a Linux entry)" % (entry.path, origin))
    args = split_cmdline(entry.options)
    initrds = entry.initrds
    if _loader_conf_default(root)[0] is None:
        _env_path, env = read_grubenv(root)
        args = expand_variables(args, env, "options of %s" % entry.path, warnings)
        initrds = expand_variables(initrds, env, "initrd of %s" % entry.path, warnings)
    return Entry(entry.title, entry.keys["linux"], initrds, args, entry.path)


# ---------------------------------------------------------------------------------------------
# Files named by an entry, the kexec state, the module's marker
# ---------------------------------------------------------------------------------------------

def resolve_boot_path(root, path, what):
    """The host path of a file an entry names. Boot loaders read it on the partition of /boot, so
    ``/vmlinuz-x`` may be ``/boot/vmlinuz-x``: the path is tried as is, then under /boot (first when /boot
    is a file system of its own)."""
    if not path.startswith("/"):
        raise NotLoadable("the %s %s is not an absolute path (a grub device such as (hd0,gpt2) cannot be "
                          "mapped to a file)" % (what, shown(path)))
    candidates = [path]
    if not path.startswith("/boot/"):
        boot = "/boot" + path
        if os.path.ismount(host_path(root, "/boot")):
            candidates.insert(0, boot)
        else:
            candidates.append(boot)
    for candidate in candidates:
        if os.path.isfile(host_path(root, candidate)):
            return candidate
    raise NotLoadable("the %s %s is not there (looked for %s)" % (what, path, " and ".join(candidates)))


def file_id(root, path):
    """``[size, mtime in ns]`` of a host file: a rebuilt initramfs is another file."""
    info = os.stat(host_path(root, path))
    return [info.st_size, info.st_mtime_ns]


def read_loaded(root):
    """True/False from /sys/kernel/kexec_loaded, None when the file is not there (no kexec in the kernel)."""
    text = read_text(root, KEXEC_LOADED, 64)
    if text is None:
        return None
    return text.strip() == "1"


def read_boot_id(root):
    try:
        text = read_text(root, BOOT_ID_FILE, 128)
    except NotLoadable:
        return None
    return text.strip() if text else None


def read_marker(root):
    """What this module last loaded (the marker's fields), or None when there is no valid marker."""
    try:
        text = read_text(root, MARKER, 65536)
        data = json.loads(text) if text is not None else None
    except (NotLoadable, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("version") != MARKER_VERSION or not isinstance(data.get("kernel"), str):
        return None
    return data


def render_marker(image):
    return json.dumps(dict(image, version=MARKER_VERSION), indent=2, sort_keys=True) + "\n"


IMAGE_FIELDS = ("kernel", "initrd", "cmdline", "kernel_file", "initrd_file", "boot_id")


def same_image(marker, image):
    return marker is not None and all(marker.get(field) == image.get(field) for field in IMAGE_FIELDS)


def describe(image):
    """Diff text of a loaded image (a marker or the wanted image); ``""`` for none."""
    if image is None:
        return ""
    return "kernel: %s\ninitrd: %s\ncmdline: %s\n" % (image.get("kernel"), image.get("initrd") or "(none)",
                                                      image.get("cmdline"))
