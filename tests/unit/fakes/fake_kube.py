# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""An in-memory stand-in for _kube.KubeApi: JSON merge patches, resourceVersion conflicts, denials; and a stub
API server with kubeconfigs that carry a secret, for the real client."""

from __future__ import annotations

import copy
import http.server
import json
import sys
import threading

from hypothesis import event
from hypothesis import strategies as hs

from ansible_collections.gpuops.sandbox.plugins.module_utils._kube import KubeError


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class FakeKube:
    def __init__(self, nodes=(), kubevirts=None, denied=(), fail_patch=(), conflict_once=()):
        self.nodes = dict((n["metadata"]["name"], copy.deepcopy(n)) for n in nodes)
        for node in self.nodes.values():
            node["metadata"].setdefault("resourceVersion", "1")
        self.kubevirts = None if kubevirts is None else [copy.deepcopy(k) for k in kubevirts]
        self.denied = set(denied)
        self.fail_patch = set(fail_patch)
        self.conflict_once = set(conflict_once)
        self.requests = 0
        self.patches = []
        self.server = "https://127.0.0.1:6443"

    def version(self):
        self.requests += 1
        return "v1.35.4"

    def list_nodes(self):
        self.requests += 1
        return [copy.deepcopy(n) for n in self.nodes.values()]

    def read_node(self, name):
        self.requests += 1
        return copy.deepcopy(self.nodes[name])

    def require(self, checks):
        self.requests += len(checks)
        denied = [c for c in checks if (c[0], c[1]) in self.denied]
        if denied:
            raise KubeError("the kubeconfig's user may not %s %s; nothing was changed" % denied[0][:2], status=403)

    def _patch(self, obj, patch):
        rv = (patch.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != obj["metadata"]["resourceVersion"]:
            raise KubeError("conflict", status=409)
        new = merge_patch(obj, patch)
        new["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return new

    def patch_node(self, name, patch):
        self.requests += 1
        self.patches.append((name, copy.deepcopy(patch)))
        if name in self.fail_patch:
            raise KubeError("forbidden to patch node %s" % name, status=403)
        if name in self.conflict_once:
            self.conflict_once.discard(name)
            self.nodes[name]["metadata"]["resourceVersion"] = str(int(self.nodes[name]["metadata"]["resourceVersion"]) + 1)
            raise KubeError("conflict", status=409)
        self.nodes[name] = self._patch(self.nodes[name], patch)
        return copy.deepcopy(self.nodes[name])

    def list_kubevirts(self, namespace):
        self.requests += 1
        if self.kubevirts is None:
            raise KubeError("KubeVirt is not installed: the API server has no kubevirt.io/v1 resource kubevirts", status=404)
        return [copy.deepcopy(k) for k in self.kubevirts if not namespace or k["metadata"]["namespace"] == namespace]

    def patch_kubevirt(self, namespace, name, patch):
        self.requests += 1
        self.patches.append((name, copy.deepcopy(patch)))
        for index, cr in enumerate(self.kubevirts):
            if cr["metadata"]["name"] == name and cr["metadata"]["namespace"] == namespace:
                self.kubevirts[index] = self._patch(cr, patch)
                return copy.deepcopy(self.kubevirts[index])
        raise KubeError("not found", status=404)


# ---------------------------------------------------------------------------------------------
# A real client against a stub API server, for the paths where credentials could leak
# ---------------------------------------------------------------------------------------------

SECRET = "S3cr3t-gpuops-token-XYZ"
GOOD_TOKEN = "the-stub-accepts-this-token"


class JsonHandler(http.server.BaseHTTPRequestHandler):
    """A request handler of a stub API server: JSON replies, no log lines."""

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass

    def _reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class StubApiServer:
    """A tiny HTTP server the real kubernetes client talks to: ``Bearer <token>`` must match exactly (401
    otherwise); then ``/version`` answers and every other request is forbidden (403). ``authorizations``
    records the Authorization headers received."""

    def __init__(self, token=GOOD_TOKEN):
        self.token = token
        self.authorizations = []
        stub = self

        class Handler(JsonHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                stub.authorizations.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != "Bearer " + stub.token:
                    self._reply(401, {"kind": "Status", "message": "Unauthorized", "code": 401})
                elif self.path.rstrip("/") == "/version":
                    self._reply(200, {"gitVersion": "v1.35.4"})
                else:
                    self._reply(403, {"kind": "Status", "code": 403,
                                      "message": 'forbidden: User "stub" cannot do %s %s' % (self.command, self.path)})

            do_GET = do_POST = do_PATCH = _answer  # noqa: N815

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.httpd.shutdown()
        self.httpd.server_close()


# Every way a kubeconfig can carry SECRET towards a failure, and a text the failure message must hold (so the
# test knows the path was reached). Port 9 (discard) refuses connections.
SECRET_SCENARIOS = {
    "token with a newline": "forbidden to",
    "token with CR LF": "forbidden to",
    "token file with a newline": "forbidden to",
    "exec plugin token with a newline": "forbidden to",
    "wrong token": "refused the credentials",
    "token with a line break inside": "cannot be sent to the API server",
    "user and password": "refused the credentials",
    "server URL with user:password": "refused the credentials",
    "unreachable server URL with user:password": "cannot reach the API server at http://127.0.0.1:9 ",
    "proxy URL with user:password": "cannot reach the API server",
    "client key data": "cannot reach the API server at https://127.0.0.1:9 ",
    "not valid YAML": "is not valid YAML",
    "not a kubeconfig": "is not a kubeconfig",
    "user entry of the wrong shape": "cannot use the kubeconfig",
}


def secret_kubeconfig(tmp_path, scenario, server_url):
    """Write the kubeconfig of ``scenario`` (see SECRET_SCENARIOS) for a stub at ``server_url``; return its path."""
    server, user, cluster_extra = server_url, {"token": GOOD_TOKEN}, {}
    if scenario == "token with a newline":
        user = {"token": GOOD_TOKEN + "\n"}
    elif scenario == "token with CR LF":
        user = {"token": GOOD_TOKEN + "\r\n"}
    elif scenario == "token file with a newline":
        (tmp_path / "token").write_text(GOOD_TOKEN + "\n")
        user = {"tokenFile": str(tmp_path / "token")}
    elif scenario == "exec plugin token with a newline":
        (tmp_path / "token").write_text(GOOD_TOKEN + "\n")
        script = ("import json, sys; print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', "
                  "'kind': 'ExecCredential', 'status': {'token': open(sys.argv[1]).read()}}))")
        user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
                         "args": ["-c", script, str(tmp_path / "token")], "interactiveMode": "Never"}}
    elif scenario == "wrong token":
        user = {"token": SECRET + "\n"}
    elif scenario == "token with a line break inside":
        user = {"token": SECRET + "\nmore"}
    elif scenario == "user and password":
        user = {"username": "admin", "password": SECRET}
    elif scenario == "server URL with user:password":
        server = server_url.replace("http://", "http://admin:%s@" % SECRET)
        user = {"token": SECRET}
    elif scenario == "unreachable server URL with user:password":
        server = "http://admin:%s@127.0.0.1:9" % SECRET
    elif scenario == "proxy URL with user:password":
        cluster_extra = {"proxy-url": "http://admin:%s@127.0.0.1:9" % SECRET}
    elif scenario == "client key data":
        server = "https://admin:%s@127.0.0.1:9" % SECRET
        user = {"client-certificate-data": SECRET, "client-key-data": SECRET}
    path = tmp_path / "kubeconfig"
    if scenario == "not valid YAML":
        path.write_text("apiVersion: v1\nusers: [\n  {name: u, user: {token: %s}}\n" % SECRET)
    elif scenario == "not a kubeconfig":
        path.write_text("- %s\n" % SECRET)
    elif scenario == "user entry of the wrong shape":
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "clusters": [{"name": "k", "cluster": {"server": server}}],
            "users": [{"name": "u", "token": SECRET}]}))
    else:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "clusters": [{"name": "k", "cluster": dict(server=server, **cluster_extra)}],
            "users": [{"name": "u", "user": user}]}))
    return str(path)


def check_no_credential_shown(tmp_path, scenario, run):
    """Through the real client: ``run(kubeconfig_path)`` (a module run returning ``("exit"|"fail", result)``)
    with the kubeconfig of ``scenario`` for a StubApiServer fails with the scenario's text, and the secret is
    nowhere in its result."""
    with StubApiServer() as stub:
        kind, result = run(secret_kubeconfig(tmp_path, scenario, stub.url))
    text = json.dumps(result)
    assert kind == "fail" and SECRET_SCENARIOS[scenario] in result["msg"]
    assert SECRET not in text and "S3cr3t" not in text and "admin:" not in text and "Invalid header" not in text
    if SECRET_SCENARIOS[scenario] == "forbidden to":
        # The token went out without the white space around it, and got as far as the permission check.
        assert set(stub.authorizations) == {"Bearer " + GOOD_TOKEN}


# ---------------------------------------------------------------------------------------------
# Fuzzing: argument values of every kind, the odd ones included
# ---------------------------------------------------------------------------------------------

ODD_TEXTS = ["inf", "-inf", "+inf", "Infinity", "-Infinity", "nan", "NaN", "1e400", "-1e400", "9" * 400, "-" + "9" * 30,
             "0", "-1", "3601", "1.5", "", " ", "true", "null", "Grafikkarte-Ü", "ノード", "\u202e\u0645", "a\nb", "x" * 300]
ODD_NUMBERS = [float("inf"), float("-inf"), float("nan"), 1e308, -0.0, 10 ** 30, -(10 ** 30), 10 ** 400]


def fuzz_values(keys=()):
    """Any JSON-able argument value: scalars (odd texts and numbers included) and lists and dicts of them,
    nested; dict keys mostly from ``keys`` so the module's own keys come up."""
    scalars = hs.one_of(hs.none(), hs.booleans(), hs.integers(-5, 70), hs.floats(), hs.sampled_from(ODD_NUMBERS),
                        hs.text(max_size=12), hs.sampled_from(ODD_TEXTS))
    key = hs.one_of(hs.sampled_from(list(keys) or ["x"]), hs.text(max_size=6))
    return hs.recursive(scalars, lambda children: hs.one_of(hs.lists(children, max_size=3),
                                                            hs.dictionaries(key, children, max_size=4)), max_leaves=10)


def check_clean_end(kind, result):
    """A fuzzed run ends in exit_json, or in fail_json with a message of its own (not the last-line catch-all)."""
    event(kind)  # --hypothesis-show-statistics: how many examples got through
    assert kind in ("exit", "fail")
    if kind == "fail":
        assert isinstance(result["msg"], str) and result["msg"].strip()
        assert "Traceback" not in result["msg"]
        assert "failed unexpectedly" not in result["msg"], result["msg"]
    else:
        assert isinstance(result["changed"], bool)


def fuzz_args(valid, options, most=3):
    """Arguments drawn from ``valid`` (a strategy of valid arguments) with up to ``most`` of ``options`` (name:
    strategy) replaced by a fuzzed value, so that examples reach the module's body as well as its checks."""

    @hs.composite
    def build(draw):
        args = dict(draw(valid))
        for name in draw(hs.lists(hs.sampled_from(sorted(options)), max_size=most, unique=True)):
            args[name] = draw(options[name])
        return args

    return build()
