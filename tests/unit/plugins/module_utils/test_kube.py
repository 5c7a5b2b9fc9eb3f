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

from ansible_collections.gpuops.sandbox.plugins.module_utils._kube import (
    KubeApi,
    KubeError,
    check_label_key,
    connect,
    kubeconfig_secrets,
    label_value,
    open_api,
    parse_version,
    redact,
    strip_userinfo,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._module import MASK, GpuopsError
from ansible_collections.gpuops.sandbox.tests.unit.fakes.fake_kube import JsonHandler

TOKEN = "good-token-value"


class Handler(JsonHandler):
    seen = []

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
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    Handler.seen = []
    yield "http://127.0.0.1:%d" % httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def kubeconfig(tmp_path, server, token=TOKEN, user=None):
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user or {"token": token}}]}))
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


# ---------------------------------------------------------------------------------------------
# Credentials never reach a message; white space around a token is not part of it
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["\n", "\r\n", " \t\n"])
def test_white_space_around_the_token_is_stripped(tmp_path, server, suffix):
    """A token file's newline used to make every request fail with "Invalid header value b'Bearer <token>\\n'"."""
    api = KubeApi(kubeconfig=kubeconfig(tmp_path, server, token=TOKEN + suffix))
    assert api.version() == "v1.35.4"
    # The client sets the token again before every request: the second one must be clean too.
    assert [n["metadata"]["name"] for n in api.list_nodes()] == ["n1", "n2"]
    assert api.requests == 3
    assert TOKEN in api.secrets


def test_a_token_file_with_a_newline_works(tmp_path, server):
    (tmp_path / "token").write_text(TOKEN + "\n")
    api = KubeApi(kubeconfig=kubeconfig(tmp_path, server, user={"tokenFile": str(tmp_path / "token")}))
    assert api.version() == "v1.35.4" and api.list_nodes()


def test_a_line_break_inside_the_token_fails_without_it(tmp_path, server):
    token = "sekrit-token-0123456789\ntail"
    api = KubeApi(kubeconfig=kubeconfig(tmp_path, server, token=token))
    with pytest.raises(KubeError) as exc:
        api.version()
    assert "holds a line break or another control character" in exc.value.msg
    assert "sekrit" not in exc.value.msg and "Invalid header" not in exc.value.msg


def test_the_userinfo_of_the_server_url_is_never_shown(tmp_path):
    path = kubeconfig(tmp_path, "http://admin:pa%24%24-sekrit-word@127.0.0.1:9")
    api = KubeApi(kubeconfig=path, request_timeout=5)
    assert api.server == "http://127.0.0.1:9"
    assert {"pa%24%24-sekrit-word", "pa$$-sekrit-word"} <= api.secrets
    with pytest.raises(KubeError) as exc:
        api.version()
    assert exc.value.msg.startswith("cannot reach the API server at http://127.0.0.1:9 to read the server version")
    assert "sekrit" not in exc.value.msg and "admin" not in exc.value.msg
    assert "pa$$-sekrit-word" in exc.value.secrets


def test_credentials_are_masked_in_the_clients_own_messages(tmp_path):
    """The client quotes a whole user entry when a key is missing ("Expected key user in .../{'token': ...}")."""
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "token": SECRET}]}))
    with pytest.raises(KubeError) as exc:
        KubeApi(kubeconfig=str(path))
    assert "Expected key user" in exc.value.msg and MASK in exc.value.msg
    assert SECRET not in exc.value.msg and SECRET in exc.value.secrets


def test_kubeconfig_secrets_finds_every_credential():
    document = {
        "clusters": [{"name": "k", "cluster": {"server": "https://u:url-pass-word@h:6443", "proxy-url": "http://p:proxy-pw@x"}}],
        "users": [
            {"name": "a", "user": {"token": "token-aaaa", "tokenFile": "/token/file/path"}},
            {"name": "b", "user": {"username": "bob", "password": "password-bbbb"}},
            {"name": "c", "user": {"client-certificate-data": "Q0VSVA==", "client-key-data": "S0VZLWRhdGE="}},
            {"name": "d", "user": {"auth-provider": {"name": "oidc", "config": {
                "id-token": "id-token-dddd", "refresh-token": "refresh-dddd", "client-secret": "client-secret-dddd",
                "client-id": "the-client-id"}}}},
            {"name": "e", "user": {"exec": {"command": "x", "env": [
                {"name": "AWS_SECRET_ACCESS_KEY", "value": "aws-secret-eeee"}, {"name": "REGION", "value": "eu-west-1"}]}}},
        ]}
    found = kubeconfig_secrets(document)
    for secret in ("url-pass-word", "u:url-pass-word", "proxy-pw", "token-aaaa", "password-bbbb", "S0VZLWRhdGE=",
                   "id-token-dddd", "refresh-dddd", "client-secret-dddd", "aws-secret-eeee"):
        assert secret in found, secret
    for public in ("bob", "/token/file/path", "Q0VSVA==", "the-client-id", "eu-west-1", "https://u:url-pass-word@h:6443"):
        assert public not in found, public


