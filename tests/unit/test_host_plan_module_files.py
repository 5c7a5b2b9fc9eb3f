# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The names of the module file sets come from the roles (module_files): the plan's kernel_modules calls and change
texts use them, and gpu_facts finds the files by them, on the lab's fake host tree. Nothing in module_utils knows the
names but as the default of those options."""

from __future__ import annotations

import os

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.host_plan import host_plan
from ansible_collections.gpuops.sandbox.plugins.module_utils import _cluster, _host, _host_plan, _modprobe
from ansible_collections.gpuops.sandbox.plugins.modules import gpu_facts
from ansible_collections.gpuops.sandbox.tests.unit.fakes import sysfs_tree as st
from ansible_collections.gpuops.sandbox.tests.unit.fakes.module_harness import call_main

KERNEL = "6.1.0-18-amd64"
LAB_SELECTORS = {"vendors": ["1234:11e8"], "classes": ["00ff00"]}
LAB_SETTINGS = {"vendor_ids": ["1234"], "device_ids": ["11e8"], "class_ids": ["00ff00"]}
DEBIAN = 'ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n'
OTHER = {"nouveau": "acme-nouveau", "vfio": "acme.vfio_boot"}
DEFAULT = {"nouveau": "gpuops-nouveau", "vfio": "gpuops-vfio"}


def lab_host(tmp_path):
    """The lab's q35 layout as the pristine image boots it: Debian 12, one kernel with its initramfs."""
    tree = st.build_lab_host(tmp_path)
    tree.write("/etc/os-release", DEBIAN)
    tree.write("/proc/sys/kernel/osrelease", KERNEL + "\n")
    tree.set_cpuinfo(st.CPUINFO_INTEL)
    tree.mkdir("/lib/modules/%s/kernel" % KERNEL)
    tree.write("/boot/vmlinuz-" + KERNEL, "kernel")
    tree.write("/boot/initrd.img-" + KERNEL, "image")
    return tree


def write_sets(tree, names, age=None):
    """The files a vm-passthrough preparation writes for the sets ``names`` (``age``: their mtime)."""
    nouveau, vfio = _modprobe.set_files(names["nouveau"]), _modprobe.set_files(names["vfio"])
    paths = [nouveau["modprobe"], vfio["modprobe"], vfio["load"]]
    tree.write(paths[0], "blacklist nouveau\noptions nouveau modeset=0\n")
    tree.write(paths[1], "softdep nvidia pre: vfio-pci\n")
    tree.write(paths[2], "vfio\nvfio_iommu_type1\nvfio_pci\n")
    if age is not None:
        for path in paths:
            os.utime(tree.path(path), (age, age))
    return paths


def facts(monkeypatch, tree, module_files=None):
    args = dict(LAB_SELECTORS, **({"module_files": module_files} if module_files is not None else {}))
    kind, result = call_main(monkeypatch, gpu_facts, tree.root, args)
    assert kind == "exit", result
    return result["ansible_facts"]


def plan_of(found, workload_type, **settings):
    given = dict(LAB_SETTINGS, workload_type=workload_type, **settings)
    return host_plan(found["gpu_facts_gpus"], found["gpu_facts_iommu"], found["gpu_facts_host"], given,
                     mdev_parents=found["gpu_facts_mdev_parents"])


def module_file_changes(plan):
    return [change["detail"] for change in plan["changes"] if change["what"] == "module files"]


def test_the_plan_and_the_facts_use_the_names_the_roles_give(monkeypatch, tmp_path):
    tree = lab_host(tmp_path)
    plan = plan_of(facts(monkeypatch, tree, OTHER), "vm-passthrough", module_files=OTHER)
    assert plan["calls"]["nouveau"]["name"] == "acme-nouveau"
    assert plan["calls"]["vfio_modules"]["name"] == "acme.vfio_boot"
    assert plan["settings"]["module_files"] == OTHER
    changes = module_file_changes(plan)
    assert changes[0] == "blacklist nouveau (/etc/modprobe.d/acme-nouveau.conf)"
    assert changes[1].endswith("(acme.vfio_boot)")
    assert not [text for text in changes if "gpuops-" in text]

    # What the preparation writes under those names, after the image was built: gpu_facts finds it by them.
    image = os.stat(tree.path("/boot/initrd.img-" + KERNEL)).st_mtime
    paths = write_sets(tree, OTHER, age=image + 60)
    found = facts(monkeypatch, tree, OTHER)
    managed = found["gpu_facts_host"]["managed_files"]
    assert managed["nouveau"] == [paths[0]]
    assert managed["vfio_modules"] == [paths[1], paths[2]]
    # The image is older than the files it must carry, though none of them has the collection's prefix.
    running = [k for k in found["gpu_facts_host"]["kernels"] if k["running"]]
    assert running[0]["initramfs_stale"] is True
    assert "/etc/modprobe.d/acme-nouveau.conf" in running[0]["problems"][0]

    # The plan of the host with its files sees them: nothing left to write.
    assert module_file_changes(plan_of(found, "vm-passthrough", module_files=OTHER)) == []
    # Leaving vm-passthrough removes the vfio set of that name.
    container = plan_of(found, "container", module_files=OTHER)
    assert container["calls"]["vfio_modules"] == {"name": "acme.vfio_boot", "state": "absent"}
    assert "/etc/modules-load.d/acme.vfio_boot.conf" in module_file_changes(container)[0]


