# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""kubecommon: what every part of kubelab shares: the checkout it lies in, its error and its log.

kubelab.py imports this module and the others beside it (kubebuild, kubeserver, kubefixtures) as siblings: it
puts its own directory on sys.path first.
"""

from __future__ import annotations

import os

from labcommon import Lab

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class KubeLabError(Exception):
    """An error the user can act on; printed without a traceback."""


LAB = Lab("kubelab", KubeLabError)
log, run, locked = LAB.log, LAB.run, LAB.locked
