"""Secret inputs through the roles' failure paths: nothing prints them.

Every role with a secret input runs for real (ansible-playbook, connection local) with a recognisable secret in
every secret input, arranged so that one failure path after the input checks is reached: a registry, a Kubernetes
API server or an AWX controller that refuses connections or answers with an error, a builder or helm that fails,
a .run that is not there. Each path is one inventory host of one playbook run (the hosts run side by side, which
keeps the file fast), with a secret of its own (and a suffix per input, so that a module hiding the value of one
input does not hide another's); the playbook runs twice, at the default verbosity and with -vvv and --diff. A test
per path and run checks that the host failed at the intended task (so it cannot pass by failing early), that the
failure still says what went wrong, and that the secret shows nowhere in the output or the log file: not as it is,
URL-encoded, or base64-encoded (as in an Authorization header or a .dockerconfigjson).

The fake commands print their argv and stdin, and the fake servers quote what they were sent when they refuse it
(see fakes/role_fakes.py): a role that shows a tool's error output or an API's error message shows a secret it passed on.

Secret inputs (the argument specs' no_log options, and the kubeconfig every cluster role reads):
  vgpu_manager_image: vgpu_manager_image_password, the kubeconfig of vgpu_manager_image_kubeconfig;
  gpu_operator: gpu_operator_pull_secret_password, the kubeconfig of gpu_operator_kubeconfig;
  awx_objects: awx_objects_controller_password, awx_objects_controller_oauthtoken, awx_objects_credentials[].inputs;
  cluster_nodes, cluster_validate, dra_driver, kubevirt_devices, host_reboot: the kubeconfig (its token).
"""

import concurrent.futures
import hashlib
import json
import os
import secrets
import sys

import pytest
import yaml

from ansible_collections.gpuops.sandbox.tests.unit.fakes import role_fakes
from ansible_collections.gpuops.sandbox.tests.unit.playbook import ansible_playbook

VERSION = "550.90.05"
RUN_NAME = "NVIDIA-Linux-x86_64-%s-vgpu-kvm.run" % VERSION
RUN_CONTENT = b"#!/bin/sh\necho fake vGPU Manager\n"
CHECKSUM_LABEL = "io.github.gpuops.vgpu-manager.run-sha256"

# The callback that records, per host, the first failure not ignored: the task and its message as shown.
RECORDER = '''
import json
from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "secret_test_failures"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.failures = {}
        self.item_msgs = {}

    def v2_runner_item_on_failed(self, result):
        self.item_msgs.setdefault(result._host.get_name(), str(result._result.get("msg", "")))

    def v2_runner_on_failed(self, result, ignore_errors=False):
        host = result._host.get_name()
        item_msg = self.item_msgs.pop(host, "")
        if not ignore_errors:
            self.failures.setdefault(host, {"task": result._task.name,
                                            "msg": item_msg or str(result._result.get("msg", ""))})

    def v2_playbook_on_stats(self, stats):
        with open(%r, "w") as handle:
            json.dump(self.failures, handle)
'''

PLAYBOOK = [{
    "name": "Secrets through the roles' failure paths",
    "hosts": "all",
    # Each host goes its own way: one role's waits (a connection retry, a registry) do not hold up the others.
    "strategy": "free",
    "gather_facts": False,
    "environment": "{{ secret_test_env }}",
    "tasks": [{"name": "Run the role under test",
               "ansible.builtin.include_role": {"name": "gpuops.sandbox.{{ secret_test_role }}"}}],
}]


class Path:
    """One failure path: the role, the task it must fail at, a text its failure message must hold (the reason
    is still told), the fake commands' verbs that fail, and the host variables (a function of the world and the
    path's secret)."""

    def __init__(self, name, role, task, says, variables, fail=()):
        self.name, self.role, self.task, self.says, self.variables, self.fail = name, role, task, says, variables, fail


def kubeconfig(world, name, secret, server):
    """A kubeconfig whose user authenticates with a bearer token made of ``secret``."""
    path = os.path.join(world["dir"], "kubeconfig-" + name)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                   "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                   "clusters": [{"name": "k", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                   "users": [{"name": "u", "user": {"token": secret + "-kubeconfig"}}]}, handle)
    return path


def closed_kubeconfig(world, name, secret):
    return kubeconfig(world, name, secret, "https://127.0.0.1:%d" % world["closed"])


# ---------------------------------------------------------------------------------------------
# vgpu_manager_image: the registry password (token request, credential check, builder login, pull secret)
# ---------------------------------------------------------------------------------------------

