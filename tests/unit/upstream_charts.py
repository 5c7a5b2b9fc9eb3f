"""The real charts the chart tests read (../shared/upstream beside the checkout), and the helm that renders them."""

from __future__ import annotations

import functools
import os
import shutil

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
UPSTREAM = os.path.join(os.path.dirname(TOP), "shared", "upstream")
OLD_CHART = os.path.join(UPSTREAM, "gpu-operator-v25.10.1", "chart")
NEW_CHART = os.path.join(UPSTREAM, "gpu-operator", "chart")
OLD_DRA = os.path.join(UPSTREAM, "dra-driver-nvidia-gpu-v0.4.1", "chart")
NEW_DRA = os.path.join(UPSTREAM, "dra-driver-nvidia-gpu", "chart")


@functools.lru_cache(maxsize=None)
def helm_binary():
    """The lab's helm (lab/kubebuild.py's cache, shared by the machine's checkouts), else one on PATH."""
    caches = [os.environ.get("GPUOPS_KUBE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gpuops-sandbox", "kube")]
    found = sorted(p for cache in caches if os.path.isdir(cache)
                   for p in (os.path.join(cache, d, "helm") for d in os.listdir(cache)) if os.access(p, os.X_OK))
    return found[-1] if found else shutil.which("helm")
