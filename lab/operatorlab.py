#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""operatorlab: the real NVIDIA GPU Operator controller, run out of cluster against the cluster lab's API server.

The operator is built from its repository beside the checkout (../shared/upstream/gpu-operator/source, Go
dependencies vendored: the build is offline) and runs as a plain process with the lab's admin kubeconfig.
It does what it does in a cluster: labels the GPU nodes (nvidia.com/gpu.deploy.*), renders its operand
DaemonSets, ConfigMaps, RBAC and RuntimeClasses and reports in the ClusterPolicy status. The lab has no
kubelet, so no operand pod ever runs: the ClusterPolicy stays notReady and the operator requeues every few
seconds, which is what it does on a cluster whose GPU nodes are not up yet.

* `build`: `go build ./cmd/gpu-operator` (GOFLAGS=-mod=vendor, GOPROXY=off, GOTOOLCHAIN=local,
  CGO_ENABLED=0) into .cache/operator, with the image's /opt layout beside it (assets/ and manifests/ as
  docker/Dockerfile copies them). A manifest records the sha256 of the binary, digests of the Go sources and
  of the layout: a missing, corrupt or outdated build is rebuilt, a valid one is reused in a second.
* `start`: runs the binary in a private mount namespace (`unshare --mount --propagation private`) where the
  cached layout is bind-mounted read-only on /opt, so it finds /opt/gpu-operator/state-* as in its image
  while the machine's own /opt is untouched. Environment as the chart's Deployment sets it:
  OPERATOR_NAMESPACE, WATCH_NAMESPACE and the image variables (DRIVER_MANAGER_IMAGE, VALIDATOR_IMAGE, the
  chart's operator.env), read from that Deployment when the chart is installed, else from the chart's
  values.yaml. Metrics and health probes on free loopback ports; no leader election. Only API servers on
  loopback are accepted: this is a lab tool, never pointed at a real cluster.
* `stop` ends exactly the operator's process group; `status [--json]`.

State (GPUOPS_OPERATOR_STATE, default .lab/operator): operator.json (pid, ports, kubeconfig, server),
operator.log. Cache: GPUOPS_OPERATOR_CACHE (default .cache/operator). Source: GPUOPS_OPERATOR_SOURCE.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

# labcommon.py lies beside this script: importable whether the script runs or is loaded from its path.
LAB_DIR = os.path.dirname(os.path.abspath(__file__))
if LAB_DIR not in sys.path:
    sys.path.insert(0, LAB_DIR)
from labcommon import (Lab, add_command, free_ports, proc_stat, read_json, sha256_file, spawn,  # noqa: E402
                       stop_process, tail_file, utc_now, write_json)

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPSTREAM = os.path.join(os.path.dirname(TOP), "shared", "upstream", "gpu-operator")
SOURCE = os.environ.get("GPUOPS_OPERATOR_SOURCE") or os.path.join(UPSTREAM, "source")
CHART = os.environ.get("GPUOPS_OPERATOR_CHART") or os.path.join(UPSTREAM, "chart")
CACHE = os.environ.get("GPUOPS_OPERATOR_CACHE") or os.path.join(TOP, ".cache", "operator")
STATE = os.environ.get("GPUOPS_OPERATOR_STATE") or os.path.join(TOP, ".lab", "operator")
KUBE_STATE = os.environ.get("GPUOPS_KUBE_STATE") or os.path.join(TOP, ".lab", "kube")
GO = os.environ.get("GPUOPS_OPERATOR_GO") or os.environ.get("GPUOPS_KUBE_GO") or "go"
UNSHARE = os.environ.get("GPUOPS_OPERATOR_UNSHARE") or "unshare"
BUILD_TIMEOUT = int(os.environ.get("GPUOPS_OPERATOR_BUILD_TIMEOUT", "3600"))
START_TIMEOUT = int(os.environ.get("GPUOPS_OPERATOR_START_TIMEOUT", "120"))

PACKAGE = "./cmd/gpu-operator"
BINARY = "gpu-operator"
VERSION_PKG = "github.com/NVIDIA/gpu-operator/internal/info"
NAMESPACE = "gpu-operator"
# The chart's Deployment and its container (templates/operator.yaml).
DEPLOYMENT = "gpu-operator"
# What the Go sources of the binary are: their digest decides whether a cached build is outdated.
SOURCE_FILES = ("go.mod", "go.sum", os.path.join("vendor", "modules.txt"))
SOURCE_DIRS = ("cmd", "api", "controllers", "internal")
# The image's /opt (docker/Dockerfile): `COPY assets /opt/gpu-operator/`, `COPY manifests
# /opt/gpu-operator/manifests`, the CRDs for helm upgrades, `COPY validator/manifests /opt/validator/manifests`.
LAYOUT = (("assets", "gpu-operator"), ("manifests", os.path.join("gpu-operator", "manifests")),
          (os.path.join("validator", "manifests"), os.path.join("validator", "manifests")))
LAYOUT_CRDS = ("nvidia.com_clusterpolicies.yaml", "nvidia.com_nvidiadrivers.yaml", "nvidia.com_gpuclusters.yaml")
# CRDs the operator's controllers watch: without them its caches never sync and it exits.
REQUIRED_CRDS = ("clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com", "gpuclusters.nvidia.com")
# Inside the mount namespace: the cached layout becomes /opt (read-only), then the operator replaces the shell.
NAMESPACE_SCRIPT = 'set -e; mount --bind -o ro "$1" /opt; shift; exec "$@"'
# How many lines of its log the error of an operator that did not start carries.
LOG_TAIL = 30


class OperatorLabError(Exception):
    """An error the user can act on; printed without a traceback."""


# Unlike the other labs, a wait for a lock names the lock file's whole path.
LAB = Lab("operatorlab", OperatorLabError, lock_path_in_log=True)
log, run, locked = LAB.log, LAB.run, LAB.locked


# ---------------------------------------------------------------------------------------------
# Building: the binary and the image's /opt layout
# ---------------------------------------------------------------------------------------------

def tree_digest(root, paths, keep=lambda rel: True):
    """sha256 over the relative names and contents of the files `paths` (files or directories) under `root`."""
    files = []
    for path in paths:
        full = os.path.join(root, path)
        if os.path.isfile(full):
            files.append(path)
            continue
        for dirpath, dirnames, filenames in os.walk(full):
            dirnames.sort()
            files += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames]
    files = sorted(f for f in files if keep(f))
    digest = hashlib.sha256()
    for rel in files:
        digest.update(rel.encode() + b"\0" + sha256_file(os.path.join(root, rel)).encode() + b"\n")
    return digest.hexdigest(), len(files)


