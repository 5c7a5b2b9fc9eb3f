# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one way every module of the collection starts, ends and fails.

- ``GpuopsError``: the base of every error the collection raises on purpose. ``msg`` is what the user reads
  (it names the bad value and what is accepted, or what was changed and rolled back); ``extra`` holds further
  result keys (``rollback``, ``kind``, ...).
- ``create_module``: AnsibleModule, failing with a message for argument values ansible-core's own checks turn
  into exceptions (``inf``, ``nan``, integers of thousands of digits).
- ``run_timed``: runs one command from an argument list with ``LC_ALL=C`` under timeout(1), telling a command that
  ran out of time apart in its stderr.
- ``run_module``: builds the module, runs its body, and turns every outcome into ``exit_json`` or ``fail_json``:
  a ``GpuopsError`` with its message, a filesystem error with a message naming it, anything else as an
  internal error with its type and text. No traceback reaches the user. Secrets registered with
  ``hide`` (tokens read from files, passwords inside URLs) are masked in every message.
"""

from __future__ import annotations

NOT_FINITE = ("inf", "infinity", "nan")
MASK = "********"

# The exit codes of a command that ran out of time under timeout(1): 124 when it ended on timeout's SIGTERM; when
# it ignored that and got SIGKILL --kill-after seconds later, timeout(1) is killed with its process group, which
# run_command reports as -9 (a shell would say 137).
TIMEOUT_RC = 124
KILLED_AFTER_TIMEOUT_RC = 137
TIMED_OUT_RCS = (TIMEOUT_RC, KILLED_AFTER_TIMEOUT_RC, -9)


class GpuopsError(Exception):
    """An error with a message for the user; ``extra`` are further result keys for ``fail_json``."""

    def __init__(self, msg, **extra):
        super().__init__(msg)
        self.msg = msg
        self.extra = extra

    def __str__(self):
        return self.msg


def error_text(exc):
    """The message of a collection error, the text of any other (with its type when it is not an OS error)."""
    if isinstance(exc, GpuopsError):
        return exc.msg
    if isinstance(exc, (IOError, OSError)):
        return str(exc)
    return "%s: %s" % (type(exc).__name__, exc)


def shown(value, limit=60):
    """``repr(value)`` (control characters escaped), cut to ``limit`` characters with the full length said, for
    messages."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return "%s... (%d characters)" % (text[:limit - 10], len(str(value)))


def hide(module, *secrets):
    """Mask ``secrets`` (non-empty strings, also their stripped forms) in everything the module returns."""
    for secret in secrets:
        if isinstance(secret, str):
            for form in (secret, secret.strip()):
                if len(form) >= 4:
                    module.no_log_values.add(form)


def create_module(module_class, argument_spec, **kwargs):
    """``module_class(argument_spec=..., **kwargs)``, failing with a message for values that ansible-core's
    integer and float checks turn into exceptions (``inf``, ``-Infinity``, ``nan``, integers too long to
    convert); the arguments are then read without types and the message names the option and its value.
    """
    try:
        return module_class(argument_spec=argument_spec, **kwargs)
    except (OverflowError, ValueError) as exc:
        loose_spec = dict((name, dict(type="raw", aliases=spec.get("aliases", []), no_log=spec.get("no_log", False)))
                          for name, spec in argument_spec.items())
        loose = module_class(argument_spec=loose_spec, supports_check_mode=True)
        bad = []
        for name, spec in sorted(argument_spec.items()):
            if spec.get("type") not in ("int", "float") or spec.get("no_log"):
                continue
            value = str(loose.params.get(name)).strip().lstrip("+-").lower()
            if value in NOT_FINITE or (value.isdigit() and len(value) > 18):
                shown = loose.params.get(name)
                shown = shown if len(str(shown)) <= 40 else "%s... (%d characters)" % (str(shown)[:20], len(str(shown)))
                bad.append("%s=%r" % (name, shown))
        reason = str(exc) if len(str(exc)) <= 200 else str(exc)[:200] + "..."
        loose.fail_json(msg="%s: expected a whole number of a sensible size (%s); nothing was changed"
                        % (", ".join(bad) or "an integer option", reason))
        raise  # not reached: fail_json exits


