# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private helpers for talking to the Kubernetes API server, shared by the cluster modules.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
It wraps the ``kubernetes`` Python client in a small class (``KubeApi``) with only the calls the
modules make, so the modules' logic can be unit-tested against a fake of that class, and so every
error becomes a ``KubeError`` whose message a person can act on. Messages never carry the contents
of the kubeconfig, tokens, passwords or client keys: only the server URL (without any ``user:password@``),
the context name and the API server's own status message. Every credential read from a kubeconfig is
also masked in whatever text reaches a message (``KubeApi.redact``), and ``open_api`` registers them with
the module (``_module.hide``) so that no output of the module can show them.
"""

from __future__ import annotations

import json
import os
import re
import threading
from urllib.parse import quote, unquote

from ansible.module_utils.basic import env_fallback

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import MASK, GpuopsError, check_range, hide

try:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.client.rest import ApiException
    from kubernetes.config.config_exception import ConfigException
    import urllib3
    import yaml
    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised by the sanity import test
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = exc
    ApiException = ConfigException = yaml = None

# Options every cluster module takes; the matching documentation is the kube_auth doc fragment.
AUTH_ARGUMENT_SPEC = dict(
    kubeconfig=dict(type="path", fallback=(env_fallback, ["K8S_AUTH_KUBECONFIG"])),
    context=dict(type="str"),
    request_timeout=dict(type="int", default=30),
)
DEFAULT_REQUEST_TIMEOUT = 30
# Concurrent requests a module may have in flight (node_labels' parallel): the client's connection pool size.
MAX_PARALLEL = 32
# request_timeout: a whole number of seconds in this range (0 would mean "no timeout" to some clients, a
# negative value is refused by urllib3 with a dump of its own; an hour is more than any one request needs).
REQUEST_TIMEOUT_RANGE = (1, 3600)

# Keys of a kubeconfig (any level, lower case) whose values are credentials; see kubeconfig_secrets.
SECRET_KEYS = ("token", "password", "client-key-data", "id-token", "refresh-token", "access-token", "client-secret",
               "secret")
SECRET_NAME_RE = re.compile(r"(token|passw|secret|key|credential)", re.IGNORECASE)
# scheme://userinfo@ at the start of a URL (userinfo: up to the last @ before the path).
URL_USERINFO_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)@")
# the same anywhere in a text, for messages of the client and urllib3.
TEXT_USERINFO_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"@]*@")

LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"
KUBEVIRT_PLURAL = "kubevirts"


class KubeError(GpuopsError):
    """A Kubernetes API call failed, or an input cannot be applied; ``msg`` says what to do.

    ``status`` is the HTTP status when the API server answered (``None`` otherwise). ``secrets`` are the
    credentials read before the error (for ``hide``; the message never holds them).
    """

    def __init__(self, msg, status=None, secrets=()):
        super().__init__(msg)
        self.msg = msg
        self.status = status
        self.secrets = tuple(secrets)


# ---------------------------------------------------------------------------------------------
# Credentials: found, masked, never shown
# ---------------------------------------------------------------------------------------------

def strip_userinfo(url):
    """``url`` without a ``user:password@`` part (``https://u:p@host:6443`` gives ``https://host:6443``)."""
    if not isinstance(url, str):
        return url
    return URL_USERINFO_RE.sub(r"\1", url)


def url_secrets(url):
    """The credentials in the userinfo of ``url``: ``user:password`` and the password, as written and decoded."""
    match = URL_USERINFO_RE.match(url) if isinstance(url, str) else None
    if not match:
        return set()
    userinfo = match.group(2)
    password = userinfo.partition(":")[2]
    return set(s for s in (userinfo, unquote(userinfo), password, unquote(password)) if s)


def kubeconfig_secrets(document):
    """Every credential of a kubeconfig document (a parsed YAML value): tokens, passwords, client keys,
    auth-provider tokens and secrets, exec environment values named like secrets, the userinfo of URLs."""
    found = set()

    def walk(node, key):
        if isinstance(node, dict):
            name = node.get("name")
            if isinstance(name, str) and "value" in node and SECRET_NAME_RE.search(name):
                walk(node["value"], "secret")
            for sub_key, value in node.items():
                walk(value, str(sub_key).lower())
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value, key)
        elif isinstance(node, (str, int, float)) and not isinstance(node, bool):
            text = str(node)
            if key and (key in SECRET_KEYS or "password" in key or "secret" in key or key.endswith("-token")):
                found.add(text)
            found.update(url_secrets(text))

    walk(document, None)
    return found