def is_build_input(rel):
    return not rel.endswith("_test.go") and "/testdata/" not in "/" + rel


def source_digest(source=None):
    """The digest of what goes into the binary: go.mod/go.sum, the vendored modules' list, the operator's Go code."""
    source = source or SOURCE
    missing = [f for f in SOURCE_FILES + (os.path.join("cmd", "gpu-operator"),) if not os.path.exists(os.path.join(source, f))]
    if missing:
        raise OperatorLabError("%s is not the GPU Operator's repository with vendored modules (no %s); see "
                               "../shared/upstream/README.md" % (source, ", ".join(missing)))
    return tree_digest(source, SOURCE_FILES + SOURCE_DIRS, keep=is_build_input)[0]


def source_commit(source=None):
    """The upstream commit named by the SOURCE file beside the source tree, or "unknown"."""
    path = os.path.join(os.path.dirname(source or SOURCE), "SOURCE")
    try:
        with open(path) as handle:
            match = re.search(r"\b([0-9a-f]{40})\b", handle.read())
    except OSError:
        return "unknown"
    return match.group(1) if match else "unknown"


def ldflags(commit):
    version = "lab-" + commit[:12] if commit != "unknown" else "lab"
    return "-s -w -X %s.version=%s -X %s.gitCommit=%s" % (VERSION_PKG, version, VERSION_PKG, commit)


def go_env():
    """The build's environment: vendored modules only, no network, the local toolchain, a static binary."""
    env = dict(os.environ, GOFLAGS="-mod=vendor -buildvcs=false", GOPROXY="off", GOTOOLCHAIN="local",
               CGO_ENABLED="0", GOWORK="off")
    env.pop("GOOS", None)
    env.pop("GOARCH", None)
    return env


