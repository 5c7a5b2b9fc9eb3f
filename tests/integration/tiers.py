"""The integration tier's shape, as data: the landing tier every landing runs, and the deep slices CI rotates through.

Every piece of lab work (LAB_WORK) and every test belongs to the landing tier or to one deep slice (SLICES). A test
of a deep slice carries ``@pytest.mark.slice("<name>")`` (or a module's ``pytestmark``); a piece of lab work names its
slice here. A session runs the landing tier and the slices named in GPUOPS_SLICES (a comma-separated list, ``all``
for every one, empty for none); the rest is deselected, and its lab work never starts.

Each slice says which claims it proves, which paths of the checkout hold the code it proves (CI runs a slice
whatever the rotation when one of them changed: scripts/ci_slices.py) and what it cost when last measured, in
core-seconds of a whole tier on the machine named beside it (what CI compares with its time budget before it starts
the slice). The landing tier and the quick tiers have a recorded cost too.

Pure data and small functions only: scripts/ci_slices.py and the unit tests import this module without pytest.
"""

import fnmatch
import os
import re

LANDING = "landing"
SLICES_ENV = "GPUOPS_SLICES"
# What a slice's lab_settings become for the lab's commands of a session (lab/labconfig.py reads it over the
# inventory's gpulab_* values).
LAB_SETTINGS_ENV = "GPUOPS_LAB_SETTINGS"

# What each part adds to a whole run, in core-seconds of the 2-core machine CI runs on: the run's wall time is
# predicted as their sum over the cores (scripts/ci_slices.py). The parts overlap (the lab's chains, the
# controller's tests and the quick tiers run side by side), so a part's figure is what it adds to the run's wall
# time times the cores, not its own CPU; its own CPU is in the measurements page. Refitted on 2026-12-02 (fourth
# session) to three whole runs of the machine CI ran 99e3208 on, the lab's CPU without ERMS: make test on a fresh
# clone of 1f2a0ce (the landing tier alone, 1734 s), CI's run of 99e3208 (landing, cluster and uefi, 2670 s as
# .ci/run timed it) and make test-full on a fresh clone of 10e7a4b (every slice, about 3702 s). The landing tier and
# the checks come from the first; cluster and uefi together from the second less the first, split as their earlier
# fit; kernels and repairs together from the third less the second, split the same way. The history is in
# docs/docsite/rst/guide_measurements.rst.
COSTS = {
    # lint, sanity, unit at nice 10 beside the integration tier; the Kubernetes binaries and the image are cached.
    # The unit tier took 626 s of wall beside the landing tier alone, 1519 s beside every slice.
    "checks": {"core_seconds": 1000, "source": "fitted 2026-12-02 (with the landing tier: 3468, 1734 s alone)"},
    # Its wall time is set by its longest chain (lab-passthrough: the vm_passthrough scenario, then the switch and
    # the refused switch, ended 1433 s into the integration tier of 683a9e9) more than by its CPU.
    LANDING: {"core_seconds": 2468,
              "source": "fitted 2026-12-02: make test on a fresh clone of 1f2a0ce, 1734 s with the checks (the "
                        "integration tier 1705 s, 3301 of 3410 core-seconds busy)"},
}

