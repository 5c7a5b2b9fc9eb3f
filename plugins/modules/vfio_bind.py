#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vfio_bind
short_description: Bind PCI functions (by default NVIDIA GPUs) to vfio-pci for passthrough, and back
version_added: 1.0.0
description:
  - With O(state=present), binds the selected PCI functions to C(vfio-pci), or to the vfio-pci variant
    driver the kernel offers for the device (found by matching the device C(modalias) against the
    C(alias vfio_pci:) lines of C(/lib/modules/<release>/modules.alias)), so KubeVirt or QEMU can pass them
    through to virtual machines.
  - Each function goes through the kernel's sequence. It is unbound from its current driver (only if
    bound), the vfio driver is written to its C(driver_override) and its address to the driver's C(bind).
    Then the C(driver) link is read back and C(/dev/vfio/<group>) must exist.
  - The vfio driver's module is loaded first with C(modprobe) (nothing is unbound when that fails).
  - Everything is checked before anything is written, and the module refuses (naming each function and
    the reason) when a function is the boot VGA device, is bound to a driver not in O(allowed_drivers), is
    an SR-IOV physical function with VFs enabled, offers NVIDIA vendor-specific vGPU types, has no IOMMU
    group (see O(assume_slot_groups) for a prediction before the IOMMU is on), is held open by a process
    (C(/dev/nvidiaN) for the nvidia driver, C(/dev/vfio/<group>) and the VFIO device nodes for vfio drivers,
    C(/dev/dri) nodes for DRM drivers), or would leave its IOMMU group unviable (another endpoint of the group
    on a host driver) without O(include_group). No process is ever stopped or killed.
  - When a function fails, every function already changed in this run is put back on its previous driver,
    in reverse order, carrying on past errors; the failure message gives both the failure and the result
    of the rollback.
  - The driver each function had is recorded in C(/var/lib/gpuops/vfio_bind/<address>.json), so
    O(state=absent) can give it back to that driver. Without a record (the function was bound by someone
    else), O(state=absent) clears C(driver_override) and binds the function's host driver explicitly. That
    driver is found by matching the function's C(modalias) against the C(alias pci:) lines of
    C(/lib/modules/<release>/modules.alias) (and C(modules.builtin.alias)), leaving out the vfio modules and
    C(pci-stub), and mapping each module to the PCI driver it registers through
    C(/sys/bus/pci/drivers/<driver>/module) (module C(xhci_pci) registers driver C(xhci_hcd)). Only when
    exactly one such driver is loaded is it bound; otherwise the kernel is left to probe a driver
    (C(/sys/bus/pci/drivers_probe)). Either way the C(driver) link is read back.
  - With O(state=absent), restores the selected functions (and with O(include_group) the other functions
    of their groups that are on a vfio driver) and removes this module's records and udev rules for them.
  - With O(state=absent), a function the host claims for vfio-pci outside this module is refused before
    anything changes, naming the claim, because it would go back to vfio-pci as soon as it is released.
    The claims are C(vfio-pci.ids=) on the running kernel's command line, C(options vfio-pci ids=) in a
    modprobe.d directory, and a driverctl override (C(/etc/driverctl.d/pci-<address>)). O(remove_claims)
    removes them instead.
  - With O(state=present), such claims are left where the host's owner wrote them (this module writes its own
    record and rule beside them) and are named in RV(host_claims) and a warning, since giving those functions
    back later takes O(remove_claims).
  - A function such a claim had already put on a vfio driver before this module bound it gets a record too, of
    the driver modules.alias names for it (C("origin") V(modules.alias), the matching modules in
    C("host_modules"), the driver only when there is exactly one module, under its registered name when loaded
    and its module's name when not). With O(state=absent) that driver is bound explicitly when it is loaded then;
    otherwise the function goes the way of one without a record (with O(remove_claims) and a command-line claim,
    on no driver until the boot without the claim, RV(devices[].until_boot) naming the recorded modules when the
    running kernel's modules.alias names none). A driver blacklisted on the host (nouveau, which the collection
    blacklists on GPU hosts) is recorded but never loaded for it.
  - Processes holding a device node are named by PID and full command line.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  state:
    description:
      - V(present) binds the selected functions to their vfio driver.
      - V(absent) gives them back to the driver they had before (or the one the kernel probes) and removes
        the persistence this module wrote for them.
    type: str
    choices: [present, absent]
    default: present
  driver:
    description:
      - The vfio driver to bind to. V(auto) uses the vfio-pci variant driver whose C(alias vfio_pci:) line
        matches the device's C(modalias) most specifically (for example C(nvgrace_gpu_vfio_pci)), and
        C(vfio-pci) when none does.
      - Any other value must be C(vfio-pci) or a variant driver (a name ending in C(_vfio_pci)).
    type: str
    default: auto
  include_group:
    description:
      - Also bind the other functions of each selected function's IOMMU group (the GPU's HDMI audio, USB-C
        controller, ...), so the group becomes viable. PCI bridges are left alone.
      - Those functions may be on a driver in O(allowed_drivers) or O(allowed_group_drivers). One on another
        driver that is a network interface of the host (it has C(/sys/bus/pci/devices/<address>/net/<name>)) is
        refused as such, naming the interface, and without the advice to allow its driver, which would take the
        interface away from the host.
      - With O(state=absent), also restore the other functions of the group that are on a vfio driver.
      - When false, a group in which another endpoint is on a host driver is refused, naming it.
    type: bool
    default: false
  assume_slot_groups:
    description:
      - Predict, in check mode, the binding of a host whose IOMMU is not on yet (no IOMMU group at all), so a
        preparation can be refused before it changes the boot settings and reboots to turn the IOMMU on.
      - A selected function without an IOMMU group (not an SR-IOV VF) is then planned as if its group were the
        functions of its own PCI slot (the same domain, bus and device, other function numbers), which is what the
        IOMMU gives the functions of a multifunction device without ACS, instead of being refused for having no
        group. With O(include_group) those functions are planned like group members (O(allowed_group_drivers)
        applies), and one on a driver not allowed is refused, naming it and its driver. Without O(include_group)
        one on a host driver is refused as an unviable group would be.
      - The prediction is a lower bound. Functions behind a PCI bridge without ACS join the group too once the
        IOMMU is on, which cannot be known before; the binding made after the reboot checks the real group again.
      - Has no effect when the host has IOMMU groups. Usable only in check mode and with O(state=present); the
        module refuses it otherwise, changing nothing.
    type: bool
    default: false
  allowed_drivers:
    description:
      - Drivers a selected function may be taken from; V(none) stands for a function without a driver.
        The target vfio driver is always allowed.
      - A function on any other driver is refused, naming that driver.
    type: list
    elements: str
    default: [nvidia, nouveau, vfio-pci, none]
  allowed_group_drivers:
    description:
      - With O(include_group), further drivers the other functions of the group may be taken from.
    type: list
    elements: str
    default: [snd_hda_intel, xhci_hcd, nvidia-gpu, ucsi_ccg]
  force_boot_vga:
    description:
      - Bind the boot VGA device (C(boot_vga) is 1) too. The host loses the console the firmware set up.
    type: bool
    default: false
  persistent:
    description:
      - With O(state=present), also write a udev rule per function, C(/etc/udev/rules.d/61-gpuops-vfio-<address>.rules),
        that gives it to the vfio driver again at every boot. Written only after the live change succeeded.
      - With V(false), existing rules are left as they are. O(state=absent) always removes the rules of the
        functions it restores.
    type: bool
    default: false
  host_claims_advice:
    description:
      - With O(state=present), the end of the warning about functions the host's own settings also claim for
        vfio-pci (RV(host_claims)), that is how to give them back to their host drivers later, in the words of the caller
        (a role names its playbook's input). Unset or empty, the warning says it in this module's words
        (O(state=absent) with O(remove_claims=true)).
    type: str
  remove_claims:
    description:
      - With O(state=absent), remove the claims the host makes for vfio-pci on the functions considered (the
        selected ones, and with O(include_group) the other functions of their groups that are restored) instead
        of refusing them.
      - The matching entries are taken out of the C(ids=) of C(options vfio-pci) lines in the modprobe.d
        directories; the other entries and the other options of the line stay, and the line goes only when
        nothing is left on it (a file left with nothing but blank lines goes too). The driverctl override of each
        function (C(/etc/driverctl.d/pci-<address>)) is deleted. These files are changed after the functions were
        given back, like the records and rules, and put back with them when anything fails. RV(files_changed)
        lists them and RV(initramfs_rebuild_required) says the initramfs, which carries a copy of modprobe.d,
        must be rebuilt.
      - The kernel command line cannot be changed here. Each C(vfio-pci.ids=) argument of the running kernel that
        claims one of the functions is returned in RV(cmdline_claims), for M(gpuops.sandbox.kernel_cmdline) to
        take off (and a reboot). A function so claimed goes back only to a host driver bound explicitly (its
        record, or the one loaded driver modules.alias gives), never to the kernel's probe, which would give it
        straight back to vfio-pci; when there is no such driver it is taken off vfio-pci and left on no driver
        until the boot without the claim, when the kernel probes its driver (RV(devices[].until_boot)).
      - An entry is removed whole, so every function it matches (say every GPU of one model) is no longer claimed
        at the next boot, including functions that are not selected.
      - Ignored with O(state=present).
    type: bool
    default: false
  timeout:
    description:
      - Seconds to wait, after each bind or restore, for the C(driver) link and C(/dev/vfio/<group>) to show
        the change.
      - A whole number from V(0) to V(3600), checked before anything is changed.
    type: int
    default: 10
notes:
  - Root privileges are needed.
  - Persistence is per address, through a udev rule that sets C(driver_override) when the function is added
    at boot, loads the vfio module and has the function probed. That works whether vfio-pci is built into
    the kernel or a module (C(options vfio-pci ids=) in modprobe.d is ignored for a built-in vfio-pci), and,
    unlike C(vfio-pci.ids=) on the kernel command line or C(options vfio-pci ids=), it lets a second GPU of the
    same model stay on the host driver. It needs no reboot and no initramfs rebuild, so RV(reboot_required)
    is always false.
  - "Ordering the host drivers after vfio-pci (C(softdep nvidia pre: vfio-pci) and C(softdep nouveau pre: vfio-pci)
    in C(/etc/modprobe.d)) and putting the vfio modules in the initramfs is left to the roles of this collection."
  - The selection options are those of M(gpuops.sandbox.gpu_facts) without C(include_all), as binding every
    function of a host would take its disks and network away.
  - Processes holding a function's device nodes are listed, never stopped. Holders of audio (C(/dev/snd))
    nodes are not checked; the sound drivers let their functions go while in use.
