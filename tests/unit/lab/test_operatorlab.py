"""Unit tests of lab/operatorlab.py: the cached build, the /opt layout, the namespace command, the operator's
environment, and start/status/stop with a stand-in operator (no Go, no root, no API server needed)."""

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
REAL_CHART = os.path.join(os.path.dirname(TOP), "shared", "upstream", "gpu-operator", "chart")
COMMIT = "a22dbf671f2e26f9a1e342f8eea28e196235e110"

# A stand-in `go`: `go env GOVERSION`, and `go build ... -o OUT PKG`, which writes a stand-in operator to OUT
# and counts its builds in $FAKE_GO_COUNT.
FAKE_GO = textwrap.dedent("""\
    #!/bin/sh
    if [ "$1" = env ]; then echo go1.26.8; exit 0; fi
    echo "$@" >> "$FAKE_GO_COUNT"
    env | grep -E '^(GOFLAGS|GOPROXY|GOTOOLCHAIN|CGO_ENABLED)=' | sort >> "$FAKE_GO_COUNT.env"
    out=
    while [ $# -gt 0 ]; do
      if [ "$1" = -o ]; then out=$2; shift; fi
      shift
    done
    cp "$FAKE_OPERATOR" "$out"
    chmod 755 "$out"
    """)

# A stand-in operator: answers --help like the real one, serves /readyz on its health probe port, and writes
# the environment it got to env.json beside its log.
FAKE_OPERATOR = textwrap.dedent("""\
    #!%s
    import http.server, json, os, sys
    if "--help" in sys.argv:
        print("Usage of gpu-operator:\\n  -metrics-bind-address string")
        sys.exit(0)
    port = int([a for a in sys.argv if a.startswith("--health-probe-bind-address=")][0].rsplit(":", 1)[1])
    with open(os.environ["FAKE_OPERATOR_ENV"], "w") as handle:
        json.dump({"env": dict(os.environ), "argv": sys.argv}, handle)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """) % sys.executable


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def source(tmp_path):
    """A small tree shaped like the operator's repository (with the SOURCE file beside it)."""
    root = tmp_path / "upstream" / "source"
    write(root / "go.mod", "module github.com/NVIDIA/gpu-operator\n\ngo 1.26.3\n")
    write(root / "go.sum")
    write(root / "vendor" / "modules.txt", "# k8s.io/api v0.35.0\n")
    write(root / "cmd" / "gpu-operator" / "main.go", "package main\n")
    write(root / "cmd" / "gpu-operator" / "main_test.go", "package main\n")
    write(root / "controllers" / "state_manager.go", "package controllers\n")
    write(root / "assets" / "state-driver" / "0500_daemonset.yaml", "kind: DaemonSet\n")
    write(root / "assets" / "pre-requisites" / "0200_runtime_class.yaml", "kind: RuntimeClass\n")
    write(root / "manifests" / "state-dcgm" / "0100_service_account.yaml", "kind: ServiceAccount\n")
    write(root / "validator" / "manifests" / "plugin-workload-validation.yaml", "kind: Pod\n")
    write(root / "deployments" / "gpu-operator" / "crds" / "nvidia.com_clusterpolicies.yaml", "kind: CustomResourceDefinition\n")
    write(tmp_path / "upstream" / "SOURCE", "NVIDIA/gpu-operator %s (2026-08-21): ...\n" % COMMIT)
    return root


