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

import pytest  # noqa: E402  pylint: disable=wrong-import-position

# The module harness asserts on behalf of the tests (of modules and of module_utils alike): have pytest explain
# its failed assertions as theirs. Registered here, before any test file imports it.
pytest.register_assert_rewrite("ansible_collections.gpuops.sandbox.tests.unit.plugins.modules.module_harness")
