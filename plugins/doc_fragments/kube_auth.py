# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""How the cluster modules reach the API server (see _kube.AUTH_ARGUMENT_SPEC)."""

from __future__ import annotations


class ModuleDocFragment:
    """Options kubeconfig, context and request_timeout."""

    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path of the kubeconfig file to use.
      - When omitted, the environment variable E(K8S_AUTH_KUBECONFIG), then E(KUBECONFIG), then
        C(~/.kube/config) are used.
      - Its contents (tokens, client keys) never appear in the module's output or error messages.
    type: path
  context:
    description:
      - Kubeconfig context to use; the kubeconfig's current context when omitted.
    type: str
  request_timeout:
    description:
      - Seconds allowed for each API request, a whole number from 1 to 3600; any other value fails before the first request.
    type: int
    default: 30
requirements:
  - kubernetes (the Python client) on the host that runs the module
notes:
  - Every failure names the API server URL and the request that failed, with the API server's own
    message. An unreachable server, rejected credentials (401) and missing permissions (403) each
    have their own message.
"""
