# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""/etc/default/grub texts shared by the unit tests of _cmdline and kernel_cmdline."""

from __future__ import annotations

# Debian 12's /etc/default/grub (shortened), with an IOMMU switch already on the default command line.
DEBIAN_GRUB = (
    "# If you change this file, run 'update-grub' afterwards to update\n"
    "GRUB_DEFAULT=0\n"
    "GRUB_TIMEOUT=5\n"
    "GRUB_DISTRIBUTOR=`( . /etc/os-release; echo ${NAME:-Debian} ) 2>/dev/null || echo Debian`\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0,115200 intel_iommu=off"\n'
    'GRUB_CMDLINE_LINUX=""\n'
)
