"""The vm-passthrough node held to the plan playbooks/plan.yml made of it before the converge, then planned again to nothing
(the checks: shared/plan_checks.py)."""

import importlib.util
import os

_SPEC = importlib.util.spec_from_file_location(
    "plan_checks", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "plan_checks.py"))
plan_checks = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(plan_checks)

test_the_host_is_what_its_plan_said, test_nothing_is_left_to_plan = plan_checks.scenario_tests("vm-passthrough")
