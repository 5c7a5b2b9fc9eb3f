"""A decision is not a change (issue 26, item 10): a role task that only asks a module what it would do
(`check_mode: true`) reports no change, so a user counting a run's changes to see whether anything happened is
not misled. The preflight's vfio-pci binding check reported one of the six changes of a first converge."""

import glob
import os

import pytest
import yaml

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK_FILES = sorted(glob.glob(os.path.join(TOP, "roles", "*", "tasks", "*.yml")))
BLOCK_KEYS = ("block", "rescue", "always")


def tasks_of(items):
    """Every task of a task list, blocks opened (the block itself is not a task)."""
    for item in items or []:
        if any(key in item for key in BLOCK_KEYS):
            for key in BLOCK_KEYS:
                yield from tasks_of(item.get(key))
        else:
            yield item


def check_only_tasks():
    for path in TASK_FILES:
        with open(path, encoding="utf-8") as handle:
            for task in tasks_of(yaml.safe_load(handle)):
                if task.get("check_mode") is True:
                    yield os.path.relpath(path, TOP), task


CHECK_ONLY = list(check_only_tasks())


def test_the_roles_have_check_only_tasks():
    # The preflight's binding check, its DRA holder check, its vGPU and VF removal checks, host_verify's.
    names = [task.get("name", "") for _path, task in CHECK_ONLY]
    assert "Check that the GPUs can be bound to vfio-pci, or given back to their host drivers" in names
    assert len(CHECK_ONLY) >= 5, names


@pytest.mark.parametrize("path, task", CHECK_ONLY, ids=["%s: %s" % (p, t.get("name")) for p, t in CHECK_ONLY])
def test_a_check_only_task_reports_no_change(path, task):
    assert task.get("changed_when") is False, "%s: %r runs in check mode but may report a change" % (
        path, task.get("name"))
