# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Offline replacement for the pip bootstrap script ansible-test downloads for its sanity venvs.

ansible-test fetches ``get-pip-<version>.py`` from a host outside the package registries; this file,
installed by scripts/run-sanity.sh into ansible-test's cache under that name, does the same job with
the pip wheel from PyPI placed beside it: it runs that pip to install pip and the packages asked for.
"""

import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Installed as get_pip_<major>_<minor>.py: use the pip wheel of that version beside it.
VERSION = os.path.basename(__file__)[len("get_pip_"):-len(".py")].replace("_", ".")
WHEELS = glob.glob(os.path.join(HERE, "pip-%s-*.whl" % VERSION))
if not WHEELS:
    sys.exit("no pip %s wheel beside %s; run scripts/run-sanity.sh to place it" % (VERSION, __file__))
sys.path.insert(0, WHEELS[0])

from pip._internal.cli.main import main  # noqa: E402  pylint: disable=wrong-import-position

# get-pip's --no-setuptools / --no-wheel only mean "do not add those packages": drop them.
ARGS = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--find-links", HERE] + ARGS))
