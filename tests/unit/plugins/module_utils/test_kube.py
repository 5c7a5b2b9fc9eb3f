# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""_kube.KubeApi through the real kubernetes client against a tiny HTTP server that plays the API server."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from ansible_collections.gpuops.sandbox.plugins.module_utils._kube import KubeApi, KubeError, check_label_key, label_value, parse_version

TOKEN = "good-token-value"


class Handler(http.server.BaseHTTPRequestHandler):
    seen = []

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass

    def _reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _auth(self):
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            self._reply(401, {"kind": "Status", "message": "Unauthorized", "code": 401})
            return False
        return True

    def do_GET(self):  # pylint: disable=invalid-name
        Handler.seen.append(("GET", self.path, None))
        if not self._auth():
            return
        if self.path.rstrip("/") == "/version":
            self._reply(200, {"gitVersion": "v1.35.4"})
        elif self.path.startswith("/api/v1/nodes?") and "continue=t1" in self.path:
            self._reply(200, {"items": [{"metadata": {"name": "n2"}}], "metadata": {}})
        elif self.path.startswith("/api/v1/nodes?"):
            self._reply(200, {"items": [{"metadata": {"name": "n1"}}], "metadata": {"continue": "t1"}})
        elif self.path.startswith("/apis/kubevirt.io/"):
            self._reply(404, {"kind": "Status", "message": "the server could not find the requested resource", "code": 404})
        else:
            self._reply(404, {"message": "no"})

    def do_PATCH(self):  # pylint: disable=invalid-name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.seen.append(("PATCH", self.path, self.headers.get("Content-Type")))
        if not self._auth():
            return
        if self.path == "/api/v1/nodes/n1":
            self._reply(200, {"metadata": {"name": "n1", "labels": body["metadata"]["labels"]}})
        else:
            self._reply(403, {"kind": "Status", "message": 'nodes "%s" is forbidden' % self.path.rsplit("/", 1)[-1], "code": 403})

    def do_POST(self):  # pylint: disable=invalid-name
        self.rfile.read(int(self.headers["Content-Length"]))
        Handler.seen.append(("POST", self.path, None))
        if not self._auth():
            return
        self._reply(201, {"status": {"allowed": False}})


@pytest.fixture(name="server")
def server_fixture():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Handler.seen = []
    yield "http://127.0.0.1:%d" % httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def kubeconfig(tmp_path, server, token=TOKEN):
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token}}]}))
    return str(path)


def test_pages_patch_content_type_and_request_count(tmp_path, server):
    api = KubeApi(kubeconfig=kubeconfig(tmp_path, server))
    assert api.version() == "v1.35.4"
    assert [n["metadata"]["name"] for n in api.list_nodes()] == ["n1", "n2"]
    node = api.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    assert node["metadata"]["labels"] == {"a": "b"}
    assert ("PATCH", "/api/v1/nodes/n1", "application/merge-patch+json") in Handler.seen
    assert api.requests == 4


def test_forbidden_and_denied_are_named(tmp_path, server):
    api = KubeApi(kubeconfig=kubeconfig(tmp_path, server))
    with pytest.raises(KubeError, match='forbidden to patch node n9: nodes "n9" is forbidden') as exc:
        api.patch_node("n9", {"metadata": {"labels": {"a": "b"}}})
    assert exc.value.status == 403
    with pytest.raises(KubeError, match="may not patch nodes, get kubevirts.kubevirt.io in namespace kubevirt"):
        api.require([("patch", "nodes", "", None), ("get", "kubevirts", "kubevirt.io", "kubevirt")])


def test_unauthorised_never_shows_the_token(tmp_path, server):
    api = KubeApi(kubeconfig=kubeconfig(tmp_path, server, token="wrong-secret-token"))
    with pytest.raises(KubeError) as exc:
        api.list_nodes()
    assert "refused the credentials" in exc.value.msg and "401" in exc.value.msg
    assert "wrong-secret-token" not in exc.value.msg


def test_missing_kubevirt(tmp_path, server):
    api = KubeApi(kubeconfig=kubeconfig(tmp_path, server))
    with pytest.raises(KubeError, match="KubeVirt is not installed"):
        api.list_kubevirts("kubevirt")


@pytest.mark.parametrize("text, expected", [("v1.8.2", (1, 8, 2)), ("1.9", (1, 9, 0)), ("v1.8.0-rc.1", (1, 8, 0)), ("", None)])
def test_parse_version(text, expected):
    assert parse_version(text) == expected


def test_label_checks():
    check_label_key("nvidia.com/gpu.workload.config")
    assert label_value("k", True) == "true" and label_value("k", None) is None
    with pytest.raises(ValueError, match="prefix 'Bad_Prefix'"):
        check_label_key("Bad_Prefix/x")
    with pytest.raises(ValueError, match="value 'a b'"):
        label_value("k", "a b")


def test_a_kubeconfig_that_does_not_exist_is_named(tmp_path):
    missing = str(tmp_path / "nowhere" / "kubeconfig")
    with pytest.raises(KubeError) as exc:
        KubeApi(kubeconfig=missing)
    assert exc.value.msg == ("kubeconfig %s does not exist; give the path of a kubeconfig on the controller"
                             % missing)
    assert "No configuration found" not in exc.value.msg


SECRET = "sekrit-token-0123456789"


@pytest.mark.parametrize("text, expected", [
    # Not YAML at all: an unclosed flow sequence, a tab where YAML wants indentation.
    ("apiVersion: v1\nusers: [\n  {name: u, user: {token: %s}}\n" % SECRET, r"is not valid YAML \(line 4, column 1\)"),
    ("users:\n\t- token: %s\n" % SECRET, r"is not valid YAML \(line 2, column 1\)"),
    # YAML, but not a kubeconfig: a list, a bare string, a user that is a string.
    ("- %s\n" % SECRET, "is not a kubeconfig: its top level is a YAML list"),
    ("%s\n" % SECRET, "is not a kubeconfig: its top level is a YAML string"),
    ("clusters:\n- name: k\n  cluster: {server: 'http://127.0.0.1:1'}\nusers:\n- name: u\n  user: %s\n"
     "contexts:\n- name: c\n  context: {cluster: k, user: u}\ncurrent-context: c\n" % SECRET,
     r"is not a valid kubeconfig \(AttributeError while reading it\)"),
    ("apiVersion: v1\nclusters: 5\nusers: [{name: u, user: {token: %s}}]\n" % SECRET,
     r"is not a valid kubeconfig \(TypeError while reading it\)"),
])
def test_a_kubeconfig_that_is_not_one_fails_clearly_without_its_contents(tmp_path, text, expected):
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(KubeError, match=expected) as exc:
        KubeApi(kubeconfig=str(path))
    assert str(path) in exc.value.msg
    assert SECRET not in exc.value.msg and "sekrit" not in exc.value.msg


def test_a_directory_is_not_a_kubeconfig(tmp_path):
    with pytest.raises(KubeError, match="cannot read the kubeconfig %s: Is a directory" % tmp_path):
        KubeApi(kubeconfig=str(tmp_path))


def test_kubeconfig_paths_joined_like_kubeconfig_need_one_that_exists(tmp_path, server):
    good = kubeconfig(tmp_path, server)
    api = KubeApi(kubeconfig=str(tmp_path / "absent") + ":" + good)
    assert api.version() == "v1.35.4"
    both = "%s:%s" % (tmp_path / "a", tmp_path / "b")
    with pytest.raises(KubeError, match="kubeconfig %s does not exist" % both):
        KubeApi(kubeconfig=both)
