"""Shared helpers for the integration tests: they run the real lab, playbooks and molecule."""

import json
import os
import subprocess
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = [sys.executable, os.path.join(TOP, "lab", "gpulab.py")]


def run(cmd, timeout=1800, env=None, check=False):
    """Run a command from the top of the checkout; return the CompletedProcess (text, merged output)."""
    full_env = dict(os.environ)
    full_env.setdefault("ANSIBLE_CONFIG", os.path.join(TOP, "ansible.cfg"))
    full_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full_env.get("PATH", "")
    full_env.update(env or {})
    proc = subprocess.run(cmd, cwd=TOP, env=full_env, timeout=timeout, text=True, check=False,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError("%s failed (rc=%s):\n%s" % (" ".join(cmd), proc.returncode, proc.stdout[-6000:]))
    return proc


def lab(*args, **kwargs):
    return run(LAB + list(args), **kwargs)


def lab_status():
    return json.loads(lab("status", "--json", check=True).stdout)["hosts"]


@pytest.fixture(scope="session")
def running_lab():
    """The whole lab, running (a no-op when `make integration` already started it)."""
    lab("start", check=True)
    return lab_status()