SLICES = {
    "kernels": {
        "claims": [
            "a dra node switched to vm-passthrough and back after a kernel update, one reboot each way "
            "(molecule dra_switch on lab-dra)",
            "a stale initramfs of a kernel that is not running is named by verify_hosts.yml and rebuilt alone, without "
            "a reboot; the removal of that kernel is no error for gpu_facts",
        ],
        "paths": ["plugins/module_utils/_kernels.py", "plugins/module_utils/_bootloader.py",
                  "plugins/module_utils/_cmdline.py", "plugins/module_utils/_host.py",
                  "plugins/modules/kernel_modules.py", "plugins/modules/kernel_cmdline.py",
                  "plugins/modules/gpu_facts.py", "plugins/module_utils/_dra_blockers.py",
                  "roles/host_prepare/*", "roles/host_verify/*", "roles/host_reboot/*", "roles/preflight/*",
                  "playbooks/prepare_hosts.yml", "playbooks/verify_hosts.yml", "playbooks/switch*.yml",
                  "extensions/molecule/dra_switch/*", "extensions/molecule/shared/*", "lab/*"],
        "core_seconds": 1088,
        "source": ("refitted 2026-12-02: with repairs, make test-full of 10e7a4b (3702 s) less CI's run of 99e3208 "
                   "(2670 s), 2064 core-seconds, split 780:700 as before; its own QEMU CPU there: lab-dra 861 in "
                   "all, its chain ending 3342 s into the tier"),
    },
    "repairs": {
        "claims": [
            "a power loss during the initramfs generation of a first preparation is repaired by the next run "
            "(lab-vgpu, from the pristine image)",
            "a drifted host (a GPU off vfio-pci, a rule deleted) is repaired by every module, then skipped again",
            "a second run on a host another run holds stops naming that run; with the lock broken on request it runs",
            "a lab host that boots and never answers SSH is reported from its rescue report and started once more",
        ],
        "paths": ["plugins/module_utils/_lock.py", "plugins/module_utils/_persist.py", "plugins/modules/host_lock.py",
                  "plugins/modules/vfio_bind.py", "plugins/module_utils/_vfio.py", "plugins/module_utils/_host.py",
                  "plugins/modules/kernel_modules.py", "roles/host_prepare/*", "roles/preflight/*",
                  "roles/host_reboot/*", "playbooks/prepare_hosts.yml", "lab/gpulab.py", "lab/labcommon.py", "lab/labstate.py",
                  "lab/labreboot.py", "lab/labhost.py"],
        "core_seconds": 976,
        "source": ("refitted 2026-12-02 with kernels (see there); its own QEMU CPU in the full run of 10e7a4b: "
                   "lab-vgpu's power loss run 1354 s of wall, the network-less host 103 core-seconds"),
    },
    "cluster": {
        "claims": [
            "the cluster half on stand-in charts: labels, installs, KubeVirt entries checked against what the nodes "
            "advertise, the DRA path, validate.yml, re-runs keep the operator's labels, nodes joining and leaving, "
            "bad input failing clearly with nothing changed (test_70)",
            "the API server of a test session is its own (test_61); a corrupt binary in the lab's Kubernetes cache "
            "is rebuilt alone (test_60)",
            "operator labels stuck by a paused node are named and repaired only with consent (test_73)",
            "a node with GPU VMs is not drained (test_74)",
            "chart upgrades: CRDs first, values kept, downgrades refused, a killed upgrade rolled back (test_76)",
            "chart values checked against the chart, maxUnavailable 0 kept, another release's CRDs left alone, CRDs "
            "compared whatever the version order (test_77)",
            "the execution environment's context, the docs site and galaxy-importer (test_80)",
        ],
        "paths": ["roles/gpu_operator/*", "roles/dra_driver/*", "roles/cluster_nodes/*", "roles/cluster_validate/*",
                  "roles/kubevirt_devices/*", "roles/discover/*", "plugins/filter/*", "plugins/module_utils/_kube.py",
                  "plugins/module_utils/_cluster.py", "plugins/module_utils/_chart_upgrade.py",
                  "plugins/module_utils/_sharing.py", "plugins/modules/node_labels.py",
                  "plugins/modules/kubevirt_host_devices.py", "plugins/modules/kube_access.py",
                  "playbooks/cluster.yml", "playbooks/validate.yml", "playbooks/remove_nodes.yml",
                  "lab/kubelab.py", "lab/kubebuild.py", "lab/kubecommon.py", "lab/kubeserver.py",
                  "lab/kubefixtures.py", "tests/fixtures/*",
                  "docs/*", "galaxy.yml", "meta/*", "execution-environment.yml", "scripts/build-docs.sh",
                  "scripts/galaxy-import.sh"],
        "core_seconds": 1191,
        "source": ("refitted 2026-12-02: with uefi, CI's run of 99e3208 (2670 s) less make test of 1f2a0ce (1734 s), "
                   "1872 core-seconds, split 1400:800 as before; test_70 alone 2655 s of wall in the full run"),
    },
    # lab-passthrough shaped as a RHEL-family host for the session: the landing tier's work on it (the
    # vm_passthrough scenario, the switch there and back, the refused switch, test_95's re-run) then runs on UEFI
    # boots through systemd-boot and dracut, and the kernel update follows. The grub-only checks of that chain (the
    # claim taken out of /etc/default/grub, the owner's later edit of it) skip in such a session: lab-passthrough
    # boots through grub in every landing without this slice.
    "uefi": {
        "claims": [
            "the vm-passthrough preparation from pristine (check mode, one reboot, the verifier's nested guest), the "
            "switch to container and back, the refused switch and the idempotent re-run (test_95) on a host that "
            "boots the RHEL family's way: OVMF, systemd-boot entries written by kernel-install, dracut "
            "(lab-passthrough with gpulab_boot: uefi)",
            "a second kernel installed there gets the collection's arguments in its entry; an entry that lost them "
            "is named by verify_hosts.yml and written again without a reboot (test_85)",
        ],
        "lab_settings": {"lab-passthrough": {"gpulab_boot": "uefi"}},
        "paths": ["lab/labuefi.py", "plugins/module_utils/_bootloader.py", "plugins/module_utils/_cmdline.py",
                  "plugins/modules/kernel_cmdline.py", "extensions/molecule/shared/distro_boot.yml"],
        "core_seconds": 681,
        "source": ("refitted 2026-12-02 with cluster (see there); lab-passthrough's QEMU 1189 core-seconds on UEFI in "
                   "the full run of 10e7a4b against 574 on grub in make test of 1f2a0ce, its chain ending at the "
                   "kernel entry 3401 s into the tier"),
    },
}


