#!/usr/bin/env python
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Measure the cluster half on a real kube-apiserver with many GPU Node objects; print a table.

On a private cluster lab (lab/kubelab.py with its own state directory, so nothing else's requests
are counted and the session server is left alone) with N GPU Nodes (default 1,000):

  labels-module    gpuops.sandbox.node_labels: label every node (mixed workload types) in one task
  labels-noop      the same again: nothing differs, nothing is patched
  labels-naive     a loop of kubernetes.core.k8s (state patched), one iteration per node
  allowlist-module gpuops.sandbox.kubevirt_host_devices: permittedHostDevices from N hosts' facts
  allowlist-naive  a loop of kubernetes.core.k8s over the hosts, each iteration patching the CR with
                   the entries of the hosts so far (a merge patch replaces lists: read, add, write)

Wall time is the whole ansible-playbook run (Ansible's own start-up included, about the same for
both); API requests are the growth of the API server's apiserver_request_total (from /metrics) over
the run, for every resource but the API server's own lease renewals. The ratio column is naive / module. Measures only: it asserts nothing.
--naive-nodes runs the naive loops on fewer nodes and scales their figures up linearly (marked *).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import yaml

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KUBELAB = [sys.executable, os.path.join(TOP, "lab", "kubelab.py")]
PLAYBOOK_BIN = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
MODELS = [("2236", "GA102GL_A10", "A10-4Q"), ("26b9", "AD102GL_L40S", "L40S-8Q"),
          ("20b5", "GA100_A100_PCIe_80GB", "A100D-10C"), ("2330", "GH100_H100_SXM5_80GB", "H100-10C")]
TYPES = ("container", "vm-passthrough", "vm-vgpu")
METRIC_RE = re.compile(r'^apiserver_request_total\{([^}]*)\}\s+([0-9.e+]+)$')
RESOURCE_RE = re.compile(r'(?:^|,)resource="([^"]*)"')


def sh(cmd, env=None, timeout=7200):
    full_env = dict(os.environ)
    full_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full_env.get("PATH", "")
    full_env.setdefault("ANSIBLE_CONFIG", os.path.join(TOP, "ansible.cfg"))
    full_env.update(env or {})
    proc = subprocess.run(cmd, cwd=TOP, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False, timeout=timeout)
    if proc.returncode:
        raise SystemExit("%s failed (rc=%d):\n%s" % (" ".join(cmd[:3]), proc.returncode, proc.stdout[-4000:]))
    return proc.stdout


def requests_total(kubectl, kubeconfig):
    """apiserver_request_total summed over every label set that names a resource.

    Non-resource requests (/metrics itself, /readyz) and the API server's own lease renewals
    (coordination.k8s.io leases, its identity heartbeat every few seconds) are left out.
    """
    text = sh([kubectl, "--kubeconfig", kubeconfig, "get", "--raw", "/metrics"])
    total = 0.0
    for line in text.splitlines():
        match = METRIC_RE.match(line)
        resource = RESOURCE_RE.search(match.group(1)) if match else None
        if resource and resource.group(1) and resource.group(1) != "leases":
            total += float(match.group(2))
    return total


def host_facts(index):
    """gpu_facts-like facts of bench host <index>: one of four GPU models, one of three workload types."""
    device, name, vgpu = MODELS[index % len(MODELS)]
    wtype = TYPES[index % len(TYPES)]
    gpu = {"address": "0000:65:00.0", "vendor": "10de", "device": device, "is_vf": False,
           "sandbox_resource_name": "nvidia.com/" + name,
           "mdev_types": [{"name": "NVIDIA " + vgpu, "resource_name": "nvidia.com/NVIDIA_" + vgpu}]}
    return wtype, vgpu, gpu


