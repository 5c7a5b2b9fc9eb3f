"""What role gpu_operator gives the chart for GPU sharing and the driver, from the inventory: the role's defaults and
vars templated as Ansible templates them (the preflight renders the real chart with the same values; test_72
installs them and reads them back from the ClusterPolicy)."""

import yaml

from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted

HOST_DRIVER = {"nvidia_driver": {"loaded": True, "version": "580.159.04", "host_module": "updates/dkms/nvidia.ko.zst",
                                 "source": "host"}}
OPERATOR_DRIVER = {"nvidia_driver": {"loaded": True, "version": "580.95.05", "host_module": None, "source": "operator"}}


def values(hosts, **inputs):
    """The chart values for GPU hosts ``hosts`` ({name: host variables}) and the play's ``inputs``."""
    hostvars = {name: dict({"inventory_hostname": name}, **hv) for name, hv in hosts.items()}
    # Role defaults, then the inventory's inputs over them, then the role's vars (Ansible's precedence).
    found = dict(trusted(load("roles/gpu_operator/defaults/main.yml")), groups={"gpu_nodes": list(hosts)},
                 hostvars=hostvars)
    found.update(inputs)
    found.update(trusted(load("roles/gpu_operator/vars/main.yml")))
    return templar(found).template(trusted("{{ __gpu_operator_values }}"))


def test_nothing_asked_keeps_the_charts_defaults():
    found = values({"a": {"gpuops_workload_type": "container"}})
    assert set(found) == {"sandboxWorkloads", "ccManager"}


def test_sharing_and_driver_values():
    mig = {"all-disabled": [{"devices": "all", "mig-enabled": False}],
           "h200-three-2g": [{"devices": "all", "mig-enabled": True, "mig-devices": {"2g.35gb": 3}}]}
    plugin = {"four-way": {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}}
    found = values({"a": {"gpuops_workload_type": "container"}}, gpuops_mig_strategy="mixed", gpuops_mig_configs=mig,
                   gpuops_device_plugin_configs=plugin, gpuops_device_plugin_config_default="four-way",
                   gpuops_driver_upgrade_policy={"maxUnavailable": "50%"}, gpuops_driver_version="580.95.05")
    assert found["mig"] == {"strategy": "mixed"}
    config = found["migManager"]["config"]
    assert (config["create"], config["name"], config["default"]) == (True, "gpuops-mig-parted-config", "all-disabled")
    assert yaml.safe_load(config["data"]["config.yaml"]) == {"version": "v1", "mig-configs": mig}
    plugin_config = found["devicePlugin"]["config"]
    assert (plugin_config["name"], plugin_config["default"]) == ("gpuops-device-plugin-config", "four-way")
    # Each configuration a YAML document of its own, with the version the plugin requires.
    assert yaml.safe_load(plugin_config["data"]["four-way"]) == dict(plugin["four-way"], version="v1")
    assert found["driver"] == {"upgradePolicy": {"maxUnavailable": "50%"}, "version": "580.95.05"}


def test_the_operators_driver_is_off_only_when_every_container_node_has_one_of_its_own():
    both = {"a": {"gpuops_workload_type": "container", "gpu_facts_host": HOST_DRIVER},
            "b": {"gpuops_workload_type": "dra", "gpu_facts_host": HOST_DRIVER},
            "vm": {"gpuops_workload_type": "vm-passthrough", "gpu_facts_host": OPERATOR_DRIVER}}
    assert values(both)["driver"] == {"enabled": False}
    one = dict(both, b={"gpuops_workload_type": "container", "gpu_facts_host": OPERATOR_DRIVER})
    assert "driver" not in values(one)
    # Facts not gathered: nothing is known, the operator's driver stays.
    assert "driver" not in values({"a": {"gpuops_workload_type": "container"}})
    # The user's own values win.
    assert values(both, gpuops_driver_version="x", gpu_operator_values={"driver": {"enabled": True}})["driver"] == {
        "enabled": True, "version": "x"}
