"""What the chart modules (test_75, test_76, test_77) take from the session's API server for their time, and how
they put it back: the ClusterPolicy named cluster-policy and the ClusterPolicy CRD (cluster-wide, shared with
test_70/72), the CRDs the charts add and the node labels."""

import json

from conftest import delete_crds, flat, kfind, kget, kubectl, restore_cluster_policy

POLICY_CRD = "clusterpolicies.nvidia.com"


def said(proc):
    """The play's output as one line, YAML's doubled quotes undone (messages wrap and quote differently)."""
    return flat(proc.stdout).replace("''", "'")


def crd_names(api):
    return set(kubectl(api, "get", "crds", "-o", "name").stdout.split())


def take_cluster_policy(api):
    """Deletes the ClusterPolicy test_70 leaves (the charts' own would refuse to take it over). Returns it (None when
    there was none) and the names of the CRDs there are now."""
    policy = kfind(api, "clusterpolicy", "cluster-policy")
    if policy:
        kubectl(api, "delete", "clusterpolicy", "cluster-policy", "--wait=true")
    return policy, crd_names(api)


def put_back_crd(api, crd):
    """Replaces a CRD with one read earlier (its spec, name, labels and annotations)."""
    kept = {k: crd[k] for k in ("apiVersion", "kind", "spec")}
    kept["metadata"] = {k: v for k, v in crd["metadata"].items() if k in ("name", "labels", "annotations")}
    kubectl(api, "replace", "-f", "-", stdin=json.dumps(kept), check=False)


class TakenCluster:
    """The cluster-wide state a module changes, read before it: take() gives the cluster the old chart's
    ClusterPolicy CRD (as on a cluster that ran that release), put_back() restores what was found."""

    def __init__(self, api, labelled):
        self.api = api
        self.labelled = labelled
        self.policy = self.crds = self.found_crd = self.nodes = None

    def take(self, policy_crd_file):
        api = self.api
        self.policy, self.crds = take_cluster_policy(api)
        self.found_crd = kfind(api, "crd", POLICY_CRD)
        kubectl(api, "replace" if self.found_crd else "create", "-f", policy_crd_file)
        self.nodes = {n: kget(api, "node", n) for n in self.labelled}
        return self

    def node_labels(self):
        return {n: kget(self.api, "node", n)["metadata"].get("labels") for n in self.labelled}

    def put_back(self):
        """The ClusterPolicy and its CRD as found, the node labels as they were, the CRDs the charts added deleted."""
        api = self.api
        kubectl(api, "delete", "clusterpolicy", "cluster-policy", "--ignore-not-found", check=False)
        if self.found_crd:
            put_back_crd(api, self.found_crd)
        if self.policy:
            restore_cluster_policy(api, self.policy)
        for name, node in self.nodes.items():
            labels = dict((k, None) for k in kget(api, "node", name)["metadata"].get("labels") or {})
            labels.update(node["metadata"].get("labels") or {})
            kubectl(api, "patch", "node", name, "--type=merge", "-p", json.dumps({"metadata": {"labels": labels}}),
                    check=False)
        delete_crds(api, sorted(crd_names(api) - self.crds))