@pytest.fixture
def oplab(tmp_path, monkeypatch, source):
    """A fresh copy of lab/operatorlab.py with its source, cache and state under tmp_path and a stand-in go."""
    fake_go = write(tmp_path / "bin" / "go", FAKE_GO)
    fake_go.chmod(0o755)
    fake_operator = write(tmp_path / "bin" / "fake-operator", FAKE_OPERATOR)
    fake_operator.chmod(0o755)
    monkeypatch.setenv("GPUOPS_OPERATOR_SOURCE", str(source))
    monkeypatch.setenv("GPUOPS_OPERATOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUOPS_OPERATOR_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("GPUOPS_OPERATOR_GO", str(fake_go))
    monkeypatch.setenv("FAKE_GO_COUNT", str(tmp_path / "go-builds"))
    monkeypatch.setenv("FAKE_OPERATOR", str(fake_operator))
    monkeypatch.setenv("FAKE_OPERATOR_ENV", str(tmp_path / "operator-env.json"))
    return load("operatorlab_under_test", os.path.join(TOP, "lab", "operatorlab.py"))


def builds(tmp_path):
    path = tmp_path / "go-builds"
    return path.read_text().splitlines() if path.exists() else []


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------

def test_env_overrides_the_paths(oplab, tmp_path, source):
    assert oplab.SOURCE == str(source)
    assert oplab.CACHE == str(tmp_path / "cache")
    assert oplab.STATE == str(tmp_path / "state")
    assert oplab.binary_path() == str(tmp_path / "cache" / "bin" / "gpu-operator")


def test_defaults_live_in_the_gitignored_cache_and_lab_dirs(monkeypatch):
    for name in ("GPUOPS_OPERATOR_CACHE", "GPUOPS_OPERATOR_STATE", "GPUOPS_OPERATOR_SOURCE", "GPUOPS_KUBE_STATE"):
        monkeypatch.delenv(name, raising=False)
    mod = load("operatorlab_defaults", os.path.join(TOP, "lab", "operatorlab.py"))
    assert mod.CACHE == os.path.join(TOP, ".cache", "operator")
    assert mod.STATE == os.path.join(TOP, ".lab", "operator")
    assert mod.SOURCE == os.path.join(os.path.dirname(TOP), "shared", "upstream", "gpu-operator", "source")
    assert mod.default_kubeconfig() == os.path.join(TOP, ".lab", "kube", "kubeconfig")
    with open(os.path.join(TOP, ".gitignore")) as handle:
        ignored = handle.read().split()
    assert ".cache/" in ignored and ".lab/" in ignored


def test_build_is_offline_from_the_vendored_modules_and_writes_nothing_into_the_source(oplab, source):
    cmd = oplab.build_command("/out/gpu-operator", commit=COMMIT)
    assert cmd[:4] == [oplab.GO, "build", "-C", str(source)]
    assert cmd[-3:] == ["-o", "/out/gpu-operator", "./cmd/gpu-operator"]
    assert "-X github.com/NVIDIA/gpu-operator/internal/info.gitCommit=%s" % COMMIT in " ".join(cmd)
    env = oplab.go_env()
    assert env["GOFLAGS"].split() == ["-mod=vendor", "-buildvcs=false"]
    assert (env["GOPROXY"], env["GOTOOLCHAIN"], env["CGO_ENABLED"]) == ("off", "local", "0")


def test_source_digest_follows_the_go_code_not_its_tests(oplab, source):
    first = oplab.source_digest()
    (source / "cmd" / "gpu-operator" / "main_test.go").write_text("package main // changed\n")
    assert oplab.source_digest() == first
    (source / "controllers" / "state_manager.go").write_text("package controllers // changed\n")
    assert oplab.source_digest() != first
    (source / "vendor" / "modules.txt").unlink()
    with pytest.raises(oplab.OperatorLabError, match="vendored modules"):
        oplab.source_digest()


def test_source_commit_comes_from_the_source_file(oplab, source):
    assert oplab.source_commit() == COMMIT
    (source.parent / "SOURCE").unlink()
    assert oplab.source_commit() == "unknown"


def test_build_once_then_reuse_then_rebuild_when_corrupt_or_outdated(oplab, tmp_path, source):
    manifest = oplab.ensure_build()
    assert len(builds(tmp_path)) == 1
    assert manifest["commit"] == COMMIT and manifest["go"] == "go1.26.8"
    assert manifest["sha256"] == oplab.sha256_file(oplab.binary_path())
    env = (tmp_path / "go-builds.env").read_text()
    assert "GOFLAGS=-mod=vendor -buildvcs=false" in env and "GOPROXY=off" in env and "CGO_ENABLED=0" in env
    # The image's /opt: assets at /opt/gpu-operator, manifests under it, the validator's, the CRDs.
    opt = tmp_path / "cache" / "opt"
    assert (opt / "gpu-operator" / "state-driver" / "0500_daemonset.yaml").is_file()
    assert (opt / "gpu-operator" / "pre-requisites" / "0200_runtime_class.yaml").is_file()
    assert (opt / "gpu-operator" / "manifests" / "state-dcgm" / "0100_service_account.yaml").is_file()
    assert (opt / "validator" / "manifests" / "plugin-workload-validation.yaml").is_file()
    assert (opt / "gpu-operator" / "nvidia.com_clusterpolicies.yaml").is_file()

    assert oplab.ensure_build() == manifest
    assert len(builds(tmp_path)) == 1, "a valid cached build is reused"

    with open(oplab.binary_path(), "ab") as handle:
        handle.write(b"# corrupt\n")
    oplab.ensure_build()
    assert len(builds(tmp_path)) == 2, "a binary whose sum does not match is rebuilt"

    (opt / "gpu-operator" / "state-driver" / "0500_daemonset.yaml").write_text("kind: Changed\n")
    oplab.ensure_build()
    assert len(builds(tmp_path)) == 3, "a changed layout is rebuilt"
    assert (opt / "gpu-operator" / "state-driver" / "0500_daemonset.yaml").read_text() == "kind: DaemonSet\n"

    (source / "controllers" / "state_manager.go").write_text("package controllers // new\n")
    oplab.ensure_build()
    assert len(builds(tmp_path)) == 4, "changed sources are rebuilt"

    write(source / "assets" / "state-driver" / "0600_configmap.yaml", "kind: ConfigMap\n")
    oplab.ensure_build()
    assert len(builds(tmp_path)) == 5, "changed assets are copied again"
    assert (opt / "gpu-operator" / "state-driver" / "0600_configmap.yaml").is_file()

    os.unlink(oplab.binary_path())
    oplab.ensure_build()
    assert len(builds(tmp_path)) == 6, "a missing binary is rebuilt"
    assert oplab.main(["build", "--rebuild"]) == 0
    assert len(builds(tmp_path)) == 7


def test_a_binary_that_does_not_run_is_corrupt(oplab, tmp_path):
    oplab.ensure_build()
    path = oplab.binary_path()
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\necho nothing useful\n")
    manifest = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    manifest["sha256"] = oplab.sha256_file(path)
    assert oplab.build_problem(manifest).startswith("corrupt: `gpu-operator --help` printed")


def test_build_without_go_says_so(oplab, monkeypatch, capsys):
    monkeypatch.setattr(oplab, "GO", "no-such-go-binary")
    assert oplab.main(["build"]) == 1
    err = capsys.readouterr().err
    assert "no-such-go-binary is not installed" in err and "Traceback" not in err


def test_build_without_the_source_says_where_to_find_it(oplab, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(oplab, "SOURCE", str(tmp_path / "nowhere"))
    assert oplab.main(["build"]) == 1
    assert "is not the GPU Operator's repository with vendored modules" in capsys.readouterr().err
    # make's build step passes --if-source: a clone without ../shared/upstream has nothing to build.
    assert oplab.main(["build", "--if-source"]) == 0
    assert "nothing to build" in capsys.readouterr().err
    assert not os.path.exists(oplab.binary_path())


# ---------------------------------------------------------------------------------------------
# The mount namespace and the environment
# ---------------------------------------------------------------------------------------------

def test_namespace_command_mounts_the_layout_on_opt_and_execs_the_operator(oplab):
    cmd = oplab.namespace_command("/cache/opt", "/cache/bin/gpu-operator", ["--leader-elect=false"], euid=0)
    assert cmd[:5] == [oplab.UNSHARE, "--mount", "--propagation", "private", "--"]
    script = cmd[cmd.index("-c") + 1]
    assert 'mount --bind -o ro "$1" /opt' in script and 'exec "$@"' in script
    assert cmd[-3:] == ["/cache/opt", "/cache/bin/gpu-operator", "--leader-elect=false"]
    # Not root: a user namespace maps the user to root, so it may mount.
    assert oplab.namespace_command("/c/opt", "/c/bin/x", [], euid=1000)[1:6] == [
        "--mount", "--propagation", "private", "--user", "--map-root-user"]
    with pytest.raises(oplab.OperatorLabError, match="is under /opt"):
        oplab.namespace_command("/opt/work/.cache/operator/opt", "/cache/bin/gpu-operator", [], euid=0)


@pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root here")
def test_the_namespace_shows_the_layout_on_opt_and_leaves_the_machines_opt_alone(oplab, tmp_path):
    layout = tmp_path / "layout"
    write(layout / "gpu-operator" / "state-driver" / "marker", "from the layout\n")
    before = sorted(os.listdir("/opt"))
    cmd = oplab.namespace_command(str(layout), "/bin/cat", ["/opt/gpu-operator/state-driver/marker"])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout) == (0, "from the layout\n"), proc.stderr
    proc = subprocess.run(oplab.namespace_command(str(layout), "/bin/touch", ["/opt/gpu-operator/new"]),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "Read-only file system" in proc.stderr
    assert sorted(os.listdir("/opt")) == before
    assert not os.path.exists("/opt/gpu-operator/state-driver/marker")


def test_env_from_values_builds_the_images_as_the_chart_helpers_do(oplab):
    values = {"driver": {"manager": {"repository": "r.io/cn", "image": "k8s-driver-manager", "version": "v0.12.0"}},
              "validator": {"repository": "r.io/nvidia", "image": "gpu-operator"},
              "operator": {"env": [{"name": "EXTRA", "value": 3}, {"name": "FROM", "valueFrom": {"x": 1}}]}}
    env = oplab.env_from_values(values, {"appVersion": "main-latest"})
    assert env == {"WATCH_NAMESPACE": "", "DRIVER_MANAGER_IMAGE": "r.io/cn/k8s-driver-manager:v0.12.0",
                   "VALIDATOR_IMAGE": "r.io/nvidia/gpu-operator:main-latest", "EXTRA": "3"}


@pytest.mark.skipif(not os.path.isdir(REAL_CHART), reason="the upstream chart is not beside this checkout")
def test_env_from_the_real_charts_values_and_its_operator_template(oplab, monkeypatch):
    monkeypatch.setattr(oplab, "CHART", REAL_CHART)
    env = oplab.env_from_values(*oplab.chart_values())
    assert env["DRIVER_MANAGER_IMAGE"].startswith("nvcr.io/nvidia/cloud-native/k8s-driver-manager:v")
    assert env["VALIDATOR_IMAGE"].startswith("nvcr.io/nvidia/gpu-operator:")
    with open(os.path.join(REAL_CHART, "templates", "operator.yaml")) as handle:
        template = handle.read()
    for name in ("WATCH_NAMESPACE", "DRIVER_MANAGER_IMAGE", "VALIDATOR_IMAGE", "OPERATOR_NAMESPACE"):
        assert name in template, "the chart's Deployment no longer sets %s" % name


def test_env_from_the_deployment_keeps_literal_values(oplab):
    deployment = {"spec": {"template": {"spec": {"containers": [
        {"name": "sidecar", "env": [{"name": "NO", "value": "x"}]},
        {"name": "gpu-operator", "env": [{"name": "WATCH_NAMESPACE", "value": ""},
                                         {"name": "OPERATOR_NAMESPACE", "valueFrom": {"fieldRef": {}}},
                                         {"name": "VALIDATOR_IMAGE", "value": "v:1"}]}]}}}}
    assert oplab.env_from_deployment(deployment) == {"WATCH_NAMESPACE": "", "VALIDATOR_IMAGE": "v:1"}


def kubeconfig(tmp_path, server):
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "lab",
           "contexts": [{"name": "lab", "context": {"cluster": "c", "user": "u"}}],
           "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority-data": "Y2E="}}],
           "users": [{"name": "u", "user": {"client-certificate-data": "Y2VydA==", "client-key-data": "a2V5"}}]}
    return write(tmp_path / "kubeconfig", yaml.safe_dump(doc))