def _size(value):
    """How many digits an integer has (str() of one of more than 4300 digits raises, so those are not spelt)."""
    return "%d digits" % len(str(abs(value))) if abs(value) < 10 ** 4000 else "more than 4000 digits"


def check_range(name, value, low=None, high=None, what="seconds"):
    """Raise GpuopsError unless ``low <= value <= high`` (either bound may be None); booleans are refused."""
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise GpuopsError("%s must be a whole number of %s, got %r; nothing was changed" % (name, what, value))
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = "%s to %s" % (low, high) if low is not None and high is not None else (
            "at least %s" % low if low is not None else "at most %s" % high)
        shown = str(value) if abs(value) <= 10 ** 15 else "a number of %s" % _size(value)
        raise GpuopsError("%s must be %s %s, got %s; nothing was changed" % (name, bounds, what, shown))
    return value


def check_timeout(value, low, high, error=GpuopsError, name="timeout"):
    """Raise ``error`` unless ``value`` is a whole number of seconds from ``low`` (0 or 1) to ``high``.

    A number below ``low`` is told as the modules always told it ("must be 0 or a positive number of seconds");
    anything else out of range, a boolean or a non-number as ``check_range`` tells it.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value < low:
        raise error("%s must be %s number of seconds, got %d" % (name, "0 or a positive" if low == 0 else "a positive",
                                                                 value))
    try:
        return check_range(name, value, low, high)
    except GpuopsError as exc:
        if error is GpuopsError:
            raise
        raise error(exc.msg) from exc


def run_timed(module, argv, timeout, option="command_timeout", kill_after=10, data=None):
    """Run ``argv`` (a list, never a shell string) with ``LC_ALL=C`` under ``timeout --kill-after``; return
    ``(rc, stdout, stderr)`` as strings. A command that ran out of time gets a line in its stderr naming the time
    limit and ``option`` (the module option that sets it). Without timeout(1) on the host the command runs unbounded.
    ``data`` (text) is the command's standard input, given as it is.
    """
    full = list(argv)
    timeout_bin = module.get_bin_path("timeout") if timeout and timeout > 0 else None
    if timeout_bin:
        full = [timeout_bin, "--kill-after=%d" % kill_after, str(timeout)] + full
    extra = {} if data is None else {"data": data, "binary_data": True}
    rc, out, err = module.run_command(full, environ_update={"LC_ALL": "C"}, expand_user_and_vars=False, **extra)
    if timeout_bin and rc in TIMED_OUT_RCS:
        err = "%s\n%s did not finish within %d seconds (%s)" % ((err or "").rstrip(), argv[0], timeout, option)
    return rc, out or "", err or ""


def run_module(build, body, *args, **kwargs):
    """``module = build()``, then ``exit_json(**body(module, *args, **kwargs))``; every failure is fail_json.

    ``body`` returns the result dict (``changed`` included) or raises. It never calls exit_json/fail_json
    itself.
    """
    module = build()
    try:
        result = body(module, *args, **kwargs)
    except GpuopsError as exc:
        extra = dict(exc.extra)
        extra.setdefault("changed", False)
        module.fail_json(msg=exc.msg, **extra)
    except (IOError, OSError) as exc:
        module.fail_json(msg="unexpected filesystem error: %s" % exc, changed=False)
    except Exception as exc:  # pylint: disable=broad-exception-caught
        # The last line: a bug shows as a message, never as a traceback. Bodies roll back their own changes.
        module.fail_json(msg="%s failed unexpectedly (%s: %s); please report this"
                         % (getattr(module, "_name", None) or "the module", type(exc).__name__, exc), changed=False)
    module.exit_json(**result)
