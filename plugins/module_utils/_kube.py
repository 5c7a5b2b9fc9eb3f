# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Private helpers for talking to the Kubernetes API server, shared by the cluster modules.

This file is private to the gpuops.sandbox collection: its interface may change at any time.
It wraps the ``kubernetes`` Python client in a small class (``KubeApi``) with only the calls the
modules make, so the modules' logic can be unit-tested against a fake of that class, and so every
error becomes a ``KubeError`` whose message a person can act on. Messages never carry the contents
of the kubeconfig, tokens or client keys: only the server URL, the context name and the API
server's own status message.
"""

from __future__ import annotations

import json
import os
import re

from ansible.module_utils.basic import env_fallback

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import GpuopsError

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

LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"
KUBEVIRT_PLURAL = "kubevirts"


class KubeError(GpuopsError):
    """A Kubernetes API call failed, or an input cannot be applied; ``msg`` says what to do.

    ``status`` is the HTTP status when the API server answered (``None`` otherwise).
    """

    def __init__(self, msg, status=None):
        super().__init__(msg)
        self.msg = msg
        self.status = status


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
    except (TypeError, ValueError, AttributeError):
        message = None
    return message or exc.reason or "no message"


def check_kubeconfig(kubeconfig):
    """Check the file(s) of ``kubeconfig`` (one path, or several joined like KUBECONFIG) before the client reads them.

    The client says only "No configuration found" for a path that does not exist, and lets a YAML error or a
    TypeError escape for a file that is not a kubeconfig. Raise KubeError naming the file instead; the message
    never quotes the file (it holds tokens and keys), only where YAML found a problem. Nothing to check when
    ``kubeconfig`` is empty (the client's default, ~/.kube/config or KUBECONFIG).
    """
    if not kubeconfig:
        return
    paths = [path for path in kubeconfig.split(os.pathsep) if path]
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
        except OSError as exc:
            raise KubeError("cannot read the kubeconfig %s: %s" % (path, exc.strerror or exc))
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


class KubeApi:
    """The few API calls the modules make, each turning failures into KubeError.

    ``requests`` counts the HTTP requests made, so modules can report what they cost.
    """

    def __init__(self, kubeconfig=None, context=None, request_timeout=30, api_client=None):
        if not HAS_KUBERNETES:
            raise KubeError("the kubernetes Python client is not installed (pip install kubernetes): %s"
                            % KUBERNETES_IMPORT_ERROR)
        self.timeout = request_timeout
        self.requests = 0
        self.context = context
        if api_client is None:
            configuration = k8s_client.Configuration()
            name = kubeconfig or "(default)"
            check_kubeconfig(kubeconfig)
            try:
                k8s_config.load_kube_config(config_file=kubeconfig, context=context,
                                            client_configuration=configuration, persist_config=False)
            except ConfigException as exc:
                raise KubeError("cannot use the kubeconfig %s%s: %s" % (
                    name, " (context %s)" % context if context else "", exc))
            except yaml.YAMLError as exc:
                raise KubeError("the kubeconfig %s is not valid YAML%s" % (name, _yaml_position(exc)))
            except OSError as exc:
                raise KubeError("cannot read the kubeconfig %s: %s" % (name, exc))
            except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
                # The file is YAML but not shaped like a kubeconfig (a user that is a string, a list of
                # clusters that is a number...). Only the exception's type: its text may quote the file.
                raise KubeError("the kubeconfig %s is not a valid kubeconfig (%s while reading it); check its "
                                "clusters, users and contexts" % (name, type(exc).__name__))
            # One retry for a dropped connection; an unreachable server fails in seconds, not minutes.
            configuration.retries = 1
            # Room for the concurrent patches of node_labels.
            configuration.connection_pool_maxsize = 32
            api_client = k8s_client.ApiClient(configuration)
        self.api_client = api_client
        self.server = api_client.configuration.host
        self.core = k8s_client.CoreV1Api(api_client)
        self.custom = k8s_client.CustomObjectsApi(api_client)
        self.authz = k8s_client.AuthorizationV1Api(api_client)

    # -- error handling ---------------------------------------------------------------------------

    def _call(self, what, func, *args, **kwargs):
        self.requests += 1
        kwargs["_request_timeout"] = self.timeout
        # Raw responses: plain dicts, without building (and re-serialising) thousands of model objects.
        kwargs["_preload_content"] = False
        try:
            response = func(*args, **kwargs)
            return json.loads(response.data or b"{}")
        except ApiException as exc:
            if exc.status == 401:
                raise KubeError("the API server at %s refused the credentials of the kubeconfig%s (401 Unauthorized) "
                                "while trying to %s; renew the token or certificate" % (
                                    self.server, " context %s" % self.context if self.context else "", what),
                                status=401)
            if exc.status == 403:
                raise KubeError("forbidden to %s: %s; grant the kubeconfig's user that permission" % (
                    what, _status_message(exc)), status=403)
            if exc.status == 0 or exc.status is None:
                raise KubeError("cannot reach the API server at %s to %s: %s" % (self.server, what, exc.reason))
            raise KubeError("cannot %s: %s %s" % (what, exc.status, _status_message(exc)), status=exc.status)
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            raise KubeError("cannot reach the API server at %s to %s: %s" % (self.server, what, reason))
        except ValueError as exc:
            raise KubeError("cannot %s: the API server at %s sent a reply that is not JSON: %s" % (what, self.server, exc))
        except OSError as exc:
            raise KubeError("cannot reach the API server at %s to %s: %s" % (self.server, what, exc))

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
            raise KubeError("the kubeconfig's user may not %s; nothing was changed" % ", ".join(denied), status=403)

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
                raise KubeError("KubeVirt is not installed: the API server has no %s/%s resource %s (install "
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
    return KubeApi(kubeconfig=module_params.get("kubeconfig"), context=module_params.get("context"),
                   request_timeout=module_params.get("request_timeout") or 30)