def build_command(out, source=None, commit="unknown"):
    """`go build -C <source>`: nothing is written into the source tree (it may be read-only)."""
    return [GO, "build", "-C", source or SOURCE, "-v", "-trimpath", "-ldflags=" + ldflags(commit), "-o", out, PACKAGE]


def layout_dir():
    return os.path.join(CACHE, "opt")


def binary_path():
    return os.path.join(CACHE, "bin", BINARY)


def manifest_path():
    return os.path.join(CACHE, "manifest.json")


def make_layout(dest, source=None):
    """The image's /opt under `dest` (copied, so a read-only or moved source does not matter at run time)."""
    source = source or SOURCE
    shutil.rmtree(dest, ignore_errors=True)
    for src, target in LAYOUT:
        if os.path.isdir(os.path.join(source, src)):
            shutil.copytree(os.path.join(source, src), os.path.join(dest, target), dirs_exist_ok=True)
    if not os.path.isdir(os.path.join(dest, "gpu-operator", "state-driver")):
        raise OperatorLabError("%s has no assets/state-driver: not the GPU Operator's repository" % source)
    crds = os.path.join(source, "deployments", "gpu-operator", "crds")
    for name in LAYOUT_CRDS:
        if os.path.exists(os.path.join(crds, name)):
            shutil.copy2(os.path.join(crds, name), os.path.join(dest, "gpu-operator", name))
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return tree_digest(dest, ["."])[0]


def layout_source_digest(source=None):
    source = source or SOURCE
    crds = [os.path.join("deployments", "gpu-operator", "crds", n) for n in LAYOUT_CRDS]
    return tree_digest(source, [s for s, _t in LAYOUT] + [c for c in crds if os.path.exists(os.path.join(source, c))])[0]


def binary_runs(path):
    """None when `path` runs and knows the operator's flags, else what is wrong."""
    try:
        proc = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60, check=False,
                              stdin=subprocess.DEVNULL)
    except OSError as exc:
        return "it does not run (%s)" % exc
    except subprocess.TimeoutExpired:
        return "`%s --help` hangs" % BINARY
    if "metrics-bind-address" not in proc.stdout + proc.stderr:
        return "`%s --help` printed %r" % (BINARY, (proc.stdout + proc.stderr).strip()[:200])
    return None


def build_problem(manifest, check_source=True, execute=True):
    """None when the cached build is usable, else why not: missing, outdated, corrupt."""
    binary, layout = binary_path(), layout_dir()
    if not manifest or not os.path.exists(binary):
        return "missing"
    if check_source and manifest.get("source_digest") != source_digest():
        return "outdated: the operator's sources changed since it was built"
    if sha256_file(binary) != manifest.get("sha256"):
        return "corrupt: its sha256 does not match the manifest"
    if not os.path.isdir(layout) or tree_digest(layout, ["."])[0] != manifest.get("layout_digest"):
        return "corrupt: the /opt layout beside it does not match the manifest"
    if check_source and manifest.get("layout_source_digest") != layout_source_digest():
        return "outdated: the operator's assets changed since they were copied"
    if execute:
        problem = binary_runs(binary)
        if problem:
            return "corrupt: " + problem
    return None