class Part:
    """A piece of the lab's work: what it is, on which host, the claim it stands for, its tier or slice, and the
    part it waits for (None: it starts with the session, after the boot of every lab host where `after` says)."""

    def __init__(self, name, host, claim, tier=LANDING, after=None):
        self.name, self.host, self.claim, self.tier, self.after = name, host, claim, tier, after

    def __repr__(self):
        return "Part(%r, %s)" % (self.name, self.tier)


LAB_WORK = [
    Part("boot", "every lab host", "the hosts start from the pristine image, reset and booted together"),
    Part("module targets", "lab-modules", "each module's target on the real kernel: kernel_cmdline, a power loss "
         "and the lab CLI's crash recovery, then the other targets on the IOMMU-enabled kernel", after="boot"),
    Part("scenario container", "lab-container", "first preparation of a container node from pristine, one reboot, "
         "testinfra verify, the host held to the plan plan.yml made before and planned again to nothing (the no-op "
         "second run: test_95)", after="boot"),
    Part("scenario vm_passthrough", "lab-passthrough", "check mode, first preparation of a vm-passthrough node "
         "from pristine, one reboot, testinfra verify with a nested guest and against the plan made before (the no-op "
         "second run: test_95)", after="boot"),
    Part("scenario vm_vgpu", "lab-vgpu", "check mode, first preparation of a vm-vgpu node from pristine, one reboot, "
         "testinfra verify against the plan made before (the no-op second run: test_95)", after="boot"),
    Part("scenario dra", "lab-dra", "first preparation of a dra node from pristine, one reboot, testinfra "
         "verify against the plan made before (the no-op second run: test_95)", after="boot"),
    Part("preflight failures", "lab-container", "four preflight refusals that change nothing",
         after="scenario container"),
    Part("held host", "lab-container", "a run stopped by another run's lock, then run with the lock broken",
         tier="repairs", after="preflight failures"),
    Part("switch", "lab-passthrough", "vm-passthrough to container and back, one reboot each way",
         after="scenario vm_passthrough"),
    Part("refused switch", "lab-passthrough", "a switch refused over a process holding the VFIO group, nothing "
         "changed", after="switch"),
    Part("drift", "lab-passthrough", "a drifted host repaired, then skipped again", tier="repairs",
         after="refused switch"),
    Part("kernel entry", "lab-passthrough", "on a systemd-boot host (gpulab_boot: uefi): a new kernel's entry gets "
         "the arguments, one that lost them is named and written again (after the drift repair when repairs runs)",
         tier="uefi", after="refused switch"),
    Part("dra_switch", "lab-dra", "dra to vm-passthrough and back after a kernel update", tier="kernels",
         after="scenario dra"),
    Part("kernel repair", "lab-dra", "a stale initramfs named and rebuilt alone; the old kernel's removal",
         tier="kernels", after="dra_switch"),
    Part("power loss", "lab-vgpu", "a power loss during the initramfs generation, repaired by the next run",
         tier="repairs", after="scenario vm_vgpu"),
    Part("no network", "lab-nonet", "a host that never answers SSH, reported from its rescue report",
         tier="repairs", after="boot"),
]
PARTS = {part.name: part for part in LAB_WORK}