def vgpu(registry=None, **extra):
    def variables(world, name, secret):
        result = {
            "vgpu_manager_image_driver_version": VERSION,
            "vgpu_manager_image_run_file": world["run_file"],
            "vgpu_manager_image_context_dir": world["context"],
            "vgpu_manager_image_registry": "127.0.0.1:%d" % (world[registry].port if registry else world["closed"]),
            "vgpu_manager_image_repository": "gpuops",
            "vgpu_manager_image_username": "gpuops",
            "vgpu_manager_image_password": secret,
            "vgpu_manager_image_validate_certs": False,
            "vgpu_manager_image_builder": "podman",
            "vgpu_manager_image_isolation": "chroot",
            "vgpu_manager_image_registry_timeout": 10,
            "vgpu_manager_image_build_timeout": 60,
        }
        result.update((key, value(world, name, secret) if callable(value) else value) for key, value in extra.items())
        return result
    return variables


VGPU = [
    # The .run is read before anything else; the password is in the play all along.
    Path("vgpu-run-file-missing", "vgpu_manager_image", "Check the .run exists", "was not found",
         vgpu(vgpu_manager_image_run_file="/nonexistent/" + RUN_NAME)),
    # uri with url_password, answered 401.
    Path("vgpu-token-service-refuses", "vgpu_manager_image", "Check the token service accepted the credentials",
         "Authentication refused", vgpu("registry_bearer_refusing")),
    # uri with an Authorization header made from the password, answered 401.
    Path("vgpu-registry-refuses-credentials", "vgpu_manager_image", "Check the credentials were accepted",
         "Authentication refused", vgpu("registry_basic_refusing")),
    # The builder reads the password on stdin and fails: its error output is shown.
    Path("vgpu-login-fails", "vgpu_manager_image", "Check the login succeeded", "could not log in",
         vgpu("registry_empty"), fail=["login"]),
    # The API server refuses the Secret, quoting it.
    Path("vgpu-pull-secret-refused", "vgpu_manager_image", "Check the image pull secret was created",
         "denied the request",
         vgpu("registry_current", vgpu_manager_image_kubeconfig=lambda w, n, s: kubeconfig(w, n, s, w["kube_refusing"].url))),
]


# ---------------------------------------------------------------------------------------------
# gpu_operator: the pull secret password, and the kubeconfig
# ---------------------------------------------------------------------------------------------

def operator(kube=None, **extra):
    def variables(world, name, secret):
        server = world[kube].url if kube else "https://127.0.0.1:%d" % world["closed"]
        result = {
            "gpu_operator_kubeconfig": kubeconfig(world, name, secret, server),
            "gpu_operator_helm_binary": os.path.join(world["bin"], "helm"),
            "gpu_operator_chart_repo_url": "",
            "gpu_operator_chart_ref": "/nonexistent/gpu-operator-chart",
            "gpu_operator_kube_version": "v1.33.1",
            "gpu_operator_hosts": [],
            "gpu_operator_pull_secret_registry": "registry.example:5000",
            "gpu_operator_pull_secret_username": "gpuops",
            "gpu_operator_pull_secret_password": secret,
        }
        result.update(extra)
        return result
    return variables


GPU_OPERATOR = [
    # helm template gets the chart values on stdin (they must not hold the password) and fails on the chart.
    Path("operator-chart-refused", "gpu_operator", "Check the GPU Operator chart accepts the values", "refuses the values",
         operator(), fail=["template"]),
    # The API server refuses the Secret, quoting it.
    Path("operator-pull-secret-refused", "gpu_operator", "Check the image pull secret was created", "denied the request",
         operator("kube_refusing")),
]


# ---------------------------------------------------------------------------------------------
# awx_objects: the controller's password or token, the credentials' inputs
# ---------------------------------------------------------------------------------------------

def awx(server=None, auth="password", **extra):
    def variables(world, name, secret):
        result = {
            "awx_objects_source_dir": world["checkout"],
            "awx_objects_controller_host": world[server].url if server else "http://127.0.0.1:%d" % world["closed"],
            "awx_objects_request_timeout": 10,
            # No groups, job templates or workflow (nor roles to derive surveys from): less to do before the credentials.
            "awx_objects_inventory_groups": [],
            "awx_objects_job_templates": [],
            "awx_objects_workflow_nodes": [],
            "awx_objects_credentials": [
                {"name": "gpuops registry", "credential_type": "gpuops container registry",
                 "inputs": {"host": "registry.example:5000", "username": "gpuops", "password": secret + "-registry"}},
                {"name": "gpuops kubeconfig", "credential_type": "gpuops kubeconfig",
                 "inputs": {"kubeconfig": "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user: {token: %s-kubeconfig}\n" % secret}}],
        }
        if auth == "password":
            result.update(awx_objects_controller_username="admin", awx_objects_controller_password=secret + "-controller")
        else:
            result.update(awx_objects_controller_oauthtoken=secret + "-controller")
        result.update(extra)
        return result
    return variables


