"""The session's API server is the tests' own and starts from an empty store, whatever ran before it.

`make site` then `make test` (the README's order) used to fail: the tests reused the main job's running
server, which carried its node labels, Helm releases and KubeVirt settings. Here a stand-in for the main
job's server (a private state directory given as GPUOPS_KUBE_STATE, as the main job's .lab/kube is) and a
test server left running by an earlier session (GPUOPS_KUBE_KEEP=1, an interrupted run) are both dirtied
the way site.yml does; a nested pytest session then takes its `kube_api` and must find it pristine, while
the main job's server keeps running untouched. Three servers run at once meanwhile (ports of their own).
A second session started beside a running one gets a state directory of its own.
"""

import concurrent.futures
import json
import os
import re
import sys
import time

import pytest

from conftest import TOP, gone, kubelab, kubelab_status, run

# The deep slice that proves this module's claims (tests/integration/tiers.py).
pytestmark = pytest.mark.slice("cluster")


NESTED = "GPUOPS_TEST_NESTED_SESSION"
WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
LAB_NODES = ("lab-container", "lab-dra", "lab-h200", "lab-passthrough", "lab-vgpu")


def kubectl(bin_dir, kubeconfig, *args, **kwargs):
    return run([os.path.join(bin_dir, "kubectl"), "--kubeconfig", kubeconfig] + list(args), timeout=120, **kwargs)


def leftovers(bin_dir, kubeconfig):
    """What site.yml leaves on a server: workload labels, the GPU Operator namespace (its Helm releases),
    the KubeVirt CR's permitted host devices."""
    found = []
    nodes = json.loads(kubectl(bin_dir, kubeconfig, "get", "nodes", "-o", "json", check=True).stdout)["items"]
    found += ["node %s has %s" % (n["metadata"]["name"], WORKLOAD_LABEL) for n in nodes
              if WORKLOAD_LABEL in n["metadata"].get("labels", {})]
    if kubectl(bin_dir, kubeconfig, "get", "namespace", "gpu-operator").returncode == 0:
        found.append("namespace gpu-operator")
    kubevirt = json.loads(kubectl(bin_dir, kubeconfig, "get", "kubevirt", "kubevirt", "-n", "kubevirt", "-o", "json",
                                  check=True).stdout)
    if (kubevirt["spec"].get("configuration") or {}).get("permittedHostDevices"):
        found.append("KubeVirt permittedHostDevices")
    return found


def dirty(bin_dir, kubeconfig, node):
    """Leave on a server what a run of site.yml leaves."""
    kubectl(bin_dir, kubeconfig, "label", "node", node, "--overwrite", "%s=vm-passthrough" % WORKLOAD_LABEL,
            check=True)
    kubectl(bin_dir, kubeconfig, "create", "namespace", "gpu-operator", check=True)
    patch = {"spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": [
        {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/GA102GL_A10", "externalResourceProvider": True}]}}}}
    kubectl(bin_dir, kubeconfig, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=merge",
            "-p", json.dumps(patch), check=True)


def start_dirty(env, bin_dir, node):
    kubelab("start", env=env, check=True, timeout=600)
    kubelab("fixtures", env=env, check=True, timeout=600)
    status = kubelab_status(env)
    dirty(bin_dir, status["kubeconfig"], node)
    return status


def nested_session(env):
    """Run test_nested_session_server_is_pristine in a pytest session of its own; (its output, seconds, its
    server's state directory)."""
    started = time.monotonic()
    proc = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s",
                os.path.join(TOP, "tests", "integration", os.path.basename(__file__))
                + "::test_nested_session_server_is_pristine"],
               env=dict(env, **{NESTED: "1", "GPUOPS_KUBE_KEEP": "0"}), timeout=900)
    seconds = time.monotonic() - started
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-6000:]
    return proc.stdout, seconds, re.search(r"^nested state_dir=(.*)$", proc.stdout, re.M).group(1)


