"""lab-dra after dra -> vm-passthrough -> dra: a prepared dra node again (the dra scenario's own checks, imported
below), and what the vm-passthrough leg looked like on this host's shape, recorded by side_effect.yml."""

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