AWX = [
    # Every awx.awx module gets the token through module_defaults; the first one cannot connect.
    Path("awx-refuses-connections", "awx_objects", "Create the project", "Connection refused", awx(auth="token")),
    # The controller (after a password login) refuses the credentials, quoting their inputs.
    Path("awx-refuses-the-credentials", "awx_objects", "Check the credentials were created",
         "Could not create or update the credentials: gpuops registry", awx("awx")),
    # The objects written instead of sent (--diff shows them) leave the credentials' inputs out.
    Path("awx-render-path-missing", "awx_objects", "Write the objects to a file instead of a controller", "does not exist",
         awx(awx_objects_render_path="/nonexistent/objects.json")),
]


# ---------------------------------------------------------------------------------------------
# The cluster roles: the kubeconfig's token, the API server refusing connections
# ---------------------------------------------------------------------------------------------

def cluster(role, hosts=None, **extra):
    def variables(world, name, secret):
        result = {role + "_kubeconfig": closed_kubeconfig(world, name, secret)}
        if hosts:
            result[role + "_hosts"] = [name]  # the test host itself, a container node
            result["gpuops_workload_type"] = "container"
        result.update(extra)
        return result
    return variables


CLUSTER = [
    Path("nodes-api-unreachable", "cluster_nodes", "Label and taint the GPU nodes", "cannot reach the API server",
         cluster("cluster_nodes", hosts=True)),
    Path("validate-api-unreachable", "cluster_validate", "Check every GPU node is ready for its workload type", "still lacks",
         cluster("cluster_validate", hosts=True, cluster_validate_retries=1, cluster_validate_delay=1,
                 cluster_validate_stuck_labels=False)),
    Path("kubevirt-api-unreachable", "kubevirt_devices", "Permit the hosts' GPUs in the KubeVirt CR and turn on the feature gates",
         "cannot reach the API server", cluster("kubevirt_devices", hosts=True)),
    Path("dra-api-unreachable", "dra_driver", "Read the API server's version (the chart's kubeVersion is checked against it)",
         "cannot reach the API server", cluster("dra_driver")),
    # The reboot cannot happen: the drain before it fails, and ansible.builtin.reboot refuses a local connection.
    Path("reboot-api-unreachable", "host_reboot", "List the VMs with GPUs on the node", "Connection refused",
         cluster("host_reboot", host_reboot_allowed=True, host_reboot_reasons=["secret test"])),
]

PATHS = VGPU + GPU_OPERATOR + AWX + CLUSTER


# ---------------------------------------------------------------------------------------------
# The world the roles meet, and the two runs
# ---------------------------------------------------------------------------------------------

def build_world(top):
    """The files, fake commands and servers the paths use, under the directory ``top``."""
    world = {"dir": str(top), "bin": role_fakes.fake_commands(os.path.join(top, "bin")), "closed": role_fakes.closed_port()}
    world["run_file"] = os.path.join(top, RUN_NAME)
    with open(world["run_file"], "wb") as handle:
        handle.write(RUN_CONTENT)
    os.makedirs(os.path.join(top, "context", "vgpu-manager", "ubuntu22.04"))
    with open(os.path.join(top, "context", "vgpu-manager", "ubuntu22.04", "Dockerfile"), "w", encoding="utf-8") as handle:
        handle.write("FROM scratch\n")
    world["context"] = os.path.join(top, "context")
    # awx_objects reads the argument specs of the checkout's roles for the surveys: an empty checkout has none.
    world["checkout"] = os.path.join(top, "checkout")
    os.makedirs(os.path.join(world["checkout"], "roles"))
    os.makedirs(os.path.join(world["checkout"], "playbooks"))
    tls = role_fakes.self_signed_tls(str(top))
    current = {CHECKSUM_LABEL: hashlib.sha256(RUN_CONTENT).hexdigest()}
    world["servers"] = {
        "registry_bearer_refusing": role_fakes.FakeRegistry(tls, auth="bearer", accept=False),
        "registry_basic_refusing": role_fakes.FakeRegistry(tls, auth="basic", accept=False),
        "registry_empty": role_fakes.FakeRegistry(tls, auth="basic"),
        "registry_current": role_fakes.FakeRegistry(tls, auth="basic", labels=current),
        "kube_refusing": role_fakes.FakeKubernetes(secrets="refuse"),
        "awx": role_fakes.FakeAwx(),
    }
    world.update(world["servers"])
    return world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = build_world(str(tmp_path_factory.mktemp("secrets")))
    yield world
    for server in world["servers"].values():
        server.close()


