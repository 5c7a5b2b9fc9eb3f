# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Sphinx configuration of the documentation site (scripts/build-docs.sh); from antsibull-docs sphinx-init."""

project = "gpuops.sandbox"
copyright = "gpuops.sandbox contributors"  # pylint: disable=redefined-builtin
title = "gpuops.sandbox"
html_short_title = "gpuops.sandbox"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.intersphinx", "sphinx_antsibull_ext"]

pygments_style = "ansible"
highlight_language = "YAML+Jinja"

html_theme = "sphinx_ansible_theme"
html_show_sphinx = False
display_version = False
html_use_smartypants = True
html_use_modindex = False
html_use_index = False
html_copy_source = False

# The site is built without network access: no intersphinx inventories are fetched.
intersphinx_mapping = {}

default_role = "any"
nitpicky = True

# References into the Ansible documentation site and into other collections' docs cannot resolve
# without intersphinx; every reference inside this collection must.
nitpick_ignore_regex = [
    ("ref", r"ansible_collections\.(?!gpuops\.sandbox\.).*"),
    ("ref", r"(common_return_values|ansible_configuration_settings|playbooks_.*|collections_.*)"),
]
