#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""kubelab: a real Kubernetes API server (etcd + kube-apiserver) on loopback for the cluster half.

There is no kubelet, scheduler or controller manager: the API server stores and validates objects,
serves discovery, custom resources, RBAC and the status subresources, which is what the collection's
cluster roles talk to. Nodes standing for the lab hosts are API objects written by `fixtures`.

* kube-apiserver and kubectl are built from the Go module k8s.io/kubernetes at a pinned release, with
  the k8s.io/* staging modules pinned to the matching v0.x.y through `replace` lines of a go.mod this
  tool writes; helm from helm.sh/helm/v3. The binaries are cached with a manifest of sha256 sums.
* etcd comes from the host's packages (`make hostdeps` installs etcd-server).
* Certificates are generated per run with the openssl CLI: a CA, the serving certificate, an admin
  client (group system:masters), a client with no RBAC rights and a service-account signing key.

Commands: build, start, stop, status, fixtures, nodes, env. Run with --help for details. Each state directory
(GPUOPS_KUBE_STATE, default .lab/kube; the integration tests use .lab/kube-tests) holds one server on ports
of its own, so several run at once.

The parts live beside this script, which holds the commands: kubecommon.py (error and log), kubebuild.py (the
Go builds), kubeserver.py (etcd, kube-apiserver, certificates and the API client) and kubefixtures.py (the
fixtures and Nodes it applies).
"""

from __future__ import annotations

import json
import os
import sys
import time

# labcommon.py and kubelab's own modules lie beside this script: importable whether the script runs or is loaded
# from its path.
LAB_DIR = os.path.dirname(os.path.abspath(__file__))
if LAB_DIR not in sys.path:
    sys.path.insert(0, LAB_DIR)
from labcommon import add_command, free_ports, port_free  # noqa: E402
# The modules themselves too, for whoever replaces one of their functions or settings (the unit tests).
import kubecommon  # noqa: E402
import kubebuild  # noqa: E402
import kubeserver  # noqa: E402
import kubefixtures  # noqa: E402
from kubecommon import LAB, TOP, KubeLabError, log, locked  # noqa: E402
from kubebuild import (BINARIES, CACHE, GO, HELM_VERSION, KUBE_VERSION, bin_dir, binary, binary_problem,  # noqa: E402
                       ensure_binaries, go_directive, helm_ldflags, k8s_ldflags, read_manifest, render_gomod,
                       staging_modules, staging_version, version_ok)
from kubeserver import (ETCD, ETCD_MIN, SERVICE_CIDR, SERVICE_IP, STATE, STATE_FILES, KubeClient,  # noqa: E402
                        apiserver_args, describe, ensure_server, etcd_args, etcd_version, kubeconfig,
                        parse_etcd_version, process_alive, process_marker, read_meta, server_sans, server_state,
                        stop_server, subject, wipe_state)
from kubefixtures import (FIXTURES, apply_fixtures, create_nodes, delete_nodes, load_documents,  # noqa: E402
                          load_nodes_module, object_path)

# What this module offers besides its commands: the names the unit tests and other callers read from it
# (free_ports and port_free among them: its unit tests check free_ports with port_free).
__all__ = [
    "kubecommon", "kubebuild", "kubeserver", "kubefixtures",
    "free_ports", "port_free", "TOP", "KubeLabError",
    "BINARIES", "CACHE", "GO", "HELM_VERSION", "KUBE_VERSION", "bin_dir", "binary", "binary_problem",
    "ensure_binaries", "go_directive", "helm_ldflags", "k8s_ldflags", "read_manifest", "render_gomod",
    "staging_modules", "staging_version", "version_ok",
    "ETCD", "ETCD_MIN", "SERVICE_CIDR", "SERVICE_IP", "STATE", "STATE_FILES", "KubeClient", "apiserver_args",
    "describe", "ensure_server", "etcd_args", "etcd_version", "kubeconfig", "parse_etcd_version",
    "process_alive", "process_marker", "read_meta", "server_sans", "server_state", "stop_server", "subject",
    "wipe_state",
    "FIXTURES", "apply_fixtures", "create_nodes", "delete_nodes", "load_documents", "load_nodes_module",
    "object_path",
    "main",
]


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def running_meta():
    meta = read_meta()
    if server_state(meta) != "running":
        raise KubeLabError("the API server is not running: start it with `kubelab start` (make kube)")
    return meta


def cmd_build(args):
    started = time.time()
    manifest = ensure_binaries(rebuild=args.rebuild)
    versions = ", ".join("%s %s" % (n, manifest["binaries"][n]["version"]) for n in BINARIES)
    log("binaries ready in %s (%.1fs): %s" % (bin_dir(), time.time() - started, versions))


def cmd_start(args):
    started = time.time()
    meta, fresh = ensure_server(fresh=args.fresh)
    if fresh:
        log("API server %s ready at %s in %.1fs (etcd %s)" % (
            meta["versions"]["kubernetes"], meta["server"], time.time() - started, meta["versions"]["etcd"]))
    else:
        log("API server already running at %s; reused" % meta["server"])
    log("admin kubeconfig: %s" % os.path.join(STATE, "kubeconfig"))


def cmd_stop(_args):
    with locked(os.path.join(STATE, "server.lock")):
        meta = read_meta()
        if not meta:
            log("no API server recorded in %s; nothing to stop" % STATE)
            return
        stop_server(meta)
    log("API server stopped")


def cmd_status(args):
    meta = read_meta()
    state = server_state(meta)
    info = describe(meta, state)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return
    print("state: %s" % state)
    if state != "stopped":
        print("server: %s" % (meta.get("server") or "-"))
        for name in ("etcd", "kube-apiserver"):
            print("%s: pid %s, port %s" % (name, info["pids"].get(name, "-"), info["ports"].get(name, "-")))
        print("kubeconfig: %s" % info["kubeconfig"])
        print("kubeconfig (no RBAC rights): %s" % info["kubeconfig_unauthorised"])
    print("versions: %s" % ", ".join("%s %s" % kv for kv in sorted(info["versions"].items())))
    print("binaries: %s" % info["bin_dir"])


def cmd_fixtures(args):
    started = time.time()
    meta = running_meta()
    result = apply_fixtures(KubeClient.admin(meta["server"]))
    if args.json:
        print(json.dumps(result, indent=2))
    log("applied %d CRDs, %d objects, %d nodes and %d ResourceSlices in %.1fs" % (
        len(result["crds"]), len(result["objects"]), len(result["nodes"]), len(result["resource_slices"]),
        time.time() - started))


def cmd_nodes(args):
    meta = running_meta()
    client = KubeClient.admin(meta["server"])
    names = ["%s%04d" % (args.prefix, i) for i in range(args.count)]
    started = time.time()
    if args.delete:
        delete_nodes(client, names, workers=args.workers)
        verb = "deleted"
    else:
        nodes_mod = load_nodes_module()
        nodes = [nodes_mod.gpu_node(n, args.workload, gpus=args.gpus) for n in names]
        create_nodes(client, nodes, workers=args.workers)
        verb = "applied"
    elapsed = time.time() - started
    print(json.dumps({"nodes": len(names), "action": verb, "seconds": round(elapsed, 2)}))
    log("%s %d nodes in %.1fs" % (verb, len(names), elapsed))


def cmd_env(_args):
    meta = running_meta()
    print("export KUBECONFIG=%s" % os.path.join(STATE, "kubeconfig"))
    print("export K8S_AUTH_KUBECONFIG=%s" % os.path.join(STATE, "kubeconfig"))
    print("export PATH=%s:$PATH" % bin_dir())
    print("# API server %s" % meta["server"])


def main(argv=None):
    parser, sub = LAB.parser(__doc__)
    p = add_command(sub, "build", cmd_build, "build kube-apiserver, kubectl and helm unless valid ones are cached")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when valid binaries are cached")
    p = add_command(sub, "start", cmd_start, "start etcd and kube-apiserver (a healthy running one is reused)")
    p.add_argument("--fresh", action="store_true",
                   help="stop a recorded server and wipe the state directory first: start from an empty store")
    add_command(sub, "stop", cmd_stop, "stop the API server and etcd")
    add_command(sub, "status", cmd_status, "state, pids, ports, kubeconfigs and versions").add_argument(
        "--json", action="store_true")
    p = add_command(sub, "fixtures", cmd_fixtures, "apply the project's fixture CRDs, objects and lab nodes")
    p.add_argument("--json", action="store_true", help="print what was applied as JSON")
    p = add_command(sub, "nodes", cmd_nodes, "create (or --delete) many GPU Node objects, e.g. for benchmarks")
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--prefix", default="bench-gpu-")
    p.add_argument("--workload", choices=("container", "vm-passthrough", "vm-vgpu", "dra"), default="container",
                   help="stand-in GPU resources in status.allocatable (no workload label is set)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--workers", type=int, default=8, help="parallel API requests")
    p.add_argument("--delete", action="store_true")
    add_command(sub, "env", cmd_env,
                "print shell exports: KUBECONFIG, K8S_AUTH_KUBECONFIG and PATH with kubectl and helm")
    return LAB.main(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