@pytest.mark.parametrize("url, expected", [
    ("https://admin:pw@127.0.0.1:6443", "https://127.0.0.1:6443"),
    ("https://admin:p@ss@host/path?x=1", "https://host/path?x=1"),
    ("https://host:6443/a@b", "https://host:6443/a@b"),
    ("https://host", "https://host"),
    (None, None),
])
def test_strip_userinfo(url, expected):
    assert strip_userinfo(url) == expected


def test_redact_masks_every_form_of_a_secret():
    secret = "sekrit\nline$"
    text = "raw %s, repr %r, bytes %r, quoted %s, stripped %s, url https://u:x@h" % (
        secret, secret, secret.encode(), "sekrit%0Aline%24", secret.strip())
    shown = redact(text, {secret, "abc"})
    assert "sekrit" not in shown and "u:x@" not in shown and "https://h" in shown
    # Secrets shorter than 4 characters are not masked (they would mask half of every message).
    assert redact("abc", {"abc"}) == "abc"


def test_a_kubeconfig_from_the_environment_is_checked_and_named(tmp_path, monkeypatch):
    """With no kubeconfig given, KUBECONFIG is read when the module runs (the client read it when imported)."""
    bad = tmp_path / "from-env"
    bad.write_text("users: [\n  {token: %s}\n" % SECRET)
    monkeypatch.setenv("KUBECONFIG", str(bad))
    with pytest.raises(KubeError, match=r"the kubeconfig %s is not valid YAML \(line 3, column 1\)" % bad) as exc:
        KubeApi()
    assert SECRET not in exc.value.msg
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(KubeError, match="kubeconfig %s \\(from KUBECONFIG\\) does not exist" % (tmp_path / "absent")):
        KubeApi()
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeError, match="kubeconfig %s \\(the default: none of kubeconfig, K8S_AUTH_KUBECONFIG, KUBECONFIG is set\\) "
                       "does not exist" % (tmp_path / ".kube" / "config")):
        KubeApi()


def test_yaml_nested_too_deeply_is_not_valid_yaml(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(KubeError, match="the kubeconfig %s is not valid YAML \\(nested too deeply\\)" % path):
        KubeApi(kubeconfig=str(path))


@pytest.mark.parametrize("timeout, needle", [
    (0, "request_timeout must be 1 to 3600 seconds, got 0; nothing was changed"),
    (-1, "request_timeout must be 1 to 3600 seconds, got -1; nothing was changed"),
    (3601, "request_timeout must be 1 to 3600 seconds, got 3601; nothing was changed"),
    (10 ** 400, "request_timeout must be 1 to 3600 seconds, got a number of 401 digits; nothing was changed"),
    (True, "request_timeout must be a whole number of seconds, got True"),
    (1.5, "request_timeout must be a whole number of seconds, got 1.5"),
])
def test_request_timeout_out_of_range_is_refused(tmp_path, server, timeout, needle):
    """0 used to become 30 silently, -1 to fail with urllib3's own validation text."""
    path = kubeconfig(tmp_path, server)
    with pytest.raises(GpuopsError) as exc:
        connect({"kubeconfig": path, "request_timeout": timeout})
    assert exc.value.msg.startswith(needle)
    with pytest.raises(GpuopsError):
        KubeApi(kubeconfig=path, request_timeout=timeout)
    assert Handler.seen == []


def test_request_timeout_default_and_bounds(tmp_path, server):
    path = kubeconfig(tmp_path, server)
    assert connect({"kubeconfig": path, "request_timeout": None}).timeout == 30
    assert connect({"kubeconfig": path, "request_timeout": 1}).timeout == 1
    assert connect({"kubeconfig": path, "request_timeout": 3600}).timeout == 3600


class _Module:
    def __init__(self, params):
        self.params = params
        self.no_log_values = set()


def test_open_api_registers_the_credentials_with_the_module(tmp_path, server):
    module = _Module({"kubeconfig": kubeconfig(tmp_path, server, token=SECRET + "\n"), "request_timeout": 5})
    api = open_api(module)
    assert SECRET in module.no_log_values and api.server == server
    # Also when connecting fails: what was read is registered.
    broken = tmp_path / "broken"
    broken.write_text(json.dumps({"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                                  "clusters": [{"name": "k", "cluster": {"server": server}}],
                                  "users": [{"name": "u", "password": "other-" + SECRET}]}))
    module = _Module({"kubeconfig": str(broken), "request_timeout": 5})
    with pytest.raises(KubeError) as exc:
        open_api(module)
    assert "other-" + SECRET in module.no_log_values and SECRET not in exc.value.msg
    with pytest.raises(GpuopsError, match="request_timeout must be 1 to 3600 seconds, got 0"):
        open_api(_Module({"kubeconfig": str(broken), "request_timeout": 0}))