def _secret_forms(secret):
    """``secret`` as it may show in a text: as is, stripped, escaped as by repr() of text and of bytes, URL-quoted."""
    forms = set()
    for text in (secret, secret.strip()):
        forms.update((text, repr(text)[1:-1], quote(text, safe="")))
        try:
            forms.add(repr(text.encode("utf-8", "surrogateescape"))[2:-1])
        except UnicodeError:
            pass
    return forms


def redact(text, secrets):
    """``text`` with every form of every secret (of 4 characters or more) masked, and no URL userinfo."""
    if not isinstance(text, str):
        text = str(text)
    forms = set()
    for secret in list(secrets):
        if isinstance(secret, str) and len(secret.strip()) >= 4:
            forms.update(f for f in _secret_forms(secret) if len(f) >= 4)
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, MASK)
    return TEXT_USERINFO_RE.sub(r"\1", text)


class _Scratch:
    """Attributes only: what the client's refresh hook writes to, instead of the shared configuration."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)


def _split_authorization(value):
    """``("Bearer", "token")`` from an Authorization header value, the credential stripped of white space."""
    scheme, _sep, credential = value.strip().partition(" ")
    if not credential:
        return None, scheme
    return scheme, credential.strip()


def check_label_key(key):
    """Raise ValueError naming ``key`` unless it is a valid label (or taint) key."""
    if not isinstance(key, str) or not key:
        raise ValueError("label key %r is not valid: it must be a non-empty string" % (key,))
    prefix, _sep, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN_RE.match(prefix)):
        raise ValueError("label key %r is not valid: the prefix %r is not a DNS subdomain" % (key, prefix))
    if not LABEL_NAME_RE.match(name):
        raise ValueError("label key %r is not valid: the name part must be 1-63 characters of [A-Za-z0-9-_.], "
                         "starting and ending with a letter or digit" % (key,))


def label_value(key, value):
    """Return ``value`` as a label value string (``None`` stays ``None``); raise ValueError when invalid."""
    if value is None:
        return None
    if isinstance(value, bool):
        value = "true" if value else "false"
    elif isinstance(value, int):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError("label %s: value %r is not a string" % (key, value))
    if len(value) > 63 or not LABEL_VALUE_RE.match(value):
        raise ValueError("label %s: value %r is not valid: at most 63 characters of [A-Za-z0-9-_.], starting "
                         "and ending with a letter or digit" % (key, value))
    return value


def parse_version(text):
    """Return ``(major, minor, patch)`` from ``v1.8.2`` / ``1.8.2-rc.1`` / ``v1.9``; None when unparsable."""
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", (text or "").strip())
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def _status_message(exc):
    """The API server's own message from an ApiException body, else its reason."""
    try:
        body = json.loads(exc.body or "{}")
        message = body.get("message")
    except (TypeError, ValueError, AttributeError, RecursionError):
        message = None
    return message or exc.reason or "no message"


def default_kubeconfig():
    """The kubeconfig the client reads when none is given: KUBECONFIG (read now, not when the client was
    imported), else ``~/.kube/config``."""
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def check_kubeconfig(kubeconfig, secrets=None):
    """Check the file(s) of ``kubeconfig`` (one path, or several joined like KUBECONFIG) before the client reads them.

    The client says only "No configuration found" for a path that does not exist, and lets a YAML error or a
    TypeError escape for a file that is not a kubeconfig. Raise KubeError naming the file instead; the message
    never quotes the file (it holds tokens and keys), only where YAML found a problem. Nothing to check when
    ``kubeconfig`` is empty. The credentials of every file read are added to the set ``secrets`` (when given),
    also when a later file fails.
    """
    if not kubeconfig:
        return
    paths = [os.path.expanduser(path) for path in kubeconfig.split(os.pathsep) if path]
    found = [path for path in paths if os.path.exists(path)]
    if not found:
        raise KubeError("kubeconfig %s does not exist; give the path of a kubeconfig on the controller" % kubeconfig)
    for path in found:
        try:
            with open(path, "rb") as handle:
                document = yaml.safe_load(handle)
        except yaml.YAMLError as exc:
            raise KubeError("the kubeconfig %s is not valid YAML%s; give the path of a kubeconfig file"
                            % (path, _yaml_position(exc)))
        except RecursionError:
            raise KubeError("the kubeconfig %s is not valid YAML (nested too deeply); give the path of a kubeconfig "
                            "file" % path)
        except OSError as exc:
            raise KubeError("cannot read the kubeconfig %s: %s" % (path, exc.strerror or exc))
        if secrets is not None:
            secrets.update(kubeconfig_secrets(document))
        if document is not None and not isinstance(document, dict):
            raise KubeError("the kubeconfig %s is not a kubeconfig: its top level is a YAML %s, not a mapping of "
                            "clusters, users and contexts" % (path, {list: "list", str: "string"}.get(
                                type(document), "scalar")))