def test_gpu_facts_finds_the_files_of_the_names_it_is_given_and_not_the_defaults(monkeypatch, tmp_path):
    """The coupling of the fact to hard-coded names is gone: with other names the default files are somebody
    else's, and without module_files the other names are."""
    tree = lab_host(tmp_path)
    other = write_sets(tree, OTHER)
    default = write_sets(tree, DEFAULT)
    managed = facts(monkeypatch, tree, OTHER)["gpu_facts_host"]["managed_files"]
    assert managed["nouveau"] == [other[0]] and managed["vfio_modules"] == other[1:]
    managed = facts(monkeypatch, tree)["gpu_facts_host"]["managed_files"]
    assert managed["nouveau"] == [default[0]] and managed["vfio_modules"] == default[1:]
    # One name given: the other keeps its default.
    managed = facts(monkeypatch, tree, {"vfio": OTHER["vfio"]})["gpu_facts_host"]["managed_files"]
    assert managed["nouveau"] == [default[0]] and managed["vfio_modules"] == other[1:]
    assert _host.managed_paths(OTHER)["nouveau"] == [other[0]]


def test_the_default_names_are_the_ones_the_plan_and_gpu_facts_start_from(monkeypatch, tmp_path):
    tree = lab_host(tmp_path)
    plan = plan_of(facts(monkeypatch, tree), "vm-passthrough")
    assert plan["settings"]["module_files"] == DEFAULT == _host_plan.DEFAULTS["module_files"]
    assert (plan["calls"]["nouveau"]["name"], plan["calls"]["vfio_modules"]["name"]) == ("gpuops-nouveau", "gpuops-vfio")


@pytest.mark.parametrize("value, words", [
    ({"nouveau": "../evil", "vfio": "gpuops-vfio"}, ["nouveau: name '../evil' is not valid",
                                                     "letters, digits, '.', '_' and '-'"]),
    ({"nouveau": "gpuops-nouveau", "vfio": "a b"}, ["vfio: name 'a b' is not valid"]),
    ({"nouveau": "x" * 65, "vfio": "gpuops-vfio"}, ["65 characters, at most 64"]),
    ({"nouveau": "", "vfio": "gpuops-vfio"}, ["name '' is not valid"]),
    ({"nouveau": 5, "vfio": "gpuops-vfio"}, ["name 5 is not valid"]),
    ({"nouveau": "same", "vfio": "same"}, ["names one set twice"]),
    ({"nouveau": "gpuops-nouveau"}, ["must name the sets nouveau and vfio", "missing: vfio"]),
    ({"nouveau": "a", "vfio": "b", "extra": "c"}, ["unknown: extra"]),
    ("gpuops-nouveau", ["'gpuops-nouveau' is not a mapping of nouveau and vfio to set names"]),
])
def test_a_bad_name_is_refused_naming_it_and_what_is_accepted(monkeypatch, tmp_path, value, words):
    found = facts(monkeypatch, lab_host(tmp_path))
    with pytest.raises(AnsibleFilterError) as caught:
        plan_of(found, "vm-passthrough", module_files=value)
    message = str(caught.value.message)
    assert message.startswith("host_plan: module_files: ")
    for word in words:
        assert word in message, message
    with pytest.raises(_cluster.PlanError):
        _host_plan.host_plan(dict(LAB_SETTINGS, workload_type="container", module_files=value), [], {}, {})


@pytest.mark.parametrize("value, words", [
    ({"nouveau": "../evil"}, ["module_files: nouveau: name '../evil' is not valid", "starting with a letter or digit"]),
    ({"nouveau": "same", "vfio": "same"}, ["module_files: ", "names one set twice"]),
])
def test_gpu_facts_refuses_a_bad_name_without_a_traceback(monkeypatch, tmp_path, value, words):
    tree = lab_host(tmp_path)
    kind, result = call_main(monkeypatch, gpu_facts, tree.root, dict(LAB_SELECTORS, module_files=value))
    assert kind == "fail"
    for word in words:
        assert word in result["msg"], result["msg"]
    assert "Traceback" not in result["msg"]


def test_a_mapping_of_the_two_sets_is_accepted_and_an_unknown_set_is_not():
    assert _modprobe.sets_problem({"nouveau": "a", "vfio": "b"}) is None
    assert "unknown: other" in _modprobe.sets_problem({"nouveau": "a", "vfio": "b", "other": "c"})


def test_both_roles_take_the_names_from_one_inventory_variable(monkeypatch, tmp_path):
    """preflight's plan and host_prepare's calls: gpuops_module_files sets both, and host_prepare stops when its
    names are not the plan's."""
    from ansible_collections.gpuops.sandbox.tests.unit.plugins.filter.test_host_plan import NVIDIA, h200_facts
    from ansible_collections.gpuops.sandbox.tests.unit.plugins.filter.test_host_plan import plan_of as h200_plan
    from ansible_collections.gpuops.sandbox.tests.unit.templating import load, templar, trusted
    from ansible_collections.gpuops.sandbox.tests.unit.test_plan_tasks import differing

    defaults = trusted(load("roles/preflight/defaults/main.yml"))
    for given, expected in (({}, DEFAULT), ({"gpuops_module_files": OTHER}, OTHER)):
        found = templar(dict(defaults, **given))
        assert found.template(trusted(defaults["preflight_module_files"])) == expected
    plan = h200_plan(monkeypatch, h200_facts(monkeypatch, tmp_path), "vm-passthrough", selectors=NVIDIA,
                     module_files=OTHER)
    assert differing(plan, gpuops_module_files=OTHER)[0] == []
    names, message = differing(plan)
    assert names == ["module_files"]
    assert "module_files {\"nouveau\": \"gpuops-nouveau\", \"vfio\": \"gpuops-vfio\"} here" in message, message