def ensure_build(rebuild=False):
    """Build what is missing or broken in the cache; return the manifest."""
    os.makedirs(CACHE, exist_ok=True)
    with locked(os.path.join(CACHE, "build.lock")):
        manifest = read_json(manifest_path())
        problem = "rebuild requested" if rebuild else build_problem(manifest)
        if problem is None:
            return manifest
        if rebuild:
            log("rebuilding the operator as asked")
        elif problem != "missing":
            log("cached operator build is %s; rebuilding it" % problem)
        if shutil.which(GO) is None:
            raise OperatorLabError("%s is not installed: the GPU Operator is built with Go (1.26 or newer)" % GO)
        commit = source_commit()
        digest = source_digest()
        go_version = run([GO, "env", "GOVERSION"], timeout=60, env=go_env()).stdout.strip()
        log("building the GPU Operator (%s) with %s: minutes the first time, seconds with Go's build cache warm"
            % (commit[:12], go_version))
        staging = tempfile.mkdtemp(prefix="build-", dir=CACHE)
        try:
            started = time.time()
            run(build_command(os.path.join(staging, BINARY), commit=commit), timeout=BUILD_TIMEOUT, env=go_env(),
                cwd=staging, progress="building the GPU Operator")
            seconds = round(time.time() - started, 1)
            layout_digest = make_layout(os.path.join(staging, "opt"))
            os.makedirs(os.path.dirname(binary_path()), exist_ok=True)
            os.replace(os.path.join(staging, BINARY), binary_path())
            shutil.rmtree(layout_dir(), ignore_errors=True)
            os.replace(os.path.join(staging, "opt"), layout_dir())
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        manifest = {"commit": commit, "source": SOURCE, "source_digest": digest,
                    "layout_source_digest": layout_source_digest(), "layout_digest": layout_digest,
                    "sha256": sha256_file(binary_path()), "go": go_version, "build_seconds": seconds,
                    "built": utc_now()}
        write_json(manifest_path(), manifest, sort_keys=True)
        problem = build_problem(manifest)
        if problem:
            raise OperatorLabError("the operator just built is %s" % problem)
        return manifest


# ---------------------------------------------------------------------------------------------
# The API server: a small client from the kubeconfig (stdlib + PyYAML)
# ---------------------------------------------------------------------------------------------

def default_kubeconfig():
    return os.path.join(KUBE_STATE, "kubeconfig")


def load_kubeconfig(path):
    """(server, {ca, cert, key} PEM bytes) of the kubeconfig's current context."""
    import yaml  # pylint: disable=import-outside-toplevel
    try:
        with open(path) as handle:
            config = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise OperatorLabError("cannot read the kubeconfig %s: %s (start the API server with `make kube`)"
                               % (path, exc.strerror))
    except yaml.YAMLError as exc:
        raise OperatorLabError("the kubeconfig %s is not YAML: %s" % (path, exc))

    def named(kind, name):
        for entry in config.get(kind) or []:
            if entry.get("name") == name:
                return entry
        raise OperatorLabError("the kubeconfig %s has no %s named %r" % (path, kind[:-1], name))

    context = named("contexts", config.get("current-context"))["context"]
    cluster = named("clusters", context["cluster"])["cluster"]
    user = named("users", context["user"])["user"]

    def data(entry, key):
        if entry.get(key + "-data"):
            return base64.b64decode(entry[key + "-data"])
        if entry.get(key):
            with open(os.path.join(os.path.dirname(path), entry[key]), "rb") as handle:
                return handle.read()
        return None

    creds = {"ca": data(cluster, "certificate-authority"), "cert": data(user, "client-certificate"),
             "key": data(user, "client-key")}
    if not (cluster.get("server") and creds["cert"] and creds["key"]):
        raise OperatorLabError("the kubeconfig %s has no server or client certificate: use the lab's admin "
                               "kubeconfig (lab/kubelab.py env)" % path)
    return cluster["server"], creds


def loopback(server):
    host = urllib.parse.urlsplit(server).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


