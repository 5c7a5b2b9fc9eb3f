"""host_prepare removes the host's own vfio-pci claims when it gives GPUs back (gpuops_vfio_remove_claims).

The calls are the host's plan's (the host_plan filter): vfio_release.yml passes the input to vfio_bind
(remove_claims); boot.yml takes the vfio-pci.ids arguments vfio_bind names (cmdline_claims) off the kernel command
line, keeping other devices' entries, counts that as a change and a reason to reboot, and rebuilds the initramfs when
vfio_bind changed a modprobe.d file. The tasks are taken from the
role's files and templated as Ansible templates them.
"""

import pytest

from ansible_collections.gpuops.sandbox.plugins.filter.host_plan import host_plan
from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted

SKIPPED = {"changed": False, "skipped": True}
CLAIMS = [{"argument": "vfio-pci.ids=10de:2236,10de:1aef", "replace_with": None},
          {"argument": "vfio_pci.ids=10de:2236,8086:1234", "replace_with": "vfio_pci.ids=8086:1234"}]


def task(path, name):
    return next(t for t in load("roles/host_prepare/" + path) if t.get("name") == name)


def with_vars(found, entry):
    return dict(found, **trusted(entry.get("vars") or {}))


def when(found, entry):
    conditions = entry["when"] if isinstance(entry["when"], list) else [entry["when"]]
    return all(templar(found).evaluate_conditional(trusted(c)) for c in conditions)


def plan_calls(workload_type, managed_cmdline=(), gpus=(), **settings):
    """The calls of the host's plan (no GPU needed: these tasks act on what an earlier type left)."""
    iommu = {"platform_vendor": "intel", "firmware_tables": ["DMAR"], "cmdline": ""}
    facts = {"managed_files": {"kernel_cmdline": list(managed_cmdline)}}
    return host_plan(list(gpus), iommu, facts, dict(settings, workload_type=workload_type, require_gpus=False,
                                                    vgpu_devices="operator"))["calls"]


@pytest.mark.parametrize("settings, wanted", [({}, False), ({"remove_vfio_claims": True}, True)])
def test_vfio_release_passes_the_input_to_vfio_bind(settings, wanted):
    calls = plan_calls("container", gpus=[{"address": "0000:65:00.0", "driver": "vfio-pci"}], **settings)
    release = task("tasks/vfio_release.yml", "Give GPUs left on vfio-pci by an earlier workload type back to their host drivers")
    args = templar({"__host_prepare_calls": calls}).template(trusted(release["gpuops.sandbox.vfio_bind"]))
    assert args["remove_claims"] is wanted and args["state"] == "absent" and args["include_group"] is True


REMOVE = "Take this collection's IOMMU arguments and the GPUs' vfio-pci.ids claims off the kernel command line"
REPLACE = "Keep only the other devices' entries in the vfio-pci.ids arguments that claimed the GPUs given back"
IOMMU_OFF = ["intel_iommu=on", "amd_iommu=on", "iommu=pt"]


def host(workload_type, managed_cmdline=()):
    return {"__host_prepare_calls": plan_calls(workload_type, managed_cmdline),
            "gpu_facts_host": {"managed_files": {"kernel_cmdline": list(managed_cmdline)}}}


def test_the_cmdline_claims_go_to_kernel_cmdline():
    found = dict(host("vm-vgpu"), __host_prepare_vfio_unbind={"changed": True, "cmdline_claims": CLAIMS})
    remove, replace = task("tasks/boot.yml", REMOVE), task("tasks/boot.yml", REPLACE)
    assert when(with_vars(found, remove), remove) and when(with_vars(found, replace), replace)
    args = templar(with_vars(found, remove)).template(trusted(remove["gpuops.sandbox.kernel_cmdline"]))
    assert args == {"arguments": ["vfio-pci.ids=10de:2236,10de:1aef"], "state": "absent"}
    args = templar(with_vars(found, replace)).template(trusted(replace["gpuops.sandbox.kernel_cmdline"]))
    assert args == {"arguments": ["vfio_pci.ids=8086:1234"]}


