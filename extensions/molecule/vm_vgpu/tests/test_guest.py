"""A guest on the prepared node: QEMU boots one with a vGPU of the configuration (an mtty mediated device)
passed through (guest_attach_probe, mode boot); the guest's kernel finds the device and makes serial ports of it."""


def test_a_guest_boots_with_a_vgpu(host):
    uuid = sorted(host.check_output("ls /sys/bus/mdev/devices").split())[0]
    result = host.ansible("gpuops.sandbox.guest_attach_probe", "mdevs=%s mode=boot timeout=900" % uuid, check=False)
    assert result["mode"] == "boot" and result["started"] is True, result
    (device,) = result["devices"]
    assert device["name"] == uuid and device["type"] == "mdev" and device["seen"] is True, device
    # mtty's device as samples/vfio-mdev/mtty.c presents it (a serial controller), and the port the guest made.
    assert (device["guest"]["vendor_id"], device["guest"]["device_id"], device["guest"]["class"]) == (
        "4348", "3253", "0700"), device
    assert device["guest"]["ttys"], device
    # The device is still there and free: the guest's QEMU is gone.
    assert host.file("/sys/bus/mdev/devices/%s" % uuid).exists
    assert host.run("pgrep -f 'gpuops-guest-prob[e]'").rc == 1