class ApiClient:
    """GET requests to the API server with the kubeconfig's client certificate."""

    def __init__(self, kubeconfig, timeout=10):
        self.server, creds = load_kubeconfig(kubeconfig)
        parsed = urllib.parse.urlsplit(self.server)
        self.host, self.port = parsed.hostname, parsed.port or 443
        self.timeout = timeout
        with tempfile.TemporaryDirectory(prefix="operatorlab-") as tmp:
            paths = {}
            for name, pem in creds.items():
                if pem:
                    paths[name] = os.path.join(tmp, name)
                    with open(os.open(paths[name], os.O_WRONLY | os.O_CREAT, 0o600), "wb") as handle:
                        handle.write(pem)
            self.context = ssl.create_default_context(cafile=paths.get("ca"))
            self.context.load_cert_chain(paths["cert"], paths["key"])

    def get(self, path):
        """(status, decoded JSON or None)."""
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=self.timeout)
        try:
            conn.request("GET", path, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            status, raw = resp.status, resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise OperatorLabError("cannot reach the API server %s: %s" % (self.server, exc))
        finally:
            conn.close()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None


# ---------------------------------------------------------------------------------------------
# The operator's environment, as the chart's Deployment gives it
# ---------------------------------------------------------------------------------------------

def chart_values(chart=None):
    import yaml  # pylint: disable=import-outside-toplevel
    chart = chart or CHART
    try:
        with open(os.path.join(chart, "values.yaml")) as handle:
            values = yaml.safe_load(handle) or {}
        with open(os.path.join(chart, "Chart.yaml")) as handle:
            meta = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise OperatorLabError("cannot read the GPU Operator chart in %s: %s" % (chart, exc))
    return values, meta


def env_from_values(values, meta):
    """DRIVER_MANAGER_IMAGE and VALIDATOR_IMAGE as templates/_helpers.tpl builds them, plus operator.env."""

    def image(spec, default_version=None):
        return "%s/%s:%s" % (spec["repository"], spec["image"], spec.get("version") or default_version)

    env = {"WATCH_NAMESPACE": "",
           "DRIVER_MANAGER_IMAGE": image(values["driver"]["manager"]),
           "VALIDATOR_IMAGE": image(values["validator"], meta.get("appVersion"))}
    for entry in (values.get("operator") or {}).get("env") or []:
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
    return env


def env_from_deployment(deployment):
    """The literal env of the chart's operator container (valueFrom entries are the pod's own: skipped)."""
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        if container.get("name") == DEPLOYMENT:
            return dict((e["name"], e.get("value") or "") for e in container.get("env") or [] if "valueFrom" not in e)
    return None


def operator_env(client, namespace):
    """({name: value}, where from): the chart's Deployment in `namespace` when installed, else its values.yaml."""
    status, deployment = client.get("/apis/apps/v1/namespaces/%s/deployments/%s" % (namespace, DEPLOYMENT))
    if status == 200 and deployment:
        env = env_from_deployment(deployment)
        if env is not None:
            return env, "deployment %s/%s" % (namespace, DEPLOYMENT)
    values, meta = chart_values()
    return env_from_values(values, meta), os.path.join(CHART, "values.yaml")


def missing_crds(client):
    missing = []
    for name in REQUIRED_CRDS:
        status, _body = client.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + name)
        if status != 200:
            missing.append(name)
    return missing


# ---------------------------------------------------------------------------------------------
# The process
# ---------------------------------------------------------------------------------------------

def meta_path():
    return os.path.join(STATE, "operator.json")


def log_path():
    return os.path.join(STATE, "operator.log")


def operator_args(metrics_port, health_port):
    return ["--metrics-bind-address=127.0.0.1:%d" % metrics_port,
            "--health-probe-bind-address=127.0.0.1:%d" % health_port,
            "--leader-elect=false", "--zap-time-encoding=iso8601"]


def under(path, directory):
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def namespace_command(layout, binary, args, euid=None):
    """The operator in a private mount namespace whose /opt is `layout` (read-only); its pid stays the one of
    `unshare` (which execs a shell, which execs the operator). Not root: a user namespace maps us to root."""
    euid = os.geteuid() if euid is None else euid
    for what, path in (("the /opt layout", layout), ("the operator binary", binary)):
        if under(path, "/opt"):
            raise OperatorLabError("%s %s is under /opt, which the operator's namespace replaces: set "
                                   "GPUOPS_OPERATOR_CACHE to a directory elsewhere" % (what, path))
    user = [] if euid == 0 else ["--user", "--map-root-user"]
    return ([UNSHARE, "--mount", "--propagation", "private"] + user
            + ["--", "/bin/sh", "-c", NAMESPACE_SCRIPT, "operatorlab-namespace", layout, binary] + list(args))


def proc_start_time(pid):
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), None when gone."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields else None


def process_is_ours(meta):
    """Whether the recorded operator still runs: same pid, start time, process group, binary."""
    pid = meta.get("pid")
    if not pid or proc_start_time(pid) is None or proc_start_time(pid) != meta.get("start_ticks"):
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            argv = [a.decode(errors="replace") for a in handle.read().split(b"\0")[:2]]
        # argv[0] is the binary; a script's is its interpreter, then the script.
        return os.getpgid(pid) == meta.get("pgid") and meta.get("binary") in argv
    except OSError:
        return False