def test_a_container_node_takes_the_iommu_arguments_and_the_claims_off_in_one_change():
    remove = task("tasks/boot.yml", REMOVE)
    managed = ["/etc/default/grub.d/99-gpuops-sandbox.cfg"]
    found = dict(host("container", managed), __host_prepare_vfio_unbind={"changed": True, "cmdline_claims": CLAIMS})
    assert when(with_vars(found, remove), remove)
    args = templar(with_vars(found, remove)).template(trusted(remove["gpuops.sandbox.kernel_cmdline"]))
    assert args == {"arguments": IOMMU_OFF + ["vfio-pci.ids=10de:2236,10de:1aef"], "state": "absent"}
    # no claim: only the IOMMU arguments; nothing of this collection's on the command line: only the claims
    found = host("container", managed)
    args = templar(with_vars(found, remove)).template(trusted(remove["gpuops.sandbox.kernel_cmdline"]))
    assert when(with_vars(found, remove), remove) and args["arguments"] == IOMMU_OFF
    found = dict(host("container"), __host_prepare_vfio_unbind={"changed": True, "cmdline_claims": CLAIMS})
    args = templar(with_vars(found, remove)).template(trusted(remove["gpuops.sandbox.kernel_cmdline"]))
    assert when(with_vars(found, remove), remove) and args["arguments"] == ["vfio-pci.ids=10de:2236,10de:1aef"]


@pytest.mark.parametrize("found", [{}, {"__host_prepare_vfio_unbind": {"changed": False, "cmdline_claims": []}},
                                   {"__host_prepare_vfio_unbind": {"changed": True, "files_changed": []}}])
@pytest.mark.parametrize("workload_type", ["container", "vm-vgpu", "dra"])
def test_no_cmdline_claim_no_kernel_cmdline_call(found, workload_type):
    for name in (REMOVE, REPLACE):
        entry = task("tasks/boot.yml", name)
        assert not when(with_vars(dict(found, **host(workload_type)), entry), entry)


def removal_task(found):
    entry = task("tasks/boot.yml", "Remove the vfio boot settings of an earlier workload type")
    found = with_vars(dict(found, __host_prepare_calls=plan_calls("container")), entry)
    return when(found, entry), templar(found).template(trusted(entry["gpuops.sandbox.kernel_modules"]["rebuild"]))


def test_a_modprobe_d_claim_removed_rebuilds_the_initramfs():
    host = {"gpu_facts_host": {"managed_files": {"vfio_modules": []}}}
    unbind = {"changed": True, "files_changed": ["/etc/modprobe.d/vfio.conf"], "initramfs_rebuild_required": True}
    assert removal_task(dict(host, __host_prepare_vfio_unbind=unbind)) == (True, "always")
    unbind = {"changed": True, "files_changed": ["/etc/driverctl.d/pci-0000:65:00.0"], "initramfs_rebuild_required": False}
    assert removal_task(dict(host, __host_prepare_vfio_unbind=unbind))[0] is False
    assert removal_task(host)[0] is False


def reboot_facts(**registered):
    entry = task("tasks/boot.yml", "Record why the host needs a reboot")
    names = ["__host_prepare_nouveau", "__host_prepare_vfio_modules", "__host_prepare_vfio_modules_removed",
             "__host_prepare_cmdline", "__host_prepare_cmdline_removed", "__host_prepare_claims_replaced",
             "__host_prepare_kernels"]
    found = dict({name: SKIPPED for name in names}, **registered)
    return templar(found).template(trusted(entry["ansible.builtin.set_fact"]))


@pytest.mark.parametrize("name", ["__host_prepare_cmdline_removed", "__host_prepare_claims_replaced"])
def test_a_claim_taken_off_the_command_line_is_a_change_and_a_reason_to_reboot(name):
    facts = reboot_facts(**{name: {"changed": True, "reboot_required": True}})
    assert facts["host_prepare_changed"] is True
    assert facts["host_prepare_reboot_reasons"] == ["kernel command line changed"]
    facts = reboot_facts()
    assert facts["host_prepare_changed"] is False and facts["host_prepare_reboot_reasons"] == []


def test_another_kernels_initramfs_rebuilt_is_a_change_but_no_reason_to_reboot():
    other = {"changed": True, "kernels_rebuilt": [{"kernel": "6.1.0-51-amd64", "running": False}]}
    facts = reboot_facts(__host_prepare_kernels=other)
    assert facts["host_prepare_changed"] is True and facts["host_prepare_reboot_reasons"] == []
    running = {"changed": True, "kernels_rebuilt": [{"kernel": "6.1.0-50-amd64", "running": True}]}
    assert reboot_facts(__host_prepare_kernels=running)["host_prepare_reboot_reasons"] == [
        "initramfs of the running kernel rebuilt"]


