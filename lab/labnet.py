# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""labnet: how the lab's hosts are reached: the lab's SSH key, the ssh command line, the wait for SSH
and the connection part of the inventory (inventories/lab/zz-lab-connection.yml).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time

from labconfig import (INVENTORY_CONNECTION, INVENTORY_DIR, SSH_USER, STATE, LabError, need_tools, read_text, run,
                       tail_text)
from labhost import Vm


def ssh_key():
    """Return (private, public) paths of the lab's own SSH key, generating it on first use."""
    key = os.path.join(STATE, "id_ed25519")
    if not (os.path.exists(key) and os.path.exists(key + ".pub")):
        need_tools("ssh-keygen")
        os.makedirs(STATE, exist_ok=True)
        for path in (key, key + ".pub"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpulab", "-f", key], timeout=30)
    return key, key + ".pub"


def ssh_cmd(port, *remote, connect_timeout=10):
    """The ssh command line to a lab host. Commands within a minute of each other share one connection (a
    master in the lab's state directory): a new connection costs an emulated guest seconds of CPU."""
    key = ssh_key()[0]
    return ["ssh", "-i", key, "-p", str(port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "ControlMaster=auto", "-o", "ControlPersist=60",
            "-o", "ControlPath=%s" % os.path.join(STATE, "cm-%C"),
            "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
            "-o", "ConnectTimeout=%d" % connect_timeout, SSH_USER + "@127.0.0.1"] + list(remote)


def close_master(port):
    """End the lab's shared SSH connection to the host on `port`, if there is one."""
    cmd = ssh_cmd(port)
    cmd[-1:-1] = ["-O", "exit"]
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(cmd, timeout=30, check=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


# How long a guest that has booted (its login prompt is on the console) may leave SSH unanswered before the lab
# calls it stuck: under a starved machine sshd was seen answering about 300 s after the prompt (2026-11-27).
ANSWER_TIMEOUT = int(os.environ.get("GPUOPS_LAB_ANSWER_TIMEOUT", "600"))
# How long a booting guest's console may stay silent, without a login prompt, before the lab calls the boot stopped.
SILENCE_TIMEOUT = int(os.environ.get("GPUOPS_LAB_SILENCE_TIMEOUT", "600"))
KERNEL_BANNER = "Linux version "
LOGIN_PROMPT = re.compile(r"\S login: ")


class NoAnswer(LabError):
    """The guest booted and does not answer SSH, or its boot stopped (see wait_ssh's bounds)."""


def booted_at(vm, console_from=0, text=None):
    """True when the console (`text`, read when not given), from offset `console_from` on, shows a login prompt
    after the last kernel banner (this boot reached its getty). A restart on the same port goes on in the same
    console file: its wait starts past what the boot before wrote."""
    text = (read_text(vm.serial) if text is None else text)[console_from:]
    return bool(LOGIN_PROMPT.search(text, max(text.rfind(KERNEL_BANNER), 0)))


def console_size(vm):
    return len(read_text(vm.serial))


def ssh_answers(port):
    try:
        proc = subprocess.run(ssh_cmd(port, "true"), timeout=30, check=False, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return proc.returncode == 0
    except subprocess.TimeoutExpired:
        return False


def wait_ssh(vm, port, timeout, answer_timeout=None, console_from=0, silence_timeout=None):
    """Wait until SSH answers; fail early (with the console tail) when QEMU dies. With `answer_timeout`, raise
    NoAnswer once the guest has shown its login prompt for that long without SSH answering, or once its console
    has been silent for `silence_timeout` (SILENCE_TIMEOUT by default) without a prompt: a boot that stopped (seen
    2026-11-27: a guest idle with its CPU halted, ssh.service still starting, no login prompt, its console quiet for
    20 minutes). A guest that never answers fails with its console's tail and its rescue report (what it says on its
    second serial port)."""
    deadline = time.time() + timeout
    prompt_seen = None
    console = (console_size(vm), time.time())
    while time.time() < deadline:
        if not vm.process_alive():
            raise LabError("%s: QEMU exited while booting; last console lines:\n%s" % (vm.name, tail_text(vm.serial)))
        if ssh_answers(port):
            return
        if answer_timeout is not None:
            now = time.time()
            text = read_text(vm.serial)  # once per round: its size and whether the prompt is there
            if len(text) != console[0]:
                console = (len(text), now)
            if prompt_seen is None and booted_at(vm, console_from, text):
                prompt_seen = now
            if prompt_seen is not None and now - prompt_seen > answer_timeout:
                raise NoAnswer("%s: booted (its login prompt has been on the console for %ds) but SSH on 127.0.0.1:%d "
                               "does not answer" % (vm.name, now - prompt_seen, port))
            if prompt_seen is None and now - console[1] > (silence_timeout or SILENCE_TIMEOUT):
                raise NoAnswer("%s: its console has been silent for %ds without a login prompt and SSH on "
                               "127.0.0.1:%d does not answer (a boot that stopped)" % (vm.name, now - console[1], port))
        time.sleep(2)
    raise LabError("%s: no SSH on 127.0.0.1:%d after %ss; last console lines:\n%s\nwhat the guest says on its rescue "
                   "port:\n%s" % (vm.name, port, timeout, tail_text(vm.serial), vm.rescue_report()))


def write_inventory(hosts):
    """Write the connection part of inventories/lab (git-ignored; ports change from run to run)."""
    key = ssh_key()[0]
    rel_key = os.path.relpath(key, INVENTORY_DIR)
    lines = [
        "---",
        "# Written by lab/gpulab.py at every start: how to reach the running lab VMs. Do not edit.",
        "all:",
        "  hosts:",
    ]
    for name in hosts:
        port = Vm(name).meta().get("ssh_port")
        if not port:
            continue
        lines += [
            "    %s:" % name,
            "      ansible_host: 127.0.0.1",
            "      ansible_port: %d" % port,
            "      ansible_user: %s" % SSH_USER,
            "      ansible_ssh_private_key_file: \"{{ inventory_dir }}/%s\"" % rel_key,
            "      ansible_python_interpreter: /usr/bin/python3",
        ]
    tmp = INVENTORY_CONNECTION + ".tmp"
    with open(tmp, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(tmp, INVENTORY_CONNECTION)