def probe(port, path="/readyz", timeout=3):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError, http.client.HTTPException):
        return False


def operator_state(meta):
    """running (its process, ready) | starting (its process, not ready) | stale (recorded, gone) | stopped."""
    if not meta:
        return "stopped"
    if not process_is_ours(meta):
        return "stale"
    return "running" if probe(meta["ports"]["health"]) else "starting"


def stop_group(meta, timeout=30):
    """SIGTERM the operator's process group (then SIGKILL); True when it is gone. Nothing else is signalled."""
    return stop_process(lambda: process_is_ours(meta), lambda sig: os.killpg(meta["pgid"], sig), timeout)


def reap(pid):
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def start_operator(manifest, kubeconfig, namespace, timeout=START_TIMEOUT):
    """Start the operator; wait until its readiness probe answers. Return its metadata."""
    kubeconfig = os.path.abspath(kubeconfig)
    client = ApiClient(kubeconfig)
    if not loopback(client.server):
        raise OperatorLabError("the kubeconfig %s points at %s: operatorlab runs the operator against the lab's "
                               "API server on loopback only" % (kubeconfig, client.server))
    status, _body = client.get("/readyz")
    if status != 200:
        raise OperatorLabError("the API server %s is not ready (HTTP %s): start it with `make kube`" % (client.server, status))
    missing = missing_crds(client)
    if missing:
        raise OperatorLabError("the API server has no %s: install the GPU Operator chart first (its CRDs; the "
                               "cluster half does: playbooks/cluster.yml)" % ", ".join(missing))
    env_vars, env_source = operator_env(client, namespace)
    metrics_port, health_port = free_ports(2)
    binary = binary_path()
    cmd = namespace_command(layout_dir(), binary, operator_args(metrics_port, health_port))
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith(("KUBE", "GPUOPS_", "OPERATOR_")))
    env.update(env_vars)
    env.update(KUBECONFIG=kubeconfig, OPERATOR_NAMESPACE=namespace)
    os.makedirs(STATE, exist_ok=True)
    started = time.time()
    proc = spawn(cmd, log_path(), env=env, log_mode="wb")
    meta = {"pid": proc.pid, "pgid": proc.pid, "start_ticks": proc_start_time(proc.pid), "binary": binary,
            "ports": {"metrics": metrics_port, "health": health_port}, "kubeconfig": kubeconfig,
            "server": client.server, "namespace": namespace, "log": log_path(), "sha256": manifest["sha256"],
            "commit": manifest.get("commit"), "env": env_vars, "env_from": env_source}
    # unshare and the shell exec the operator: the pid (and its start time) stay those of the process spawned.
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise OperatorLabError("the operator exited (rc=%s); %s:\n%s"
                                   % (proc.returncode, log_path(), tail_file(log_path(), LOG_TAIL)))
        if probe(health_port):
            break
        if time.time() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise OperatorLabError("the operator was not ready after %ss; %s:\n%s"
                                   % (timeout, log_path(), tail_file(log_path(), LOG_TAIL)))
        time.sleep(0.3)
    meta["start_ticks"] = proc_start_time(proc.pid)
    meta["start_seconds"] = round(time.time() - started, 1)
    meta["started"] = utc_now()
    if not process_is_ours(meta):
        raise OperatorLabError("the operator's process %d is not the binary %s; %s:\n%s"
                               % (proc.pid, binary, log_path(), tail_file(log_path(), LOG_TAIL)))
    write_json(meta_path(), meta, sort_keys=True)
    return meta


def ensure_operator(kubeconfig, namespace, restart=False):
    """Reuse a running operator of the same build, API server and namespace; else (re)start one. (meta, started)"""
    manifest = ensure_build()
    with locked(os.path.join(STATE, "operator.lock")):
        meta = read_json(meta_path())
        state = operator_state(meta)
        same = (meta.get("kubeconfig") == os.path.abspath(kubeconfig) and meta.get("namespace") == namespace
                and meta.get("sha256") == manifest["sha256"])
        if state == "running" and same and not restart:
            return meta, False
        if state in ("running", "starting"):
            log("stopping the operator (pid %s) to start it again" % meta["pid"])
            if not stop_group(meta):
                raise OperatorLabError("the operator (pid %s) did not stop" % meta["pid"])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(meta_path())
        return start_operator(manifest, kubeconfig, namespace), True


