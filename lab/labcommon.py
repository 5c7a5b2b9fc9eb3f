# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""labcommon: the helpers the lab scripts (gpulab.py, kubelab.py, operatorlab.py) share.

A script makes one `Lab` for itself, which knows its name and its error class: its log lines, the commands it
runs, its lock files and its command line (`main`) speak in that name. The functions below it know nothing of
any script: files, JSON records, loopback ports and the processes a lab starts.

The scripts import this module as a sibling (they put their own directory on sys.path), so each still runs on
its own as `python lab/<script>.py`; it keeps no state of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

# Seconds between the progress lines of a long step (GPUOPS_LAB_PROGRESS=0 turns them off).
PROGRESS_ENV = "GPUOPS_LAB_PROGRESS"
PROGRESS_DEFAULT = 30


class Lab:
    """One lab script: `prog` names it in every message, `error` is its error for the user (printed without a
    traceback by `main`). `log_to` is the stream of its log lines ("stdout" or "stderr", looked up at each line),
    `run_tail` how many lines of a failed command's output its error carries, `lock_path_in_log` whether a wait
    for a lock names the lock file's whole path or only its name."""

    def __init__(self, prog, error, log_to="stderr", run_tail=20, lock_path_in_log=False):
        self.prog = prog
        self.error = error
        self.log_to = log_to
        self.run_tail = run_tail
        self.lock_path_in_log = lock_path_in_log
        self.debug_env = prog.upper() + "_DEBUG"

    def log(self, msg):
        print(self.prog + ": " + msg, file=getattr(sys, self.log_to), flush=True)

    def run(self, cmd, timeout=600, check=True, env=None, cwd=None, input_text=None, progress=None):
        """Run a command (list) with a timeout; raise the lab's error with its output when it fails.

        With `progress` (what the command does, as in "building helm"), a line every few seconds says how
        long it has run, how many lines it has printed and the last of them (see `Progress`)."""
        try:
            if progress:
                proc = self._run_reporting(cmd, timeout, env, cwd, input_text, progress)
            else:
                proc = subprocess.run(cmd, timeout=timeout, check=False, text=True, input=input_text, cwd=cwd,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                      stdin=None if input_text is not None else subprocess.DEVNULL)
        except FileNotFoundError:
            raise self.error("command not found: %s" % cmd[0])
        except subprocess.TimeoutExpired:
            raise self.error("command timed out after %ss: %s" % (timeout, " ".join(cmd)))
        if check and proc.returncode != 0:
            tail = ((proc.stderr or "") + (proc.stdout or "")).strip().splitlines()[-self.run_tail:]
            raise self.error("command failed (rc=%s): %s\n%s" % (proc.returncode, " ".join(cmd), "\n".join(tail)))
        return proc

    def _run_reporting(self, cmd, timeout, env, cwd, input_text, what):
        """subprocess.run for `run(progress=...)`: both streams are read as they come, so the progress lines
        can show the latest output line."""
        proc = subprocess.Popen(cmd, text=True, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL)
        streams = {"stdout": [], "stderr": []}
        with Progress(self, what) as progress:
            readers = [threading.Thread(target=_read_lines, args=(getattr(proc, name), lines, progress), daemon=True)
                       for name, lines in streams.items()]
            for reader in readers:
                reader.start()
            if input_text is not None:
                try:
                    proc.stdin.write(input_text)
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                progress.failed = True
                raise
            finally:
                for reader in readers:
                    reader.join(timeout=5)
            progress.failed = proc.returncode != 0
        return subprocess.CompletedProcess(cmd, proc.returncode, "".join(streams["stdout"]), "".join(streams["stderr"]))

    @contextlib.contextmanager
    def locked(self, path):
        """Hold an exclusive lock file, so two commands of this lab do not act on the same things at once."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.log("another %s command holds %s; waiting for it"
                         % (self.prog, path if self.lock_path_in_log else os.path.basename(path)))
                fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def parser(self, doc):
        """(parser, its subcommands): the description is the first paragraph of the script's docstring `doc`."""
        parser = argparse.ArgumentParser(prog=self.prog, description=doc.split("\n\n", maxsplit=1)[0])
        return parser, parser.add_subparsers(dest="command", required=True)

    def main(self, parser, argv=None):
        """Parse `argv`, run the chosen command (its `func`); return the exit code. The lab's errors and an
        interrupt are one line on stderr; anything else too, unless <PROG>_DEBUG is set (then the traceback)."""
        args = parser.parse_args(argv)
        try:
            args.func(args)
        except self.error as exc:
            print("%s: error: %s" % (self.prog, exc), file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("%s: interrupted" % self.prog, file=sys.stderr)
            return 130
        except Exception as exc:  # pylint: disable=broad-except
            if os.environ.get(self.debug_env):
                raise
            print("%s: unexpected error: %s: %s (set %s=1 for a traceback)"
                  % (self.prog, type(exc).__name__, exc, self.debug_env), file=sys.stderr)
            return 1
        return 0


def progress_interval():
    """Seconds between progress lines: GPUOPS_LAB_PROGRESS, else 30; 0 (or a bad value) means none."""
    value = os.environ.get(PROGRESS_ENV)
    if value is None:
        return PROGRESS_DEFAULT
    try:
        seconds = float(value)
    except ValueError:
        return 0
    return seconds if 0 < seconds < float("inf") else 0


def duration(seconds):
    """45s, 3m05s, 1h02m: how people read elapsed times."""
    seconds = int(seconds)
    if seconds < 60:
        return "%ds" % seconds
    if seconds < 3600:
        return "%dm%02ds" % divmod(seconds, 60)
    return "%dh%02dm" % (seconds // 3600, seconds % 3600 // 60)


# A terminal's control sequences: CSI (colours, cursor moves, erase: ESC [ ... final byte), OSC (a window title:
# ESC ] ... BEL or ESC \\) and the other escapes (ESC, intermediate bytes, a final byte: ESC ( B, ESC 7...).
CONTROL_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~])")
# What is left of control characters after the sequences are gone (a lone ESC, BEL, backspace, NUL...).
CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def plain_text(text):
    """A console or command output line as a terminal would have shown it, as plain text on one line: without
    control sequences (systemd's colours on a serial console), only what the last carriage return redrew
    (a progress counter rewriting its line), with runs of white space as one space."""
    text = CONTROL_SEQUENCE.sub("", text or "")
    drawn = [part for part in text.split("\r") if part.strip()]
    text = drawn[-1] if drawn else ""
    return " ".join(CONTROL_CHARACTER.sub("", text).split())