def test_a_function_left_to_the_boot_is_not_expected_back_on_a_fixed_driver():
    entry = task("tasks/vfio_release.yml", "Remember which driver each function went back to (host_verify checks it, also after the reboot)")
    devices = [{"address": "0000:01:00.0", "changed": True, "after": "nvidia", "until_boot": None},
               {"address": "0000:02:00.0", "changed": True, "after": None, "until_boot": []},
               {"address": "0000:03:00.0", "changed": True, "after": None, "until_boot": ["nouveau"]},
               {"address": "0000:04:00.0", "changed": False, "after": "snd_hda_intel", "until_boot": None},
               {"address": "0000:05:00.0", "changed": True, "after": None, "until_boot": None}]
    found = with_vars({"__host_prepare_vfio_unbind": {"devices": devices}}, entry)
    facts = templar(found).template(trusted(entry["ansible.builtin.set_fact"]))
    assert facts["host_prepare_restored"] == {"0000:01:00.0": "nvidia", "0000:05:00.0": None}


def kernel(version, running=False, stale=False):
    return {"version": version, "running": running, "initramfs_stale": stale, "entries": [], "problems": []}


@pytest.mark.parametrize("kernels, wanted", [
    ([kernel("6.1.0-50-amd64", running=True)], False),
    ([kernel("6.1.0-50-amd64", running=True, stale=True)], True),
    ([kernel("6.1.0-50-amd64", running=True), kernel("6.1.0-56-amd64")], True),
    ([kernel("6.1.0-56-amd64")], True),
    ([], True),
    (None, True),
])
def test_the_kernels_rebuild_runs_unless_the_one_kernel_is_the_running_one_and_current(kernels, wanted):
    entry = task("tasks/boot.yml", "Rebuild the initramfs of each installed kernel built without the collection's module files")
    found = {"gpu_facts_host": {"managed_files": {}}}
    if kernels is not None:
        found["gpu_facts_host"]["kernels"] = kernels
    assert when(with_vars(found, entry), entry) is wanted


@pytest.mark.parametrize("path, name, module_vars", [
    ("roles/host_prepare/tasks/runtime.yml", "Bind the GPUs and their IOMMU group siblings to vfio-pci, persistently",
     "roles/host_prepare/defaults/main.yml"),
    ("roles/preflight/tasks/main.yml", "Check that the GPUs can be bound to vfio-pci, or given back to their host drivers",
     "roles/preflight/defaults/main.yml"),
])
def test_the_warning_about_a_hand_made_claim_names_the_playbooks_input(monkeypatch, tmp_path, path, name, module_vars):
    """vfio_bind, run with the advice the role gives it on a host claimed by hand, warns in the playbook's words."""
    from ansible.module_utils import basic
    from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
    from ansible_collections.gpuops.sandbox.tests.unit.fakes.vfio_bind_host import RELEASE, make_host, run

    def find(tasks):
        for entry in tasks:
            if entry.get("name") == name:
                return entry
            found = find(entry.get("block") or [])
            if found:
                return found
        return None

    entry = find(load(path))
    found = dict(trusted(load(module_vars)), **trusted(entry.get("vars") or {}))
    advice = " ".join(templar(found).template(trusted(entry["gpuops.sandbox.vfio_bind"]["host_claims_advice"])).split())
    assert "gpuops_vfio_remove_claims=true" in advice and "state=absent" not in advice, advice
    host = make_host(monkeypatch, st.build_vfio_gpu_host(tmp_path, RELEASE))
    tree, _kernel = host
    tree.set_cmdline("BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/sda1 ro intel_iommu=on iommu=pt "
                     "vfio-pci.ids=10de:2236,10de:1aef")
    warned = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: warned.append(text))
    kind, result = run(monkeypatch, host, {"addresses": [st.A10], "include_group": True, "persistent": True,
                                           "host_claims_advice": advice}, check=True)
    assert kind == "exit", result
    claimed = [w for w in warned if "claimed for vfio-pci by the host's own settings" in w]
    assert len(claimed) == 1 and claimed[0].endswith(advice), warned
    assert "state=absent" not in claimed[0] and " remove_claims=true" not in claimed[0]
