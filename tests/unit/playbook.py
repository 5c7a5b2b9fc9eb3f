"""Run ansible-playbook from the top of the checkout with the project's ansible.cfg, for the unit tests that run
roles and task files for real on localhost."""

import os
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ansible_playbook(*args, timeout=300, env=None):
    """``ansible-playbook args...`` with ``env`` added to the environment (it may name another ANSIBLE_CONFIG); return
    (exit code, stdout and stderr together)."""
    env = dict(dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1"), **dict(env or {}))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["ansible-playbook"] + [str(a) for a in args], cwd=TOP, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, timeout=timeout)
    return proc.returncode, proc.stdout