def _yaml_position(exc):
    """" (line L, column C)" of a YAML error: never its problem text, which may quote the file."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return ""
    return " (line %d, column %d)" % (mark.line + 1, mark.column + 1)


def check_request_timeout(value):
    """``value`` when it is a whole number of seconds in REQUEST_TIMEOUT_RANGE; GpuopsError naming it otherwise."""
    return check_range("request_timeout", value, REQUEST_TIMEOUT_RANGE[0], REQUEST_TIMEOUT_RANGE[1], "seconds")


class KubeApi:
    """The few API calls the modules make, each turning failures into KubeError.

    ``requests`` counts the HTTP requests made, so modules can report what they cost. ``server`` is the API
    server URL without its userinfo; ``secrets`` the credentials read from the kubeconfig (and those the
    client obtains later, from an exec plugin or a token file), which every message of this class masks.
    """

    def __init__(self, kubeconfig=None, context=None, request_timeout=DEFAULT_REQUEST_TIMEOUT, api_client=None):
        if not HAS_KUBERNETES:
            raise KubeError("the kubernetes Python client is not installed (pip install kubernetes): %s"
                            % KUBERNETES_IMPORT_ERROR)
        self.timeout = check_request_timeout(request_timeout)
        self.requests = 0
        self.context = context
        self.secrets = set()
        if api_client is None:
            try:
                api_client = self._load(kubeconfig, context)
            except KubeError as exc:
                raise self._error(exc.msg, exc.status)
        self.api_client = api_client
        self.server = strip_userinfo(api_client.configuration.host)
        self.core = k8s_client.CoreV1Api(api_client)
        self.custom = k8s_client.CustomObjectsApi(api_client)
        self.authz = k8s_client.AuthorizationV1Api(api_client)

    def _load(self, kubeconfig, context):
        """An ApiClient from the kubeconfig; every credential read is in ``self.secrets`` (also on failure)."""
        configuration = k8s_client.Configuration()
        config_file = kubeconfig or default_kubeconfig()
        name = kubeconfig or "%s (%s)" % (config_file, "from KUBECONFIG" if os.environ.get("KUBECONFIG") else
                                          "the default: none of kubeconfig, K8S_AUTH_KUBECONFIG, KUBECONFIG is set")
        if kubeconfig:
            check_kubeconfig(kubeconfig, self.secrets)
        else:
            try:
                check_kubeconfig(config_file, self.secrets)
            except KubeError as exc:
                raise KubeError(exc.msg.replace("kubeconfig %s does not exist" % config_file,
                                                "kubeconfig %s does not exist" % name, 1))
        try:
            k8s_config.load_kube_config(config_file=config_file, context=context,
                                        client_configuration=configuration, persist_config=False)
        except ConfigException as exc:
            raise KubeError("cannot use the kubeconfig %s%s: %s" % (
                name, " (context %s)" % context if context else "", exc))
        except yaml.YAMLError as exc:
            raise KubeError("the kubeconfig %s is not valid YAML%s" % (name, _yaml_position(exc)))
        except OSError as exc:
            raise KubeError("cannot read the kubeconfig %s: %s" % (name, exc))
        except (AttributeError, KeyError, IndexError, TypeError, ValueError, RecursionError) as exc:
            # The file is YAML but not shaped like a kubeconfig (a user that is a string, a list of
            # clusters that is a number...). Only the exception's type: its text may quote the file.
            raise KubeError("the kubeconfig %s is not a valid kubeconfig (%s while reading it); check its "
                            "clusters, users and contexts" % (name, type(exc).__name__))
        self._take_credentials(configuration)
        self._clean_after_refresh(configuration)
        # One retry for a dropped connection; an unreachable server fails in seconds, not minutes.
        configuration.retries = 1
        # Room for the concurrent patches of node_labels (its parallel option is at most this).
        configuration.connection_pool_maxsize = MAX_PARALLEL
        return k8s_client.ApiClient(configuration)

    def _clean_key(self, value):
        """An Authorization value with the white space around its credential (a token file's newline) stripped:
        in a header it makes every request fail with the token in the error. The credential is recorded."""
        if not isinstance(value, str):
            return value
        scheme, credential = _split_authorization(value)
        self.secrets.update((value, credential))
        return "%s %s" % (scheme, credential) if scheme else credential

    def _take_credentials(self, configuration):
        """Record the configuration's credentials and clean its Authorization values."""
        for key, value in list(configuration.api_key.items()):
            configuration.api_key[key] = self._clean_key(value)
        password = getattr(configuration, "password", None)
        if isinstance(password, str) and password:
            self.secrets.add(password)
        for attribute in ("host", "proxy"):
            self.secrets.update(url_secrets(getattr(configuration, attribute, None)))

    def _clean_after_refresh(self, configuration):
        """The client's hook sets the token again before every request (from an exec plugin or a token file
        when it expires) and installs a new hook of its own. Run it on a scratch copy of the credentials, so
        that the shared configuration only ever holds cleaned values (node_labels sends from several threads)."""
        hook = [configuration.refresh_api_key_hook]
        if hook[0] is None:
            return
        lock = threading.Lock()

        def refresh_and_clean(conf):
            with lock:
                scratch = _Scratch(api_key=dict(conf.api_key), refresh_api_key_hook=None)
                hook[0](scratch)
                hook[0] = scratch.refresh_api_key_hook or hook[0]
                for key, value in scratch.api_key.items():
                    cleaned = self._clean_key(value)
                    if conf.api_key.get(key) != cleaned:
                        conf.api_key[key] = cleaned
                for name, value in vars(scratch).items():
                    if name not in ("api_key", "refresh_api_key_hook") and getattr(conf, name, None) != value:
                        setattr(conf, name, value)
                        self.secrets.update(url_secrets(value))

        configuration.refresh_api_key_hook = refresh_and_clean

    def redact(self, text):
        """``text`` with every credential this client knows masked and no URL userinfo."""
        return redact(text, self.secrets)

    def _error(self, msg, status=None):
        return KubeError(self.redact(msg), status=status, secrets=self.secrets)

    # -- error handling ---------------------------------------------------------------------------

    def _call(self, what, func, *args, **kwargs):
        self.requests += 1
        kwargs["_request_timeout"] = self.timeout
        # Raw responses: plain dicts, without building (and re-serialising) thousands of model objects.
        kwargs["_preload_content"] = False
        try:
            # Without preloading, the body is read here: a connection lost meanwhile fails like one refused.
            data = func(*args, **kwargs).data
        except ApiException as exc:
            if exc.status == 401:
                raise self._error("the API server at %s refused the credentials of the kubeconfig%s (401 Unauthorized) "
                                  "while trying to %s; renew the token or certificate" % (
                                      self.server, " context %s" % self.context if self.context else "", what),
                                  status=401)
            if exc.status == 403:
                raise self._error("forbidden to %s: %s; grant the kubeconfig's user that permission" % (
                    what, _status_message(exc)), status=403)
            if exc.status == 0 or exc.status is None:
                raise self._error("cannot reach the API server at %s to %s: %s" % (self.server, what, exc.reason))
            raise self._error("cannot %s: %s %s" % (what, exc.status, _status_message(exc)), status=exc.status)
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            raise self._error("cannot reach the API server at %s to %s: %s" % (self.server, what, reason))
        except ValueError as exc:
            # Raised before anything is sent: http.client refuses a header (a credential holding a line break
            # or another control character), urllib3 a URL it cannot parse. The text may quote the credential.
            if "header" in str(exc).lower():
                raise self._error("cannot %s: a credential of the kubeconfig cannot be sent to the API server at %s "
                                  "(it holds a line break or another control character); check the token or "
                                  "password of the kubeconfig's user" % (what, self.server))
            raise self._error("cannot %s: the request to the API server at %s cannot be sent: %s" % (
                what, self.server, exc))
        except OSError as exc:
            raise self._error("cannot reach the API server at %s to %s: %s" % (self.server, what, exc))
        except ConfigException as exc:
            # The client refreshes an expired token (exec plugin, token file) before a request.
            raise self._error("cannot %s: the kubeconfig's credentials cannot be refreshed: %s" % (what, exc))
        try:
            return json.loads(data or b"{}")
        except (ValueError, RecursionError) as exc:
            raise self._error("cannot %s: the API server at %s sent a reply that is not JSON: %s" % (what, self.server, exc))

    # -- access -----------------------------------------------------------------------------------

    def version(self):
        """Return the server's ``gitVersion`` (also proves it is reachable and the credentials work)."""
        info = self._call("read the server version", k8s_client.VersionApi(self.api_client).get_code)
        return info.get("gitVersion")

    def can_i(self, verb, resource, group="", namespace=None, name=None):
        """Whether the kubeconfig's user may ``verb`` the ``resource`` (SelfSubjectAccessReview)."""
        attrs = {"verb": verb, "resource": resource, "group": group}
        if namespace:
            attrs["namespace"] = namespace
        if name:
            attrs["name"] = name
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}}
        review = self._call("check permission to %s %s" % (verb, resource),
                            self.authz.create_self_subject_access_review, body)
        return bool(review.get("status", {}).get("allowed"))

    def require(self, checks):
        """Fail naming every ``(verb, resource, group, namespace)`` the user may not do."""
        denied = ["%s %s%s%s" % (verb, resource, "." + group if group else "", " in namespace %s" % ns if ns else "")
                  for verb, resource, group, ns in checks if not self.can_i(verb, resource, group, ns)]
        if denied:
            raise self._error("the kubeconfig's user may not %s; nothing was changed" % ", ".join(denied), status=403)

    # -- nodes ------------------------------------------------------------------------------------

    def list_nodes(self, page_size=500):
        """Return every Node as a plain dict (``metadata`` and ``spec`` only), following pages."""
        nodes = []
        token = None
        while True:
            kwargs = {"limit": page_size}
            if token:
                kwargs["_continue"] = token
            result = self._call("list the nodes", self.core.list_node, **kwargs)
            nodes.extend(result.get("items") or [])
            token = (result.get("metadata") or {}).get("continue")
            if not token:
                return nodes

    def read_node(self, name):
        return self._call("read node %s" % name, self.core.read_node, name)

    def patch_node(self, name, patch):
        """JSON merge patch of one node; returns the node as a dict."""
        return self._call("patch node %s" % name, self.core.patch_node, name, patch,
                          _content_type="application/merge-patch+json")

    # -- KubeVirt ---------------------------------------------------------------------------------

    def list_kubevirts(self, namespace):
        """Every KubeVirt CR in ``namespace`` (all namespaces when empty); KubeError when KubeVirt is absent."""
        try:
            if namespace:
                result = self._call("list the KubeVirt CRs in namespace %s" % namespace,
                                    self.custom.list_namespaced_custom_object,
                                    KUBEVIRT_GROUP, KUBEVIRT_VERSION, namespace, KUBEVIRT_PLURAL)
            else:
                result = self._call("list the KubeVirt CRs", self.custom.list_cluster_custom_object,
                                    KUBEVIRT_GROUP, KUBEVIRT_VERSION, KUBEVIRT_PLURAL)
        except KubeError as exc:
            if exc.status == 404:
                raise self._error("KubeVirt is not installed: the API server has no %s/%s resource %s (install "
                                  "KubeVirt and its KubeVirt CR first); nothing was changed"
                                  % (KUBEVIRT_GROUP, KUBEVIRT_VERSION, KUBEVIRT_PLURAL), status=404)
            raise
        return result.get("items", [])

    def patch_kubevirt(self, namespace, name, patch):
        return self._call("patch the KubeVirt CR %s/%s" % (namespace, name), self.custom.patch_namespaced_custom_object,
                          KUBEVIRT_GROUP, KUBEVIRT_VERSION, namespace, KUBEVIRT_PLURAL, name, patch,
                          _content_type="application/merge-patch+json")


def connect(module_params):
    """A KubeApi from the module's auth options (kubeconfig, context, request_timeout)."""
    timeout = module_params.get("request_timeout")
    return KubeApi(kubeconfig=module_params.get("kubeconfig"), context=module_params.get("context"),
                   request_timeout=DEFAULT_REQUEST_TIMEOUT if timeout is None else timeout)


def open_api(module, api_factory=connect):
    """Check the auth options, connect with ``api_factory(module.params)`` and register every credential the
    client read with ``hide`` (also when connecting fails), so no output of the module can show one."""
    check_request_timeout(module.params.get("request_timeout"))
    try:
        api = api_factory(module.params)
    except KubeError as exc:
        hide(module, *exc.secrets)
        raise
    hide(module, *getattr(api, "secrets", ()))
    return api
