# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""labnet: how the lab's hosts are reached: the lab's SSH key, the ssh command line, the wait for SSH
and the connection part of the inventory (inventories/lab/zz-lab-connection.yml).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

from labconfig import (INVENTORY_CONNECTION, INVENTORY_DIR, SSH_USER, STATE, LabError, need_tools, run,
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
    key = ssh_key()[0]
    return ["ssh", "-i", key, "-p", str(port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=%d" % connect_timeout, SSH_USER + "@127.0.0.1"] + list(remote)


def wait_ssh(vm, port, timeout):
    """Wait until SSH answers; fail early (with the console tail) when QEMU dies."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not vm.process_alive():
            raise LabError("%s: QEMU exited while booting; last console lines:\n%s" % (vm.name, tail_text(vm.serial)))
        try:
            proc = subprocess.run(ssh_cmd(port, "true"), timeout=30, check=False, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if proc.returncode == 0:
                return
        except subprocess.TimeoutExpired:
            pass
        time.sleep(2)
    raise LabError("%s: no SSH on 127.0.0.1:%d after %ss; last console lines:\n%s"
                   % (vm.name, port, timeout, tail_text(vm.serial)))


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
