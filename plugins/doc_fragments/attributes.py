# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The attributes of the modules that describe them in the common words: check_mode, diff_mode, idempotent."""

from __future__ import annotations


class ModuleDocFragment:
    """Attributes check_mode, diff_mode, idempotent and (FACTS) facts.

    DOCUMENTATION: a module that fully supports check mode and is idempotent; the module gives its own
    diff_mode support (full, or none when it changes nothing), and may add details to any attribute.
    FACTS: a module that returns facts.
    """

    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation
      indicates no change.
    support: full
"""

    FACTS = r"""
attributes:
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
    support: full
"""