class Progress:
    """A long step that says, every `progress_interval()` seconds, that it is still going: what it does, for
    how long, and what it is at (the last output line of its command, or what `status()` returns), and at
    the end how long it took (unless `say_done` is false: the caller says it).

    Used as `with Progress(lab, "building helm") as step: ...`; `step.line(text)` counts an output line
    (thread-safe)."""

    LAST_WIDTH = 90

    def __init__(self, lab, what, status=None, interval=None, say_done=True):
        self.lab = lab
        self.say_done = say_done
        self.what = what
        self.status = status
        self.interval = progress_interval() if interval is None else interval
        self.started = time.monotonic()
        self.lines = 0
        self.last = ""
        self.failed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def line(self, text):
        text = text.strip()
        with self._lock:
            self.lines += 1
            if text:
                self.last = text

    def elapsed(self):
        return time.monotonic() - self.started

    def report(self):
        """The progress line: 'still building helm (2m30s, 812 lines of output; last: ...)'."""
        with self._lock:
            lines, last = self.lines, self.last
        if self.status is not None:
            try:
                last = self.status() or ""
            except Exception:  # pylint: disable=broad-except
                last = ""
        details = [duration(self.elapsed())]
        if lines:
            details.append("%d line%s of output" % (lines, "" if lines == 1 else "s"))
        text = "still %s (%s)" % (self.what, ", ".join(details))
        last = plain_text(last)
        if last:
            if len(last) > self.LAST_WIDTH:
                last = last[:self.LAST_WIDTH - 3] + "..."
            text += ": " + last
        return text

    def _beat(self):
        while not self._stop.wait(self.interval):
            self.lab.log(self.report())

    def __enter__(self):
        if self.interval:
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.say_done and exc_type is None and not self.failed and self.elapsed() >= (self.interval or float("inf")):
            self.lab.log("%s: done in %s" % (self.what, duration(self.elapsed())))
        return False


