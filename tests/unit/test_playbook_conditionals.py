"""Every conditional in the project's task files is a string once YAML has parsed it.

A plain YAML scalar holding ': ' becomes a mapping (`- x is search('a: b')`), which Ansible then
refuses at run time, long after lint passed. This finds such entries without running anything.
"""

import glob
import os

import pytest
import yaml

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = ("that", "when", "failed_when", "changed_when", "until")
FILES = sorted(
    f for pattern in ("roles/*/tasks/*.yml", "roles/*/handlers/*.yml", "playbooks/*.yml",
                      "tests/integration/targets/*/tasks/*.yml", "extensions/molecule/*/*.yml")
    for f in glob.glob(os.path.join(TOP, pattern))
)


def bad_conditionals(node):
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in KEYS:
                for item in value if isinstance(value, list) else [value]:
                    if not isinstance(item, (str, bool)):
                        found.append((key, item))
            found.extend(bad_conditionals(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(bad_conditionals(item))
    return found


def test_the_check_catches_a_colon_in_a_plain_scalar():
    assert bad_conditionals(yaml.safe_load("- assert:\n    that:\n      - x is search('a: b')\n"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: os.path.relpath(p, TOP))
def test_conditionals_are_strings(path):
    with open(path) as handle:
        assert bad_conditionals(yaml.safe_load(handle)) == []
