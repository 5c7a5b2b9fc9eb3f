#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_lock
short_description: Hold a host-side lock for the duration of a GPU host preparation
version_added: 1.0.0
description:
  - Keeps two preparations of the same host (a scheduled AWX job and a person, say) from interleaving. The lock is
    the record C(/var/lib/gpuops/lock.json) on the host, a JSON object with C(run_id), C(owner), C(started),
    C(updated) (UTC timestamps from the host clock), C(boot_id) (from C(/proc/sys/kernel/random/boot_id)) and
    C(expect_reboot).
  - V(present) takes the lock, or refreshes it when the record already holds O(run_id). Against another run's
    record it fails, changing nothing, with a message naming that run's owner, run id, start and the time since
    its last refresh, unless that record is stale or O(break=true); it is then taken over and RV(took_over) says
    whose it was and why.
  - "Another run's record is stale when the host booted since it was written and it did not announce that reboot
    (O(expect_reboot)): that run ended with the host (power loss, crash, a reboot by someone else); or when its
    last refresh is more than O(stale_after) seconds old."
  - A record holding O(run_id) written in an earlier boot is this run's own lock across the reboot it announced
    with O(expect_reboot=true); it is refreshed with the new boot id. If this run did not announce a reboot, it is
    refreshed as well, with a warning that the host rebooted under the run.
  - V(absent) releases the lock, removing the record only when it holds O(run_id); another run's record is left
    alone with a warning naming it (unless O(break=true)).
  - One call reads, checks and writes the record while it holds an exclusive C(flock) on C(/var/lib/gpuops), so two
    calls started at the same instant are serialised and exactly one of them gets the lock. The record is written
    atomically and durably (a temporary file synced to the disk, renamed over it, the directory synced), so a power
    loss leaves the old record or the new one, never an empty file; mode 0644; the directory is created 0755 when
    missing.
  - A record that is not valid (not JSON, missing fields, unreadable) fails the call with a message naming the file;
    O(break=true) replaces it. A directory or symlink in place of the record is never replaced.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  state:
    description:
      - V(present) takes or refreshes the lock; V(absent) releases it.
    type: str
    choices: [present, absent]
    default: present
  run_id:
    description:
      - Identifies this run, the same on every call of the run and different from every other run (for example
        the AWX job id, or the control host, process id and start time).
      - "1 to 128 of the characters C(A-Z a-z 0-9 . _ : -)."
    type: str
    required: true
  owner:
    description:
      - Free text naming the run for people, quoted in the messages other runs get, for example
        "alice@ctl-1 pid 4242, playbooks/prepare_hosts.yml" or "AWX job 42 (Prepare GPU nodes)".
      - Required with O(state=present). At most 512 characters; control and format characters (newlines, tabs,
        escape sequences, bidirectional overrides) are refused.
    type: str
  expect_reboot:
    description:
      - Announce that this run is about to reboot the host itself. Set it on a refresh just before the reboot, so
        the record is not taken as left by a run that died with the host; the first refresh after the reboot
        (with the default V(false)) clears it.
    type: bool
    default: false
  stale_after:
    description:
      - Seconds after its last refresh from which another run's record is stale and taken over.
      - A whole number from V(60) to V(604800) (a week); a boolean is refused. It must exceed the longest time
        between two refreshes of a run (a drain and a reboot included), or a live run loses its lock.
    type: int
    default: 3600
  break:
    description:
      - Take over another run's lock even when it is not stale, or replace a record that is not valid. With
        O(state=absent), remove it. Use it only when that run is gone; the result reports what was taken over.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reports what would be taken, refreshed, taken over or released; writes nothing. A lock held by
      another run fails in check mode too.
  diff_mode:
    support: full
    description: Shows the record before and after.
  idempotent:
    support: full
    description: A second call with the same arguments only refreshes C(updated) in the record and reports no
      change; releasing a lock that is not held changes nothing.
notes:
  - "Changes: taking, taking over and releasing the lock are changes; a refresh that only moves C(updated) is not,
    while one that changes the owner text, O(expect_reboot) or the boot id is."
  - Root privileges are needed to write C(/var/lib/gpuops).
  - "The lock is advisory: it keeps out the runs that take it, not a person changing the host by hand."
  - Only Linux hosts (C(flock), C(/proc/sys/kernel/random/boot_id)).
seealso:
  - module: gpuops.sandbox.gpu_facts
"""

EXAMPLES = r"""
- name: Take the host lock for this preparation
  gpuops.sandbox.host_lock:
    run_id: "awx-{{ awx_job_id }}"
    owner: "AWX job {{ awx_job_id }} (Prepare GPU nodes)"