def run_all(world, name, *options, paths=None):
    """Run every path (or ``paths``) as one host of one playbook; return (output, log file text, failures by host,
    secret by path)."""
    paths = PATHS if paths is None else paths
    top = os.path.join(world["dir"], name)
    os.makedirs(os.path.join(top, "callbacks"))
    os.makedirs(os.path.join(top, "tmp"))
    with open(os.path.join(top, "callbacks", "secret_test_failures.py"), "w", encoding="utf-8") as handle:
        handle.write(RECORDER % os.path.join(top, "failures.json"))
    hosts, path_secrets = {}, {}
    for path in paths:
        secret = "S3cr3t-%s" % secrets.token_hex(8)
        path_secrets[path.name] = secret
        hosts[path.name] = dict(path.variables(world, path.name, secret), ansible_connection="local",
                                ansible_python_interpreter=sys.executable, secret_test_role=path.role,
                                secret_test_env={"PATH": world["bin"] + os.pathsep + os.environ.get("PATH", ""),
                                                 "GPUOPS_FAKE_FAIL": " ".join(path.fail)})
    with open(os.path.join(top, "inventory.yml"), "w", encoding="utf-8") as handle:
        yaml.safe_dump({"all": {"hosts": hosts}}, handle)
    with open(os.path.join(top, "play.yml"), "w", encoding="utf-8") as handle:
        yaml.safe_dump(PLAYBOOK, handle, sort_keys=False)
    log = os.path.join(top, "ansible.log")
    env = {"ANSIBLE_CALLBACK_PLUGINS": os.path.join(top, "callbacks"), "ANSIBLE_CALLBACKS_ENABLED": "secret_test_failures",
           "ANSIBLE_LOG_PATH": log, "ANSIBLE_FORKS": str(len(paths)), "TMPDIR": os.path.join(top, "tmp")}
    rc, out = ansible_playbook("-i", os.path.join(top, "inventory.yml"), os.path.join(top, "play.yml"), *options,
                               env=env, timeout=600)
    assert rc != 0, out[-3000:]
    with open(os.path.join(top, "failures.json"), encoding="utf-8") as handle:
        failures = json.load(handle)
    with open(log, encoding="utf-8", errors="replace") as handle:
        logged = handle.read()
    return out, logged, failures, path_secrets


RUNS = {"default": (), "vvv-diff": ("-vvv", "--diff")}


@pytest.fixture(scope="module")
def runs(world):
    """Both runs, side by side (each waits on its servers and its hosts' modules much of the time)."""
    with concurrent.futures.ThreadPoolExecutor(len(RUNS)) as pool:
        futures = dict((name, pool.submit(run_all, world, name, *options)) for name, options in RUNS.items())
        return dict((name, future.result()) for name, future in futures.items())


@pytest.mark.parametrize("verbosity", list(RUNS))
@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_the_secret_is_not_shown(runs, path, verbosity):
    out, logged, failures, path_secrets = runs[verbosity]
    secret = path_secrets[path.name]
    failure = failures.get(path.name)
    assert failure is not None, "%s did not fail (%s)" % (path.name, verbosity)
    assert failure["task"] == path.task, "%s failed at %r, not at %r: %s" % (
        path.name, failure["task"], path.task, failure["msg"][:2000])
    assert path.says in failure["msg"], failure["msg"][:2000]
    for where, text in (("output", out), ("log file", logged)):
        forms = role_fakes.secret_forms_in(text, secret)
        assert not forms, "%s: the secret shows %s in the %s (%s):\n%s" % (
            path.name, " and ".join(forms), where, verbosity, context_of(text, secret))


def context_of(text, secret, width=300):
    """Lines around where ``secret`` shows, for the assertion message."""
    index = text.find(secret)
    if index < 0:
        return text[-2000:]
    return text[max(0, index - width):index + width]