# The hosts on the landing tier's longest chain, and the nice value their QEMU gets while the lab work runs. On
# lab-passthrough the vm_passthrough scenario (check mode, the converge, the verifier's nested guest), the switch
# there and back and the refused switch run one after the other, and the tier waits for them: on 2026-12-01 that
# chain ended 1000 s after every other host's work. At nice -2 its QEMU weighs about 1.55 times another's, so it
# runs sooner while four hosts and the controller share the two cores; the others keep equal shares among themselves
# (a host starved to a fraction of a core timed out in update-initramfs and in systemd's device waits, 2026-11-26).
CRITICAL_HOSTS = {"lab-passthrough": -2}


def parse_slices(text):
    """The slices a GPUOPS_SLICES value names: a comma-separated list, `all` for every one. Raises ValueError on a
    name that is no slice."""
    names = [name.strip() for name in (text or "").split(",") if name.strip()]
    if names == ["all"]:
        return list(SLICES)
    unknown = [name for name in names if name not in SLICES]
    if unknown:
        raise ValueError("%s=%r: no slice named %s; the slices are: %s (or all)"
                         % (SLICES_ENV, text, ", ".join(unknown), ", ".join(SLICES)))
    return [name for name in SLICES if name in names]


def selected_slices(environ=None):
    return parse_slices((os.environ if environ is None else environ).get(SLICES_ENV, ""))


def lab_settings(slices, existing=None):
    """The per-host lab settings the selected `slices` need (their lab_settings), over `existing` (what the session
    was given in LAB_SETTINGS_ENV, as lab/labconfig.py's settings_overrides reads and checks it): {} when none."""
    merged = {host: dict(values) for host, values in (existing or {}).items()}
    for name in slices:
        for host, values in SLICES[name].get("lab_settings", {}).items():
            merged.setdefault(host, {}).update(values)
    return merged


def runs(tier, slices):
    """Whether work of `tier` (LANDING or a slice's name) runs when `slices` are selected."""
    return tier == LANDING or tier in slices


def part_runs(name, slices):
    """Whether the lab part `name` runs: its own tier is selected, and so is every part it waits for."""
    part = PARTS[name]
    return runs(part.tier, slices) and (part.after is None or part_runs(part.after, slices))


def paths_match(patterns, paths):
    """The paths (relative to the checkout) that one of `patterns` (fnmatch; `dir/*` takes everything below dir)
    matches."""
    return sorted(path for path in paths if any(fnmatch.fnmatch(path, pattern) for pattern in patterns))


# Each directory of tests/integration/targets is a module target, found there: its aliases file says when it runs on lab-modules,
# `gpulab/before_reboot/<order>` (on the pristine command line: kernel_cmdline) or `gpulab/after_reboot/<order>` (on
# the kernel the restart boots), and `gpulab/plain_ssh` keeps its play off mitogen. A directory without tasks/main.yml
# or without its place is an error of the session, not a target skipped.
TARGET_ALIAS = re.compile(r"^gpulab/(before_reboot|after_reboot)/(\d+)$")


def module_targets_found(directory):
    """({"before_reboot": [names], "after_reboot": [names]}, [names on plain SSH]), each phase in its order."""
    phases, plain = {"before_reboot": [], "after_reboot": []}, []
    problems = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not os.path.isdir(path):
            continue
        try:
            with open(os.path.join(path, "aliases"), encoding="utf-8") as handle:
                aliases = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
        except OSError:
            aliases = []
        places = [TARGET_ALIAS.match(alias) for alias in aliases if TARGET_ALIAS.match(alias)]
        if not os.path.isfile(os.path.join(path, "tasks", "main.yml")):
            problems.append("%s has no tasks/main.yml" % name)
        if len(places) != 1:
            problems.append("%s's aliases give it %d places on lab-modules (one gpulab/before_reboot/<order> or "
                            "gpulab/after_reboot/<order> is needed)" % (name, len(places)))
            continue
        phases[places[0].group(1)].append((int(places[0].group(2)), name))
        if "gpulab/plain_ssh" in aliases:
            plain.append(name)
    if problems:
        raise ValueError("module targets under tests/integration/targets: " + "; ".join(problems))
    return {phase: [name for _order, name in sorted(found)] for phase, found in phases.items()}, plain
