"""preflight decides the vfio-pci binding of a vm-passthrough node before anything changes, also while the IOMMU
is still off (a host not prepared yet), from the functions of each GPU's PCI slot.

The call is the host's plan's (the host_plan filter): the plan is worked out from the facts and the inputs, the
role's block turns its call into vfio_bind's arguments as Ansible templates them, the module runs with those
arguments on a fake host booted with the IOMMU off (a GPU, its audio and a USB controller on uhci_hcd in one slot),
and the rescue message is templated from the module's failure.
"""

import os

import pytest

from ansible_collections.gpuops.sandbox.plugins.filter.host_plan import host_plan
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.vfio_bind_host import RELEASE, make_host, run
from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted

BLOCK = "Decide the vfio-pci binding before anything changes"
OMIT = "__omit_place_holder__"
GROUP_DRIVERS = ["snd_hda_intel", "xhci_hcd", "nvidia-gpu", "ucsi_ccg"]


def block():
    return next(t for t in load("roles/preflight/tasks/main.yml") if t.get("name") == BLOCK)


def variables(workload_type, iommu_on, gpus=None, binding="host", extra_drivers=(), remove_claims=False):
    """What the play has when the block runs: the facts of gpu_facts, the host's plan from them, the block's vars."""
    iommu = {"enabled": iommu_on, "group_count": 9 if iommu_on else 0, "platform_vendor": "intel",
             "firmware_tables": ["DMAR"]}
    gpus = gpus if gpus is not None else [{"address": st.SLOT_GPU, "driver": "nvidia"}]
    host = {"managed_files": {"vfio_rules": []}}
    plan = host_plan(gpus, iommu, host, {
        "workload_type": workload_type, "vendor_ids": ["10de"], "vfio_binding": binding,
        "vfio_group_drivers": GROUP_DRIVERS + list(extra_drivers), "remove_vfio_claims": remove_claims,
        "vgpu_devices": "operator"})
    found = dict(inventory_hostname="gpu-1", group_names=[], preflight_type=workload_type, omit=OMIT,
                 gpu_facts_iommu=iommu, gpu_facts_gpus=gpus, gpu_facts_host=host, preflight_plan=plan)
    found.update(trusted(block()["vars"]))
    return found


def selected(found):
    return templar(found).evaluate_conditional(trusted(block()["when"]))


def module_args(found):
    task = block()["block"][0]
    assert task["check_mode"] is True
    args = templar(found).template(trusted(task["gpuops.sandbox.vfio_bind"]))
    return {name: value for name, value in args.items() if value != OMIT}


@pytest.mark.parametrize("workload_type, iommu_on, chosen, predicted", [
    ("vm-passthrough", False, True, True),   # the defect: skipped while the IOMMU was off
    ("vm-passthrough", True, True, False),
    ("container", False, False, False),      # nothing of vfio-pci to undo
    ("vm-vgpu", True, False, False),
])
def test_the_block_runs_while_the_iommu_is_off_and_predicts_then_only(workload_type, iommu_on, chosen, predicted):
    found = variables(workload_type, iommu_on)
    assert selected(found) is chosen
    if chosen:
        args = module_args(found)
        assert args["assume_slot_groups"] is predicted
        assert args["state"] == "present" and args["include_group"] is True and args["persistent"] is True
        assert args["vendors"] == ["10de"] and args["allowed_group_drivers"] == GROUP_DRIVERS


def test_operator_binding_is_not_predicted():
    assert selected(variables("vm-passthrough", False, binding="operator")) is False


@pytest.fixture
def slot_host(tmp_path, monkeypatch):
    return make_host(monkeypatch, st.build_vfio_slot_host(tmp_path, RELEASE))


def rescue_message(found, failure):
    task = block()["rescue"][0]
    return templar(dict(found, ansible_failed_result=failure)).template(trusted(task["ansible.builtin.fail"]["msg"]))


def test_a_slot_sibling_on_a_driver_not_allowed_stops_the_host_before_the_reboot(monkeypatch, slot_host):
    tree, kernel = slot_host
    before = tree.snapshot()
    found = variables("vm-passthrough", False)
    kind, result = run(monkeypatch, slot_host, module_args(found), check=True)
    assert kind == "fail"
    assert "0000:01:00.2 (8086:2934, class 0c0300) is in the PCI slot of 0000:01:00.0" in result["msg"]
    assert "bound to uhci_hcd" in result["msg"]
    assert tree.snapshot() == before and kernel.writes == []
    msg = rescue_message(found, result)
    assert msg.startswith("gpu-1 cannot be prepared as a vm-passthrough node: refusing to change anything: ")
    assert ("A function that goes to vfio-pci with a GPU (its IOMMU group, predicted from its PCI slot as the IOMMU "
            "is not on yet) is on a driver not allowed. Either add that driver to gpuops_vfio_group_drivers (the "
            "role input preflight_vfio_group_drivers, which host_prepare binds with)") in msg
    assert msg.endswith("or unbind the function from that driver, or disable it (e.g. in the firmware setup). "
                        "Nothing was changed.")

    # The inventory allows the driver: the same check plans the whole slot, as host_prepare will bind it.
    found = variables("vm-passthrough", False, extra_drivers=["uhci_hcd"])
    kind, result = run(monkeypatch, slot_host, module_args(found), check=True)
    assert kind == "exit", result
    assert [(d["address"], d["after"]) for d in result["devices"]] == [
        (st.SLOT_GPU, "vfio-pci"), (st.SLOT_AUDIO, "vfio-pci"), (st.SLOT_USB, "vfio-pci")]
    assert tree.snapshot() == before and kernel.writes == []


