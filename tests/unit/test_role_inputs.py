"""Role inputs an argument spec cannot bound: timeouts, counts, Helm durations, list entries, secrets.

The filter is tested directly; the roles run for real (ansible-playbook on localhost) with bad values and
must stop in their first task, naming the variable and what is accepted, before anything is changed.
"""

import json
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.input_problems import FilterModule, duration_seconds
from ansible_collections.gpuops.sandbox.tests.unit.playbook import ansible_playbook

input_problems = FilterModule().filters()["input_problems"]
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "Gpuops-S3cret-4f9a"


# ---------------------------------------------------------------------------------------------
# The filter
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [1, 30, "30", " 45 ", 86400])
def test_good_seconds_pass(value):
    assert input_problems({"t": {"value": value, "min": 1, "max": 86400}}) == []


@pytest.mark.parametrize("value, why", [
    (0, "out of range"), (-1, "out of range"), ("-5", "out of range"), (86401, "out of range"),
    (True, "not a whole number"), (False, "not a whole number"), (1.5, "not a whole number"),
    ("inf", "not a whole number"), ("1e400", "not a whole number"), ("9" * 500, "not a whole number"),
    ("\u0661\u0662", "not a whole number"), ("30s", "not a whole number"), (None, "not a whole number"),
    ("30\n", None), ([], "not a whole number"),
])
def test_bad_seconds_are_named(value, why):
    problems = input_problems({"host_reboot_timeout": {"value": value, "min": 1, "max": 86400}})
    if why is None:  # a trailing newline around digits is whitespace, as int() reads it
        assert problems == []
        return
    assert len(problems) == 1
    assert problems[0].startswith("host_reboot_timeout=")
    assert why in problems[0] and "from 1 to 86400" in problems[0]
    assert len(problems[0]) < 200


@pytest.mark.parametrize("value, seconds", [("10m", 600), ("1h30m", 5400), ("90s", 90), ("1.5h", 5400),
                                            ("300ms", 0.3), ("0", 0), ("2h45m10s", 9910)])
def test_go_durations(value, seconds):
    assert duration_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["600", "10 m", "m", "10x", "", "1h-5m", ".m", 600, True, None, "1" * 100 + "s"])
def test_not_durations(value):
    assert duration_seconds(value) is None


@pytest.mark.parametrize("value, why", [("600", "not a duration"), ("0", "longer than zero"), ("-5m", "longer than zero"),
                                        ("25h", "longer than the 86400 seconds"), (600, "not a duration")])
def test_bad_durations_are_named(value, why):
    problems = input_problems({"gpu_operator_wait_timeout": {"value": value, "duration": True, "max_seconds": 86400}})
    assert len(problems) == 1 and problems[0].startswith("gpu_operator_wait_timeout=") and why in problems[0]


def test_a_malformed_check_is_an_error():
    with pytest.raises(AnsibleFilterError, match="needs a value"):
        input_problems({"x": {"min": 1}})
    with pytest.raises(AnsibleFilterError, match="expects a dict"):
        input_problems(["x"])


# ---------------------------------------------------------------------------------------------
# The roles, for real
# ---------------------------------------------------------------------------------------------

def play(tmp_path, role, variables):
    """Run one role on localhost with ``variables``; return (rc, all output)."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"name": "role input check", "hosts": "localhost", "gather_facts": False,
                                         "roles": ["gpuops.sandbox.%s" % role]}]))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(variables))
    return ansible_playbook("-i", "localhost,", "-c", "local", playbook, "-e", "@%s" % extra, "-v")


KUBECONFIG = {"gpuops_kubeconfig": "/nonexistent/kubeconfig"}
CASES = [
    ("cluster_validate", {"cluster_validate_retries": 0}, "cluster_validate_retries=0 is out of range"),
    ("cluster_validate", {"cluster_validate_delay": True}, "cluster_validate_delay=True is not a whole number"),
    ("kubevirt_devices", {"kubevirt_devices_request_timeout": -1}, "kubevirt_devices_request_timeout=-1 is out of range"),
    ("cluster_nodes", {"cluster_nodes_request_timeout": "0"}, "cluster_nodes_request_timeout='0' is out of range"),
    ("gpu_operator", {"gpu_operator_wait_timeout": "600"}, "gpu_operator_wait_timeout='600' is not a duration"),
    ("dra_driver", {"dra_driver_wait_timeout": "0s"}, "dra_driver_wait_timeout='0s' must be longer than zero"),
    ("host_reboot", {"host_reboot_timeout": 0, "host_reboot_reasons": []}, "host_reboot_timeout=0 is out of range"),
]


@pytest.mark.parametrize("role, variables, message", CASES, ids=[c[2].split("=")[0] for c in CASES])
def test_the_role_stops_first_naming_the_value(tmp_path, role, variables, message):
    rc, out = play(tmp_path, role, dict(KUBECONFIG, **variables))
    assert rc != 0, out[-3000:]
    assert message in out, out[-3000:]
    assert "Check the timeouts and counts" in out
    # Nothing after the first task ran.
    assert out.count("TASK [") <= 2, out[-3000:]


def test_a_typo_in_a_claim_template_is_refused(tmp_path):
    rc, out = play(tmp_path, "dra_driver", dict(KUBECONFIG, dra_driver_claim_templates=[
        {"name": "vfio-gpu", "namespace": "default", "devcie_class": "vfio.gpu.nvidia.com"}]))
    assert rc != 0
    assert "devcie_class" in out and "dra_driver_claim_templates" in out, out[-3000:]


def test_a_secret_input_is_never_printed(tmp_path):
    """The pull secret password, given with a typo elsewhere in the inputs so that validation fails, does not
    appear anywhere in the output; neither do an AWX credential's inputs."""
    rc, out = play(tmp_path, "gpu_operator", dict(KUBECONFIG, gpu_operator_pull_secret_password=SECRET,
                                                  gpu_operator_wait_timeout="bad"))
    assert rc != 0 and "gpu_operator_wait_timeout" in out
    assert SECRET not in out
    rc, out = play(tmp_path, "awx_objects", {"awx_objects_credentials": [
        {"name": "reg", "credential_type": "gpuops container registry", "inputs": {"password": SECRET}, "typo": 1}]})
    assert rc != 0 and "typo" in out, out[-3000:]
    assert SECRET not in out


SECRET_WORDS = ("password", "token", "secret_key", "api_key", "apikey", "oauthtoken")


def secret_options(options, prefix=""):
    """(name, spec) of every option (sub-options too) whose name says it holds a secret, or inputs of credentials."""
    found = []
    for name, spec in (options or {}).items():
        path = prefix + name
        if any(word in name.lower() for word in SECRET_WORDS) and spec.get("type", "str") in ("str", "raw", "dict") \
                and not name.endswith(("_name", "_file", "_path")):
            found.append((path, spec))
        if path == "awx_objects_credentials.inputs":
            found.append((path, spec))
        found.extend(secret_options(spec.get("options"), path + "."))
    return found


def test_every_secret_input_of_every_role_is_no_log():
    checked, missing = [], []
    for role in sorted(os.listdir(os.path.join(TOP, "roles"))):
        path = os.path.join(TOP, "roles", role, "meta", "argument_specs.yml")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as handle:
            specs = yaml.safe_load(handle)["argument_specs"]
        for entry in specs.values():
            for name, spec in secret_options(entry.get("options")):
                checked.append(name)
                if not spec.get("no_log"):
                    missing.append(name)
    assert "gpu_operator_pull_secret_password" in checked and "awx_objects_credentials.inputs" in checked
    assert missing == []
