# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""labconfig: what every part of gpulab reads: its settings, its error and log, and the lab's hosts.

The settings are the places the lab keeps its files (the image cache, the hosts' state, the inventory; the
environment can move each of them), the image recipe and the size of a lab host. The hosts are those of the
tracked inventory (inventories/lab/hosts.yml) with their gpulab_* variables.

gpulab.py imports this module and the others beside it (labhost, labimage, labnet, labreboot) as siblings: it
puts its own directory on sys.path first.
"""

from __future__ import annotations

import json
import os
import shutil

from labcommon import Lab, inventory_entries, inventory_host_vars

LAB_DIR = os.path.dirname(os.path.abspath(__file__))
# The lab's command line: each host's reboot follower runs it (`gpulab follow-reboots HOST`).
CLI = os.path.join(LAB_DIR, "gpulab.py")

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The image cache belongs to the machine, not to a checkout (like Go's build cache): every clone and worktree of
# the project boots the same image, built once per recipe. GPUOPS_LAB_CACHE moves it.
CACHE = os.environ.get("GPUOPS_LAB_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gpuops-sandbox", "lab")
STATE = os.environ.get("GPUOPS_LAB_STATE") or os.path.join(TOP, ".lab")
INVENTORY_DIR = os.environ.get("GPUOPS_LAB_INVENTORY") or os.path.join(TOP, "inventories", "lab")
INVENTORY_HOSTS = os.path.join(INVENTORY_DIR, "hosts.yml")
INVENTORY_CONNECTION = os.path.join(INVENTORY_DIR, "zz-lab-connection.yml")
IMAGE_FILES = os.path.join(TOP, "lab", "image")

# Bump when the image recipe changes: a cached image built by an older recipe is rebuilt.
RECIPE_VERSION = "16"
SUITE = "bookworm"
IMAGE_NAME = "debian12-gpulab"
DISK_SIZE = 4 * 1024 ** 3
PART_OFFSET = 1024 * 1024
PACKAGES = [
    "systemd-sysv", "udev", "openssh-server", "python3", "kmod", "iproute2", "initramfs-tools",
    "linux-image-amd64", "grub-pc", "pciutils", "procps", "sudo", "dbus",
    # A nested guest on a prepared host (issue: proof that a VM can take the devices): QEMU to start it and
    # busybox for the small initramfs a full guest boot runs.
    "qemu-system-x86", "busybox-static",
]
# Kernel arguments the pristine image boots with. intel_iommu=off is deliberate (see gpulab.py's docstring).
# no_timer_check: under emulation on a loaded machine the kernel's boot-time check of the timer interrupt can
# miss its few ticks, and with the IOMMU's interrupt remapping on (intel_iommu=on after preparation) the kernel
# then panics ("timer doesn't work through Interrupt-remapped IO-APIC") instead of falling back; seen in the
# lab on a reboot beside four other emulated hosts. mitigations=off: the guest is a throwaway on loopback, and
# under emulation the kernel's retpolines and return-buffer filling cost it CPU on every call and context switch
# (update-initramfs in the guest 81 s with them, 70-76 s without, measured 2026-11-27). intel_iommu=off stays last
# (molecule's distro_boot.yml).
IMAGE_CMDLINE = "console=ttyS0,115200 no_timer_check mitigations=off intel_iommu=off"
SSH_USER = "root"
MEMORY_MB = int(os.environ.get("GPUOPS_LAB_MEMORY", "1536"))
CPUS = int(os.environ.get("GPUOPS_LAB_CPUS", "1"))
# The emulated CPU of a host under software emulation (QEMU's -cpu; part of a saved boot's key, so another model
# makes its own saved boots). Without ERMS and FSRM the guest's kernel and C library zero and copy memory by words:
# QEMU 7.2's software emulation runs `rep stosb`/`rep movsb` one byte per step, and a UEFI reboot took 40 % less
# CPU so (the measurements page, 2026-12-02). GPUOPS_LAB_CPU sets another model, for measuring one against another.
TCG_CPU = os.environ.get("GPUOPS_LAB_CPU") or "max,erms=off,fsrm=off"
BOOT_TIMEOUT = int(os.environ.get("GPUOPS_LAB_BOOT_TIMEOUT", "900"))
FINALISE_MARKER = "GPULAB-FINALISE-OK"


class LabError(Exception):
    """An error the user can act on; printed without a traceback."""


# Log lines go to stdout; a failed command's error carries the last 15 lines of its output.
LAB = Lab("gpulab", LabError, log_to="stdout", run_tail=15)
log, run, locked = LAB.log, LAB.run, LAB.locked


def need_tools(*names):
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise LabError(
            "missing tools: %s. Run `make hostdeps` (as root it installs them with apt-get) or install "
            "qemu-system-x86, qemu-utils, debootstrap, fdisk, e2fsprogs and openssh-client." % ", ".join(missing)
        )


# ---------------------------------------------------------------------------------------------
# Lab hosts, read from the tracked inventory
# ---------------------------------------------------------------------------------------------

def load_inventory():
    """The YAML data of inventories/lab/hosts.yml."""
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise LabError("PyYAML is missing: run the lab through `make` (it creates the .venv) or pip install pyyaml")
    try:
        with open(INVENTORY_HOSTS) as handle:
            return yaml.safe_load(handle) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise LabError("cannot read the lab inventory %s: %s" % (INVENTORY_HOSTS, exc))


def lab_hosts():
    """Return the host names of inventories/lab/hosts.yml, in file order, but those with gpuops_host_managed: false
    (a node whose host another tool prepares: the cluster lab has a Node for it, and no VM stands for its host)."""
    data = load_inventory()
    names = []
    for name, _hostvars, _groups in inventory_entries(data):
        if name not in names and inventory_host_vars(data, name).get("gpuops_host_managed", True) is not False:
            names.append(name)
    if not names:
        raise LabError("the lab inventory %s names no hosts" % INVENTORY_HOSTS)
    return names


# A run may set some hosts' lab settings over the inventory's, without editing it: a JSON object of host names, each
# with its gpulab_* values ({"lab-passthrough": {"gpulab_boot": "uefi"}}). The integration tier sets it for a deep
# slice that needs a host shaped otherwise (tests/integration/tiers.py).
SETTINGS_ENV = "GPUOPS_LAB_SETTINGS"


def settings_overrides(environ=None):
    """The per-host settings SETTINGS_ENV gives ({} without it). Raises LabError naming the bad value."""
    text = (os.environ if environ is None else environ).get(SETTINGS_ENV, "").strip()
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise LabError("%s=%r is not JSON (%s); expected an object of host names, each with its gpulab_* settings, "
                       "e.g. {\"lab-passthrough\": {\"gpulab_boot\": \"uefi\"}}" % (SETTINGS_ENV, text, exc))
    bad = [] if isinstance(data, dict) else [text]
    for host, values in (data.items() if isinstance(data, dict) else ()):
        if not isinstance(values, dict) or any(not str(key).startswith("gpulab_") for key in values):
            bad.append("%s: %r" % (host, values))
    if bad:
        raise LabError("%s: %s is not an object of gpulab_* settings; expected an object of host names, each with "
                       "its gpulab_* settings, e.g. {\"lab-passthrough\": {\"gpulab_boot\": \"uefi\"}}"
                       % (SETTINGS_ENV, "; ".join(bad)))
    return data


def lab_host_settings(name):
    """The lab settings of one host: its host variables named gpulab_* in inventories/lab/hosts.yml, with those
    SETTINGS_ENV gives for it over them."""
    settings = {k: v for k, v in inventory_host_vars(load_inventory(), name).items() if k.startswith("gpulab_")}
    settings.update(settings_overrides().get(name, {}))
    return settings


def autostarts(name):
    """False for a host with gpulab_autostart: false (started only when named, e.g. a test-only host)."""
    return lab_host_settings(name).get("gpulab_autostart", True) is not False


def select_hosts(requested, starting=False):
    """The named hosts (all must be known), or by default every host; `starting` leaves out by default
    the hosts that do not start unless named."""
    known = lab_hosts()
    if not requested:
        return [h for h in known if autostarts(h)] if starting else known
    unknown = [h for h in requested if h not in known]
    if unknown:
        raise LabError("unknown lab host(s) %s; the lab has: %s" % (", ".join(unknown), ", ".join(known)))
    return list(requested)


# ---------------------------------------------------------------------------------------------
# Where the cached base image lies
# ---------------------------------------------------------------------------------------------

def image_path():
    """The image of this recipe: checkouts at other recipes keep their own beside it (a host's overlay disk
    names its image as its backing file, so an image must not change under a checkout that uses it)."""
    return os.path.join(CACHE, "%s-r%s.img" % (IMAGE_NAME, RECIPE_VERSION))


def manifest_path():
    return os.path.join(CACHE, "%s-r%s.json" % (IMAGE_NAME, RECIPE_VERSION))


# ---------------------------------------------------------------------------------------------
# Console logs
# ---------------------------------------------------------------------------------------------

def read_text(path):
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def tail_text(path, lines=20):
    return "\n".join(read_text(path).strip().splitlines()[-lines:])