def test_the_session_server_has_a_state_directory_of_its_own(kube_api):
    """Every kubelab subprocess of the session (no env given) reads the session's server, not the main job's."""
    assert os.path.realpath(kube_api["state_dir"]) != os.path.realpath(os.path.join(TOP, ".lab", "kube")), \
        "the session's API server is the main job's (.lab/kube)"
    assert os.environ.get("GPUOPS_KUBE_STATE") == kube_api["state_dir"]
    status = kubelab_status()
    assert status["state"] == "running" and status["server"] == kube_api["server"], status
    env = kubelab("env", check=True).stdout
    assert "KUBECONFIG=%s\n" % kube_api["kubeconfig"] in env and "# API server %s" % kube_api["server"] in env


def test_a_session_sees_neither_the_main_jobs_server_nor_a_leftover_test_server(kube_api, tmp_path):
    bin_dir = kube_api["bin_dir"]
    main_env = {"GPUOPS_KUBE_STATE": str(tmp_path / "main")}
    leftover_env = {"GPUOPS_KUBE_STATE": str(tmp_path / "tests")}
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            main, leftover = [future.result() for future in (
                pool.submit(start_dirty, main_env, bin_dir, "lab-vgpu"),
                pool.submit(start_dirty, leftover_env, bin_dir, "lab-container"))]
        _out, seconds, state_dir = nested_session({
            "GPUOPS_KUBE_STATE": main_env["GPUOPS_KUBE_STATE"],
            "GPUOPS_KUBE_TEST_STATE": leftover_env["GPUOPS_KUBE_STATE"]})
        print("nested session with a fresh API server: %.1fs" % seconds)
        assert state_dir == leftover_env["GPUOPS_KUBE_STATE"]
        # The nested session started its server afresh in the leftover's state directory, then stopped it.
        for name, pid in leftover["pids"].items():
            assert gone(pid), "the leftover test server's %s (pid %s) still runs" % (name, pid)
        assert kubelab_status(leftover_env)["state"] == "stopped"
        # The main job's server still runs, as the main job left it.
        after = kubelab_status(main_env)
        assert after["state"] == "running" and after["pids"] == main["pids"], after
        assert len(leftovers(bin_dir, main["kubeconfig"])) == 3
        # And the outer session's server is another one again.
        assert kube_api["server"] not in (main["server"], leftover["server"])
    finally:
        kubelab("stop", env=main_env, timeout=120)
        kubelab("stop", env=leftover_env, timeout=120)


def test_a_session_beside_this_one_gets_a_server_of_its_own(kube_api, tmp_path):
    """A second session on the same state directory (two engineers, one checkout) takes <directory>-<pid>
    and removes it at its end; this session's server runs on, untouched."""
    base = kube_api["state_dir"]
    _out, seconds, state_dir = nested_session({"GPUOPS_KUBE_TEST_STATE": base,
                                               "GPUOPS_KUBE_STATE": str(tmp_path / "main")})
    print("nested session beside this one: %.1fs" % seconds)
    assert re.fullmatch(re.escape(base) + r"-\d+", state_dir), state_dir
    assert not os.path.exists(state_dir)
    status = kubelab_status()
    assert status["state"] == "running" and status["pids"] == kube_api["pids"], status
    assert not os.path.exists(tmp_path / "main" / "server.json")


@pytest.mark.skipif(os.environ.get(NESTED) != "1", reason="run by the tests above in a nested pytest session")
def test_nested_session_server_is_pristine(kube_api):
    assert kube_api["state_dir"] == os.environ["GPUOPS_KUBE_STATE"]
    assert leftovers(kube_api["bin_dir"], kube_api["kubeconfig"]) == []
    nodes = json.loads(kubectl(kube_api["bin_dir"], kube_api["kubeconfig"], "get", "nodes", "-o", "json",
                               check=True).stdout)["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == list(LAB_NODES)
    print("fresh API server started in %ss" % kube_api["start_seconds"])
    print("nested state_dir=%s" % kube_api["state_dir"])