def test_kubeconfig_and_loopback(oplab, tmp_path):
    server, creds = oplab.load_kubeconfig(str(kubeconfig(tmp_path, "https://127.0.0.1:6443")))
    assert server == "https://127.0.0.1:6443" and creds == {"ca": b"ca", "cert": b"cert", "key": b"key"}
    assert oplab.loopback("https://127.0.0.1:1") and oplab.loopback("https://localhost:1")
    assert not oplab.loopback("https://10.0.0.1:6443") and not oplab.loopback("https://k8s.example.com")
    with pytest.raises(oplab.OperatorLabError, match="cannot read the kubeconfig"):
        oplab.load_kubeconfig(str(tmp_path / "missing"))


# ---------------------------------------------------------------------------------------------
# start, status, stop with a stand-in operator and API server
# ---------------------------------------------------------------------------------------------

class FakeApi:
    """Answers what start_operator asks: /readyz, the CRDs, the chart's Deployment."""

    crds = set(("clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com", "gpuclusters.nvidia.com"))
    deployment = None
    server = "https://127.0.0.1:6443"

    def __init__(self, kubeconfig_path, timeout=10):
        self.kubeconfig = kubeconfig_path

    def get(self, path):
        if path == "/readyz":
            return 200, None
        if "/customresourcedefinitions/" in path:
            return (200, {}) if path.rsplit("/", 1)[1] in self.crds else (404, None)
        if path.endswith("/deployments/gpu-operator"):
            return (200, self.deployment) if self.deployment else (404, None)
        return 404, None