def test_other_refusals_keep_the_short_message():
    found = variables("vm-passthrough", True)
    msg = rescue_message(found, {"msg": "refusing to change anything: 0000:01:00.0 is in use (driver nvidia)"})
    assert msg == ("gpu-1 cannot be prepared as a vm-passthrough node: refusing to change anything: 0000:01:00.0 is "
                   "in use (driver nvidia). Nothing was changed.")


def test_preflight_checks_with_remove_claims_what_host_prepare_will_remove(monkeypatch, slot_host):
    """Leaving vm-passthrough with a GPU claimed in modprobe.d: refused unless gpuops_vfio_remove_claims is set."""
    tree, kernel = slot_host
    kernel.do_unbind(st.SLOT_GPU, "nvidia", "x", "x")
    kernel.do_bind(st.SLOT_GPU, "vfio-pci", "x", "x")
    kernel.writes.clear()
    tree.write("/etc/modprobe.d/vfio.conf", "options vfio-pci ids=10de:2236\n")
    before = tree.snapshot()

    def leaving(**inputs):
        found = variables("container", False, gpus=[{"address": st.SLOT_GPU, "driver": "vfio-pci"}], **inputs)
        assert selected(found) is True
        return found

    found = leaving()
    args = module_args(found)
    assert args["state"] == "absent" and args["remove_claims"] is False
    kind, result = run(monkeypatch, slot_host, args, check=True)
    assert kind == "fail" and "options vfio-pci ids=10de:2236 in /etc/modprobe.d/vfio.conf" in result["msg"]
    msg = rescue_message(found, result)
    assert msg.endswith("Set gpuops_vfio_remove_claims=true (the role input preflight_remove_vfio_claims, and "
                        "host_prepare's host_prepare_remove_vfio_claims) to have the preparation remove those claims. "
                        "Nothing was changed.")

    found = leaving(remove_claims=True)
    args = module_args(found)
    assert args["remove_claims"] is True
    kind, result = run(monkeypatch, slot_host, args, check=True)
    assert kind == "exit", result
    assert result["files_changed"] == ["/etc/modprobe.d/vfio.conf"] and result["initramfs_rebuild_required"] is True
    assert tree.snapshot() == before and kernel.writes == []
    # Other refusals do not suggest it.
    assert "gpuops_vfio_remove_claims" not in rescue_message(found, {"msg": "refusing to change anything: in use"})


def test_binding_leaves_remove_claims_out():
    """vfio_bind reads remove_claims only when it gives functions back; the plan's binding does not carry it."""
    args = module_args(variables("vm-passthrough", True, remove_claims=True))
    assert args["state"] == "present" and "remove_claims" not in args


def test_a_network_interface_the_host_uses_in_the_slot_is_refused_without_the_advice_to_allow_its_driver(
        monkeypatch, tmp_path):
    """The hostile lab VM: an e1000 the host runs on (enp1s0f3), function 3 of the GPU's slot."""
    tree = st.build_vfio_slot_host(tmp_path, RELEASE)
    tree.add_function("0000:01:00.3", "8086", "100e", "020000", parent=st.SLOT_PORT, driver="e1000")
    tree.mkdir("/sys/bus/pci/devices/0000:01:00.3/net/enp1s0f3")
    host = make_host(monkeypatch, tree)
    found = variables("vm-passthrough", False, extra_drivers=["uhci_hcd"])
    kind, result = run(monkeypatch, host, module_args(found), check=True)
    assert kind == "fail", result
    msg = " ".join(rescue_message(found, result).split())
    assert "is a live network interface of the host, enp1s0f3 (driver e1000)" in msg
    assert ("A network interface the host uses would go to vfio-pci with a GPU: do not add its driver to "
            "gpuops_vfio_group_drivers, which would take the interface away from the host.") in msg
    assert "Either add that driver" not in msg and "add e1000" not in msg
    assert msg.endswith("Nothing was changed.")


@pytest.mark.parametrize("audio_driver", ["snd_hda_intel", "pci-stub", None])
def test_the_plan_expects_on_vfio_pci_what_vfio_bind_binds(monkeypatch, tmp_path, audio_driver):
    """host_verify checks the prepared host against the plan's expected.vfio: on the model GPU host (IOMMU on), it
    names exactly the functions vfio_bind's own check-mode run with the plan's arguments would put on vfio-pci - the
    A10 and its audio function, which vfio_bind leaves where it is when it is parked on pci-stub."""
    from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
    from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call_main

    tree = st.build_vfio_gpu_host(str(tmp_path), RELEASE)
    devdir = tree.functions[st.A10_AUDIO]
    os.unlink(tree.path("/sys/bus/pci/drivers/snd_hda_intel/" + st.A10_AUDIO))
    os.unlink(tree.path(devdir + "/driver"))
    if audio_driver:
        tree.bind(st.A10_AUDIO, audio_driver)
    kind, result = call_main(monkeypatch, gpu_facts, tree.root, {"vendors": ["10de:2236"]})
    assert kind == "exit", result
    facts = result["ansible_facts"]
    plan = host_plan(facts["gpu_facts_gpus"], facts["gpu_facts_iommu"], facts["gpu_facts_host"],
                     {"workload_type": "vm-passthrough", "vendor_ids": ["10de"], "device_ids": ["2236"]})
    host = make_host(monkeypatch, tree)
    kind, result = run(monkeypatch, host, plan["calls"]["vfio_bind"], check=True)
    assert kind == "exit", result
    bound = sorted(d["address"] for d in result["devices"] if d["after"] == "vfio-pci")
    assert plan["expected"]["vfio"] == bound
    assert (st.A10_AUDIO in bound) is (audio_driver != "pci-stub"), bound
