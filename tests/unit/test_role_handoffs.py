"""What one role works out, the next reads the same way: who binds the GPUs and who creates the vGPU devices, and the
CPU vendor.

The roles' defaults are templated as Ansible templates them, for every combination of the inputs and of which
roles ran before (prepare_hosts.yml: preflight, host_prepare, host_verify; verify_hosts.yml: preflight,
host_verify; a user's play: host_verify alone). host_verify must expect what host_prepare did.
"""

import itertools

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpuops.sandbox.plugins.filter.host_plan import host_plan
from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted


def defaults(role):
    return trusted(load("roles/%s/defaults/main.yml" % role))


def resolve(variables, name):
    return templar(variables).template(variables[name])


INPUTS = list(itertools.product([None, "host", "operator"], [None, "", "/etc/kubeconfig"]))


@pytest.mark.parametrize("binding, kubeconfig", INPUTS)
@pytest.mark.parametrize("kind", ["vfio_binding", "vgpu_devices"])
def test_verification_expects_what_preparation_did(binding, kubeconfig, kind):
    inputs = {}
    if binding is not None:
        inputs["gpuops_" + kind] = binding
    if kubeconfig is not None:
        inputs["gpuops_kubeconfig"] = kubeconfig
    # The preparation: preflight records the mode, host_prepare reads it.
    preflight = dict(defaults("preflight"), **inputs)
    mode = resolve(preflight, "preflight_" + kind)
    prepared = resolve(dict(defaults("host_prepare"), **inputs, **{"preflight_%s_mode" % kind: mode}),
                       "host_prepare_" + kind)
    assert prepared == mode
    expected = binding or ("operator" if kubeconfig else "host")
    assert prepared == expected
    # verify_hosts.yml: preflight then host_verify, host_prepare's defaults not in the play.
    verify = dict(defaults("host_verify"), **inputs, **{"preflight_%s_mode" % kind: mode})
    assert resolve(verify, "host_verify_" + kind) == prepared
    # host_verify alone (no preflight fact): the same rule.
    assert resolve(dict(defaults("host_verify"), **inputs), "host_verify_" + kind) == prepared
    # host_prepare's value, when the play has it, wins (a user setting the role variable directly).
    other = "host" if prepared == "operator" else "operator"
    verify["host_prepare_" + kind] = other
    assert resolve(verify, "host_verify_" + kind) == other


def argument_spec(role):
    return load("roles/%s/meta/argument_specs.yml" % role)["argument_specs"]["main"]["options"]


RECORD = "Record the CPU vendor, who binds the GPUs and who creates the vGPU devices"


def recorded_cpu_vendor(platform_vendor):
    """What preflight records from the host's plan, worked out from gpu_facts' platform_vendor."""
    task = next(t for t in load("roles/preflight/tasks/main.yml") if t.get("name") == RECORD)
    value = trusted(task["ansible.builtin.set_fact"]["preflight_cpu_vendor"])
    plan = host_plan([], {"platform_vendor": platform_vendor}, {}, {"workload_type": "container"})
    return templar({"preflight_plan": plan}).template(value)


@pytest.mark.parametrize("platform_vendor, recorded", [("intel", "intel"), ("amd", "amd"), (None, "unknown")])
@pytest.mark.parametrize("role", ["host_prepare", "host_verify"])
def test_the_cpu_vendor_preflight_records_passes_the_argument_specs(platform_vendor, recorded, role):
    """A container node whose firmware and CPU name neither Intel nor AMD (e.g. Arm): platform_vendor is null.
    default('intel') does not replace a null, so host_prepare's argument spec (intel, amd) used to fail there."""
    spec = {role + "_cpu_vendor": argument_spec(role)[role + "_cpu_vendor"]}
    for exported in (recorded_cpu_vendor(platform_vendor), platform_vendor):  # null: a play that set it so itself
        value = resolve(dict(defaults(role), preflight_cpu_vendor=exported), role + "_cpu_vendor")
        assert value == recorded
        result = ArgumentSpecValidator(spec).validate({role + "_cpu_vendor": value})
        assert result.error_messages == []
    # Without preflight (the role alone), the documented default.
    assert resolve(defaults(role), role + "_cpu_vendor") == "intel" == spec[role + "_cpu_vendor"]["default"]


@pytest.mark.parametrize("version", [None, "0.4.1"])
def test_one_dra_driver_version_for_the_chart_and_the_host_checks(version):
    # The chart the cluster half installs is the version the host side judges nvidia-persistenced by.
    inputs = {} if version is None else {"gpuops_dra_driver_version": version}
    chart = resolve(dict(defaults("dra_driver"), **inputs), "dra_driver_chart_version")
    judged = [resolve(dict(defaults(role), **inputs), "%s_dra_driver_version" % role)
              for role in ("preflight", "host_prepare", "host_verify")]
    assert chart == (version or "")
    assert judged == [chart] * 3
