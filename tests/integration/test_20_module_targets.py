"""Each module's integration target (tests/integration/targets/<module>) on a real lab host.

They run on lab-modules, the lab's spare host (outside gpu_nodes, started only when named), while the
three workload-type scenarios of test_40 run on the GPU hosts in the background. The host starts from
the pristine image (IOMMU off); kernel_cmdline turns the IOMMU on through grub; the host then reboots
once, and the other targets run on the IOMMU-enabled kernel. The host is reset and stopped at the end.
"""

import os

import pytest

from conftest import TOP, lab, run

HOST = "lab-modules"
TARGETS_DIR = os.path.join(TOP, "tests", "integration", "targets")
# kernel_cmdline first (it needs the pristine command line); the rest after the reboot.
BEFORE_REBOOT = ["kernel_cmdline"]
AFTER_REBOOT = ["iommu_check", "gpu_facts", "sriov_vfs", "mdev_create", "vfio_bind", "host_lock"]


def run_tasks(tmp_path, name, tasks):
    playbook = tmp_path / ("%s.yml" % name)
    playbook.write_text(
        "- name: Integration target %s\n  hosts: %s\n  gather_facts: false\n  tasks:\n%s" % (name, HOST, tasks)
    )
    return run(["ansible-playbook", "-i", "inventories/lab/", str(playbook)], timeout=2400)


def include(target):
    return "    - name: Run %s\n      ansible.builtin.include_tasks: %s\n" % (
        target, os.path.join(TARGETS_DIR, target, "tasks", "main.yml"))


@pytest.fixture(scope="module")
def pristine_host(scenario_batch):  # pylint: disable=unused-argument
    # The scenarios start first (the fixture), then this host boots from the pristine image beside them.
    lab("reset", "--no-start", HOST, check=True)
    proc = lab("start", HOST, timeout=1800)
    assert proc.returncode == 0, proc.stdout
    yield HOST
    lab("reset", "--no-start", HOST)


def target_present(target):
    return os.path.isfile(os.path.join(TARGETS_DIR, target, "tasks", "main.yml"))


@pytest.mark.parametrize("target", BEFORE_REBOOT)
def test_target_before_reboot(pristine_host, tmp_path, target):
    proc = run_tasks(tmp_path, target, include(target))
    assert proc.returncode == 0, proc.stdout[-8000:]


def test_reboot_applies_the_iommu_arguments(pristine_host, tmp_path):
    proc = run_tasks(tmp_path, "reboot", """    - name: Reboot once into the new command line
      ansible.builtin.reboot:
        reboot_timeout: 1200
        # Back only when the root file system takes writes (modules need a temporary directory).
        test_command: touch /var/tmp/.gpuops-reboot-test && rm -f /var/tmp/.gpuops-reboot-test
    - name: Read the running command line and the IOMMU groups
      ansible.builtin.command: cat /proc/cmdline /sys/kernel/iommu_groups/0/type
      register: after
      changed_when: false
    - name: The IOMMU is on
      ansible.builtin.assert:
        that:
          - "'intel_iommu=on' in after.stdout_lines[0].split()"
          - "'intel_iommu=off' not in after.stdout_lines[0].split()"
""")
    assert proc.returncode == 0, proc.stdout[-8000:]


@pytest.mark.parametrize("target", AFTER_REBOOT)
def test_target_after_reboot(pristine_host, tmp_path, target):
    if not target_present(target):
        pytest.fail("integration target %s is missing" % target)
    proc = run_tasks(tmp_path, target, include(target))
    assert proc.returncode == 0, proc.stdout[-8000:]