@pytest.fixture
def started(oplab, tmp_path, monkeypatch):
    """operatorlab with a stand-in API server, the stand-in operator run without a mount namespace."""
    monkeypatch.setattr(oplab, "ApiClient", FakeApi)
    monkeypatch.setattr(oplab, "CHART", REAL_CHART if os.path.isdir(REAL_CHART) else str(tmp_path / "chart"))
    if not os.path.isdir(REAL_CHART):
        write(tmp_path / "chart" / "Chart.yaml", "appVersion: v1\n")
        write(tmp_path / "chart" / "values.yaml", yaml.safe_dump({
            "driver": {"manager": {"repository": "r", "image": "m", "version": "v1"}},
            "validator": {"repository": "r", "image": "v"}}))
    monkeypatch.setattr(oplab, "namespace_command", lambda layout, binary, args: [binary] + list(args))
    path = str(kubeconfig(tmp_path, FakeApi.server))
    yield oplab, path
    meta = oplab.read_json(oplab.meta_path())
    if meta and oplab.process_is_ours(meta):
        os.killpg(meta["pgid"], signal.SIGKILL)


def status(oplab, capsys):
    capsys.readouterr()
    assert oplab.main(["status", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_start_status_stop(started, tmp_path, capsys):
    oplab, path = started
    assert status(oplab, capsys)["state"] == "stopped"
    assert oplab.main(["start", "--kubeconfig", path]) == 0
    info = status(oplab, capsys)
    assert info["state"] == "running"
    assert info["server"] == FakeApi.server and info["namespace"] == "gpu-operator"
    assert info["log"] == str(tmp_path / "state" / "operator.log")
    assert info["pid"] == info["pgid"], "the operator leads its own process group"
    assert info["env"]["VALIDATOR_IMAGE"] and info["env_from"].endswith("values.yaml")
    seen = json.loads((tmp_path / "operator-env.json").read_text())
    assert seen["env"]["OPERATOR_NAMESPACE"] == "gpu-operator"
    assert seen["env"]["KUBECONFIG"] == os.path.abspath(path)
    assert seen["env"]["WATCH_NAMESPACE"] == ""
    assert seen["env"]["DRIVER_MANAGER_IMAGE"] == info["env"]["DRIVER_MANAGER_IMAGE"]
    assert not [k for k in seen["env"] if k.startswith("GPUOPS_")]
    assert "--leader-elect=false" in seen["argv"]
    assert "--metrics-bind-address=127.0.0.1:%d" % info["ports"]["metrics"] in seen["argv"]

    # A second start reuses it; --restart gives a new process.
    assert oplab.main(["start", "--kubeconfig", path]) == 0
    assert "reused" in capsys.readouterr().err
    assert status(oplab, capsys)["pid"] == info["pid"]
    assert oplab.main(["start", "--kubeconfig", path, "--restart"]) == 0
    again = status(oplab, capsys)
    assert again["state"] == "running" and again["pid"] != info["pid"]

    assert oplab.main(["stop"]) == 0
    assert status(oplab, capsys)["state"] == "stopped"
    assert oplab.main(["stop"]) == 0
    assert "nothing to stop" in capsys.readouterr().err


def test_start_takes_the_image_env_from_the_charts_deployment(started, tmp_path, monkeypatch, capsys):
    oplab, path = started
    monkeypatch.setattr(FakeApi, "deployment", {"spec": {"template": {"spec": {"containers": [
        {"name": "gpu-operator", "env": [{"name": "WATCH_NAMESPACE", "value": ""},
                                         {"name": "VALIDATOR_IMAGE", "value": "mirror.example/gpu-operator:v9"},
                                         {"name": "DRIVER_MANAGER_IMAGE", "value": "mirror.example/dm:v9"}]}]}}}})
    assert oplab.main(["start", "--kubeconfig", path, "--namespace", "gpu-ops"]) == 0
    info = status(oplab, capsys)
    assert info["env_from"] == "deployment gpu-ops/gpu-operator" and info["namespace"] == "gpu-ops"
    seen = json.loads((tmp_path / "operator-env.json").read_text())["env"]
    assert (seen["VALIDATOR_IMAGE"], seen["OPERATOR_NAMESPACE"]) == ("mirror.example/gpu-operator:v9", "gpu-ops")
    assert oplab.main(["stop"]) == 0


def test_start_without_the_crds_says_to_install_the_chart(started, monkeypatch, capsys):
    oplab, path = started
    monkeypatch.setattr(FakeApi, "crds", set(["clusterpolicies.nvidia.com"]))
    assert oplab.main(["start", "--kubeconfig", path]) == 1
    err = capsys.readouterr().err
    assert "has no nvidiadrivers.nvidia.com, gpuclusters.nvidia.com: install the GPU Operator chart first" in err
    assert status(oplab, capsys)["state"] == "stopped"


def test_start_refuses_an_api_server_off_loopback(started, tmp_path, monkeypatch, capsys):
    oplab, _path = started
    monkeypatch.setattr(FakeApi, "server", "https://k8s.example.com:6443")
    assert oplab.main(["start", "--kubeconfig", str(kubeconfig(tmp_path, FakeApi.server))]) == 1
    assert "on loopback only" in capsys.readouterr().err


def test_an_operator_that_exits_is_reported_with_its_log(started, tmp_path, monkeypatch, capsys):
    oplab, path = started
    monkeypatch.setattr(oplab, "namespace_command",
                        lambda layout, binary, args: ["/bin/sh", "-c", "echo OPERATOR_NAMESPACE not set; exit 1"])
    assert oplab.main(["start", "--kubeconfig", path]) == 1
    err = capsys.readouterr().err
    assert "the operator exited (rc=1)" in err and "OPERATOR_NAMESPACE not set" in err


def test_stop_ends_exactly_the_operators_process_group(oplab, tmp_path):
    """The recorded group (the operator and a child of it) goes; a process outside it, and a stale record
    whose pid now belongs to another process, are left alone."""
    binary = tmp_path / "bin" / "gpu-operator"
    os.symlink("/bin/sleep", binary)
    group = subprocess.Popen(["/bin/sh", "-c", 'sleep 300 & exec "$0" 300', str(binary)], start_new_session=True)
    outsider = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            with open("/proc/%d/cmdline" % group.pid, "rb") as handle:
                if handle.read().split(b"\0")[0] == str(binary).encode():
                    break
            time.sleep(0.05)
        meta = {"pid": group.pid, "pgid": group.pid, "start_ticks": oplab.proc_start_time(group.pid),
                "binary": str(binary)}
        assert oplab.process_is_ours(meta)
        assert not oplab.process_is_ours(dict(meta, start_ticks=meta["start_ticks"] - 1)), "a reused pid is not ours"
        assert oplab.stop_group(dict(meta, binary="/other/binary")), "not ours: nothing to stop"
        assert group.poll() is None, "a process that is not the recorded binary is not signalled"
        assert oplab.stop_group(meta)
        group.wait(timeout=10)
        deadline = time.time() + 10
        while group_members(group.pid) and time.time() < deadline:
            time.sleep(0.1)
        assert group_members(group.pid) == [], "the operator's child went with its group"
        assert outsider.poll() is None, "a process outside the group is untouched"
    finally:
        for proc in (group, outsider):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group.pid, signal.SIGKILL)


def group_members(pgid):
    """Live (not zombie) processes of a process group."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def test_status_of_a_stale_record(oplab, tmp_path, capsys):
    state = tmp_path / "state"
    write(state / "operator.json", json.dumps({"pid": 2 ** 22 + 7, "pgid": 2 ** 22 + 7, "start_ticks": 1,
                                               "binary": "/x", "ports": {"health": 1, "metrics": 2}}))
    info = status(oplab, capsys)
    assert info["state"] == "stale" and info["pid"] is None
    assert oplab.main(["stop"]) == 0
    assert not (state / "operator.json").exists()


def test_the_script_runs_standalone():
    proc = subprocess.run([sys.executable, os.path.join(TOP, "lab", "operatorlab.py"), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0
    for command in ("build", "start", "stop", "status"):
        assert command in proc.stdout


# ---------------------------------------------------------------------------------------------
# The lab's Node objects (tests/fixtures/nodes.py) as the operator reads them
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def nodes():
    return load("nodes_for_operatorlab", os.path.join(TOP, "tests", "fixtures", "nodes.py"))


def test_lab_nodes_carry_what_the_operator_needs(nodes):
    """NFD's PCI labels (GPU node), OS release labels (the operator refuses to reconcile without them and
    tags driver and vGPU Manager images with <ID><VERSION_ID>), kernel labels, and a container runtime."""
    for node in nodes.lab_nodes():
        labels = node["metadata"]["labels"]
        assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
        assert labels["feature.node.kubernetes.io/system-os_release.ID"] == "debian"
        assert labels["feature.node.kubernetes.io/system-os_release.VERSION_ID"] == "12"
        assert labels["feature.node.kubernetes.io/kernel-version.full"] == node["status"]["nodeInfo"]["kernelVersion"]
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        assert node["status"]["nodeInfo"]["osImage"].startswith("Debian GNU/Linux 12")


def test_a_node_of_another_os(nodes):
    node = nodes.gpu_node("gpu-u", "vm-vgpu", os_id="ubuntu", os_version="22.04", kernel="5.15.0-130-generic")
    labels = node["metadata"]["labels"]
    nfd = "feature.node.kubernetes.io/"
    assert (labels[nfd + "system-os_release.ID"], labels[nfd + "system-os_release.VERSION_ID"]) == ("ubuntu", "22.04")
    assert (labels[nfd + "system-os_release.VERSION_ID.major"], labels[nfd + "system-os_release.VERSION_ID.minor"]) == ("22", "04")
    assert [labels[nfd + "kernel-version." + p] for p in ("major", "minor", "revision")] == ["5", "15", "0"]
    assert node["status"]["nodeInfo"]["kernelVersion"] == "5.15.0-130-generic"
    assert node["status"]["nodeInfo"]["osImage"] == "ubuntu 22.04"
