"""Stand-ins for what the roles talk to, for tests that run the roles for real on localhost and look for leaked
secrets: fake commands (podman, buildah, docker, helm) that print their argv and stdin, a container registry
(HTTPS), Kubernetes API servers and an AWX controller (HTTP).

Where a real peer could echo what it was sent (a command's error output, an API's validation error), the stand-in
does echo it: whatever the role then prints of the failure shows a secret it passed on. Each server runs in a thread
of the test process on a free port of 127.0.0.1.
"""

import base64
import datetime
import hashlib
import http.server
import json
import os
import re
import socket
import ssl
import sys
import threading
import urllib.parse

# ---------------------------------------------------------------------------------------------
# Finding a secret in output, as it is or encoded
# ---------------------------------------------------------------------------------------------

_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{12,}={0,2}")


def _b64_decodings(text, depth):
    """Texts base64 runs of ``text`` decode to (standard and URL-safe alphabets), nested up to ``depth``."""
    found = []
    for run in set(_B64_RUN.findall(text)):
        stripped = run.rstrip("=")
        for start in range(4):  # a run may begin inside a longer encoded word
            chunk = stripped[start:]
            chunk += "=" * (-len(chunk) % 4)
            for decode in (base64.b64decode, base64.urlsafe_b64decode):
                try:
                    decoded = decode(chunk.encode()).decode("utf-8", "replace")
                except ValueError:
                    continue
                found.append(decoded)
                if depth > 1:
                    found.extend(_b64_decodings(decoded, depth - 1))
    return found


def secret_forms_in(text, secret):
    """How ``secret`` shows in ``text``: as it is, URL-encoded, or inside base64 (nested twice, as in a
    .dockerconfigjson). Empty when it does not."""
    forms = []
    if secret in text:
        forms.append("plain")
    if urllib.parse.quote(secret, safe="") != secret and urllib.parse.quote(secret, safe="") in text:
        forms.append("url-encoded")
    if any(secret in decoded for decoded in _b64_decodings(text, 2)):
        forms.append("base64")
    return forms


