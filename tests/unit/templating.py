"""Role files read and templated as Ansible templates them, for the unit tests that check what a role's defaults
and task arguments come to without running a play."""

import os

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

try:
    from ansible.template import trust_as_template
except ImportError:  # ansible-core before 2.19 (scripts/test-cores.sh) templates every string it is given
    def trust_as_template(value):
        return value

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def trusted(value):
    """``value`` with every string in it marked as a template (what Ansible does with the role's own files)."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return dict((k, trusted(v)) for k, v in value.items())
    if isinstance(value, list):
        return [trusted(v) for v in value]
    return value


def load(path):
    """The YAML document at ``path``, relative to the top of the checkout."""
    with open(os.path.join(TOP, path), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def templar(variables):
    return Templar(loader=DataLoader(), variables=variables)