- name: Announce the reboot this run is about to do
  gpuops.sandbox.host_lock:
    run_id: "awx-{{ awx_job_id }}"
    owner: "AWX job {{ awx_job_id }} (Prepare GPU nodes)"
    expect_reboot: true

- name: Refresh the lock after the reboot (clears expect_reboot, records the new boot id)
  gpuops.sandbox.host_lock:
    run_id: "awx-{{ awx_job_id }}"
    owner: "AWX job {{ awx_job_id }} (Prepare GPU nodes)"

- name: Release it
  gpuops.sandbox.host_lock:
    run_id: "awx-{{ awx_job_id }}"
    state: absent

- name: Take over the lock of a run that is known to be gone
  gpuops.sandbox.host_lock:
    run_id: "ctl-1:4242:20260509T073525"
    owner: "alice@ctl-1 pid 4242, playbooks/prepare_hosts.yml"
    break: true
"""

RETURN = r"""
action:
  description: What the call did (would do, in check mode).
  returned: success
  type: str
  choices: [acquired, refreshed, taken_over, released, none]
  sample: acquired
lock_file:
  description: Path of the lock record on the host.
  returned: success, and on failure when the lock is held by another run or its record is not valid
  type: str
  sample: /var/lib/gpuops/lock.json
record:
  description: The lock record on the host after the call (the one that would be written, in check mode), or null
    when there is none (or when a V(absent) left a record that is not valid in place).
  returned: success
  type: dict
  sample: {"run_id": "awx-42", "owner": "AWX job 42 (Prepare GPU nodes)", "started": "2026-05-09T07:35:25Z",
           "updated": "2026-05-09T07:41:02Z", "boot_id": "0f8b6e1c-3a5d-4f2e-9c7b-1d2e3f4a5b6c",
           "expect_reboot": false}
held_by:
  description:
    - The record of the other run that holds the lock, with C(age), the seconds since its last refresh, when the
      call did not take it (a failed V(present), or a V(absent) that left it in place); null otherwise.
  returned: success, and on failure when the lock is held by another run
  type: dict
  sample: {"run_id": "ctl-1:4242:20260509T073525", "owner": "alice@ctl-1 pid 4242, playbooks/prepare_hosts.yml",
           "started": "2026-05-09T07:35:25Z", "updated": "2026-05-09T07:40:11Z",
           "boot_id": "0f8b6e1c-3a5d-4f2e-9c7b-1d2e3f4a5b6c", "expect_reboot": false, "age": 51}
took_over:
  description:
    - The record this call replaced (V(present)) or removed (V(absent) with O(break=true)) although it was not its
      own, or null. The record's fields (null for a record that was not valid), C(reason) (V(boot), V(age),
      V(break) or V(corrupt)) and C(why), the reason in words.
  returned: success
  type: dict
  sample: {"run_id": "awx-41", "owner": "AWX job 41 (Prepare GPU nodes)", "started": "2026-05-09T06:02:10Z",
           "updated": "2026-05-09T06:12:44Z", "boot_id": "8e0c1d7a-2b4f-4c3d-8a9e-5f6a7b8c9d0e",
           "expect_reboot": false, "reason": "boot",
           "why": "the host booted since that run last refreshed the lock (...) and that run did not announce a reboot"}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    GpuopsError,
    check_range,
    create_module,
    run_module,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils import _lock, _persist

# The filesystem root the module works on; unit tests point it at a fake tree.
ROOT = "/"


def build_module():
    return create_module(
        AnsibleModule,
        argument_spec={
            "state": dict(type="str", choices=["present", "absent"], default="present"),
            "run_id": dict(type="str", required=True),
            "owner": dict(type="str"),
            "expect_reboot": dict(type="bool", default=False),
            "stale_after": dict(type="int", default=3600),
            "break": dict(type="bool", default=False),
        },
        required_if=[("state", "present", ("owner",))],
        supports_check_mode=True,
    )


def check_params(params):
    """Every option checked before anything is read or written; raises LockError naming the value."""
    _lock.check_run_id(params["run_id"])
    owner = _lock.check_owner(params["owner"])
    if params["state"] == "present" and owner is None:
        raise _lock.LockError("owner is required with state=present; nothing was changed")
    try:
        check_range("stale_after", params["stale_after"], _lock.STALE_MIN, _lock.STALE_MAX)
    except GpuopsError as exc:
        raise _lock.LockError(exc.msg) from exc