def write_playbooks(directory, kubeconfig, names, naive_names):
    hosts, label_specs = [], []
    for index, name in enumerate(names):
        wtype, vgpu, gpu = host_facts(index)
        hosts.append({"name": name, "workload_type": wtype, "gpus": [gpu]})
        labels = {"nvidia.com/gpu.workload.config": wtype, "nvidia.com/vgpu.config": vgpu if wtype == "vm-vgpu" else None}
        label_specs.append({"name": name, "labels": labels})
    clear_specs = [{"name": n, "labels": {"nvidia.com/gpu.workload.config": None, "nvidia.com/vgpu.config": None}}
                   for n in names]
    data = {"kubeconfig": kubeconfig, "hosts": hosts, "label_specs": label_specs, "clear_specs": clear_specs,
            "naive_specs": label_specs[:len(naive_names)], "naive_hosts": hosts[:len(naive_names)]}
    with open(os.path.join(directory, "data.json"), "w") as handle:
        json.dump(data, handle)

    def play(tasks):
        return [{"name": "Bench", "hosts": "localhost", "connection": "local", "gather_facts": False,
                 "vars_files": ["data.json"], "tasks": tasks}]

    books = {
        "labels-module.yml": play([{"name": "Label every node", "gpuops.sandbox.node_labels": {
            "kubeconfig": "{{ kubeconfig }}", "nodes": "{{ label_specs }}"}}]),
        "labels-clear.yml": play([{"name": "Remove the labels", "gpuops.sandbox.node_labels": {
            "kubeconfig": "{{ kubeconfig }}",
            "nodes": "{{ clear_specs }}"}}]),
        "labels-naive.yml": play([{"name": "Label one node", "kubernetes.core.k8s": {
            "kubeconfig": "{{ kubeconfig }}", "state": "patched", "api_version": "v1", "kind": "Node",
            "name": "{{ item.name }}", "definition": {"metadata": {"labels": "{{ item.labels }}"}}},
            "loop": "{{ naive_specs }}", "loop_control": {"label": "{{ item.name }}"}}]),
        "allowlist-module.yml": play([{"name": "Permit every host's devices", "gpuops.sandbox.kubevirt_host_devices": {
            "kubeconfig": "{{ kubeconfig }}", "hosts": "{{ hosts }}", "kubevirt_version": "v1.8.0"}}]),
        "allowlist-naive.yml": play([{"name": "Permit the devices of the hosts so far", "kubernetes.core.k8s": {
            "kubeconfig": "{{ kubeconfig }}", "state": "patched", "api_version": "kubevirt.io/v1", "kind": "KubeVirt",
            "namespace": "kubevirt", "name": "kubevirt",
            "merge_type": "merge",
            "definition": {"spec": {"configuration": {"permittedHostDevices": {
                "pciHostDevices": "{{ __pci }}", "mediatedDevices": "{{ __mdev }}"},
                "developerConfiguration": {"featureGates": ["GPU", "HostDevices", "DisableMDEVConfiguration"]}}}}},
            "vars": {
                "__upto": "{{ naive_hosts[:index + 1] }}",
                "__pci": "{{ __upto | selectattr('workload_type', 'eq', 'vm-passthrough') | map(attribute='gpus') | flatten"
                         " | map('gpuops_bench_pci') | list | unique }}",
                "__mdev": "{{ __upto | selectattr('workload_type', 'eq', 'vm-vgpu') | map(attribute='gpus') | flatten"
                          " | map(attribute='mdev_types') | flatten | map('gpuops_bench_mdev') | list | unique }}"},
            "loop": "{{ naive_hosts }}", "loop_control": {"index_var": "index", "label": "{{ item.name }}"}}]),
    }
    # The naive loop builds each entry with plain Jinja (no collection filter): two tiny filters here.
    os.makedirs(os.path.join(directory, "filter_plugins"), exist_ok=True)
    with open(os.path.join(directory, "filter_plugins", "bench.py"), "w") as handle:
        handle.write(
            "def pci(g):\n"
            "    return {'pciVendorSelector': (g['vendor'] + ':' + g['device']).upper(),"
            " 'resourceName': g['sandbox_resource_name'], 'externalResourceProvider': True}\n\n\n"
            "def mdev(t):\n"
            "    return {'mdevNameSelector': t['name'], 'resourceName': t['resource_name'], 'externalResourceProvider': True}\n\n\n"
            "class FilterModule:\n"
            "    def filters(self):\n"
            "        return {'gpuops_bench_pci': pci, 'gpuops_bench_mdev': mdev}\n")
    for name, book in books.items():
        with open(os.path.join(directory, name), "w") as handle:
            yaml.safe_dump(book, handle, sort_keys=False)


