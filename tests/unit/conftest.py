"""Make the checkout importable as ansible_collections.gpuops.sandbox for plain pytest runs.

`make venv` links the checkout at .build/collections/ansible_collections/gpuops/sandbox; under
ansible-test the collection is already on the path and this does nothing.
"""

import os
import sys

_TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_COLLECTIONS = os.path.join(_TOP, ".build", "collections")
if os.path.isdir(_COLLECTIONS) and _COLLECTIONS not in sys.path:
    sys.path.insert(0, _COLLECTIONS)
    # Ansible's own collection finder, as ansible-playbook and ansible-test have it: the role defaults the tests
    # template find the collection's filters (gpuops.sandbox.*) through it.
    from ansible.utils.collection_loader._collection_finder import (  # noqa: E402  pylint: disable=wrong-import-position
        _AnsibleCollectionFinder)
    _AnsibleCollectionFinder(paths=[_COLLECTIONS])._install()

import pytest  # noqa: E402  pylint: disable=wrong-import-position

# The module harness asserts on behalf of the tests (of modules and of module_utils alike): have pytest explain
# its failed assertions as theirs. Registered here, before any test file imports it.
pytest.register_assert_rewrite("ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness")