def decide_present(params, current, problem, boot_id, moment, warnings):
    """``(action, new_record, took_over)`` for state=present; raises LockError when the lock is not ours to take."""
    took_over = None
    if problem is not None:
        if not params["break"]:
            raise _lock.LockError(_lock.corrupt_message(problem), lock_file=_lock.LOCK_FILE, held_by=None)
        took_over = _lock.took_over(None, "corrupt", "the record was not valid: %s" % problem)
        action = "taken_over"
    elif current is None:
        action = "acquired"
    elif current["run_id"] == params["run_id"]:
        action = "refreshed"
        if current["boot_id"] != boot_id and not current["expect_reboot"]:
            warnings.append("the host rebooted since run %s last refreshed the host lock, and the run had not "
                            "announced a reboot (expect_reboot); the lock is kept for the run" % params["run_id"])
    else:
        stale = _lock.staleness(current, boot_id, moment, params["stale_after"])
        if stale is None:
            if not params["break"]:
                raise _lock.LockError(_lock.held_message(current, boot_id, moment, params["stale_after"]),
                                      lock_file=_lock.LOCK_FILE, held_by=_lock.describe(current, moment))
            stale = ("break", "break=true (the lock was not stale: %s)"
                     % _lock.refreshed_text(_lock.age_of(current, moment)))
        took_over = _lock.took_over(current, *stale)
        action = "taken_over"
    record = {
        "run_id": params["run_id"],
        "owner": params["owner"],
        "started": current["started"] if action == "refreshed" else _lock.stamp(moment),
        "updated": _lock.stamp(moment),
        "boot_id": boot_id,
        "expect_reboot": params["expect_reboot"],
    }
    return action, record, took_over


def decide_absent(params, current, problem, moment, warnings):
    """``(action, new_record, took_over, held_by)`` for state=absent (a record left in place stays the record)."""
    if problem is not None:
        if params["break"]:
            return "released", None, _lock.took_over(None, "corrupt", "the record was not valid: %s" % problem), None
        warnings.append("the host lock %s is not a valid lock record (%s); it was left in place: the next run "
                        "that takes the lock fails on it until it is replaced with %s or removed"
                        % (_lock.LOCK_FILE, problem, _lock.BREAK_HINT))
        return "none", None, None, None
    if current is None:
        return "none", None, None, None
    if current["run_id"] == params["run_id"]:
        return "released", None, None, None
    if params["break"]:
        why = "break=true (%s)" % _lock.refreshed_text(_lock.age_of(current, moment))
        return "released", None, _lock.took_over(current, "break", why), None
    warnings.append("the host lock %s is held by another run, %s (run %s, started %s, %s); it was left in place"
                    % (_lock.LOCK_FILE, _lock.printable(current["owner"]), current["run_id"], current["started"],
                       _lock.refreshed_text(_lock.age_of(current, moment))))
    return "none", current, None, _lock.describe(current, moment)


def run(module, root):
    """The body of :func:`main` for ``run_module``: returns the result dict or raises, never exits."""
    params = module.params
    check_params(params)
    present = params["state"] == "present"
    boot_id = _lock.read_boot_id(root) if present else None
    warnings = []
    with _lock.exclusive(root, create=present and not module.check_mode):
        moment = _lock.now()
        current, problem, before_text = _lock.read_record(root)
        if present:
            action, record, took_over = decide_present(params, current, problem, boot_id, moment, warnings)
            held_by = None
        else:
            action, record, took_over, held_by = decide_absent(params, current, problem, moment, warnings)
        if action == "refreshed":
            changed = any(current[f] != record[f] for f in _lock.FIELDS if f != "updated")
        else:
            changed = action != "none"
        if not module.check_mode:
            if present:
                # Durable: a power loss during the run must leave this record (a host that reboots under a
                # run is taken over by its next run), not an empty file no run can read.
                _persist.write_text(module, root, _lock.LOCK_FILE, _lock.render(record), durable=True)
            elif action == "released":
                _persist.remove_file(root, _lock.LOCK_FILE)
    if took_over is not None:
        warnings.append(_lock.takeover_warning(took_over))
    for warning in warnings:
        module.warn(warning)
    result = {
        "changed": changed,
        "action": action,
        "lock_file": _lock.LOCK_FILE,
        "record": record,
        "held_by": held_by,
        "took_over": took_over,
    }
    if module._diff:
        after_text = _lock.render(record) if present else (before_text if action == "none" else None)
        result["diff"] = {"before_header": _lock.LOCK_FILE, "after_header": _lock.LOCK_FILE,
                          "before": before_text or "", "after": after_text or ""}
    return result


def main():
    run_module(build_module, run, ROOT)


if __name__ == "__main__":
    main()
