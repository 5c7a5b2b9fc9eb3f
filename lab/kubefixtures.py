# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""kubefixtures: what `kubelab fixtures` and `kubelab nodes` put on the server: the project's CRDs and
objects (tests/fixtures) and the Nodes standing for the lab hosts (tests/fixtures/nodes.py).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import time

from kubecommon import TOP, KubeLabError

FIXTURES = os.path.join(TOP, "tests", "fixtures")


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