def describe(meta, state, manifest):
    live = state in ("running", "starting")
    return {"state": state, "pid": meta.get("pid") if live else None, "pgid": meta.get("pgid") if live else None,
            "ports": meta.get("ports") if live else {}, "kubeconfig": meta.get("kubeconfig"),
            "server": meta.get("server"), "namespace": meta.get("namespace"), "log": log_path(),
            "env": meta.get("env") or {}, "env_from": meta.get("env_from"), "started": meta.get("started"),
            "start_seconds": meta.get("start_seconds"), "state_dir": STATE, "binary": binary_path(),
            "layout": layout_dir(),
            "build": {k: manifest.get(k) for k in ("commit", "sha256", "go", "build_seconds", "built")}}


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def cmd_build(args):
    started = time.time()
    if args.if_source and not os.path.isdir(SOURCE):
        log("no GPU Operator source at %s: nothing to build (the operator tests skip)" % SOURCE)
        return
    manifest = ensure_build(rebuild=args.rebuild)
    log("operator ready in %s (%.1fs; the last build took %ss): commit %s, sha256 %s"
        % (binary_path(), time.time() - started, manifest.get("build_seconds"), manifest.get("commit", "?")[:12],
           manifest["sha256"][:16]))


def cmd_start(args):
    started = time.time()
    kubeconfig = args.kubeconfig or default_kubeconfig()
    meta, fresh = ensure_operator(kubeconfig, args.namespace, restart=args.restart)
    if fresh:
        log("GPU Operator (pid %d) ready against %s in %.1fs; log: %s" % (meta["pid"], meta["server"],
                                                                          time.time() - started, meta["log"]))
    else:
        log("GPU Operator already running (pid %d) against %s; reused" % (meta["pid"], meta["server"]))


def cmd_stop(_args):
    with locked(os.path.join(STATE, "operator.lock")):
        meta = read_json(meta_path())
        if not meta:
            log("no operator recorded in %s; nothing to stop" % STATE)
            return
        if not stop_group(meta):
            raise OperatorLabError("the operator (pid %s) did not stop" % meta.get("pid"))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(meta_path())
    log("GPU Operator stopped")


def cmd_status(args):
    meta = read_json(meta_path())
    state = operator_state(meta)
    info = describe(meta, state, read_json(manifest_path()))
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return
    print("state: %s" % state)
    if state in ("running", "starting"):
        print("pid: %s (process group %s)" % (info["pid"], info["pgid"]))
        print("ports: metrics %(metrics)s, health %(health)s" % info["ports"])
        print("API server: %s (namespace %s)" % (info["server"], info["namespace"]))
    print("log: %s" % info["log"])
    print("binary: %s (commit %s)" % (info["binary"], (info["build"].get("commit") or "not built")[:12]))


def main(argv=None):
    parser, sub = LAB.parser(__doc__)
    p = add_command(sub, "build", cmd_build, "build the operator (and its /opt layout) unless a valid build is cached")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when a valid build is cached")
    p.add_argument("--if-source", action="store_true",
                   help="do nothing when the operator's source is not beside the checkout (a clone without "
                        "../shared/upstream)")
    p = add_command(sub, "start", cmd_start, "start the operator against the lab's API server (a running one is reused)")
    p.add_argument("--kubeconfig", help="admin kubeconfig of a loopback API server (default: the kubelab's of "
                                        "GPUOPS_KUBE_STATE, .lab/kube/kubeconfig)")
    p.add_argument("--namespace", default=NAMESPACE, help="OPERATOR_NAMESPACE, where the chart is installed")
    p.add_argument("--restart", action="store_true", help="stop a running operator and start it again")
    add_command(sub, "stop", cmd_stop, "stop the operator (its process group)")
    add_command(sub, "status", cmd_status, "state, pid, ports, API server, log and build").add_argument("--json", action="store_true")
    return LAB.main(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
