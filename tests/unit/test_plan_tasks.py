"""The role tasks that read a host's plan: preflight's one refusal, worded from the plan's refusals, and host_prepare's
check that the plan was worked out from its own inputs. The plans are the host_plan filter's, from the facts
gpu_facts reads on the fake H200 host of FACTS.md (Ubuntu 24.04, driver 580.159.04 from the distribution); the tasks
are taken from the roles' files and templated as Ansible templates them."""

from ansible_collections.gpuops.sandbox.tests.unit.plugins.filter.test_host_plan import NVIDIA, h200_facts, plan_of
from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted

REFUSE = "Stop on what the plan of the host refuses"
CHECK = "Check that the plan was worked out from this role's inputs"


def refusal(plan, workload_type):
    task = next(t for t in load("roles/preflight/tasks/main.yml") if t.get("name") == REFUSE)
    found = templar({"inventory_hostname": "h200", "preflight_type": workload_type, "preflight_plan": plan})
    check = task["ansible.builtin.assert"]
    passes = all(found.evaluate_conditional(trusted(c)) for c in check["that"])
    return passes, " ".join(found.template(trusted(check["fail_msg"])).split())


def test_a_refused_host_is_told_each_refusal_with_its_fix(monkeypatch, tmp_path):
    tree = h200_facts(monkeypatch, tmp_path)
    tree.write("/etc/os-release", 'ID=fedora\nVERSION_ID="41"\nPRETTY_NAME="Fedora Linux 41"\n')
    plan = plan_of(monkeypatch, tree, "vm-passthrough", selectors=NVIDIA, vfio_binding="operator",
                   supported_os={"ubuntu": ["24.04"]})
    passes, message = refusal(plan, "vm-passthrough")
    assert not passes
    assert message.startswith("h200 cannot be prepared as a vm-passthrough node: Fedora Linux 41 (ID=fedora, "
                              "VERSION_ID=41) is not supported (operating system); use one of: ubuntu 24.04; the GPUs "
                              "0000:65:00.0, "), message
    assert message.endswith("are held by the NVIDIA driver installed on the host (updates/dkms/nvidia.ko.zst, version "
                            "580.159.04), which the GPU Operator's vfio-manager leaves alone, so they would never reach "
                            "VMs (host driver); remove the host's NVIDIA driver packages, or let the collection bind "
                            "the GPUs (gpuops_vfio_binding: host). Nothing was changed."), message


def test_a_host_the_plan_accepts_passes(monkeypatch, tmp_path):
    plan = plan_of(monkeypatch, h200_facts(monkeypatch, tmp_path), "vm-passthrough", selectors=NVIDIA)
    assert refusal(plan, "vm-passthrough")[0] is True


def differing(plan, **inputs):
    """host_prepare's check with its defaults (the gpuops_ variables and preflight's exports) and these inputs."""
    task = next(t for t in load("roles/host_prepare/tasks/main.yml") if t.get("name") == CHECK)
    found = dict(trusted(load("roles/host_prepare/defaults/main.yml")), **trusted(load("roles/host_prepare/vars/main.yml")))
    found.update(inventory_hostname="h200", preflight_plan=plan, preflight_type=plan["workload_type"],
                 preflight_cpu_vendor=plan["cpu_vendor"], preflight_vfio_binding_mode=plan["settings"]["vfio_binding"],
                 preflight_vgpu_devices_mode=plan["settings"]["vgpu_devices"],
                 preflight_vfio_group_drivers_list=plan["settings"]["vfio_group_drivers"], **inputs)
    found.update(trusted(task["vars"]))
    check = task["ansible.builtin.assert"]
    t = templar(found)
    return t.template(trusted(task["vars"]["__host_prepare_differs"])), " ".join(t.template(trusted(check["fail_msg"])).split())


def test_host_prepare_takes_the_plan_worked_out_from_the_same_inputs(monkeypatch, tmp_path):
    tree = h200_facts(monkeypatch, tmp_path)
    plan = plan_of(monkeypatch, tree, "vm-passthrough", selectors=NVIDIA)
    assert differing(plan)[0] == []
    assert differing(plan, gpuops_gpu_vendor_ids=["10de"], gpuops_vfio_remove_claims="no")[0] == []


def test_host_prepare_stops_on_an_input_the_plan_was_not_worked_out_from(monkeypatch, tmp_path):
    plan = plan_of(monkeypatch, h200_facts(monkeypatch, tmp_path), "vm-passthrough", selectors=NVIDIA)
    names, message = differing(plan, host_prepare_iommu_pt=False, gpuops_gpu_device_ids=["2335"])
    assert names == ["vendors", "iommu_pt"]
    assert message == (
        "host_prepare on h200 was given other inputs than the plan of the preflight role was worked out from: vendors "
        "[\"10de:2335\"] here, [\"10de\"] in the plan; iommu_pt false here, true in the plan. Give both roles the same "
        "values (preflight_<name> and host_prepare_<name>; the gpuops_ variables set both). Nothing was changed.")


def test_host_prepare_stops_on_vgpu_inputs_the_plan_was_not_worked_out_from(monkeypatch, tmp_path):
    """A vm-vgpu node's VF and vGPU device calls come from the plan: another configuration name or VF count given to
    host_prepare alone would be ignored without a word, so the check names it (the vgpu entry of the settings)."""
    config = {"version": "v1", "vgpu-configs": {"H200-8C": [{"devices": "all", "vgpu-devices": {"H200-8C": 2}}],
                                                "H200-16C": [{"devices": "all", "vgpu-devices": {"H200-16C": 1}}]}}
    plan = plan_of(monkeypatch, h200_facts(monkeypatch, tmp_path), "vm-vgpu", selectors=NVIDIA,
                   vgpu_device_config=config, vgpu_config_name="H200-8C", sriov_numvfs="4")
    assert plan["settings"]["vgpu"]["config_name"] == "H200-8C" and plan["settings"]["vgpu"]["sriov_numvfs"] == 4
    same = {"gpuops_vgpu_device_config": config, "gpuops_vgpu_config_name": "H200-8C", "gpuops_sriov_numvfs": 4}
    assert differing(plan, **same)[0] == []
    names, message = differing(plan, **dict(same, host_prepare_vgpu_config_name="H200-16C"))
    assert names == ["vgpu"], names
    assert '"config_name": "H200-16C"' in message and '"config_name": "H200-8C"' in message, message
    # Elsewhere the vGPU inputs shape no call and are not compared.
    passthrough = plan_of(monkeypatch, h200_facts(monkeypatch, tmp_path / "p"), "vm-passthrough", selectors=NVIDIA)
    assert "vgpu" not in passthrough["settings"]
    assert differing(passthrough, host_prepare_vgpu_config_name="H200-16C")[0] == []
