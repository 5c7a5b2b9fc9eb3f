"""lab-dra after a kernel update and dra -> vm-passthrough -> dra: a prepared dra node again (the dra scenario's own
checks, imported below), what the vm-passthrough leg looked like on this host's shape, and each leg on the kernel the
distribution installed, recorded by side_effect.yml."""

import importlib.util
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_DRA = _load("dra_node", "..", "..", "dra", "tests", "test_dra_node.py")
lab_functions = _load("lab_functions", "..", "..", "shared", "lab_functions.py")
# The dra scenario's checks of a prepared node, run here as they are, with the fixtures they use.
globals().update((name, value) for name, value in vars(_DRA).items()
                 if name.startswith("test_") or name in ("found", "handed"))

# The drivers the group companions of lab-dra's first GPU have on a host that never bound them (by class).
HOST_DRIVERS = {"0x040300": "snd_hda_intel", "0x0c0330": "xhci_hcd"}


def leg(host, name):
    report = json.loads(host.file("/var/tmp/gpuops-dra-switch-%s.json" % name).content_string)
    return report, lab_functions.parse(report["functions"])


def test_the_passthrough_leg_was_ready_and_probed(host):
    report, functions = leg(host, "vm-passthrough")
    assert report["workload_type"] == "vm-passthrough" and report["ready"] is True, report["checks"]
    gpus = lab_functions.gpus(functions)
    # vfio_probe made a VMM's calls for each GPU of this shape (the one behind the PCIe switch included).
    probe = report["vfio_probe"]
    assert probe["verdict"] == "yes" and probe["failed"] == 0 and probe["probed"] >= len(gpus) == 2, probe
    assert "a VMM can take the devices" in [c["check"] for c in report["checks"] if c["ok"]]
    assert report["reboot"]["method"] != "none"


def test_the_passthrough_leg_bound_every_function_of_the_groups(host):
    """The GPU in slot 03 with its audio and USB functions, the GPU behind the switch (whose group also holds
    the switch's downstream port, a bridge, left on pcieport)."""
    _report, functions = leg(host, "vm-passthrough")
    gpus, companions = lab_functions.gpus(functions), lab_functions.companions(functions)
    assert sorted(functions[a]["class"] for a in companions) == ["0x040300", "0x0c0330"], companions
    assert {a: functions[a]["driver"] for a in gpus + companions} == {a: "vfio-pci" for a in gpus + companions}
    behind_switch = [a for a in gpus if not a.startswith("0000:00:")]
    assert behind_switch, gpus
    bridges = [a for a, f in functions.items()
               if f["group"] == functions[behind_switch[0]]["group"] and f["class"].startswith("0x0604")]
    assert bridges and all(functions[a]["driver"] == "pcieport" for a in bridges), bridges


def test_the_way_back_gave_every_function_its_driver(host):
    report, functions = leg(host, "dra")
    assert report["workload_type"] == "dra" and report["ready"] is True, report["checks"]
    companions = lab_functions.companions(functions)
    assert {a: functions[a]["driver"] for a in companions} == {
        a: HOST_DRIVERS[functions[a]["class"]] for a in companions}
    assert [a for a, f in functions.items() if f["override"] != "(null)" or f["driver"] == "vfio-pci"] == []
    assert report["reboot"]["method"] != "none"


def installed(host):
    """What side_effect.yml saw once dpkg had installed the kernel update: {"kernel", "package", "kernels"}."""
    return json.loads(host.file("/var/tmp/gpuops-dra-switch-kernel.json").content_string)


def test_the_kernel_update_came_with_the_collections_settings(host):
    """Installed by dpkg on the prepared dra node, with no run of the collection since: gpu_facts reads both
    kernels and neither lacks anything. The package's hooks built the new initramfs with the collection's files,
    and update-grub gave the new entries the collection's arguments."""
    seen = installed(host)
    kernels = {k["version"]: k for k in seen["kernels"]}
    assert seen["kernel"] in kernels and len(kernels) == 2, kernels
    new = kernels[seen["kernel"]]
    assert new["running"] is False and new["initramfs"] == "/boot/initrd.img-" + seen["kernel"], new
    assert new["entries"] and [e for e in new["entries"] if e["missing"]] == [], new
    assert {v: k["problems"] for v, k in kernels.items()} == {v: [] for v in kernels}


def images_of(report):
    """{kernel version: [the collection's files and vfio-pci.ko in its initramfs]} of a leg."""
    return {version: listing.split() for version, _sep, listing in (line.partition(" ") for line in report["images"])}


def test_each_leg_booted_the_kernel_update(host):
    new = installed(host)["kernel"]
    for name in ("vm-passthrough", "dra"):
        report, _functions = leg(host, name)
        assert report["kernel"] == new, (name, report["kernel"])
        check = [c for c in report["checks"] if c["check"] == "other installed kernels"]
        assert check and check[0]["ok"], (name, check)


def test_every_kernels_image_carried_exactly_the_legs_files(host):
    """Both switches rebuilt both kernels' images: the vfio settings and vfio-pci in each while the host was a
    vm-passthrough node, neither once it was a dra node again; nouveau's blacklist in all. initramfs-tools takes no
    rule from /etc/udev/rules.d: the GPUs' vfio rules stay out of every image."""
    for name, vfio in (("vm-passthrough", True), ("dra", False)):
        report, _functions = leg(host, name)
        images = images_of(report)
        assert len(images) == 2 and installed(host)["kernel"] in images, (name, images)
        for version, files in images.items():
            assert "etc/modprobe.d/gpuops-nouveau.conf" in files, (name, version, files)
            carried = {"etc/modprobe.d/gpuops-vfio.conf" in files, any(f.endswith("/vfio-pci.ko") for f in files)}
            assert carried == {vfio} and not [f for f in files if "udev/rules.d/" in f], (name, version, files)
