"""What cluster_validate waits for on each node (its vars __cluster_validate_want_labels), templated as Ansible
templates the role's files: the operator's deploy labels of the node's workload type, but not the driver on a node
whose driver is installed on the host (the collection labels it deploy.driver=false), and on a container node with
a MIG config the MIG Manager and, unless turned off, the MIG config state it reports."""

import pytest

from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted

DEFAULTS = load("roles/cluster_validate/defaults/main.yml")
VARS = load("roles/cluster_validate/vars/main.yml")


def wanted(entry, **settings):
    variables = trusted(dict(DEFAULTS, **VARS))
    variables.update(settings)
    variables["__cluster_validate_entry"] = entry
    return templar(variables).template(variables["__cluster_validate_want_labels"])


def entry(wtype="container", **fields):
    return dict({"name": "n1", "workload_type": wtype, "driver_source": None, "mig_config": None}, **fields)


def deploy(*operands):
    return ["nvidia.com/gpu.deploy.%s=true" % o for o in operands]


@pytest.mark.parametrize("node, settings, want", [
    (entry(), {}, deploy("driver", "container-toolkit", "device-plugin")),
    (entry(driver_source="host"), {}, deploy("container-toolkit", "device-plugin")),
    (entry(driver_source="operator"), {}, deploy("driver", "container-toolkit", "device-plugin")),
    (entry("dra", driver_source="host"), {}, deploy("container-toolkit")),
    (entry(mig_config="all-1g.18gb", driver_source="host"), {},
     deploy("container-toolkit", "device-plugin", "mig-manager") + ["nvidia.com/mig.config.state=success"]),
    (entry(mig_config="all-1g.18gb"), {"cluster_validate_mig_config_state": False},
     deploy("driver", "container-toolkit", "device-plugin", "mig-manager")),
    (entry(mig_config="all-1g.18gb"), {"cluster_validate_operator_labels": False}, []),
    (entry("vm-passthrough", mig_config="all-1g.18gb"), {}, deploy("vfio-manager", "sandbox-device-plugin")),
])
def test_what_each_node_is_waited_for(node, settings, want):
    assert wanted(node, **settings) == want
