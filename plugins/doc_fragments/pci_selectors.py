# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The PCI selector options shared by the modules that act on GPUs (see _pci.SELECTOR_ARGUMENT_SPEC), and the
include_all option of the modules that only read (_pci.SELECTION_ARGUMENT_SPEC)."""

from __future__ import annotations


class ModuleDocFragment:
    """Options addresses, vendors and classes; INCLUDE_ALL adds include_all."""

    DOCUMENTATION = r"""
options:
  addresses:
    description:
      - Select exactly these PCI functions, as C(DDDD:BB:SS.F) (or C(BB:SS.F) for domain C(0000)).
      - Each must exist in C(/sys/bus/pci/devices) and resolve under C(/sys/devices).
    type: list
    elements: str
  vendors:
    description:
      - Select functions whose vendor, or vendor and device, matches one of these, as C(VVVV) or
        C(VVVV:DDDD) in hex (for example C(10de) or C(10de:2236)).
      - An empty list matches every vendor.
      - When omitted, C(10de) (NVIDIA) is used.
    type: list
    elements: str
  classes:
    description:
      - Select functions whose PCI class starts with one of these, as 2, 4 or 6 hex digits (class,
        class and subclass, or class, subclass and programming interface).
      - A function must match one of O(vendors) and one of O(classes).
      - An empty list matches every class.
      - When omitted, C(030000) and C(030200) are used.
    type: list
    elements: str
"""

    INCLUDE_ALL = r"""
options:
  include_all:
    description:
      - Take every PCI function of the host, whatever its vendor and class.
      - Mutually exclusive with O(addresses), O(vendors) and O(classes).
    type: bool
    default: false
"""
