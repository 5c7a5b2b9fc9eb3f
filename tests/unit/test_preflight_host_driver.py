"""preflight refuses a VM node whose GPUs a driver installed on the host holds, when the GPU Operator would have to
give them to VMs (its vfio-manager skips such GPUs silently; its vGPU Manager cannot load beside the driver), and
says what to do. The task is taken from the role's task file and templated as Ansible templates it, with the facts
of the real H200 host of FACTS.md (driver 580.159.04 from the distribution, GPU 0000:00:06.0 on nvidia)."""

import pytest

from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted

TASK = "Check that no driver installed on the host holds the GPUs the operator must give to VMs"
H200_GPU = {"address": "0000:00:06.0", "vendor": "10de", "device": "2335", "driver": "nvidia"}
HOST_DRIVER = {"loaded": True, "version": "580.159.04", "host_module": "updates/dkms/nvidia.ko.zst", "source": "host"}


def task():
    return next(t for t in load("roles/preflight/tasks/main.yml") if t.get("name") == TASK)


def outcome(workload_type, driver=None, binding="operator", vgpu="operator", gpus=None):
    """(runs, passes, message) of the task for a host with these facts."""
    found = dict(inventory_hostname="h200", preflight_type=workload_type, preflight_vfio_binding_mode=binding,
                 preflight_vgpu_devices_mode=vgpu, gpu_facts_gpus=gpus if gpus is not None else [H200_GPU],
                 gpu_facts_host={"nvidia_driver": driver or HOST_DRIVER})
    found.update(trusted(task()["vars"]))
    t = templar(found)
    runs = t.evaluate_conditional(trusted(task()["when"]))
    check = task()["ansible.builtin.assert"]
    passes = all(t.evaluate_conditional(trusted(c)) for c in check["that"])
    return runs, passes, " ".join(t.template(trusted(check["fail_msg"])).split())


def test_vm_passthrough_by_the_operator_is_refused_with_the_fix():
    runs, passes, message = outcome("vm-passthrough")
    assert runs and not passes
    assert message == (
        "h200 is a vm-passthrough node whose GPUs 0000:00:06.0 are held by the NVIDIA driver installed on the host "
        "(updates/dkms/nvidia.ko.zst, version 580.159.04). The GPU Operator's vfio-manager skips GPUs a host driver "
        "holds, so they would never reach VMs: remove the host's NVIDIA driver packages, or let the collection bind "
        "the GPUs (gpuops_vfio_binding: host). Nothing was changed.")


def test_vm_vgpu_by_the_operator_is_refused():
    runs, passes, message = outcome("vm-vgpu")
    assert runs and not passes and "The vGPU Manager the GPU Operator deploys cannot load beside it" in message


@pytest.mark.parametrize("workload_type, driver, binding, gpus, runs, passes", [
    ("vm-passthrough", None, "host", None, False, True),          # vfio_bind takes them off the driver itself
    ("container", None, "operator", None, False, True),           # a container node keeps its driver
    ("vm-passthrough", dict(HOST_DRIVER, source="operator"), "operator", None, True, True),  # the operator's own
    ("vm-passthrough", None, "operator", [dict(H200_GPU, driver="vfio-pci")], True, True),  # not held
])
def test_other_hosts_pass(workload_type, driver, binding, gpus, runs, passes):
    found = outcome(workload_type, driver, binding, gpus=gpus)
    assert found[0] is runs and (not runs or found[1] is passes)


MIG_TASK = "Check that no GPU of a node turning into a VM node is in MIG mode"


def mig_outcome(workload_type, instances):
    task_ = next(t for t in load("roles/preflight/tasks/main.yml") if t.get("name") == MIG_TASK)
    found = dict(inventory_hostname="h200", preflight_type=workload_type,
                 gpu_facts_gpus=[dict(H200_GPU, mig_instances=instances), {"address": "0000:00:07.0", "driver": None}])
    found.update(trusted(task_["vars"]))
    t = templar(found)
    check = task_["ansible.builtin.assert"]
    return (t.evaluate_conditional(trusted(task_["when"])),
            all(t.evaluate_conditional(trusted(c)) for c in check["that"]),
            " ".join(t.template(trusted(check["fail_msg"])).split()))


def test_a_gpu_in_mig_mode_stops_a_switch_to_a_vm_type_with_the_way_out():
    runs, passes, message = mig_outcome("vm-passthrough", 7)
    assert runs and not passes
    assert message.startswith("h200 is to become a vm-passthrough node, but its GPUs 0000:00:06.0 have MIG GPU "
                              "instances") and "gpuops_mig_config: all-disabled" in message
    assert mig_outcome("vm-vgpu", 2)[:2] == (True, False) and mig_outcome("dra", 1)[:2] == (True, False)
    # No instances (MIG off, or not on nvidia: null), or a container node: nothing to stop.
    assert mig_outcome("vm-passthrough", 0)[:2] == (True, True)
    assert mig_outcome("vm-passthrough", None)[:2] == (True, True)
    assert mig_outcome("container", 7)[0] is False


def test_debians_packaged_driver_read_by_gpu_facts_is_refused_on_a_vm_node(monkeypatch, tmp_path):
    """Debian 12's nvidia-kernel-dkms (updates/dkms/nvidia-current.ko, loaded as nvidia): the facts gpu_facts gathers
    on such a tree make the refusal fire, naming the renamed file."""
    from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
    from ansible_collections.gpuops.sandbox.tests.unit.fakes import nvidia_packages as nv
    from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
    from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call_main

    host = st.build_gpu_host(tmp_path)
    nv.install_debian_dkms(host, "nvidia-current")
    kind, result = call_main(monkeypatch, gpu_facts, host.root, {})
    assert kind == "exit", result
    facts = result["ansible_facts"]
    held = [gpu for gpu in facts["gpu_facts_gpus"] if gpu["driver"] == "nvidia"]
    assert held, "the fake host has a GPU on nvidia"
    runs, passes, message = outcome("vm-passthrough", facts["gpu_facts_host"]["nvidia_driver"], gpus=held)
    assert runs and not passes
    assert ("held by the NVIDIA driver installed on the host (updates/dkms/nvidia-current.ko, version %s)"
            % nv.DEBIAN_VERSION) in message
