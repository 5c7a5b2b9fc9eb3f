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


# ---------------------------------------------------------------------------------------------
# The cluster lab: a real etcd + kube-apiserver on loopback (lab/kubelab.py)
# ---------------------------------------------------------------------------------------------

KUBELAB = [sys.executable, os.path.join(TOP, "lab", "kubelab.py")]


def kubelab(*args, **kwargs):
    """Run lab/kubelab.py with the given arguments (env= overrides, e.g. GPUOPS_KUBE_STATE)."""
    kwargs.setdefault("timeout", 5400)
    return run(KUBELAB + list(args), **kwargs)


def kubelab_status(env=None):
    return json.loads(kubelab("status", "--json", check=True, env=env, timeout=120).stdout)


@pytest.fixture(scope="session")
def kube_api():
    """The cluster lab's API server with the project's fixtures, for the whole session.

    Builds the binaries (cached in .cache/kube), starts etcd and kube-apiserver (a healthy one started
    by `make kube` is reused) and applies the fixture CRDs, objects and lab Nodes. Yields a dict:
    server, kubeconfig (admin), kubeconfig_unauthorised (no RBAC rights), bin_dir (kube-apiserver,
    kubectl, helm), versions, pids, ports. Stops the server at the end unless GPUOPS_KUBE_KEEP=1.
    """
    kubelab("build", check=True)
    kubelab("start", check=True, timeout=600)
    kubelab("fixtures", check=True, timeout=600)
    status = kubelab_status()
    assert status["state"] == "running", status
    yield status
    if os.environ.get("GPUOPS_KUBE_KEEP") != "1":
        kubelab("stop", check=True, timeout=120)