extends_documentation_fragment:
  - gpuops.sandbox.pci_selectors
  - gpuops.sandbox.attributes
attributes:
  check_mode:
    details:
      - Nothing is written and no module is loaded; C(modprobe --dry-run) checks the vfio module exists.
  diff_mode:
    support: full
    details:
      - Shows the driver of each function before and after, and the content of each record and udev rule file
        (and, with O(remove_claims), of each modprobe.d file and driverctl override).
seealso:
  - module: gpuops.sandbox.gpu_facts
  - module: gpuops.sandbox.iommu_check
  - module: gpuops.sandbox.sriov_vfs
"""

EXAMPLES = r"""
- name: Bind every NVIDIA GPU and its HDMI audio to vfio-pci, and keep them there after reboots
  gpuops.sandbox.vfio_bind:
    include_group: true
    persistent: true

- name: Bind one A10 given by address (its group must already be viable)
  gpuops.sandbox.vfio_bind:
    addresses:
      - "0000:65:00.0"

- name: Bind every A10 (10de:2236) with its group, in check mode with a diff first
  gpuops.sandbox.vfio_bind:
    vendors:
      - "10de:2236"
    include_group: true
  check_mode: true
  diff: true

- name: Before the IOMMU is turned on, check that the GPUs can go to vfio-pci with the functions of their slots
  gpuops.sandbox.vfio_bind:
    include_group: true
    assume_slot_groups: true
  check_mode: true

