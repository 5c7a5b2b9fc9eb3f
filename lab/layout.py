# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The stand-in devices of a lab host as data.

A layout is a list of PCI slots. Each slot sits on the root bus (``behind: bus``, the default), behind its
own PCIe root port (``root-port``) or behind a PCIe switch (``switch``: a root port, the switch's upstream
port and one downstream port), and holds up to eight functions, function 0 first:

* ``gpu``: QEMU's ``edu`` device (1234:11e8), the stand-in GPU the lab's selectors pick;
* ``audio``: an HDA controller (8086:293e, snd_hda_intel), like a GPU's HDMI audio function;
* ``usb``: an xHCI controller (1b36:000d, xhci_hcd), like the USB-C controller of Turing-class boards;
* ``serial``: a 16550 serial card (1b36:0002, serial driver), a function of a driver the collection does
  not bind unless told;
* ``sriov``: an NVMe controller with SR-IOV (1b36:0010, 4 VFs), standing in for an SR-IOV GPU (one per host).

``slot`` is the root-bus slot (hexadecimal, as lspci shows it) of the device or of its root port. The lab
keeps slots 00 (host bridge), 01 (boot VGA), 06 (disk), 07 (network) and 1f (the chipset) for itself.

In inventories/lab/hosts.yml a host's ``gpulab_layout`` replaces DEFAULT_LAYOUT, so a user can rehearse the
shape of their own hardware. The guest's PCI addresses follow from the layout: the firmware numbers the
buses below the root ports depth first, in slot order (guest_addresses), which the lab's tests check
against the booted kernel.
"""

from __future__ import annotations

# kind: (QEMU device, vendor:device, what it stands for)
FUNCTIONS = {
    "gpu": ("edu", "1234:11e8", "stand-in GPU"),
    "audio": ("ich9-intel-hda", "8086:293e", "HDMI audio function"),
    "usb": ("qemu-xhci", "1b36:000d", "USB controller"),
    "serial": ("pci-serial", "1b36:0002", "serial card"),
    "sriov": ("nvme", "1b36:0010", "SR-IOV physical function"),
}
BEHIND = ("bus", "root-port", "switch")
RESERVED_SLOTS = {0x00: "the host bridge", 0x01: "the boot VGA device", 0x06: "the lab's disk",
                  0x07: "the lab's network card", 0x1F: "the chipset"}

# Today's shape of every lab host: a GPU with its audio function in slot 03, the SR-IOV stand-in behind the
# root port in slot 04, a lone GPU behind the root port in slot 05.
DEFAULT_LAYOUT = (
    {"slot": "03", "functions": ["gpu", "audio"]},
    {"slot": "04", "behind": "root-port", "functions": ["sriov"]},
    {"slot": "05", "behind": "root-port", "functions": ["gpu"]},
)


class LayoutError(ValueError):
    """A layout that cannot be built; the message names the host, the bad value and what is accepted."""


def _slot(value, where):
    text = str(value).strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    if isinstance(value, bool) or not text or len(text) > 2 or any(c not in "0123456789abcdef" for c in text):
        raise LayoutError("%s: slot %r is not a PCI slot number (two hex digits, 02 to 1e)" % (where, value))
    slot = int(text, 16)
    if slot in RESERVED_SLOTS:
        raise LayoutError("%s: slot %02x is the lab's own (%s); free slots: 02-05, 08-1e"
                          % (where, slot, RESERVED_SLOTS[slot]))
    if slot > 0x1E:
        raise LayoutError("%s: slot %r is out of range; free slots: 02-05, 08-1e" % (where, value))
    return slot


def normalise(layout, host="lab host"):
    """Check a layout and return it as a list of {slot: int, behind: str, functions: [kind]}, in slot order."""
    if layout is None:
        layout = DEFAULT_LAYOUT
    if not isinstance(layout, (list, tuple)) or not layout:
        raise LayoutError("%s: gpulab_layout must be a non-empty list of slots, got %r" % (host, layout))
    slots, seen, sriov = [], {}, 0
    for index, entry in enumerate(layout):
        where = "%s: gpulab_layout[%d]" % (host, index)
        if not isinstance(entry, dict):
            raise LayoutError("%s must be a mapping with slot, behind and functions, got %r" % (where, entry))
        unknown = sorted(set(entry) - {"slot", "behind", "functions"})
        if unknown:
            raise LayoutError("%s: unknown key(s) %s; accepted: slot, behind, functions" % (where, ", ".join(unknown)))
        if "slot" not in entry:
            raise LayoutError("%s has no slot" % where)
        slot = _slot(entry["slot"], where)
        if slot in seen:
            raise LayoutError("%s: slot %02x is already used by gpulab_layout[%d]" % (where, slot, seen[slot]))
        seen[slot] = index
        behind = entry.get("behind", "bus")
        if behind not in BEHIND:
            raise LayoutError("%s: behind=%r; accepted: %s" % (where, behind, ", ".join(BEHIND)))
        functions = entry.get("functions")
        if not isinstance(functions, (list, tuple)) or not 1 <= len(functions) <= 8:
            raise LayoutError("%s: functions must be a list of 1 to 8 kinds, got %r" % (where, functions))
        for kind in functions:
            if kind not in FUNCTIONS:
                raise LayoutError("%s: function kind %r; accepted: %s" % (where, kind, ", ".join(FUNCTIONS)))
        sriov += list(functions).count("sriov")
        slots.append({"slot": slot, "behind": behind, "functions": list(functions)})
    if sriov > 1:
        raise LayoutError("%s: %d sriov functions; the lab has one SR-IOV stand-in per host" % (host, sriov))
    return sorted(slots, key=lambda s: s["slot"])


def _function_args(kind, bus, slot, function, count, nvme_serial):
    device = FUNCTIONS[kind][0]
    spec = "%s,%saddr=%02x.%d" % (device, "bus=%s," % bus if bus else "", slot, function)
    if function == 0 and count > 1:
        spec += ",multifunction=on"
    if kind == "sriov":
        spec += (",serial=%s,subsys=subsys0,sriov_max_vfs=4,sriov_vq_flexible=8,sriov_vi_flexible=4,"
                 "max_ioqpairs=12" % nvme_serial)
        return ["-device", "nvme-subsys,id=subsys0", "-device", spec]
    return ["-device", spec]


def qemu_args(layout, nvme_serial, host="lab host", hold_sriov=False):
    """The QEMU arguments of a layout (the boot VGA device first). With `hold_sriov`, the SR-IOV function's
    controller is left out (its subsystem and its port stay): QEMU cannot save a machine that has one, so a host
    started from a saved boot gets it hot-plugged afterwards (sriov_hotplug)."""
    args = ["-vga", "std"]
    chassis = 0
    for entry in normalise(layout, host):
        slot, functions = entry["slot"], entry["functions"]
        if entry["behind"] == "bus":
            bus, dev_slot = None, slot
        else:
            chassis += 1
            port = "rp%d" % chassis
            args += ["-device", "pcie-root-port,id=%s,chassis=%d,addr=%02x.0" % (port, chassis, slot)]
            bus, dev_slot = port, 0
            if entry["behind"] == "switch":
                chassis += 1
                up, down = "up%d" % chassis, "dn%d" % chassis
                args += ["-device", "x3130-upstream,id=%s,bus=%s" % (up, port),
                         "-device", "xio3130-downstream,id=%s,bus=%s,chassis=%d,slot=0" % (down, up, chassis)]
                bus = down
        for function, kind in enumerate(functions):
            more = _function_args(kind, bus, dev_slot, function, len(functions), nvme_serial)
            args += more[:2] if kind == "sriov" and hold_sriov else more
    return args


def sriov_hotplug(layout, nvme_serial, host="lab host"):
    """(device_add argument, guest address) of the layout's SR-IOV function, or None without one. Only a function
    alone in its slot behind a root port or a switch can be hot-plugged (a slot of its own on a hot-plug capable
    port); the others return None and keep the controller on the command line (see hold_sriov)."""
    for entry in normalise(layout, host):
        if "sriov" in entry["functions"]:
            if entry["behind"] == "bus" or len(entry["functions"]) != 1:
                return None
            args = qemu_args([{"slot": "%02x" % entry["slot"], "behind": entry["behind"], "functions": ["sriov"]}],
                             nvme_serial, host)
            # The ports are numbered in slot order (chassis 1, 2...): the spec's bus is renamed to this layout's.
            spec = args[-1]
            port = _port_of(layout, entry["slot"], host)
            spec = ",".join("bus=%s" % port if part.startswith("bus=") else part for part in spec.split(","))
            return spec, guest_addresses(layout, host)["sriov"][0]
    return None


def _port_of(layout, slot, host):
    """The QEMU id of the bus the device in root-bus `slot` sits on (its root port, or the switch's downstream
    port), as qemu_args names it."""
    chassis = 0
    for entry in normalise(layout, host):
        if entry["behind"] == "bus":
            continue
        chassis += 1
        port = "rp%d" % chassis
        if entry["behind"] == "switch":
            chassis += 1
            port = "dn%d" % chassis
        if entry["slot"] == slot:
            return port
    raise LayoutError("%s: no port in slot %02x" % (host, slot))


def guest_addresses(layout, host="lab host"):
    """{kind: [PCI address in the guest]} in address order, from the firmware's depth-first bus numbering."""
    found = {kind: [] for kind in FUNCTIONS}
    next_bus = 1
    for entry in normalise(layout, host):
        if entry["behind"] == "bus":
            bus, slot = 0, entry["slot"]
        elif entry["behind"] == "root-port":
            bus, slot = next_bus, 0
            next_bus += 1
        else:
            # root port -> the switch's upstream port (its bus) -> downstream port (the next) -> the device's bus
            bus, slot = next_bus + 2, 0
            next_bus += 3
        for function, kind in enumerate(entry["functions"]):
            found[kind].append("0000:%02x:%02x.%d" % (bus, slot, function))
    return {kind: sorted(addresses) for kind, addresses in found.items()}