def _read_lines(stream, lines, progress):
    for text in iter(stream.readline, ""):
        lines.append(text)
        progress.line(text)
    stream.close()


def add_command(sub, name, func, text, **defaults):
    """Add the subcommand `name` (help `text`) that runs `func(args)`; return its parser, for its arguments."""
    parser = sub.add_parser(name, help=text)
    parser.set_defaults(func=func, **defaults)
    return parser


# ---------------------------------------------------------------------------------------------
# Files and JSON records
# ---------------------------------------------------------------------------------------------

def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_text(path, text, mode=0o644):
    """Write `text` to `path` through a temporary file beside it, so a reader never sees half of it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def read_json(path):
    """The JSON object in `path`; {} when the file is missing, unreadable or holds no JSON object."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def inventory_entries(data):
    """Each listing of a host in an Ansible YAML inventory's data, depth first in file order (a group's hosts
    before its children): ``(host, hostvars, groups)``, ``groups`` the group names from the top down to the
    group that lists it. A host listed twice comes twice; its callers merge or keep the first."""
    found = []

    def walk(name, group, path):
        if not isinstance(group, dict):
            return
        path = path + (name,)
        for host, hostvars in (group.get("hosts") or {}).items():
            found.append((host, hostvars if isinstance(hostvars, dict) else {}, path))
        for child_name, child in (group.get("children") or {}).items():
            walk(child_name, child, path)

    for name, group in (data or {}).items():
        walk(name, group, ())
    return found


def inventory_host_vars(data, host):
    """The variables given to ``host`` in an inventory's data, merged over its listings ({} when none)."""
    merged = {}
    for name, hostvars, _groups in inventory_entries(data):
        if name == host:
            merged.update(hostvars)
    return merged


def write_json(path, data, sort_keys=False):
    write_text(path, json.dumps(data, indent=2, sort_keys=sort_keys) + "\n")


def tail_file(path, lines):
    """The last `lines` lines of a log file, or "(no log)"."""
    try:
        with open(path, errors="replace") as handle:
            return "\n".join(handle.read().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def utc_now():
    """The time now as recorded in the labs' manifests and metadata (ISO 8601, UTC, whole seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------------------------------------
# Loopback ports
# ---------------------------------------------------------------------------------------------

def port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count):
    """`count` distinct free loopback ports, chosen by the kernel."""
    socks, ports = [], []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in socks:
            sock.close()
    return ports


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------

def proc_stat(pid):
    """The fields of /proc/<pid>/stat after the command name (the first is the state), or None when there is
    no such process or it is a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, TypeError):
        return None
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields


def spawn(cmd, log_path, env=None, log_mode="ab"):
    """Start `cmd` in a session (and process group) of its own, its output into `log_path`; return the Popen."""
    with open(log_path, log_mode) as logf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True)
    return proc


def stop_process(alive, send, timeout):
    """SIGTERM through `send(signal)`, SIGKILL when `alive()` still holds after `timeout` seconds; True when it
    is gone. Nothing is sent to what `alive()` does not recognise."""
    if not alive():
        return True
    with contextlib.suppress(ProcessLookupError):
        send(signal.SIGTERM)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not alive():
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        send(signal.SIGKILL)
    time.sleep(0.5)
    return not alive()
