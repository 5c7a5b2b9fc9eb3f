"""What the verifiers know of a lab host's PCI functions, read from the host itself, so the same checks hold on
every layout (lab/layout.py): the GPUs are the functions the lab inventory's selectors pick, and the functions
that go with them are the other endpoints of their IOMMU groups."""

import os

import yaml

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
GROUP_VARS = os.path.join(TOP, "inventories", "lab", "group_vars", "all.yml")

FUNCTIONS = (
    "for f in /sys/bus/pci/devices/*; do "
    "d=-; [ -e \"$f/driver\" ] && d=$(basename \"$(readlink \"$f/driver\")\"); "
    "g=-; [ -e \"$f/iommu_group\" ] && g=$(basename \"$(readlink \"$f/iommu_group\")\"); "
    "echo \"$(basename \"$f\") $(cat \"$f/vendor\" \"$f/device\" \"$f/class\" | tr '\\n' ' ')$d "
    "$(cat \"$f/driver_override\") $g\"; done")


def selectors():
    """(vendor ids, device ids, class ids) the lab inventory selects GPUs by, as sysfs spells them (0x...)."""
    with open(GROUP_VARS, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    return tuple(frozenset("0x" + str(v).lower() for v in data[key])
                 for key in ("gpuops_gpu_vendor_ids", "gpuops_gpu_device_ids", "gpuops_gpu_class_ids"))


def functions(host):
    """{address: {vendor, device, class, driver, override, group}} of every PCI function of the host."""
    return parse(host.check_output(FUNCTIONS).splitlines())


def parse(lines):
    """The functions from lines of FUNCTIONS' output (also what a scenario recorded on the host)."""
    found = {}
    for line in lines:
        address, vendor, device, klass, driver, override, group = line.split()
        found[address] = {"vendor": vendor, "device": device, "class": klass, "driver": driver,
                          "override": override, "group": group}
    return found


def gpus(found):
    """The addresses of the functions the inventory's selectors pick, in order."""
    vendors, devices, classes = selectors()
    return sorted(a for a, f in found.items()
                  if f["vendor"] in vendors and f["device"] in devices and f["class"][:8] in classes)


def companions(found):
    """The other endpoints (not PCI bridges) of the GPUs' IOMMU groups: the functions bound with them."""
    chosen = gpus(found)
    groups = {found[a]["group"] for a in chosen} - {"-"}
    return sorted(a for a, f in found.items()
                  if f["group"] in groups and a not in chosen and not f["class"].startswith("0x0604"))


# The boot path of a lab host (lab/labuefi.py): "systemd-boot" for a gpulab_boot: uefi host (OVMF, systemd-boot
# entries written by kernel-install on the ESP, dracut), "grub" otherwise (grub and initramfs-tools).
BOOT_PATH = ("if [ -d /boot/efi/loader/entries ] && ! command -v grub-mkconfig >/dev/null; then echo systemd-boot; "
             "else echo grub; fi")
# Each ESP entry, one line each: "<file> <options...>".
ENTRIES = ("for e in /boot/efi/loader/entries/*.conf; do [ -e \"$e\" ] || continue; "
           "echo \"$(basename \"$e\") $(sed -n 's/^options[[:space:]]*//p' \"$e\")\"; done")


def boot_path(host):
    return host.check_output(BOOT_PATH).strip()


def booted_images(host, kernel):
    """The initramfs images of `kernel` that a boot of it loads or is copied from: /boot's (both paths) and, on
    systemd-boot, the copy kernel-install put beside its entry on the ESP, the one the boot loader loads."""
    images = ["/boot/initrd.img-%s" % kernel]
    if boot_path(host) == "systemd-boot":
        images += ["/boot/efi" + path for path in host.check_output(
            "sed -n 's/^initrd[[:space:]]*//p' /boot/efi/loader/entries/*-%s.conf" % kernel).split()]
    return images


def initramfs_files(host, image):
    """The paths in an initramfs image, as lsinitramfs (initramfs-tools) or lsinitrd (dracut) lists them, without
    a leading ./ ."""
    if host.run("command -v lsinitramfs").rc == 0:
        out = host.check_output("lsinitramfs %s" % image)
        return [line.strip().lstrip("./") for line in out.splitlines() if line.strip()]
    # lsinitrd's listing has ls -l's columns; the path is the last (a link's as "path -> target").
    out = host.check_output("lsinitrd %s" % image)
    paths = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 9 and fields[0][:1] in "-dlcbps":
            path = fields[8] if "->" in fields else fields[-1]
            paths.append(path.lstrip("./"))
    return paths


def entries(host):
    """{entry file: [options]} of every systemd-boot entry on the ESP (empty on a grub host)."""
    found = {}
    for line in host.check_output(ENTRIES).splitlines():
        name, _sep, options = line.partition(" ")
        found[name] = options.split()
    return found


def comparable(cmdline):
    """A command line's arguments without those the boot loader adds on its own (grub's BOOT_IMAGE=, systemd-boot's
    initrd=): what the host's configuration gave it."""
    return [arg for arg in cmdline.split() if not arg.startswith(("BOOT_IMAGE=", "initrd="))]
