#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""kubelab: a real Kubernetes API server (etcd + kube-apiserver) on loopback for the cluster half.

There is no kubelet, scheduler or controller manager: the API server stores and validates objects,
serves discovery, custom resources, RBAC and the status subresources, which is what the collection's
cluster roles talk to. Nodes standing for the lab hosts are API objects written by `fixtures`.

* kube-apiserver and kubectl are built from the Go module k8s.io/kubernetes at a pinned release, with
  the k8s.io/* staging modules pinned to the matching v0.x.y through `replace` lines of a go.mod this
  tool writes; helm from helm.sh/helm/v3. The binaries are cached with a manifest of sha256 sums.
* etcd comes from the host's packages (`make hostdeps` installs etcd-server).
* Certificates are generated per run with the openssl CLI: a CA, the serving certificate, an admin
  client (group system:masters), a client with no RBAC rights and a service-account signing key.

Commands: build, start, stop, status, fixtures, nodes, env. Run with --help for details. Each state directory
(GPUOPS_KUBE_STATE, default .lab/kube; the integration tests use .lab/kube-tests) holds one server on ports
of its own, so several run at once.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import http.client
import importlib.util
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

# labcommon.py lies beside this script: importable whether the script runs or is loaded from its path.
LAB_DIR = os.path.dirname(os.path.abspath(__file__))
if LAB_DIR not in sys.path:
    sys.path.insert(0, LAB_DIR)
from labcommon import (Lab, add_command, free_ports, proc_stat, read_json, sha256_file, spawn,  # noqa: E402
                       stop_process, tail_file, utc_now, write_json, write_text)
# kubelab itself needs no port_free; its unit tests check free_ports with it.
from labcommon import port_free  # noqa: E402,F401 pylint: disable=unused-import

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("GPUOPS_KUBE_CACHE") or os.path.join(TOP, ".cache", "kube")
STATE = os.environ.get("GPUOPS_KUBE_STATE") or os.path.join(TOP, ".lab", "kube")
GO = os.environ.get("GPUOPS_KUBE_GO") or "go"
ETCD = os.environ.get("GPUOPS_KUBE_ETCD") or "etcd"
START_TIMEOUT = int(os.environ.get("GPUOPS_KUBE_START_TIMEOUT", "180"))
BUILD_TIMEOUT = int(os.environ.get("GPUOPS_KUBE_BUILD_TIMEOUT", "5400"))
# Health checks of a running server before it is called stale (see server_state()).
READY_ATTEMPTS = 3
FIXTURES = os.path.join(TOP, "tests", "fixtures")

# Pinned releases. The staging modules (k8s.io/api, k8s.io/client-go, ...) follow as v0.<minor>.<patch>.
KUBE_VERSION = "v1.35.4"
HELM_VERSION = "v3.20.2"
# The Go packages built into each binary, and how each binary reports its version.
K8S_PACKAGES = {"kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
                "kubectl": "k8s.io/kubernetes/cmd/kubectl"}
HELM_PACKAGE = "helm.sh/helm/v3/cmd/helm"
VERSION_ARGS = {"kube-apiserver": ["--version"], "kubectl": ["version", "--client"],
                "helm": ["version", "--short"]}
BINARIES = ("kube-apiserver", "kubectl", "helm")
# Oldest etcd the pinned kube-apiserver is run against (see etcd_problem()).
ETCD_MIN = (3, 5, 0)
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
ADMIN_USER = "gpuops-admin"
NOBODY_USER = "gpuops-unauthorised"
# Admission plugins that only make sense with controllers this lab does not run: ServiceAccount
# rejects pods until a controller has created the namespace's `default` service account.
DISABLED_ADMISSION = ("ServiceAccount",)
# How many lines of its log the error of an etcd or kube-apiserver that did not start carries.
LOG_TAIL = 25


class KubeLabError(Exception):
    """An error the user can act on; printed without a traceback."""


LAB = Lab("kubelab", KubeLabError)
log, run, locked = LAB.log, LAB.run, LAB.locked


# ---------------------------------------------------------------------------------------------
# Building the binaries
# ---------------------------------------------------------------------------------------------

def staging_version(kube_version):
    """v1.35.4 -> v0.35.4: the tag the k8s.io/* staging modules carry for a Kubernetes release."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", kube_version)
    if not match:
        raise KubeLabError("not a Kubernetes release version: %r (expected v1.MINOR.PATCH)" % kube_version)
    return "v0.%s.%s" % match.groups()


def staging_modules(gomod_text):
    """The modules k8s.io/kubernetes's go.mod replaces with its own ./staging/src/ directories."""
    found = set()
    for line in gomod_text.splitlines():
        match = re.match(r"\s*(?:replace\s+)?(\S+)(?:\s+v\S+)?\s+=>\s+\./staging/src/(\S+)\s*$", line)
        if match and match.group(1) == match.group(2):
            found.add(match.group(1))
    return sorted(found)


def go_directive(gomod_text):
    match = re.search(r"^go\s+(\d+\.\d+(?:\.\d+)?)\s*$", gomod_text, re.M)
    return match.group(1) if match else None


def render_gomod(kube_version, modules, go_version):
    """The go.mod of the build directory: k8s.io/kubernetes plus its staging modules as released."""
    staged = staging_version(kube_version)
    lines = [
        "// Written by lab/kubelab.py: builds kube-apiserver and kubectl from k8s.io/kubernetes %s." % kube_version,
        "module gpuops.sandbox/kubelab",
        "",
        "go %s" % go_version,
        "",
        "require k8s.io/kubernetes %s" % kube_version,
        "",
        "replace (",
    ]
    width = max(len(m) for m in modules)
    lines += ["\t%s => %s %s" % (m.ljust(width), m, staged) for m in modules]
    lines += [")", ""]
    return "\n".join(lines)


def k8s_ldflags(kube_version):
    """Linker flags: strip symbols and stamp the release into both version packages."""
    major, minor = re.fullmatch(r"v(\d+)\.(\d+)\.\d+", kube_version).groups()
    stamps = {"gitVersion": kube_version, "gitMajor": major, "gitMinor": minor,
              "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z"}
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += ["-X %s.%s=%s" % (pkg, key, value) for key, value in sorted(stamps.items())]
    return " ".join(flags)


def helm_ldflags(helm_version):
    return "-s -w -X helm.sh/helm/v3/internal/version.version=%s" % helm_version


def bin_dir():
    return os.path.join(CACHE, "bin-" + KUBE_VERSION)


def wanted_versions():
    return {"kube-apiserver": KUBE_VERSION, "kubectl": KUBE_VERSION, "helm": HELM_VERSION}


def version_ok(name, output, version):
    """Whether a binary's version output names the pinned release."""
    if name == "helm":
        return output.strip().split("+")[0] == version
    return re.search(r"(^|\s)%s(\s|$)" % re.escape(version), output) is not None


def read_manifest(directory):
    return read_json(os.path.join(directory, "manifest.json")) or None


def binary_problem(directory, manifest, name, execute=True):
    """None when the cached binary `name` is usable, else why not (missing, outdated, corrupt)."""
    path = os.path.join(directory, name)
    entry = ((manifest or {}).get("binaries") or {}).get(name)
    if not os.path.exists(path) or not entry:
        return "missing"
    if entry.get("version") != wanted_versions()[name]:
        return "outdated: %s, pinned %s" % (entry.get("version"), wanted_versions()[name])
    if sha256_file(path) != entry.get("sha256"):
        return "corrupt: its sha256 does not match the manifest"
    if execute:
        try:
            proc = subprocess.run([path] + VERSION_ARGS[name], capture_output=True, text=True, timeout=60,
                                  check=False, stdin=subprocess.DEVNULL)
        except OSError as exc:
            return "corrupt: it does not run (%s)" % exc
        except subprocess.TimeoutExpired:
            return "corrupt: `%s` hangs" % " ".join([name] + VERSION_ARGS[name])
        if proc.returncode != 0 or not version_ok(name, proc.stdout, entry["version"]):
            printed = (proc.stdout + proc.stderr).strip()[:200]
            return "corrupt: `%s` printed %r" % (" ".join([name] + VERSION_ARGS[name]), printed)
    return None


def go_env():
    env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-mod=mod -buildvcs=false")
    return env


def go_version():
    return run([GO, "env", "GOVERSION"], timeout=60).stdout.strip()


def build_k8s(names, dest):
    """Build kube-apiserver/kubectl into `dest` from a go.mod pinning the release and its staging modules."""
    work = os.path.join(CACHE, "build-" + KUBE_VERSION)
    os.makedirs(work, exist_ok=True)
    env = go_env()
    # go.mod of k8s.io/kubernetes names its staging modules (replaced by ./staging in its own tree).
    proc = run([GO, "mod", "download", "-json", "k8s.io/kubernetes@" + KUBE_VERSION], cwd=CACHE, env=env,
               timeout=BUILD_TIMEOUT, progress="downloading k8s.io/kubernetes " + KUBE_VERSION)
    try:
        info = json.loads(proc.stdout)
        with open(info["GoMod"]) as handle:
            upstream = handle.read()
    except (ValueError, KeyError, OSError) as exc:
        raise KubeLabError("cannot read the go.mod of k8s.io/kubernetes %s: %s" % (KUBE_VERSION, exc))
    modules = staging_modules(upstream)
    if len(modules) < 10:
        raise KubeLabError("k8s.io/kubernetes %s names only %d staging modules" % (KUBE_VERSION, len(modules)))
    write_text(os.path.join(work, "go.mod"), render_gomod(KUBE_VERSION, modules, go_directive(upstream) or "1.25"))
    # -v names each package as it is compiled: the progress lines count them.
    cmd = [GO, "build", "-v", "-trimpath", "-ldflags=" + k8s_ldflags(KUBE_VERSION), "-o", dest + os.sep]
    run(cmd + [K8S_PACKAGES[n] for n in names], cwd=work, env=env, timeout=BUILD_TIMEOUT,
        progress="building " + " and ".join(names))


def build_helm(dest):
    """go install helm at the pinned version (its own go.mod decides its dependencies)."""
    env = dict(go_env(), GOBIN=dest, GOFLAGS="-buildvcs=false")
    run([GO, "install", "-v", "-trimpath", "-ldflags=" + helm_ldflags(HELM_VERSION),
         "%s@%s" % (HELM_PACKAGE, HELM_VERSION)], cwd=CACHE, env=env, timeout=BUILD_TIMEOUT,
        progress="building helm " + HELM_VERSION)


def ensure_binaries(rebuild=False):
    """Build what is missing or broken in the cache; return the manifest of bin-<version>/."""
    directory = bin_dir()
    os.makedirs(CACHE, exist_ok=True)
    with locked(os.path.join(CACHE, "build.lock")):
        manifest = read_manifest(directory) or {}
        todo = {}
        for name in BINARIES:
            problem = "rebuild requested" if rebuild else binary_problem(directory, manifest, name)
            if problem:
                todo[name] = problem
        if not todo:
            return manifest
        if shutil.which(GO) is None:
            raise KubeLabError("%s is not installed: the API server is built with Go (1.25 or newer)" % GO)
        for name, problem in todo.items():
            if problem != "missing":
                log("cached %s is %s; rebuilding it" % (name, problem))
        staging = tempfile.mkdtemp(prefix="build-", dir=CACHE)
        try:
            timings = dict(manifest.get("build_seconds") or {})
            k8s = [n for n in K8S_PACKAGES if n in todo]
            if k8s:
                log("building %s %s with %s (many minutes the first time, seconds once Go's build cache is warm)"
                    % (" and ".join(k8s), KUBE_VERSION, go_version()))
                started = time.time()
                build_k8s(k8s, staging)
                timings["k8s"] = round(time.time() - started, 1)
            if "helm" in todo:
                log("building helm %s" % HELM_VERSION)
                started = time.time()
                build_helm(staging)
                timings["helm"] = round(time.time() - started, 1)
            os.makedirs(directory, exist_ok=True)
            binaries = dict(manifest.get("binaries") or {})
            for name in todo:
                os.replace(os.path.join(staging, name), os.path.join(directory, name))
                binaries[name] = {"version": wanted_versions()[name],
                                  "sha256": sha256_file(os.path.join(directory, name))}
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        manifest = {"kubernetes": KUBE_VERSION, "staging": staging_version(KUBE_VERSION), "helm": HELM_VERSION,
                    "go": go_version(), "binaries": binaries, "build_seconds": timings,
                    "built": utc_now()}
        write_json(os.path.join(directory, "manifest.json"), manifest, sort_keys=True)
        for name in BINARIES:
            problem = binary_problem(directory, manifest, name)
            if problem:
                raise KubeLabError("the %s just built is %s" % (name, problem))
        return manifest


def binary(name):
    return os.path.join(bin_dir(), name)


# ---------------------------------------------------------------------------------------------
# etcd and certificates
# ---------------------------------------------------------------------------------------------

def parse_etcd_version(text):
    """(3, 5, 16) from `etcd --version` output, None when it names no version."""
    match = re.search(r"etcd Version:\s*(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(x) for x in match.groups()) if match else None


def etcd_version():
    path = shutil.which(ETCD)
    if path is None:
        raise KubeLabError("etcd is not installed: run `make hostdeps` (as root it installs etcd-server %s.%s or "
                           "newer) or set GPUOPS_KUBE_ETCD to an etcd binary" % ETCD_MIN[:2])
    version = parse_etcd_version(run([path, "--version"], timeout=30).stdout)
    if version is None:
        raise KubeLabError("cannot tell the version of %s" % path)
    if version < ETCD_MIN:
        raise KubeLabError("etcd %s is too old for kube-apiserver %s (it needs %s or newer): run `make hostdeps`, "
                           "which installs etcd-server from Debian 13 on Debian 12"
                           % (".".join(map(str, version)), KUBE_VERSION, ".".join(map(str, ETCD_MIN))))
    return ".".join(map(str, version))


def pki_dir():
    return os.path.join(STATE, "pki")


OPENSSL_CONFIG = """# Written by lab/kubelab.py for one run of the cluster lab.
[req]
distinguished_name = dn
prompt = no
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = %(sans)s
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
"""


def server_sans():
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local"]
    return ", ".join(["IP:127.0.0.1", "IP:" + SERVICE_IP] + ["DNS:" + n for n in names])


def subject(common_name, groups=()):
    """An openssl -subj string: organisations are Kubernetes groups, the common name its user."""
    for part in (common_name,) + tuple(groups):
        if "/" in part or "=" in part:
            raise KubeLabError("invalid certificate name %r" % part)
    return "".join("/O=%s" % g for g in groups) + "/CN=%s" % common_name


def openssl(*args):
    return run(["openssl"] + list(args), timeout=60)


def make_key(path):
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)
    os.chmod(path, 0o600)


def make_certificates(directory):
    """A fresh CA, serving certificate, admin and unauthorised clients and service-account key pair."""
    if shutil.which("openssl") is None:
        raise KubeLabError("openssl is not installed: run `make hostdeps` or install openssl")
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, mode=0o700)
    config = os.path.join(directory, "openssl.cnf")
    write_text(config, OPENSSL_CONFIG % {"sans": server_sans()})

    def path(name):
        return os.path.join(directory, name)

    make_key(path("ca.key"))
    openssl("req", "-x509", "-new", "-config", config, "-extensions", "ca", "-key", path("ca.key"),
            "-subj", subject("gpuops-kubelab-ca"), "-days", "30", "-out", path("ca.crt"))
    leaves = (("apiserver", "server", subject("kube-apiserver")),
              ("admin", "client", subject(ADMIN_USER, ("system:masters",))),
              ("unauthorised", "client", subject(NOBODY_USER)))
    for name, kind, subj in leaves:
        make_key(path(name + ".key"))
        openssl("req", "-new", "-config", config, "-key", path(name + ".key"), "-subj", subj,
                "-out", path(name + ".csr"))
        openssl("x509", "-req", "-in", path(name + ".csr"), "-CA", path("ca.crt"), "-CAkey", path("ca.key"),
                "-set_serial", "0x" + os.urandom(8).hex(), "-days", "30", "-extfile", config,
                "-extensions", kind, "-out", path(name + ".crt"))
        os.unlink(path(name + ".csr"))
    make_key(path("sa.key"))
    openssl("pkey", "-in", path("sa.key"), "-pubout", "-out", path("sa.pub"))


def kubeconfig(server, ca_pem, cert_pem, key_pem, user):
    """A kubeconfig document (dict) with the certificates embedded, so it can be copied anywhere."""

    def b64(data):
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "kubelab", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": "kubelab", "context": {"cluster": "kubelab", "user": user}}],
        "current-context": "kubelab",
    }


def write_kubeconfigs(server):
    import yaml  # pylint: disable=import-outside-toplevel
    pki = pki_dir()

    def read(name):
        with open(os.path.join(pki, name), "rb") as handle:
            return handle.read()

    for filename, client, user in (("kubeconfig", "admin", ADMIN_USER),
                                   ("kubeconfig-unauthorised", "unauthorised", NOBODY_USER)):
        doc = kubeconfig(server, read("ca.crt"), read(client + ".crt"), read(client + ".key"), user)
        write_text(os.path.join(STATE, filename), yaml.safe_dump(doc, default_flow_style=False), mode=0o600)


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------

def meta_path():
    return os.path.join(STATE, "server.json")


def read_meta():
    return read_json(meta_path())


def process_alive(pid, marker):
    """Whether `pid` is a live (not zombie) process whose command line contains `marker`."""
    if not pid:
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return proc_stat(pid) is not None and marker in cmdline


def etcd_args(data_dir, client_port, peer_port):
    client = "http://127.0.0.1:%d" % client_port
    peer = "http://127.0.0.1:%d" % peer_port
    return ["--name", "kubelab", "--data-dir", data_dir,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", "kubelab=" + peer, "--initial-cluster-state", "new",
            # A throw-away store on loopback: no fsync, small snapshots, quiet logs.
            "--unsafe-no-fsync", "--snapshot-count", "10000", "--log-level", "warn"]


def apiserver_args(pki, etcd_port, secure_port):

    def path(name):
        return os.path.join(pki, name)

    return [
        "--etcd-servers=http://127.0.0.1:%d" % etcd_port,
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=%d" % secure_port,
        "--tls-cert-file=" + path("apiserver.crt"), "--tls-private-key-file=" + path("apiserver.key"),
        "--client-ca-file=" + path("ca.crt"),
        "--authorization-mode=RBAC", "--anonymous-auth=false",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--service-account-key-file=" + path("sa.pub"),
        "--service-account-signing-key-file=" + path("sa.key"),
        "--service-cluster-ip-range=" + SERVICE_CIDR,
        "--disable-admission-plugins=" + ",".join(DISABLED_ADMISSION),
        # Endpoints may not hold a loopback address, so the `kubernetes` Service gets none.
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true", "--profiling=false", "--v=1",
    ]


def stop_pid(pid, marker, timeout=20):
    """SIGTERM (then SIGKILL) one of our processes; True when it is gone."""
    return stop_process(lambda: process_alive(pid, marker), lambda sig: os.kill(pid, sig), timeout)


# ---------------------------------------------------------------------------------------------
# A small client for the API server (stdlib only)
# ---------------------------------------------------------------------------------------------

class KubeClient:
    """HTTPS calls to the lab's API server with a client certificate; one connection per thread."""

    def __init__(self, server, ca_file, cert_file, key_file, timeout=30):
        parsed = urllib.parse.urlsplit(server)
        self.host, self.port = parsed.hostname, parsed.port or 443
        self.context = ssl.create_default_context(cafile=ca_file)
        self.context.load_cert_chain(cert_file, key_file)
        self.timeout = timeout
        self.local = threading.local()

    @classmethod
    def admin(cls, server, user="admin"):
        pki = pki_dir()
        return cls(server, os.path.join(pki, "ca.crt"), os.path.join(pki, user + ".crt"),
                   os.path.join(pki, user + ".key"))

    def _connection(self):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=self.timeout)
            self.local.conn = conn
        return conn

    def request(self, method, path, body=None, content_type="application/json"):
        """Return (status, decoded JSON or text). Retries once on a dropped keep-alive connection."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        status, raw = None, b""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                status, raw = resp.status, resp.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise KubeLabError("%s %s: %s" % (method, path, exc))
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode(errors="replace")
        return status, payload

    def check(self, method, path, body=None, content_type="application/json", ok=(200, 201)):
        status, payload = self.request(method, path, body, content_type)
        if status not in ok:
            message = payload.get("message") if isinstance(payload, dict) else payload
            raise KubeLabError("%s %s: HTTP %s: %s" % (method, path, status, message))
        return payload

    def apply(self, path, obj, manager="gpuops-kubelab"):
        """Server-side apply of `obj` at `path` (the object's own path, or its /status)."""
        query = urllib.parse.urlencode({"fieldManager": manager, "force": "true"})
        return self.check("PATCH", "%s?%s" % (path, query), obj, content_type="application/apply-patch+yaml")


def readyz(server, timeout=5):
    """True when the API server at `server` answers /readyz with ok to the admin client."""
    try:
        client = KubeClient.admin(server)
        client.timeout = timeout
        status, payload = client.request("GET", "/readyz")
    except (KubeLabError, OSError, ssl.SSLError):
        return False
    return status == 200 and str(payload).strip() == "ok"


def etcd_healthy(port, timeout=3):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=timeout) as resp:
            return json.loads(resp.read()).get("health") == "true"
    except (OSError, ValueError, urllib.error.URLError):
        return False


def process_marker():
    """What the command line of this state directory's etcd and kube-apiserver contains: the directory and a
    separator, so the server of .lab/kube does not claim the processes of .lab/kube-tests."""
    return os.path.join(STATE, "")


def server_state(meta, check_ready=True):
    """running | stale (recorded but dead, unhealthy or with its port taken) | stopped (nothing recorded)."""
    if not meta:
        return "stopped"
    marker = process_marker()
    alive = [process_alive(meta.get("pids", {}).get(n), marker) for n in ("etcd", "kube-apiserver")]
    if not all(alive):
        return "stale"
    if not check_ready:
        return "running"
    # Live processes that fail a health check once are not dead yet: on a loaded machine a check can time
    # out. Retry a little before calling them stale (which makes `start` restart them).
    for attempt in range(READY_ATTEMPTS):
        if etcd_healthy(meta["ports"]["etcd"]) and readyz(meta["server"]):
            return "running"
        if attempt + 1 < READY_ATTEMPTS:
            time.sleep(1)
    return "stale"


def stop_server(meta):
    problems = []
    for name in ("kube-apiserver", "etcd"):
        pid = (meta.get("pids") or {}).get(name)
        if pid and not stop_pid(pid, process_marker()):
            problems.append("%s (pid %s)" % (name, pid))
    if problems:
        raise KubeLabError("could not stop %s" % ", ".join(problems))
    for name in ("server.json", "kubeconfig", "kubeconfig-unauthorised"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(STATE, name))


def start_server(manifest, etcd_ver):
    """Start etcd and kube-apiserver on fresh ports with fresh certificates and an empty store."""
    started = time.time()
    make_certificates(pki_dir())
    data_dir = os.path.join(STATE, "etcd")
    shutil.rmtree(data_dir, ignore_errors=True)
    etcd_port, peer_port, api_port = free_ports(3)
    logs = {n: os.path.join(STATE, n + ".log") for n in ("etcd", "kube-apiserver")}
    for path in logs.values():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    meta = {"pids": {}, "ports": {"etcd": etcd_port, "etcd-peer": peer_port, "kube-apiserver": api_port},
            "server": "https://127.0.0.1:%d" % api_port, "state": STATE,
            "versions": {"kubernetes": manifest["kubernetes"], "helm": manifest["helm"], "etcd": etcd_ver}}
    etcd = spawn([shutil.which(ETCD)] + etcd_args(data_dir, etcd_port, peer_port), logs["etcd"])
    meta["pids"]["etcd"] = etcd.pid
    write_json(meta_path(), meta)
    deadline = time.time() + 60
    while not etcd_healthy(etcd_port):
        if etcd.poll() is not None or time.time() > deadline:
            stop_server(meta)
            raise KubeLabError("etcd did not start; %s:\n%s" % (logs["etcd"], tail_file(logs["etcd"], LOG_TAIL)))
        time.sleep(0.2)
    api = spawn([binary("kube-apiserver")] + apiserver_args(pki_dir(), etcd_port, api_port), logs["kube-apiserver"])
    meta["pids"]["kube-apiserver"] = api.pid
    write_json(meta_path(), meta)
    deadline = time.time() + START_TIMEOUT
    while not readyz(meta["server"], timeout=3):
        if api.poll() is not None or time.time() > deadline:
            stop_server(meta)
            why = "exited" if api.poll() is not None else "was not ready after %ss" % START_TIMEOUT
            log_file = logs["kube-apiserver"]
            raise KubeLabError("kube-apiserver %s; %s:\n%s" % (why, log_file, tail_file(log_file, LOG_TAIL)))
        time.sleep(0.3)
    write_kubeconfigs(meta["server"])
    meta["start_seconds"] = round(time.time() - started, 1)
    meta["started"] = utc_now()
    write_json(meta_path(), meta)
    return meta


# What a server leaves in its state directory (all of it but the lock); nothing else there is touched.
STATE_FILES = ("server.json", "kubeconfig", "kubeconfig-unauthorised", "etcd.log", "kube-apiserver.log")
STATE_DIRS = ("etcd", "pki")


def wipe_state():
    """Remove a server's store, certificates, kubeconfigs and logs from the state directory."""
    for name in STATE_DIRS:
        shutil.rmtree(os.path.join(STATE, name), ignore_errors=True)
    for name in STATE_FILES:
        for path in (os.path.join(STATE, name), os.path.join(STATE, name + ".tmp")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def ensure_server(fresh=False):
    """Reuse a healthy server; restart a stale one; start one when none runs. Return its metadata.

    With `fresh`, a recorded server (running or not) is stopped and the state directory wiped first, so the
    new server starts from an empty store whatever ran before (the integration tests' session server).
    """
    manifest = ensure_binaries()
    etcd_ver = etcd_version()
    with locked(os.path.join(STATE, "server.lock")):
        meta = read_meta()
        if fresh:
            if meta:
                log("stopping the API server recorded in %s for a fresh start" % STATE)
                stop_server(meta)
            wipe_state()
            return start_server(manifest, etcd_ver), True
        state = server_state(meta)
        if state == "running" and meta.get("versions", {}).get("kubernetes") == manifest["kubernetes"]:
            if not os.path.exists(os.path.join(STATE, "kubeconfig-unauthorised")):
                write_kubeconfigs(meta["server"])
            return meta, False
        if state != "stopped":
            log("the recorded API server is %s; restarting it" % (
                state if state != "running" else "another version"))
            stop_server(meta)
        return start_server(manifest, etcd_ver), True


def describe(meta, state):
    return {"state": state, "server": meta.get("server") if state == "running" else None,
            "kubeconfig": os.path.join(STATE, "kubeconfig"),
            "kubeconfig_unauthorised": os.path.join(STATE, "kubeconfig-unauthorised"),
            "pids": meta.get("pids", {}) if state != "stopped" else {},
            "ports": meta.get("ports", {}) if state != "stopped" else {},
            "versions": meta.get("versions") or {"kubernetes": KUBE_VERSION, "helm": HELM_VERSION},
            "bin_dir": bin_dir(), "state_dir": STATE, "start_seconds": meta.get("start_seconds")}


# ---------------------------------------------------------------------------------------------
# Fixtures: the project's CRDs, objects and Nodes standing for the lab hosts
# ---------------------------------------------------------------------------------------------

def load_nodes_module():
    path = os.path.join(FIXTURES, "nodes.py")
    spec = importlib.util.spec_from_file_location("gpuops_fixture_nodes", path)
    if spec is None or not os.path.exists(path):
        raise KubeLabError("the node fixtures %s are missing" % path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def object_path(obj, subresource=None):
    """The REST path of a (cluster-scoped or namespaced) object of the kinds the fixtures use."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    plural = {"CustomResourceDefinition": "customresourcedefinitions", "Namespace": "namespaces",
              "Node": "nodes", "KubeVirt": "kubevirts", "ClusterPolicy": "clusterpolicies",
              "ResourceSlice": "resourceslices"}.get(kind)
    if plural is None:
        plural = kind.lower() + "s"
    base = "/api/v1" if api_version == "v1" else "/apis/" + api_version
    namespace = obj["metadata"].get("namespace")
    path = "%s/%s%s/%s" % (base, "namespaces/%s/" % namespace if namespace else "", plural, obj["metadata"]["name"])
    return path + ("/" + subresource if subresource else "")


def load_documents(directory):
    import yaml  # pylint: disable=import-outside-toplevel
    docs = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(directory, name)) as handle:
                docs += [d for d in yaml.safe_load_all(handle) if d]
    return docs


def apply_with_status(client, obj, keep_existing=False):
    """Apply an object, then its `status` (if any) through the status subresource.

    With `keep_existing`, an object already on the server keeps what it has (only its status is applied):
    the collection configures the fixture objects (the KubeVirt CR), and `make site` run again must find
    them as the last run left them, not reset to the fixture.
    """
    body = {k: v for k, v in obj.items() if k != "status"}
    status = 404
    if keep_existing:
        status = client.request("GET", object_path(obj))[0]
    if status != 200:
        client.apply(object_path(obj), body)
    if obj.get("status"):
        client.apply(object_path(obj, "status"), {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                                                  "metadata": {"name": obj["metadata"]["name"],
                                                               **({"namespace": obj["metadata"]["namespace"]}
                                                                  if obj["metadata"].get("namespace") else {})},
                                                  "status": obj["status"]})


def wait_established(client, names, timeout=60):
    deadline = time.time() + timeout
    pending = set(names)
    while pending:
        for name in sorted(pending):
            crd = client.check("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + name)
            conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                pending.discard(name)
        if pending and time.time() > deadline:
            raise KubeLabError("CRDs not established after %ss: %s" % (timeout, ", ".join(sorted(pending))))
        if pending:
            time.sleep(0.2)


def apply_fixtures(client):
    crds = load_documents(os.path.join(FIXTURES, "crds"))
    if not crds:
        raise KubeLabError("no fixture CRDs in %s" % os.path.join(FIXTURES, "crds"))
    for crd in crds:
        client.apply(object_path(crd), crd)
    wait_established(client, [c["metadata"]["name"] for c in crds])
    objects = load_documents(os.path.join(FIXTURES, "objects"))
    for obj in objects:
        apply_with_status(client, obj, keep_existing=True)
    nodes_mod = load_nodes_module()
    nodes = nodes_mod.lab_nodes()
    create_nodes(client, nodes)
    # What the DRA driver's kubelet plugin would publish for the lab's DRA hosts (the lab runs no kubelet).
    slices = nodes_mod.lab_dra_slices()
    for item in slices:
        client.apply(object_path(item), item)
    return {"crds": [c["metadata"]["name"] for c in crds],
            "objects": ["%s/%s" % (o["kind"], o["metadata"]["name"]) for o in objects],
            "nodes": [n["metadata"]["name"] for n in nodes],
            "resource_slices": [r["metadata"]["name"] for r in slices]}


def create_nodes(client, nodes, workers=8):
    """Apply Node objects and their status (capacity, allocatable, conditions) in parallel."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(apply_with_status, client, n) for n in nodes]:
            future.result()


def delete_nodes(client, names, workers=8):
    def delete(name):
        client.check("DELETE", "/api/v1/nodes/" + name, ok=(200, 202, 404))

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(delete, n) for n in names]:
            future.result()


def running_meta():
    meta = read_meta()
    if server_state(meta) != "running":
        raise KubeLabError("the API server is not running: start it with `kubelab start` (make kube)")
    return meta


def cmd_build(args):
    started = time.time()
    manifest = ensure_binaries(rebuild=args.rebuild)
    versions = ", ".join("%s %s" % (n, manifest["binaries"][n]["version"]) for n in BINARIES)
    log("binaries ready in %s (%.1fs): %s" % (bin_dir(), time.time() - started, versions))


def cmd_start(args):
    started = time.time()
    meta, fresh = ensure_server(fresh=args.fresh)
    if fresh:
        log("API server %s ready at %s in %.1fs (etcd %s)" % (
            meta["versions"]["kubernetes"], meta["server"], time.time() - started, meta["versions"]["etcd"]))
    else:
        log("API server already running at %s; reused" % meta["server"])
    log("admin kubeconfig: %s" % os.path.join(STATE, "kubeconfig"))


def cmd_stop(_args):
    with locked(os.path.join(STATE, "server.lock")):
        meta = read_meta()
        if not meta:
            log("no API server recorded in %s; nothing to stop" % STATE)
            return
        stop_server(meta)
    log("API server stopped")


def cmd_status(args):
    meta = read_meta()
    state = server_state(meta)
    info = describe(meta, state)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return
    print("state: %s" % state)
    if state != "stopped":
        print("server: %s" % (meta.get("server") or "-"))
        for name in ("etcd", "kube-apiserver"):
            print("%s: pid %s, port %s" % (name, info["pids"].get(name, "-"), info["ports"].get(name, "-")))
        print("kubeconfig: %s" % info["kubeconfig"])
        print("kubeconfig (no RBAC rights): %s" % info["kubeconfig_unauthorised"])
    print("versions: %s" % ", ".join("%s %s" % kv for kv in sorted(info["versions"].items())))
    print("binaries: %s" % info["bin_dir"])


def cmd_fixtures(args):
    started = time.time()
    meta = running_meta()
    result = apply_fixtures(KubeClient.admin(meta["server"]))
    if args.json:
        print(json.dumps(result, indent=2))
    log("applied %d CRDs, %d objects, %d nodes and %d ResourceSlices in %.1fs" % (
        len(result["crds"]), len(result["objects"]), len(result["nodes"]), len(result["resource_slices"]),
        time.time() - started))


def cmd_nodes(args):
    meta = running_meta()
    client = KubeClient.admin(meta["server"])
    names = ["%s%04d" % (args.prefix, i) for i in range(args.count)]
    started = time.time()
    if args.delete:
        delete_nodes(client, names, workers=args.workers)
        verb = "deleted"
    else:
        nodes_mod = load_nodes_module()
        nodes = [nodes_mod.gpu_node(n, args.workload, gpus=args.gpus) for n in names]
        create_nodes(client, nodes, workers=args.workers)
        verb = "applied"
    elapsed = time.time() - started
    print(json.dumps({"nodes": len(names), "action": verb, "seconds": round(elapsed, 2)}))
    log("%s %d nodes in %.1fs" % (verb, len(names), elapsed))


def cmd_env(_args):
    meta = running_meta()
    print("export KUBECONFIG=%s" % os.path.join(STATE, "kubeconfig"))
    print("export K8S_AUTH_KUBECONFIG=%s" % os.path.join(STATE, "kubeconfig"))
    print("export PATH=%s:$PATH" % bin_dir())
    print("# API server %s" % meta["server"])


def main(argv=None):
    parser, sub = LAB.parser(__doc__)
    p = add_command(sub, "build", cmd_build, "build kube-apiserver, kubectl and helm unless valid ones are cached")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when valid binaries are cached")
    p = add_command(sub, "start", cmd_start, "start etcd and kube-apiserver (a healthy running one is reused)")
    p.add_argument("--fresh", action="store_true",
                   help="stop a recorded server and wipe the state directory first: start from an empty store")
    add_command(sub, "stop", cmd_stop, "stop the API server and etcd")
    add_command(sub, "status", cmd_status, "state, pids, ports, kubeconfigs and versions").add_argument("--json", action="store_true")
    p = add_command(sub, "fixtures", cmd_fixtures, "apply the project's fixture CRDs, objects and lab nodes")
    p.add_argument("--json", action="store_true", help="print what was applied as JSON")
    p = add_command(sub, "nodes", cmd_nodes, "create (or --delete) many GPU Node objects, e.g. for benchmarks")
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--prefix", default="bench-gpu-")
    p.add_argument("--workload", choices=("container", "vm-passthrough", "vm-vgpu", "dra"), default="container",
                   help="stand-in GPU resources in status.allocatable (no workload label is set)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--workers", type=int, default=8, help="parallel API requests")
    p.add_argument("--delete", action="store_true")
    add_command(sub, "env", cmd_env, "print shell exports: KUBECONFIG, K8S_AUTH_KUBECONFIG and PATH with kubectl and helm")
    return LAB.main(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
