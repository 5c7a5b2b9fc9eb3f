# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""kubebuild: the cluster lab's binaries: kube-apiserver, kubectl and helm, built with Go and cached.

kube-apiserver and kubectl come from the Go module k8s.io/kubernetes at a pinned release, with the k8s.io/*
staging modules pinned to the matching v0.x.y through `replace` lines of a go.mod written here; helm from
helm.sh/helm/v3. A manifest beside the binaries records their versions and sha256 sums: a missing, corrupt or
outdated binary is built again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time

from labcommon import read_json, sha256_file, utc_now, write_json, write_text
from kubecommon import KubeLabError, locked, log, run

# Shared by every checkout on the machine, as the lab's image is (a fresh clone linked the three binaries again from
# Go's build cache: 110 s before its integration tier could start, 2026-12-01); builds are serialised by a lock in it.
CACHE = os.environ.get("GPUOPS_KUBE_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gpuops-sandbox", "kube")
GO = os.environ.get("GPUOPS_KUBE_GO") or "go"
BUILD_TIMEOUT = int(os.environ.get("GPUOPS_KUBE_BUILD_TIMEOUT", "5400"))

# Pinned releases. The staging modules (k8s.io/api, k8s.io/client-go, ...) follow as v0.<minor>.<patch>.
KUBE_VERSION = "v1.35.4"
HELM_VERSION = "v3.20.2"
# The Go packages built into each binary, and how each binary reports its version.
K8S_PACKAGES = {"kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
                "kubectl": "k8s.io/kubernetes/cmd/kubectl"}
HELM_PACKAGE = "helm.sh/helm/v3/cmd/helm"
VERSION_ARGS = {"kube-apiserver": ["--version"], "kubectl": ["version", "--client"],
                "helm": ["version", "--short"]}
BINARIES = ("kube-apiserver", "kubectl", "helm")


# ---------------------------------------------------------------------------------------------
# Building the binaries
# ---------------------------------------------------------------------------------------------

def staging_version(kube_version):
    """v1.35.4 -> v0.35.4: the tag the k8s.io/* staging modules carry for a Kubernetes release."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", kube_version)
    if not match:
        raise KubeLabError("not a Kubernetes release version: %r (expected v1.MINOR.PATCH)" % kube_version)
    return "v0.%s.%s" % match.groups()


def staging_modules(gomod_text):
    """The modules k8s.io/kubernetes's go.mod replaces with its own ./staging/src/ directories."""
    found = set()
    for line in gomod_text.splitlines():
        match = re.match(r"\s*(?:replace\s+)?(\S+)(?:\s+v\S+)?\s+=>\s+\./staging/src/(\S+)\s*$", line)
        if match and match.group(1) == match.group(2):
            found.add(match.group(1))
    return sorted(found)


def go_directive(gomod_text):
    match = re.search(r"^go\s+(\d+\.\d+(?:\.\d+)?)\s*$", gomod_text, re.M)
    return match.group(1) if match else None


def render_gomod(kube_version, modules, go_version):
    """The go.mod of the build directory: k8s.io/kubernetes plus its staging modules as released."""
    staged = staging_version(kube_version)
    lines = [
        "// Written by lab/kubelab.py: builds kube-apiserver and kubectl from k8s.io/kubernetes %s." % kube_version,
        "module gpuops.sandbox/kubelab",
        "",
        "go %s" % go_version,
        "",
        "require k8s.io/kubernetes %s" % kube_version,
        "",
        "replace (",
    ]
    width = max(len(m) for m in modules)
    lines += ["\t%s => %s %s" % (m.ljust(width), m, staged) for m in modules]
    lines += [")", ""]
    return "\n".join(lines)


def k8s_ldflags(kube_version):
    """Linker flags: strip symbols and stamp the release into both version packages."""
    major, minor = re.fullmatch(r"v(\d+)\.(\d+)\.\d+", kube_version).groups()
    stamps = {"gitVersion": kube_version, "gitMajor": major, "gitMinor": minor,
              "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z"}
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += ["-X %s.%s=%s" % (pkg, key, value) for key, value in sorted(stamps.items())]
    return " ".join(flags)


def helm_ldflags(helm_version):
    return "-s -w -X helm.sh/helm/v3/internal/version.version=%s" % helm_version


def bin_dir():
    return os.path.join(CACHE, "bin-" + KUBE_VERSION)


def wanted_versions():
    return {"kube-apiserver": KUBE_VERSION, "kubectl": KUBE_VERSION, "helm": HELM_VERSION}


def version_ok(name, output, version):
    """Whether a binary's version output names the pinned release."""
    if name == "helm":
        return output.strip().split("+")[0] == version
    return re.search(r"(^|\s)%s(\s|$)" % re.escape(version), output) is not None


def read_manifest(directory):
    return read_json(os.path.join(directory, "manifest.json")) or None


def binary_problem(directory, manifest, name, execute=True):
    """None when the cached binary `name` is usable, else why not (missing, outdated, corrupt)."""
    path = os.path.join(directory, name)
    entry = ((manifest or {}).get("binaries") or {}).get(name)
    if not os.path.exists(path) or not entry:
        return "missing"
    if entry.get("version") != wanted_versions()[name]:
        return "outdated: %s, pinned %s" % (entry.get("version"), wanted_versions()[name])
    if sha256_file(path) != entry.get("sha256"):
        return "corrupt: its sha256 does not match the manifest"
    if execute:
        try:
            proc = subprocess.run([path] + VERSION_ARGS[name], capture_output=True, text=True, timeout=60,
                                  check=False, stdin=subprocess.DEVNULL)
        except OSError as exc:
            return "corrupt: it does not run (%s)" % exc
        except subprocess.TimeoutExpired:
            return "corrupt: `%s` hangs" % " ".join([name] + VERSION_ARGS[name])
        if proc.returncode != 0 or not version_ok(name, proc.stdout, entry["version"]):
            printed = (proc.stdout + proc.stderr).strip()[:200]
            return "corrupt: `%s` printed %r" % (" ".join([name] + VERSION_ARGS[name]), printed)
    return None


def go_env():
    env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-mod=mod -buildvcs=false")
    return env


def go_version():
    return run([GO, "env", "GOVERSION"], timeout=60).stdout.strip()


def build_k8s(names, dest):
    """Build kube-apiserver/kubectl into `dest` from a go.mod pinning the release and its staging modules."""
    work = os.path.join(CACHE, "build-" + KUBE_VERSION)
    os.makedirs(work, exist_ok=True)
    env = go_env()
    # go.mod of k8s.io/kubernetes names its staging modules (replaced by ./staging in its own tree).
    proc = run([GO, "mod", "download", "-json", "k8s.io/kubernetes@" + KUBE_VERSION], cwd=CACHE, env=env,
               timeout=BUILD_TIMEOUT, progress="downloading k8s.io/kubernetes " + KUBE_VERSION)
    try:
        info = json.loads(proc.stdout)
        with open(info["GoMod"]) as handle:
            upstream = handle.read()
    except (ValueError, KeyError, OSError) as exc:
        raise KubeLabError("cannot read the go.mod of k8s.io/kubernetes %s: %s" % (KUBE_VERSION, exc))
    modules = staging_modules(upstream)
    if len(modules) < 10:
        raise KubeLabError("k8s.io/kubernetes %s names only %d staging modules" % (KUBE_VERSION, len(modules)))
    write_text(os.path.join(work, "go.mod"), render_gomod(KUBE_VERSION, modules, go_directive(upstream) or "1.25"))
    # -v names each package as it is compiled: the progress lines count them.
    cmd = [GO, "build", "-v", "-trimpath", "-ldflags=" + k8s_ldflags(KUBE_VERSION), "-o", dest + os.sep]
    run(cmd + [K8S_PACKAGES[n] for n in names], cwd=work, env=env, timeout=BUILD_TIMEOUT,
        progress="building " + " and ".join(names))


def build_helm(dest):
    """go install helm at the pinned version (its own go.mod decides its dependencies)."""
    env = dict(go_env(), GOBIN=dest, GOFLAGS="-buildvcs=false")
    run([GO, "install", "-v", "-trimpath", "-ldflags=" + helm_ldflags(HELM_VERSION),
         "%s@%s" % (HELM_PACKAGE, HELM_VERSION)], cwd=CACHE, env=env, timeout=BUILD_TIMEOUT,
        progress="building helm " + HELM_VERSION)


def ensure_binaries(rebuild=False):
    """Build what is missing or broken in the cache; return the manifest of bin-<version>/."""
    directory = bin_dir()
    os.makedirs(CACHE, exist_ok=True)
    with locked(os.path.join(CACHE, "build.lock")):
        manifest = read_manifest(directory) or {}
        todo = {}
        for name in BINARIES:
            problem = "rebuild requested" if rebuild else binary_problem(directory, manifest, name)
            if problem:
                todo[name] = problem
        if not todo:
            return manifest
        if shutil.which(GO) is None:
            raise KubeLabError("%s is not installed: the API server is built with Go (1.25 or newer)" % GO)
        for name, problem in todo.items():
            if problem != "missing":
                log("cached %s is %s; rebuilding it" % (name, problem))
        staging = tempfile.mkdtemp(prefix="build-", dir=CACHE)
        try:
            timings = dict(manifest.get("build_seconds") or {})
            k8s = [n for n in K8S_PACKAGES if n in todo]
            if k8s:
                log("building %s %s with %s (many minutes the first time, seconds once Go's build cache is warm)"
                    % (" and ".join(k8s), KUBE_VERSION, go_version()))
                started = time.time()
                build_k8s(k8s, staging)
                timings["k8s"] = round(time.time() - started, 1)
            if "helm" in todo:
                log("building helm %s" % HELM_VERSION)
                started = time.time()
                build_helm(staging)
                timings["helm"] = round(time.time() - started, 1)
            os.makedirs(directory, exist_ok=True)
            binaries = dict(manifest.get("binaries") or {})
            for name in todo:
                os.replace(os.path.join(staging, name), os.path.join(directory, name))
                binaries[name] = {"version": wanted_versions()[name],
                                  "sha256": sha256_file(os.path.join(directory, name))}
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        manifest = {"kubernetes": KUBE_VERSION, "staging": staging_version(KUBE_VERSION), "helm": HELM_VERSION,
                    "go": go_version(), "binaries": binaries, "build_seconds": timings,
                    "built": utc_now()}
        write_json(os.path.join(directory, "manifest.json"), manifest, sort_keys=True)
        for name in BINARIES:
            problem = binary_problem(directory, manifest, name)
            if problem:
                raise KubeLabError("the %s just built is %s" % (name, problem))
        return manifest


def binary(name):
    return os.path.join(bin_dir(), name)
