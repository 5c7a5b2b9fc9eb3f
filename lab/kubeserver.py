# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""kubeserver: the cluster lab's server: etcd and kube-apiserver on loopback, their certificates and state.

Certificates are made for each start with the openssl CLI: a CA, the serving certificate, an admin client
(group system:masters), a client with no RBAC rights and a service-account signing key. The state directory
(GPUOPS_KUBE_STATE) holds the server's record (server.json), store, certificates, kubeconfigs and logs.
KubeClient is the small client (stdlib only) that asks the server whether it is ready and that the fixtures
use.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import shutil
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from labcommon import (free_ports, proc_stat, read_json, spawn, stop_process, tail_file, utc_now, write_json,
                       write_text)
from kubecommon import TOP, KubeLabError, locked, log, run
from kubebuild import HELM_VERSION, KUBE_VERSION, bin_dir, binary, ensure_binaries

STATE = os.environ.get("GPUOPS_KUBE_STATE") or os.path.join(TOP, ".lab", "kube")
ETCD = os.environ.get("GPUOPS_KUBE_ETCD") or "etcd"
START_TIMEOUT = int(os.environ.get("GPUOPS_KUBE_START_TIMEOUT", "180"))
# Health checks of a running server before it is called stale (see server_state()).
READY_ATTEMPTS = 3
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