def closed_port():
    """A TCP port of 127.0.0.1 that refuses connections (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Fake commands
# ---------------------------------------------------------------------------------------------

FAKE_COMMAND = r'''#!%(python)s
"""Fake %(name)s: prints its argv and its stdin to stderr, as a tool's error output could; fails when its verb
is in GPUOPS_FAKE_FAIL (space-separated), else answers like the real one would."""
import os, select, sys

name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
verbs = ("version", "info", "login", "build", "bud", "push", "template", "list", "show", "upgrade", "install",
         "repo", "get", "dependency")
verb = next((a for a in args if a in verbs), "")
stdin = ""
if not sys.stdin.isatty() and select.select([sys.stdin], [], [], 0.2)[0]:
    stdin = sys.stdin.read()
sys.stderr.write("fake %%s %%s: argv %%r; stdin %%r\n" %% (name, verb, args, stdin))
if verb in os.environ.get("GPUOPS_FAKE_FAIL", "").split():
    sys.stderr.write("fake %%s: %%s failed\n" %% (name, verb))
    sys.exit(1)
if name == "helm" and verb == "version":
    print('version.BuildInfo{Version:"v3.17.3", GitCommit:"fake", GitTreeState:"clean", GoVersion:"go1.23.7"}')
elif name == "helm" and verb == "list":
    print("[]")
elif name == "helm" and verb == "show":
    print("apiVersion: v2\nname: fake-chart\nversion: 1.0.0\n")
elif name == "helm" and verb == "template":
    print("---")
elif verb == "login":
    print("Login Succeeded!")
'''


def fake_commands(directory, names=("podman", "buildah", "docker", "helm")):
    """Write the fake commands into ``directory``; return it."""
    os.makedirs(directory, exist_ok=True)
    for name in names:
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(FAKE_COMMAND % {"python": sys.executable, "name": name})
        os.chmod(path, 0o755)
    return str(directory)


# ---------------------------------------------------------------------------------------------
# HTTP servers
# ---------------------------------------------------------------------------------------------

class _Server:
    """A threading HTTP(S) server on 127.0.0.1; ``handle(handler)`` of the subclass answers each request."""

    def __init__(self, tls=None):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # pylint: disable=arguments-differ
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.body = self.rfile.read(length) if length else b""
                server.handle(self)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any  # noqa: N815

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = "%s://127.0.0.1:%d" % ("https" if tls else "http", self.port)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def reply(handler, code, body=None, headers=None, content_type="application/json"):
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        handler.send_response(code)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def handle(self, handler):
        raise NotImplementedError


def self_signed_tls(directory):
    """A server TLS context with a fresh self-signed certificate for 127.0.0.1."""
    from cryptography import x509  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives import hashes, serialization  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=import-outside-toplevel
    from cryptography.x509.oid import NameOID  # pylint: disable=import-outside-toplevel
    import ipaddress  # pylint: disable=import-outside-toplevel

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake registry")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = os.path.join(directory, "registry.crt"), os.path.join(directory, "registry.key")
    with open(cert_path, "wb") as handle:
        handle.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context


class FakeRegistry(_Server):
    """A container registry (distribution API v2 over HTTPS).

    ``auth``: ``bearer`` (a token service at /token, which answers Basic credentials with the token
    ``<password>-token``, so the token carries the secret too) or ``basic``. ``accept``: whether credentials are
    accepted; a refusal quotes the Authorization header it was sent, as an error body may. ``labels``: when given,
    every tag exists, its image configuration having these labels; otherwise no tag exists.
    """

    def __init__(self, tls, auth="basic", accept=True, labels=None):
        self.auth, self.accept, self.labels = auth, accept, labels
        self.config = json.dumps({"config": {"Labels": labels or {}}}).encode()
        self.config_digest = "sha256:" + hashlib.sha256(self.config).hexdigest()
        super().__init__(tls)

    def _authorised(self, handler):
        value = handler.headers.get("Authorization") or ""
        if not self.accept:
            return False
        if self.auth == "bearer":
            return value.startswith("Bearer ") and value.endswith("-token")
        return value.startswith("Basic ")

    def handle(self, handler):
        path = urllib.parse.urlsplit(handler.path).path
        refusal = {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required",
                               "detail": {"received": handler.headers.get("Authorization")}}]}
        if self.auth == "bearer" and path == "/token":
            basic = (handler.headers.get("Authorization") or "").partition("Basic ")[2]
            if not self.accept or not basic:
                return self.reply(handler, 401, refusal)
            password = base64.b64decode(basic).decode().partition(":")[2]
            return self.reply(handler, 200, {"token": password + "-token"})
        if not self._authorised(handler):
            challenge = ('Bearer realm="%s/token",service="fake-registry"' % self.url if self.auth == "bearer"
                         else 'Basic realm="fake-registry"')
            return self.reply(handler, 401, refusal, {"WWW-Authenticate": challenge})
        if path == "/v2/":
            return self.reply(handler, 200, {})
        if "/manifests/" in path and self.labels is not None:
            manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                   "digest": self.config_digest, "size": len(self.config)}, "layers": []}
            return self.reply(handler, 200, manifest, {"Docker-Content-Digest": "sha256:" + "0" * 64},
                              "application/vnd.oci.image.manifest.v1+json")
        if "/blobs/" in path and self.labels is not None:
            return self.reply(handler, 200, self.config, content_type="application/octet-stream")
        return self.reply(handler, 404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]})


class FakeKubernetes(_Server):
    """A Kubernetes API server with core/v1 namespaces, secrets and configmaps and nothing else: every namespace
    exists, no secret or configmap does. ``secrets``: ``accept`` creates them; ``refuse`` answers 422 quoting the
    object it was sent, as an admission webhook's denial may."""

    RESOURCES = [("namespaces", "Namespace", False), ("secrets", "Secret", True), ("configmaps", "ConfigMap", True)]

    def __init__(self, secrets="accept"):
        self.secrets = secrets
        super().__init__()

    def handle(self, handler):
        path = urllib.parse.urlsplit(handler.path).path.rstrip("/")
        if path == "/version":
            return self.reply(handler, 200, {"major": "1", "minor": "33", "gitVersion": "v1.33.1", "platform": "linux/amd64"})
        if path == "/api":
            return self.reply(handler, 200, {"kind": "APIVersions", "versions": ["v1"],
                                             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
        if path == "/apis":
            return self.reply(handler, 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        if path == "/api/v1":
            return self.reply(handler, 200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
                 "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                for name, kind, namespaced in self.RESOURCES]})
        match = re.match(r"^/api/v1/namespaces/([^/]+)$", path)
        if match and handler.command in ("GET", "PATCH"):
            return self.reply(handler, 200, {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": match.group(1), "resourceVersion": "1", "uid": "fake"},
                                             "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
        match = re.match(r"^/api/v1/namespaces/([^/]+)/(secrets|configmaps)(/[^/]+)?$", path)
        if match and handler.command == "POST":
            sent = json.loads(handler.body or b"{}")
            if match.group(2) == "secrets" and self.secrets == "refuse":
                return self.reply(handler, 422, {
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
                    "message": 'admission webhook "fake.gpuops" denied the request: %s' % json.dumps(sent)})
            sent.setdefault("metadata", {}).update(resourceVersion="1", uid="fake")
            return self.reply(handler, 201, sent)
        return self.reply(handler, 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                         "code": 404, "message": "%s not found" % path})


class FakeKubeAccess(_Server):
    """A Kubernetes API server that answers only what kube_access asks: its version, and every
    SelfSubjectAccessReview allowed. Anything else is 404. ``requests`` lists ``(method, path)`` of every request, so
    a test can show that a run stopped before it read or changed anything on the cluster."""

    def __init__(self):
        self.requests = []
        super().__init__()

    def handle(self, handler):
        path = urllib.parse.urlsplit(handler.path).path.rstrip("/")
        self.requests.append((handler.command, path))
        if path == "/version":
            return self.reply(handler, 200, {"major": "1", "minor": "35", "gitVersion": "v1.35.4", "platform": "linux/amd64"})
        if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" and handler.command == "POST":
            review = json.loads(handler.body or b"{}")
            review["status"] = {"allowed": True}
            return self.reply(handler, 201, review)
        return self.reply(handler, 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                         "code": 404, "message": "%s not found" % path})

    def kubeconfig(self, path):
        """Write a kubeconfig for this server to ``path``; return it."""
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                       "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                       "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                       "users": [{"name": "fake", "user": {"token": "fake-token"}}]}, handle)
        return str(path)


class FakeAwx(_Server):
    """An AWX controller where every object asked for by name exists and takes any change, except credentials:
    there are none, and creating one is refused with a validation error quoting the inputs it was sent, as a
    field error may. OAuth2 tokens are made for any user."""

    def handle(self, handler):
        url = urllib.parse.urlsplit(handler.path)
        path, query = url.path, urllib.parse.parse_qs(url.query)
        match = re.match(r"^/api/v2/([a-z_]+)/(?:(\d+)/)?(?:([a-z_]+)/)?$", path)
        if not match:
            return self.reply(handler, 404, {"detail": "Not found."})
        endpoint, ident, related = match.groups()
        if endpoint == "tokens":
            if handler.command == "DELETE":
                return self.reply(handler, 204)
            return self.reply(handler, 201, {"id": 7, "token": "fake-awx-session-token"})
        if endpoint == "credentials" and handler.command in ("POST", "PATCH"):
            sent = json.loads(handler.body or b"{}")
            return self.reply(handler, 400, {"inputs": ["Not valid for its credential type: %s" % json.dumps(sent.get("inputs"))]})
        if related:
            if handler.command == "GET":
                return self.reply(handler, 200, {"count": 0, "next": None, "results": []})
            return self.reply(handler, 204)
        if handler.command == "GET" and not ident:
            if endpoint == "credentials":
                return self.reply(handler, 200, {"count": 0, "next": None, "results": []})
            name = (query.get("name") or query.get("name__iexact") or ["object"])[0]
            return self.reply(handler, 200, {"count": 1, "next": None, "results": [self._object(endpoint, 1, name)]})
        if handler.command == "GET":
            return self.reply(handler, 200, self._object(endpoint, int(ident), "object"))
        sent = json.loads(handler.body or b"{}")
        obj = self._object(endpoint, int(ident or 1), sent.get("name", "object"))
        obj.update(sent)
        return self.reply(handler, 201 if handler.command == "POST" else 200, obj)

    @staticmethod
    def _object(endpoint, ident, name):
        url = "/api/v2/%s/%d/" % (endpoint, ident)
        related = dict((key, url + key + "/") for key in (
            "children", "hosts", "credentials", "survey_spec", "workflow_nodes", "labels", "instance_groups",
            "notification_templates_started", "notification_templates_success", "notification_templates_error"))
        return {"id": ident, "type": endpoint.rstrip("s"), "url": url, "name": name, "related": related,
                "summary_fields": {}, "scm_revision": "", "kind": ""}