def measure(directory, book, kubectl, kubeconfig):
    before = requests_total(kubectl, kubeconfig)
    started = time.time()
    sh([PLAYBOOK_BIN, os.path.join(directory, book)], env={"ANSIBLE_FILTER_PLUGINS": os.path.join(directory, "filter_plugins")})
    elapsed = time.time() - started
    after = requests_total(kubectl, kubeconfig)
    return elapsed, int(after - before)


def reset_kubevirt(kubectl, kubeconfig):
    patch = {"metadata": {"annotations": {"gpuops.sandbox/permitted-host-devices": None}},
             "spec": {"configuration": {"permittedHostDevices": None, "developerConfiguration": {"featureGates": []}}}}
    sh([kubectl, "--kubeconfig", kubeconfig, "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=merge",
        "-p", json.dumps(patch)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--naive-nodes", type=int, help="nodes for the naive loops (default: all)")
    parser.add_argument("--keep", action="store_true", help="leave the private API server running")
    args = parser.parse_args(argv)
    naive_count = min(args.naive_nodes or args.nodes, args.nodes)
    state = os.path.join(TOP, ".lab", "kube-bench")
    env = {"GPUOPS_KUBE_STATE": state}
    sh(KUBELAB + ["build"], env=env)
    sh(KUBELAB + ["start"], env=env)
    try:
        sh(KUBELAB + ["fixtures"], env=env)
        status = json.loads(sh(KUBELAB + ["status", "--json"], env=env))
        kubeconfig, kubectl = status["kubeconfig"], os.path.join(status["bin_dir"], "kubectl")
        prefix = "bench-gpu-"
        sh(KUBELAB + ["nodes", "--count", str(args.nodes), "--prefix", prefix], env=env)
        names = ["%s%04d" % (prefix, i) for i in range(args.nodes)]
        rows = []
        with tempfile.TemporaryDirectory(prefix="bench-cluster.") as directory:
            write_playbooks(directory, kubeconfig, names, names[:naive_count])
            module = measure(directory, "labels-module.yml", kubectl, kubeconfig)
            noop = measure(directory, "labels-module.yml", kubectl, kubeconfig)
            measure(directory, "labels-clear.yml", kubectl, kubeconfig)
            naive = measure(directory, "labels-naive.yml", kubectl, kubeconfig)
            rows.append(("label %d nodes" % args.nodes, module, naive, noop))
            reset_kubevirt(kubectl, kubeconfig)
            module = measure(directory, "allowlist-module.yml", kubectl, kubeconfig)
            noop = measure(directory, "allowlist-module.yml", kubectl, kubeconfig)
            reset_kubevirt(kubectl, kubeconfig)
            naive = measure(directory, "allowlist-naive.yml", kubectl, kubeconfig)
            rows.append(("KubeVirt allowlist from %d hosts" % args.nodes, module, naive, noop))
        scale = float(args.nodes) / naive_count
        mark = "*" if naive_count < args.nodes else ""
        print("\nCluster half on a real kube-apiserver %s, %d GPU nodes%s" % (
            status.get("versions", {}).get("kubernetes", ""), args.nodes,
            " (naive loops on %d nodes, scaled x%.1f: *)" % (naive_count, scale) if mark else ""))
        print("| measurement | module: wall s / API requests | module no-op re-run | naive k8s loop: wall s / API requests | ratio wall / requests |")
        print("|---|---|---|---|---|")
        for title, (m_s, m_r), (n_s, n_r), (z_s, z_r) in rows:
            n_s, n_r = n_s * scale, n_r * scale
            print("| %s | %.1f / %d | %.1f / %d | %.1f%s / %d%s | %.0fx / %.1fx |" % (
                title, m_s, m_r, z_s, z_r, n_s, mark, n_r, mark, n_s / m_s if m_s else 0, n_r / m_r if m_r else 0))
    finally:
        if not args.keep:
            sh(KUBELAB + ["stop"], env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
