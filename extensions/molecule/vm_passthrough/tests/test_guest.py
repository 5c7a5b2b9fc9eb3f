"""A guest on the prepared node: QEMU boots one with the first GPU and the other functions of its IOMMU group
passed through (guest_attach_probe, mode boot), and the guest's kernel lists each of them on its console."""

import importlib.util
import os

_SPEC = importlib.util.spec_from_file_location(
    "lab_functions", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                  "lab_functions.py"))
lab_functions = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lab_functions)


def test_a_guest_boots_with_the_gpu_and_its_audio_function(host):
    found = lab_functions.functions(host)
    gpu = lab_functions.gpus(found)[0]
    devices = [gpu] + [a for a in lab_functions.companions(found) if found[a]["group"] == found[gpu]["group"]]
    assert len(devices) >= 2, found
    result = host.ansible("gpuops.sandbox.guest_attach_probe",
                          "devices=%s mode=boot timeout=900" % ",".join(devices), check=False)
    assert result["mode"] == "boot" and result["started"] is True, result
    seen = {d["name"]: d for d in result["devices"]}
    assert sorted(seen) == sorted(devices)
    assert all(d["seen"] and d["problem"] is None for d in seen.values()), result["devices"]
    # What the guest's kernel read from each function's configuration space: the host's function itself.
    for address in devices:
        guest = seen[address]["guest"]
        assert ("0x" + guest["vendor_id"], "0x" + guest["device_id"]) == (
            found[address]["vendor"], found[address]["device"]), (address, guest)
    assert (seen[gpu]["guest"]["vendor_id"], seen[gpu]["guest"]["device_id"]) == ("1234", "11e8")
    # Nothing of the guest is left: its QEMU is gone and the GPU is free for the next VM.
    assert host.run("pgrep -f 'gpuops-guest-prob[e]'").rc == 1