- name: Bind the boot GPU of a headless host, which is on nouveau
  gpuops.sandbox.vfio_bind:
    addresses:
      - "0000:01:00.0"
    force_boot_vga: true
    include_group: true

- name: Give the GPUs and their audio functions back to their host drivers, and drop the udev rules
  gpuops.sandbox.vfio_bind:
    state: absent
    include_group: true

- name: Give back GPUs claimed for vfio-pci by hand (modprobe.d, driverctl, vfio-pci.ids), removing the claims
  gpuops.sandbox.vfio_bind:
    state: absent
    include_group: true
    remove_claims: true
  register: released

- name: Take the vfio-pci.ids arguments off the kernel command line (or keep only the other devices' entries)
  gpuops.sandbox.kernel_cmdline:
    arguments: ["{{ item.replace_with or item.argument }}"]
    state: "{{ 'present' if item.replace_with else 'absent' }}"
  loop: "{{ released.cmdline_claims }}"

- name: Rebuild the initramfs, which carries a copy of modprobe.d (Debian and Ubuntu)
  ansible.builtin.command: update-initramfs -u -k all
  when: released.initramfs_rebuild_required
  changed_when: true
"""

RETURN = r"""
devices:
  description: One entry per function considered (the selected ones, and with O(include_group) the other functions
    of their groups), sorted by address.
  returned: always
  type: list
  elements: dict
  sample:
    - address: "0000:65:00.0"
      vendor: "10de"
      device: "2236"
      class: "030200"
      iommu_group: 12
      role: selected
      before: nvidia
      after: vfio-pci
      changed: true
    - address: "0000:65:00.1"
      vendor: "10de"
      device: "1aef"
      class: "040300"
      iommu_group: 12
      role: group
      before: snd_hda_intel
      after: vfio-pci
      changed: true
  contains:
    address:
      description: PCI address, lower case.
      type: str
      sample: "0000:65:00.0"
    vendor:
      description: Vendor ID.
      type: str
      sample: "10de"
    device:
      description: Device ID.
      type: str
      sample: "2236"
    class:
      description: PCI class code, 6 hex digits.
      type: str
      sample: "030200"
    iommu_group:
      description: IOMMU group number, or null.
      type: int
      sample: 12
    role:
      description: C(selected) when the selectors chose the function, C(group) when O(include_group) added it.
      type: str
      sample: selected
    before:
      description: Driver before the run, or null.
      type: str
      sample: nvidia
    after:
      description: Driver after the run, read back from sysfs; in check mode the driver expected (null when the kernel
        would choose it).
      type: str
      sample: vfio-pci
    changed:
      description: Whether the function's binding changed (or would change in check mode).
      type: bool
      sample: true
    until_boot:
      description:
        - With O(remove_claims), for a function claimed by C(vfio-pci.ids=) on the running kernel's command line
          that has no host driver to bind now (none recorded, and not exactly one loaded that modules.alias gives),
          it is taken off vfio-pci and left on no driver until the host boots without the claim, and this lists the
          host modules modules.alias gives for it, among which the kernel chooses at that boot (empty when none,
          as for a device no host driver supports). Null for every other function.
      type: list
      elements: str
      sample: [nouveau]
persistent_files:
  description: The udev rules of the considered functions that exist after the run (or would, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["/etc/udev/rules.d/61-gpuops-vfio-0000:65:00.0.rules"]
record_files:
  description: The records of original drivers of the considered functions that exist after the run (or would,
    in check mode), including those inferred from modules.alias for functions the host had claimed.
  returned: always
  type: list
  elements: str
  sample: ["/var/lib/gpuops/vfio_bind/0000:65:00.0.json"]
files_changed:
  description: Record and rule files written or removed, and with O(remove_claims) the modprobe.d files edited or
    removed and the driverctl overrides removed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["/var/lib/gpuops/vfio_bind/0000:65:00.0.json"]
loaded_modules:
  description: Kernel modules loaded with modprobe (in check mode, those that would be).
  returned: always
  type: list
  elements: str
  sample: ["vfio_pci"]
reboot_required:
  description: Always false; the change is live and the udev rules act at the next boot by themselves. With
    O(remove_claims), see RV(cmdline_claims) and RV(initramfs_rebuild_required) for what the next boot needs.
  returned: always
  type: bool
  sample: false
host_claims:
  description:
    - With O(state=present), the functions considered that the host also claims for vfio-pci by its own settings
      (C(vfio-pci.ids=) on the running kernel's command line, C(options vfio-pci ids=) in modprobe.d, a driverctl
      override), each with its claims; a warning names them too. They are left as they are. Giving such a function
      back later takes O(remove_claims) with O(state=absent). Not returned with O(state=absent).
  returned: when O(state=present)
  type: list
  elements: dict
  sample:
    - address: "0000:65:00.0"
      claims: ["vfio-pci.ids=10de:2236 on the kernel command line (/proc/cmdline; put there by the boot configuration,
                e.g. /etc/default/grub)"]
cmdline_claims:
  description:
    - With O(remove_claims) and O(state=absent), the C(vfio-pci.ids=) arguments of the running kernel's command line
      that claim one of the functions considered (also in check mode), for M(gpuops.sandbox.kernel_cmdline) to take
      off; they stay in effect until the host boots without them. Empty otherwise.
    - C(argument) is the argument as written on the command line; C(replace_with) the same argument with only the
      entries of other devices, to set instead (state=present), or null when none is left (take C(argument) off,
      state=absent).
  returned: always
  type: list
  elements: dict
  sample:
    - argument: "vfio-pci.ids=10de:2236,10de:1aef,8086:1234"
      replace_with: "vfio-pci.ids=8086:1234"
initramfs_rebuild_required:
  description: Whether a modprobe.d file changed (or would, in check mode), so the initramfs, which carries a copy of
    modprobe.d, must be rebuilt before the next boot.
  returned: always
  type: bool
  sample: false
rollback:
  description: When a change failed, one line per function put back, with the result.
  returned: failure during the change
  type: list
  elements: str
  sample: ["0000:65:00.0 back on nvidia"]
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.sandbox.plugins.module_utils._module import (
    check_timeout,
    create_module,
    run_module,
    run_timed,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils import _modprobe, _persist, _vfio
from ansible_collections.gpuops.sandbox.plugins.module_utils._pci import (
    SELECTOR_ARGUMENT_SPEC,
    SELECTOR_MUTUALLY_EXCLUSIVE,
    select_functions,
)
from ansible_collections.gpuops.sandbox.plugins.module_utils._sysfs import MAX_WAIT

# The filesystem root and kernel release the module works on; unit tests point them at a fake host.
ROOT = "/"
RELEASE = None

# Seconds modprobe may take before it is killed (coreutils timeout, when the host has it).
MODPROBE_TIMEOUT = 60


def build_module():
    return create_module(
        AnsibleModule,
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            **SELECTOR_ARGUMENT_SPEC,
            driver=dict(type="str", default="auto"),
            include_group=dict(type="bool", default=False),
            allowed_drivers=dict(type="list", elements="str", default=list(_vfio.DEFAULT_ALLOWED_DRIVERS)),
            allowed_group_drivers=dict(type="list", elements="str",
                                       default=list(_vfio.DEFAULT_ALLOWED_GROUP_DRIVERS)),
            force_boot_vga=dict(type="bool", default=False),
            assume_slot_groups=dict(type="bool", default=False),
            persistent=dict(type="bool", default=False),
            remove_claims=dict(type="bool", default=False),
            host_claims_advice=dict(type="str"),
            timeout=dict(type="int", default=10),
        ),
        mutually_exclusive=SELECTOR_MUTUALLY_EXCLUSIVE,
        supports_check_mode=True,
    )


# How a caller gives hand-made claims back, in this module's words; a role says it in its playbook's inputs.
HOST_CLAIMS_ADVICE = ("run state=absent with remove_claims=true: it removes those claims (a vfio-pci.ids= argument "
                      "through kernel_cmdline and a reboot)")


def check_params(params):
    """Checks the argument spec cannot express; raise VfioError. Runs before anything is read or changed."""
    check_timeout(params["timeout"], 0, MAX_WAIT, _vfio.VfioError)
    driver = params["driver"]
    if driver != "auto" and (not _vfio.DRIVER_NAME_RE.fullmatch(driver) or not _vfio.is_vfio_driver(driver)):
        raise _vfio.VfioError("driver %r is not a vfio driver; use auto, vfio-pci or a variant driver whose name "
                              "ends in _vfio_pci (e.g. nvgrace_gpu_vfio_pci)" % (driver,))
    _vfio.check_driver_names(params["allowed_drivers"], "allowed_drivers")
    _vfio.check_driver_names(params["allowed_group_drivers"], "allowed_group_drivers")


def check_prediction(params, check_mode):
    """Refuse ``assume_slot_groups`` outside check mode or with state=absent (a prediction never binds)."""
    if not params["assume_slot_groups"]:
        return
    if not check_mode:
        raise _vfio.VfioError("assume_slot_groups=true only predicts the binding of a host whose IOMMU is not on "
                              "yet; use it in check mode (check_mode: true), and bind without it once the IOMMU "
                              "is on; nothing was changed")
    if params["state"] != "present":
        raise _vfio.VfioError("assume_slot_groups=true applies to state=present only; nothing was changed")


def select(params, root):
    if params["addresses"] is not None and not params["addresses"]:
        raise _vfio.VfioError("addresses must list at least one PCI address (omit it to select by vendors and classes)")
    selected = select_functions(root=root, addresses=params["addresses"], vendors=params["vendors"],
                                classes=params["classes"])
    if not selected and params["state"] == "present":
        raise _vfio.VfioError(
            "no PCI function matches vendors %s and classes %s; nothing to bind"
            % (", ".join(params["vendors"] if params["vendors"] is not None else ["10de"]) or "(any)",
               ", ".join(params["classes"] if params["classes"] is not None else ["030000", "030200"]) or "(any)"))
    return selected


def plan_files(plan, params, root):
    """Return ``[(path, old_text, new_text)]`` for the record and rule files to write (new) or remove (None), then
    (with ``remove_claims``) the modprobe.d files to edit and the driverctl overrides to remove."""
    changes = []
    for entry in plan["devices"]:
        addr = entry["address"]
        record, rule = _vfio.record_path(addr), _vfio.udev_rule_path(addr)
        old_record, old_rule = _persist.read_text(root, record), _persist.read_text(root, rule)
        if params["state"] == "absent":
            for path, old in ((record, old_record), (rule, old_rule)):
                if old is not None:
                    changes.append((path, old, None))
            continue
        if entry.get("record") is not None or entry["action"] == "bind":
            new_record = entry.get("record") or _vfio.record_text(entry["state"], entry["target"])
            if new_record != old_record:
                changes.append((record, old_record, new_record))
        if params["persistent"]:
            new_rule = _vfio.udev_rule_text(entry["state"], entry["target"])
            if new_rule != old_rule:
                changes.append((rule, old_rule, new_rule))
    changes.extend(plan.get("claim_files", []))
    return changes


def apply_files(module, root, changes):
    """Write or remove each file of ``changes`` (``(path, old, new)``); on any error the ones already done are put
    back (``_persist.write_files``) and VfioError says which file failed and any not put back."""
    try:
        _persist.write_files(module, root, [(path, new) for path, _old, new in changes])
    except _persist.PersistError as exc:
        raise _vfio.VfioError(exc.msg) from exc


def load_drivers(module, drivers):
    """modprobe each vfio driver's module (``--dry-run`` in check mode); raise VfioError naming it."""
    if not drivers:
        return []
    modprobe = module.get_bin_path("modprobe", required=True)
    loaded = []
    for driver in drivers:
        name = _vfio.module_for_driver(driver)
        argv = [modprobe] + (["--dry-run"] if module.check_mode else []) + [name]
        rc, out, err = run_timed(module, argv, MODPROBE_TIMEOUT, option="the module's limit for modprobe")
        if rc != 0:
            raise _vfio.VfioError(
                "kernel module %s (driver %s) cannot be loaded: %s failed (rc=%d): %s; nothing was changed"
                % (name, driver, " ".join(argv), rc, (err.strip() or out.strip() or "no output")))
        loaded.append(name)
    return loaded


def _device_lines(entries, key):
    return "".join("%s: %s\n" % (e["address"], _vfio.driver_label(e[key])) for e in entries)


def _expected_after(entry):
    if entry["action"] == "bind":
        return entry["target"]
    if entry["action"] == "restore":
        return entry["restore_to"]
    return entry["before"]


def summarize(plan, root, check_mode):
    devices = []
    for entry in plan["devices"]:
        state = entry["state"]
        after = _expected_after(entry) if check_mode else _vfio.current_driver(entry["address"], root)
        devices.append({
            "address": entry["address"], "vendor": state["vendor"], "device": state["device"],
            "class": state["class"], "iommu_group": state["group"], "role": entry["role"],
            "before": entry["before"], "after": after, "changed": entry["action"] != "none",
            "until_boot": entry.get("until_boot"),
        })
    return devices


def existing_after(plan, changes, root, path_of):
    """Paths (from ``path_of``) of the considered functions that exist once ``changes`` are applied."""
    final = {path: new for path, _old, new in changes}
    paths = []
    for entry in plan["devices"]:
        path = path_of(entry["address"])
        if path in final:
            if final[path] is not None:
                paths.append(path)
        elif _persist.read_text(root, path) is not None:
            paths.append(path)
    return paths


def host_claims(plan, root):
    """The functions considered that the host claims for vfio-pci by its own settings, with those claims."""
    found = []
    for entry in plan["devices"]:
        claims = _vfio.vfio_claims(entry["state"], root)
        if claims:
            found.append({"address": entry["address"], "claims": claims})
    return found


def run(module, root="/", release=None):
    """Plan, check, apply (unless check mode) and return the result dict; raises VfioError/SysfsError.

    The body of :func:`main` for ``run_module``: it never calls exit_json or fail_json.
    """
    params = module.params
    check_params(params)
    check_prediction(params, module.check_mode)
    selected = select(params, root)
    if params["state"] == "present":
        plan = _vfio.plan_bind(selected, root=root, driver=params["driver"], include_group=params["include_group"],
                               allowed_drivers=params["allowed_drivers"],
                               allowed_group_drivers=params["allowed_group_drivers"],
                               force_boot_vga=params["force_boot_vga"], release=release,
                               assume_slot_groups=params["assume_slot_groups"])
    else:
        plan = _vfio.plan_unbind(selected, root=root, include_group=params["include_group"],
                                 remove_claims=params["remove_claims"], release=release)
    changes = plan_files(plan, params, root)
    to_load = _vfio.drivers_to_load(plan, root)
    result = {
        "changed": bool(plan["steps"] or changes),
        "persistent_files": existing_after(plan, changes, root, _vfio.udev_rule_path),
        "record_files": existing_after(plan, changes, root, _vfio.record_path),
        "files_changed": [path for path, _old, _new in changes],
        "loaded_modules": [],
        "reboot_required": False,
        "cmdline_claims": plan.get("cmdline_claims", []),
        "initramfs_rebuild_required": any(_modprobe.is_modprobe_path(path) for path, _old, _new in changes),
    }
    if module._diff:
        result["diff"] = [{"before_header": "drivers", "after_header": "drivers",
                           "before": _device_lines(summarize(plan, root, True), "before"),
                           "after": _device_lines(summarize(plan, root, True), "after")}]
        for path, old, new in changes:
            result["diff"].append({"before_header": path, "after_header": path,
                                   "before": old or "", "after": new or ""})
    if params["state"] == "present":
        result["host_claims"] = host_claims(plan, root)
        if result["host_claims"]:
            module.warn("%s: these functions are also claimed for vfio-pci by the host's own settings, which this "
                        "module leaves where they are. To give them back to their host drivers later, %s"
                        % ("; ".join("%s by %s" % (c["address"], " and ".join(c["claims"])) for c in result["host_claims"]),
                           (params.get("host_claims_advice") or "").strip() or HOST_CLAIMS_ADVICE))
    result["loaded_modules"] = load_drivers(module, to_load)
    if module.check_mode or not result["changed"]:
        result["devices"] = summarize(plan, root, True)
        return result
    for driver in to_load:
        if not _vfio.wait_until(lambda d=driver: _vfio.driver_loaded(d, root), params["timeout"]):
            raise _vfio.VfioError("modprobe %s succeeded but /sys/bus/pci/drivers/%s did not appear; nothing was "
                                  "changed" % (_vfio.module_for_driver(driver), driver))
    done = _vfio.apply_steps(plan["steps"], root=root, timeout=params["timeout"])
    try:
        apply_files(module, root, changes)
    except _vfio.VfioError as exc:
        lines = _vfio.rollback(done, root, params["timeout"])
        raise _vfio.VfioError("%s (after the drivers were changed); %s" % (exc.msg, _vfio.describe_rollback(lines)),
                              rollback=lines)
    result["devices"] = summarize(plan, root, False)
    return result


def main():
    run_module(build_module, run, root=ROOT, release=RELEASE)


if __name__ == "__main__":
    main()
