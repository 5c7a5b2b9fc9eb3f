"""The container node against the plan playbooks/plan.yml made of it before the converge (shared/plan_before.yml): the
host shows what the plan said, its one reboot included, and plan.yml on it now finds nothing to change."""

import importlib.util
import os

_SPEC = importlib.util.spec_from_file_location(
    "plan_checks", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "plan_checks.py"))
plan_checks = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(plan_checks)


def test_the_host_is_what_its_plan_said(host):
    plan = plan_checks.check_host_is_as_planned(host)
    assert plan["workload_type"] == "container", plan["workload_type"]
    # From pristine the preparation reboots once (the kernel arguments, the initramfs): the plan said so first.
    assert plan["reboot"]["required"] is True, plan["reboot"]


def test_nothing_is_left_to_plan(host, tmp_path):
    plan_checks.check_nothing_left_to_plan(host, tmp_path)
