"""What one role works out, the next reads the same way: who binds the GPUs and who creates the vGPU devices.

The roles' defaults are templated as Ansible templates them, for every combination of the inputs and of which
roles ran before (prepare_hosts.yml: preflight, host_prepare, host_verify; verify_hosts.yml: preflight,
host_verify; a user's play: host_verify alone). host_verify must expect what host_prepare did.
"""

import itertools
import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def defaults(role):
    with open(os.path.join(TOP, "roles", role, "defaults", "main.yml"), encoding="utf-8") as handle:
        return dict((k, trust_as_template(v) if isinstance(v, str) else v) for k, v in yaml.safe_load(handle).items())


def resolve(variables, name):
    return Templar(loader=DataLoader(), variables=variables).template(variables[name])


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
