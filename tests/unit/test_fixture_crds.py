"""The project's fixture CRDs (tests/fixtures/crds/) against what the collection writes and upstream.

The fixtures are the project's own files. Every field path they type must exist, with the same type,
in the CRD schema the upstream project publishes (a copy of which lives in ../shared/upstream/ beside
the checkout for developers and CI); only that comparison is skipped when the folder is missing.
"""

import os

import pytest
import yaml

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CRDS = os.path.join(TOP, "tests", "fixtures", "crds")
UPSTREAM = os.path.join(os.path.dirname(TOP), "shared", "upstream")

FIXTURES = {
    "kubevirts.kubevirt.io": ("kubevirts.kubevirt.io.yaml", "kubevirt/kubevirts.kubevirt.io.crd.yaml"),
    "clusterpolicies.nvidia.com": ("clusterpolicies.nvidia.com.yaml", "gpu-operator/nvidia.com_clusterpolicies.yaml"),
}
# Field paths the collection writes (or reads) and that the fixtures must type; [] is a list item.
MUST_TYPE = {
    "kubevirts.kubevirt.io": {
        "spec.configuration.permittedHostDevices.pciHostDevices[].pciVendorSelector": "string",
        "spec.configuration.permittedHostDevices.pciHostDevices[].resourceName": "string",
        "spec.configuration.permittedHostDevices.pciHostDevices[].externalResourceProvider": "boolean",
        "spec.configuration.permittedHostDevices.mediatedDevices[].mdevNameSelector": "string",
        "spec.configuration.permittedHostDevices.mediatedDevices[].resourceName": "string",
        "spec.configuration.permittedHostDevices.mediatedDevices[].externalResourceProvider": "boolean",
        "spec.configuration.developerConfiguration.featureGates[]": "string",
        "spec.configuration.mediatedDevicesConfiguration": "object",
        "status.observedKubeVirtVersion": "string",
    },
    "clusterpolicies.nvidia.com": {
        "spec.sandboxWorkloads.enabled": "boolean",
        "spec.sandboxWorkloads.defaultWorkload": "string",
        "spec.vgpuManager.enabled": "boolean",
        "spec.vgpuDeviceManager.enabled": "boolean",
        "spec.vfioManager.enabled": "boolean",
        "spec.sandboxDevicePlugin.enabled": "boolean",
    },
}


def load(path):
    with open(path) as handle:
        docs = [d for d in yaml.safe_load_all(handle) if d]
    crds = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
    assert len(crds) == 1, "%s: expected one CRD, found %d" % (path, len(crds))
    return crds[0]


def storage_schema(crd):
    versions = [v for v in crd["spec"]["versions"] if v.get("storage")]
    assert versions, "%s has no storage version" % crd["metadata"]["name"]
    return versions[0]["schema"]["openAPIV3Schema"]


def typed_paths(schema, prefix=""):
    """{path: node} for every node below `schema` that declares a type; lists add `[]` to the path."""
    found = {}
    for name, node in (schema.get("properties") or {}).items():
        path = prefix + ("." if prefix else "") + name
        if "type" in node:
            found[path] = node
        found.update(typed_paths(node, path))
        if node.get("items"):
            item = node["items"]
            if "type" in item:
                found[path + "[]"] = item
            found.update(typed_paths(item, path + "[]"))
    return found


def resolve(schema, path):
    """The node at `path` in `schema`, or None when the schema does not have it."""
    node = schema
    for part in path.split("."):
        is_item = part.endswith("[]")
        name = part[:-2] if is_item else part
        node = (node.get("properties") or {}).get(name)
        if node is None:
            return None
        while is_item:
            node = node.get("items")
            if node is None:
                return None
            is_item = False
    return node


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_types_what_the_collection_writes(name):
    crd = load(os.path.join(CRDS, FIXTURES[name][0]))
    assert crd["metadata"]["name"] == name
    paths = typed_paths(storage_schema(crd))
    for path, kind in MUST_TYPE[name].items():
        assert path in paths, "%s does not type %s" % (name, path)
        assert paths[path]["type"] == kind, "%s types %s as %s" % (name, path, paths[path]["type"])


def test_fixture_scopes_and_versions():
    kubevirt = load(os.path.join(CRDS, FIXTURES["kubevirts.kubevirt.io"][0]))
    policy = load(os.path.join(CRDS, FIXTURES["clusterpolicies.nvidia.com"][0]))
    assert kubevirt["spec"]["scope"] == "Namespaced"
    assert policy["spec"]["scope"] == "Cluster"
    for crd in (kubevirt, policy):
        served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
        assert served == ["v1"]
        assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
        schema = storage_schema(crd)
        assert schema["properties"]["spec"].get("x-kubernetes-preserve-unknown-fields") is True


def test_typed_paths_walks_lists_and_objects():
    schema = {"properties": {"a": {"type": "object", "properties": {
        "b": {"type": "array", "items": {"type": "object", "properties": {"c": {"type": "string"}}}}}}}}
    assert sorted(typed_paths(schema)) == ["a", "a.b", "a.b[]", "a.b[].c"]
    assert resolve(schema, "a.b[].c") == {"type": "string"}
    assert resolve(schema, "a.b[].d") is None
    assert resolve(schema, "a.x") is None


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_fixture_path_exists_upstream(name):
    fixture_file, upstream_file = FIXTURES[name]
    upstream_path = os.path.join(UPSTREAM, upstream_file)
    if not os.path.isdir(UPSTREAM):
        pytest.skip("no ../shared/upstream beside the checkout: the upstream schema comparison is skipped")
    ours = load(os.path.join(CRDS, fixture_file))
    theirs = load(upstream_path)
    assert ours["spec"]["group"] == theirs["spec"]["group"]
    assert ours["spec"]["scope"] == theirs["spec"]["scope"]
    assert ours["spec"]["names"]["kind"] == theirs["spec"]["names"]["kind"]
    assert ours["spec"]["names"]["plural"] == theirs["spec"]["names"]["plural"]
    upstream_schema = storage_schema(theirs)
    problems = []
    for path, node in sorted(typed_paths(storage_schema(ours)).items()):
        if path in ("apiVersion", "kind", "metadata"):
            continue
        other = resolve(upstream_schema, path)
        if other is None:
            problems.append("%s: not in the upstream schema" % path)
        elif other.get("type") != node["type"]:
            problems.append("%s: %s here, %s upstream" % (path, node["type"], other.get("type")))
        elif node.get("enum") and not set(node["enum"]) <= set(other.get("enum") or node["enum"]):
            problems.append("%s: enum %s not within upstream %s" % (path, node["enum"], other.get("enum")))
    assert not problems, "%s differs from upstream:\n%s" % (name, "\n".join(problems))
