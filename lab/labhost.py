# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""labhost: a lab host as a process: the QEMU command line, the accelerator and the Vm class.

A host is a QEMU process started with -daemonize: the machine (q35 with an emulated Intel IOMMU), the stand-in
devices of its layout (lab/layout.py), KVM when it boots a kernel here and software emulation otherwise. The
Vm class keeps a host's overlay disk, pid file, QMP sockets, console log and recorded state under
.lab/<name>, starts and stops its QEMU and reads its state through QMP.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from labcommon import free_ports, port_free, read_json
import labstate
import labuefi
import layout as layout_mod
from labconfig import (CACHE, CLI, CPUS, INVENTORY_HOSTS, MEMORY_MB, STATE, TCG_CPU, LabError, image_path,
                       lab_host_settings, log, read_text, run)


def qemu_base_cmd(name, accel, iommu=True):
    """The machine: q35 with an emulated Intel IOMMU (its ACPI DMAR table), unless ``iommu`` is false, which
    stands for a host whose firmware has VT-d turned off."""
    machine = "q35,accel=%s" % accel
    if accel == "kvm":
        machine += ",kernel-irqchip=split"
    cmd = [
        "qemu-system-x86_64", "-name", name, "-machine", machine, "-cpu", TCG_CPU if accel == "tcg" else "host",
        "-smp", str(CPUS), "-m", str(MEMORY_MB), "-display", "none", "-monitor", "none",
    ]
    if iommu:
        cmd += ["-device", "intel-iommu,intremap=on"]
    return cmd


def stand_in_devices(nvme_serial, layout=None, host="lab host", hold_sriov=False):
    """The devices that stand in for GPUs: the host's gpulab_layout, or the default (see lab/layout.py); with
    `hold_sriov`, without the SR-IOV function's controller (hot-plugged later, see lab/labstate.py)."""
    try:
        return layout_mod.qemu_args(layout, nvme_serial, host, hold_sriov=hold_sriov)
    except layout_mod.LayoutError as exc:
        raise LabError("%s (inventory %s)" % (exc, INVENTORY_HOSTS))


def qcow2_overlay(path, backing, backing_format):
    """A new qcow2 overlay at `path` on `backing` (written beside it, then moved into place)."""
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", backing_format, "-b", backing, path + ".tmp"], timeout=60)
    os.replace(path + ".tmp", path)


class PristinePlan:
    """How a host starts from the pristine image: "restore" (from its shape's saved boot) or "save" (a cold boot,
    saved once it answers); `hotplug` is (device_add argument, guest address) of the SR-IOV controller to add
    once the guest runs, or None."""

    def __init__(self, mode, saved, hotplug):
        self.mode, self.saved, self.hotplug = mode, saved, hotplug


def accel_cache_key():
    return "%s|%s" % (os.uname().release, labstate.qemu_version())


def choose_accel(kernel=None, initrd=None):
    """KVM when it boots a kernel here, software emulation (TCG) otherwise; the probe is cached."""
    forced = os.environ.get("GPUOPS_LAB_ACCEL")
    if forced:
        if forced not in ("kvm", "tcg"):
            raise LabError("GPUOPS_LAB_ACCEL=%s: expected kvm or tcg" % forced)
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    cache = os.path.join(CACHE, "accel.json")
    key = accel_cache_key()
    known = read_json(cache)
    if known.get("key") == key and known.get("accel") in ("kvm", "tcg"):
        return known["accel"]
    # Without a loose kernel at hand, the probe boots the cached image itself through grub.
    accel = "kvm" if probe_kvm(kernel, initrd) else "tcg"
    log("KVM %s; using %s" % ("works" if accel == "kvm" else "did not boot a kernel in time", accel))
    os.makedirs(CACHE, exist_ok=True)
    with open(cache, "w") as handle:
        json.dump({"key": key, "accel": accel}, handle)
    return accel


def probe_kvm(kernel, initrd, seconds=25):
    """Boot a kernel under KVM and watch the console for init starting."""
    with tempfile.TemporaryDirectory() as tmp:
        serial = os.path.join(tmp, "serial.log")
        cmd = qemu_base_cmd("gpulab-kvm-probe", "kvm") + ["-serial", "file:" + serial, "-no-reboot", "-nic", "none"]
        if kernel:
            cmd += ["-kernel", kernel, "-initrd", initrd, "-append", "console=ttyS0 panic=-1"]
        else:
            cmd += ["-drive", "file=%s,if=virtio,format=raw,readonly=on" % image_path()]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        ok = False
        deadline = time.time() + seconds
        while time.time() < deadline and proc.poll() is None:
            text = read_text(serial)
            if "Run /init as init process" in text or "Freeing unused kernel" in text:
                ok = True
                break
            time.sleep(0.5)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        return ok


# The disk and network devices every host has (part of a shape's key, see PristinePlan).
DISK_DEVICE = ["-device", "virtio-blk-pci,drive=disk0,addr=06.0"]
NIC_DEVICE = ["-device", "virtio-net-pci,netdev=net0,addr=07.0"]


def nic_device(settings, host):
    """The NIC's device arguments: a gpulab_boot: uefi host's has no option ROM, so OVMF does not load iPXE's network
    boot driver at each boot (the host boots from its ESP; lab/labuefi.py)."""
    if labuefi.boot_of(settings, host) == "uefi":
        return [NIC_DEVICE[0], NIC_DEVICE[1] + ",romfile="]
    return NIC_DEVICE


class Vm:
    """One lab host: its overlay disk, QEMU process, SSH port and console log under .lab/<name>."""

    pending = None

    def __init__(self, name):
        self.name = name
        self.dir = os.path.join(STATE, name)
        self.disk = os.path.join(self.dir, "disk.qcow2")
        self.pidfile = os.path.join(self.dir, "qemu.pid")
        self.qmp_path = os.path.join(self.dir, "qmp.sock")
        self.serial = os.path.join(self.dir, "console.log")
        self.rescue = os.path.join(self.dir, "rescue.sock")
        self.rescue_log = os.path.join(self.dir, "rescue.log")
        self.events = os.path.join(self.dir, "events.sock")
        self.follow_log = os.path.join(self.dir, "reboots.log")
        self.meta_path = os.path.join(self.dir, "vm.json")
        # A gpulab_boot: uefi host's ESP disk and firmware variables (lab/labuefi.py).
        self.esp = os.path.join(self.dir, "esp.qcow2")
        self.vars = os.path.join(self.dir, "vars.fd")
        self.boot_files = (self.esp, self.vars)
        self.converting = False

    # -- recorded state -----------------------------------------------------------------------
    def meta(self):
        return read_json(self.meta_path)

    def save_meta(self, **values):
        data = self.meta()
        data.update(values)
        os.makedirs(self.dir, exist_ok=True)
        with open(self.meta_path + ".tmp", "w") as handle:
            json.dump(data, handle, indent=2)
        os.replace(self.meta_path + ".tmp", self.meta_path)

    def pid(self):
        try:
            with open(self.pidfile) as handle:
                return int(handle.read().strip())
        except (OSError, ValueError):
            return None

    def process_alive(self):
        pid = self.pid()
        if not pid:
            return False
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as handle:
                cmdline = handle.read().split(b"\0")
        except OSError:
            return False
        return b"qemu-system-x86_64" in os.path.basename(cmdline[0]) and self.name.encode() in cmdline

    @contextlib.contextmanager
    def _qmp_session(self, path, timeout):
        """A QMP connection on the unix socket `path`, past the greeting and the capabilities' answer: (socket,
        line reader)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            reader = sock.makefile("r")
            json.loads(reader.readline())  # greeting
            sock.sendall(b'{"execute": "qmp_capabilities"}\n')
            self._qmp_reply(reader)
            yield sock, reader

    def qmp_command(self, command, timeout=10):
        """Send one QMP command; return its answer dict, or None when QEMU does not answer."""
        return self.qmp(command, timeout_=timeout)

    def qmp(self, command, timeout_=10, **arguments):
        """Send one QMP command with `arguments`; its answer dict, or None when QEMU does not answer."""
        message = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        try:
            with self._qmp_session(self.qmp_path, timeout_) as (sock, reader):
                sock.sendall(json.dumps(message).encode() + b"\n")
                return self._qmp_reply(reader)
        except (OSError, ValueError):
            return None

    @staticmethod
    def _qmp_reply(reader):
        while True:
            line = reader.readline()
            if not line:
                raise ValueError("QMP closed")
            msg = json.loads(line)
            if "return" in msg or "error" in msg:
                return msg

    def state(self):
        """running, stale (pid file but no live QEMU), hung (QEMU alive, not running) or stopped."""
        if self.process_alive():
            reply = self.qmp_command("query-status")
            if reply and reply.get("return", {}).get("status") == "running":
                return "running"
            return "hung"
        if os.path.exists(self.pidfile):
            return "stale"
        return "stopped"

    # -- lifecycle -----------------------------------------------------------------------------
    def ensure_overlay(self, manifest):
        if os.path.exists(self.disk) and self.meta().get("image_id") == manifest["id"]:
            return
        if os.path.exists(self.disk):
            log("%s: the base image changed; starting from a fresh copy of it" % self.name)
        self.new_overlay(manifest)

    def new_overlay(self, manifest, backing=None):
        """A new overlay disk on the pristine image, or on `backing` (a saved boot's disk, itself on the image)."""
        os.makedirs(self.dir, exist_ok=True)
        qcow2_overlay(self.disk, backing or image_path(), "qcow2" if backing else "raw")
        for path in self.boot_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.save_meta(image_id=manifest["id"], created=time.time(), pristine=backing is None, firmware=None)

    def converted(self):
        """True once this host boots through UEFI (converted, or restored from a converted host's saved boot)."""
        return self.meta().get("firmware") == "uefi"

    def boot_args(self, settings):
        """(the disk's device arguments, the firmware's and ESP's) of this host's next start: a gpulab_boot: uefi
        host boots through OVMF once converted, and before that through the BIOS from the base image's disk, first
        in the boot order, beside its empty ESP disk (lab/labuefi.py)."""
        if labuefi.boot_of(settings, self.name) == "bios":
            return DISK_DEVICE, []
        if self.converted():
            if not os.path.exists(self.vars):
                labuefi.new_variables(self.vars)
            return DISK_DEVICE, labuefi.firmware_args(labuefi.firmware()[0], self.vars) + labuefi.esp_args(
                self.esp, bootindex=0)
        if not os.path.exists(self.esp):
            labuefi.new_esp(self.esp)
        return [DISK_DEVICE[0], DISK_DEVICE[1] + ",bootindex=0"], labuefi.esp_args(self.esp)

    def saved_extras(self):
        """The files a saved boot of this host keeps beside its overlay disk: {name in the saved boot: path}."""
        return {"esp.qcow2": self.esp, "vars.fd": self.vars} if self.converted() else {}

    def restore_extras(self, saved):
        """A host restored from `saved`: its ESP disk on the saved one, its variables a copy of the saved ones."""
        extras = saved.meta().get("extra_bytes") or {}
        if "esp.qcow2" not in extras:
            return
        qcow2_overlay(self.esp, os.path.join(saved.dir, "esp.qcow2"), "qcow2")
        shutil.copyfile(os.path.join(saved.dir, "vars.fd"), self.vars + ".tmp")
        os.replace(self.vars + ".tmp", self.vars)
        self.save_meta(firmware="uefi")

    def pristine_plan(self, manifest, accel, settings):
        """How this host starts when its overlay is still the pristine image's (a PristinePlan), or None: a cold
        boot with every device (a host that has run, saved boots turned off, a host without a network, an SR-IOV
        function that cannot be hot-plugged)."""
        if not self.meta().get("pristine") or not labstate.enabled() or settings.get("gpulab_network", True) is False:
            return None
        layout = settings.get("gpulab_layout")
        try:
            has_sriov = any("sriov" in entry["functions"] for entry in layout_mod.normalise(layout, self.name))
            hotplug = layout_mod.sriov_hotplug(layout, "gpulab-" + self.name, self.name)
        except layout_mod.LayoutError as exc:
            raise LabError("%s (inventory %s)" % (exc, INVENTORY_HOSTS))
        if has_sriov and hotplug is None:
            return None
        iommu = settings.get("gpulab_iommu", True) is not False
        # A gpulab_boot: uefi host is saved once converted (lab/labuefi.py): its shape has the firmware and ESP.
        boot = labuefi.shape_args() if labuefi.boot_of(settings, self.name) == "uefi" else []
        shape = qemu_base_cmd("gpulab", accel, iommu=iommu) + boot + DISK_DEVICE + nic_device(
            settings, self.name) + stand_in_devices("gpulab-shape", layout, self.name, hold_sriov=True)
        saved = labstate.SavedBoot(labstate.shape_key(manifest["id"], accel, shape))
        return PristinePlan("restore" if saved.ready() else "save", saved, hotplug)

    def launch(self, manifest, accel, pubkey_file, rebooting=False):
        """Start QEMU; its SSH port. ``rebooting``: the guest asked for a restart (follow_reboots), so the host
        keeps its port and its console log goes on in the same file. A host started from the pristine image is
        restored from its shape's saved boot, or boots without its SR-IOV controller to be saved (lab/labstate.py):
        `self.pending` holds that plan (a PristinePlan, None for a cold boot with every device), which
        finish_pristine carries out once the guest runs."""
        self.ensure_overlay(manifest)
        settings = lab_host_settings(self.name)
        uefi = labuefi.boot_of(settings, self.name) == "uefi"
        if not rebooting and uefi and not self.converted() and not self.meta().get("pristine"):
            log("%s: its conversion to UEFI did not finish; starting from a fresh copy of the image" % self.name)
            self.new_overlay(manifest)
        elif not rebooting and not uefi and self.converted():
            log("%s: boots through the BIOS now (gpulab_boot), its disk is a UEFI host's; starting from a fresh copy "
                "of the image" % self.name)
            self.new_overlay(manifest)
        plan = None if rebooting else self.pristine_plan(manifest, accel, settings)
        if plan is not None and plan.mode == "restore":
            try:
                return self._launch(manifest, accel, pubkey_file, rebooting, plan)
            except labstate.SavedBootError as exc:
                log("%s: %s; booting it cold instead" % (self.name, exc))
                self.kill()
                plan.saved.discard(str(exc))
                self.new_overlay(manifest)
                plan = PristinePlan("save", plan.saved, plan.hotplug)
        return self._launch(manifest, accel, pubkey_file, rebooting, plan)

    def _launch(self, manifest, accel, pubkey_file, rebooting, plan):
        self.pending = plan
        incoming = []
        if plan is not None and plan.mode == "restore":
            self.new_overlay(manifest, backing=plan.saved.disk)
            self.restore_extras(plan.saved)
            incoming = ["-incoming", "exec:cat %s" % labstate.quoted(plan.saved.state)]
        if not rebooting:
            # A gpulab_boot: uefi host that is not converted boots the base image to be converted (gpulab.py).
            self.converting = (labuefi.boot_of(lab_host_settings(self.name), self.name) == "uefi"
                               and not self.converted())
        for attempt in range(1 if rebooting else 3):
            port = self.meta().get("ssh_port")
            if port and not attempt and not rebooting and not port_free(port):
                log("%s: port %d is taken by another program; using a free one" % (self.name, port))
                port = None
            if not port or attempt:
                port = free_ports(1)[0]
            for path in (self.pidfile, self.qmp_path, self.events, self.rescue):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            # Keep the previous console log for post-mortems.
            if os.path.exists(self.serial) and not rebooting:
                os.replace(self.serial, self.serial + ".previous")
            settings = lab_host_settings(self.name)
            iommu = settings.get("gpulab_iommu", True) is not False
            # gpulab_network: false leaves the NIC out (a host that boots and never answers: the lab's test of
            # its own recovery).
            # (QEMU adds a user-network NIC of its own to a machine given none: -nic none.)
            nic = ["-nic", "none"] if settings.get("gpulab_network", True) is False else [
                "-netdev", "user,id=net0,hostfwd=tcp:127.0.0.1:%d-:22" % port] + nic_device(settings, self.name)
            disk_device, boot = self.boot_args(settings)
            cmd = qemu_base_cmd(self.name, accel, iommu=iommu) + boot + [
                "-drive", "file=%s,if=none,id=disk0,format=qcow2" % self.disk,
            ] + disk_device + nic + incoming + [
                "-fw_cfg", "name=opt/gpuops/authorized_keys,file=%s" % pubkey_file,
                "-chardev", "file,id=console,path=%s,append=on" % self.serial, "-serial", "chardev:console",
                # The rescue port (ttyS1): the guest's report when SSH does not answer (rescue_report).
                "-chardev", "socket,id=rescue,path=%s,server=on,wait=off" % self.rescue, "-serial", "chardev:rescue",
                "-qmp", "unix:%s,server=on,wait=off" % self.qmp_path,
                # A guest's reboot ends this QEMU; follow_reboots starts the host again (see there why).
                "-qmp", "unix:%s,server=on,wait=off" % self.events, "-action", "reboot=shutdown",
                "-pidfile", self.pidfile, "-daemonize",
            ] + stand_in_devices("gpulab-" + self.name, settings.get("gpulab_layout"), self.name,
                                 hold_sriov=plan is not None)
            proc = subprocess.run(cmd, timeout=120, check=False, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            if proc.returncode == 0:
                keep_priority(self.pid())
                self.save_meta(ssh_port=port, accel=accel, started=time.time(), pristine=False,
                               start=("restored from saved boot %s" % plan.saved.key if incoming else "cold boot"))
                if incoming:
                    self._wait_restored()
                self.follow()
                return port
            err = proc.stderr.strip()
            if "hostfwd" in err or "Could not set up host forwarding" in err:
                log("%s: port %d was taken; trying another" % (self.name, port))
                continue
            raise LabError("%s: QEMU did not start (rc=%s): %s" % (self.name, proc.returncode, err))
        raise LabError("%s: no free SSH port found after 3 tries" % self.name)

    def _wait_restored(self, timeout=600):
        """Wait until QEMU has loaded the saved boot and runs the guest; SavedBootError when it does not."""
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            if not self.process_alive():
                raise labstate.SavedBootError("QEMU stopped while loading the saved boot")
            reply = self.qmp("query-status") or {}
            status = (reply.get("return") or {}).get("status")
            if status == "running":
                return
            if status == "paused":
                # The state was saved from a paused guest (see SavedBoot.save): QEMU keeps it paused.
                self.qmp("cont")
                continue
            if status not in (None, "inmigrate"):
                raise labstate.SavedBootError("QEMU is %s after loading the saved boot" % status)
            time.sleep(0.5)
        raise labstate.SavedBootError("QEMU did not load the saved boot within %ds (%s)" % (timeout, status))

    # -- a pristine start, once the guest runs (see launch) -----------------------------------------
    def tell_restored(self, timeout=300):
        """A guest restored from a saved boot: install this lab's key and set its clock, through the rescue port
        (SSH does not take this lab's key yet). SavedBootError when the guest does not confirm both."""
        for request, done in (("keys", "=== keys ok"), ("clock %d" % int(time.time()), "=== clock ok")):
            answer = self.rescue_request(request, ("=== %s " % request.split()[0],), timeout)
            if done not in answer:
                raise labstate.SavedBootError("the restored guest did not confirm `%s` on its rescue port: %s"
                                              % (request.split()[0], answer.strip()[-200:] or "no answer"))

    def save_boot(self, plan, manifest, port, close_ssh):
        """Save this host, just booted from the pristine image and answering, as its shape's boot, unless another
        host saves it now or it is there. `close_ssh(port)` ends the lab's shared SSH connection first (an open
        connection would be saved half-open). Logs what it did; a refusal is logged, not raised."""
        with plan.saved.writer() as mine:
            if not mine:
                return
            close_ssh(port)
            time.sleep(2)
            try:
                seconds = plan.saved.save(self, manifest["id"])
            except labstate.SavedBootError as exc:
                log("%s: not saved (%s); the next pristine start boots cold again" % (self.name, exc))
                return
            log("%s: saved as the boot of its shape (%s, %.0f MiB, %.0fs); pristine hosts of this shape start from "
                "it" % (self.name, plan.saved.key, os.path.getsize(plan.saved.state) / 1048576.0, seconds))

    def hotplug_sriov(self, plan):
        """Add the SR-IOV controller held back from the command line (hot-plug on its port); the guest address it
        should appear at."""
        spec, address = plan.hotplug
        reply = self.qmp("human-monitor-command", **{"command-line": "device_add %s,id=gpulab-sriov" % spec})
        text = ((reply or {}).get("return") or "") if reply and "error" not in reply else json.dumps(reply)
        if reply is None or "error" in reply or text.strip():
            raise LabError("%s: QEMU did not hot-plug the SR-IOV stand-in (%s): %s" % (self.name, spec, text.strip()))
        return address

    def rescue_request(self, request, marks, timeout):
        """Send one line on the rescue port; the text received until a line starting with one of `marks` ends,
        or until `timeout`."""
        chunks = []
        deadline = time.monotonic() + timeout
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(self.rescue)
                sock.sendall(request.encode() + b"\n")
                while time.monotonic() < deadline:
                    sock.settimeout(max(1.0, min(5.0, deadline - time.monotonic())))
                    try:
                        data = sock.recv(4096)
                    except socket.timeout:
                        # A guest paused by the host or slow to read: the request is asked again.
                        sock.sendall(request.encode() + b"\n")
                        continue
                    if not data:
                        break
                    chunks.append(data)
                    text = b"".join(chunks).decode("utf-8", "replace")
                    if any(mark in text and text.endswith("\n") for mark in marks):
                        break
        except OSError as exc:
            return "(the rescue port cannot be reached: %s)" % exc
        return b"".join(chunks).decode("utf-8", "replace").replace("\r", "")

    def kill(self, graceful_seconds=0):
        """Power the VM off: ACPI power button first (when graceful), then QEMU quit, then SIGKILL."""
        if self.process_alive():
            if graceful_seconds:
                self.qmp_command("system_powerdown")
                deadline = time.time() + graceful_seconds
                while time.time() < deadline and self.process_alive():
                    time.sleep(1)
            if self.process_alive():
                self.qmp_command("quit")
                deadline = time.time() + 10
                while time.time() < deadline and self.process_alive():
                    time.sleep(0.5)
            if self.process_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid(), signal.SIGKILL)
                time.sleep(1)
        for path in (self.pidfile, self.qmp_path, self.events, self.rescue):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def rescue_report(self, timeout=90):
        """What the guest says about itself on its rescue port (services, network, journal), read without SSH;
        kept in .lab/<host>/rescue.log. A note instead when the port does not answer within `timeout`."""
        chunks = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(self.rescue)
                sock.sendall(b"report\n")
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    sock.settimeout(max(1.0, deadline - time.monotonic()))
                    try:
                        data = sock.recv(65536)
                    except socket.timeout:
                        break
                    if not data:
                        break
                    chunks.append(data)
                    if b"=== end" in b"".join(chunks[-2:]):
                        break
        except OSError as exc:
            return "(no rescue report: the rescue port %s cannot be reached: %s)" % (self.rescue, exc)
        text = b"".join(chunks).decode("utf-8", "replace").replace("\r", "")
        start = text.find("=== gpulab-rescue")
        if start < 0:
            return "(no rescue report: the guest did not answer on its rescue port within %ds%s)" % (
                timeout, "; it sent: " + text.strip()[-300:] if text.strip() else "")
        report = text[start:]
        with open(self.rescue_log, "a", encoding="utf-8") as handle:
            handle.write(report + "\n")
        return report

    # -- reboots -------------------------------------------------------------------------------
    def follow(self):
        """Start this host's reboot follower (`gpulab follow-reboots HOST`, in a session of its own): it lives
        as long as this QEMU does."""
        os.makedirs(self.dir, exist_ok=True)
        with open(self.follow_log, "a", encoding="utf-8") as out:
            subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, CLI, "follow-reboots", self.name], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)

    def shutdown_reason(self):
        """Wait on QEMU's event monitor until this QEMU stops: the SHUTDOWN event's reason ("guest-reset" when
        the guest asked for a restart), or None when QEMU went without one (killed) or never answered."""
        try:
            with self._qmp_session(self.events, 30) as (sock, reader):
                sock.settimeout(None)
                for line in reader:
                    msg = json.loads(line)
                    if msg.get("event") == "SHUTDOWN":
                        return msg.get("data", {}).get("reason")
        except (OSError, ValueError):
            return None
        return None


def keep_priority(pid):
    """Give a daemonized QEMU the priority of the command that started it. -daemonize starts a session of its
    own, and where the kernel groups processes by session for scheduling (autogroup, on by default in most
    distributions) a session's share of the CPU is set by its group's nice value, not by its processes' own:
    a lab host started at a lower priority (`nice gpulab start`) would compete as an equal. True when the
    group took the value; False when there was nothing to carry over or no autogroup to set."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if not pid or nice <= 0:
        return False
    try:
        with open("/proc/%d/autogroup" % pid, "w", encoding="ascii") as handle:
            handle.write(str(nice))
    except OSError:
        return False
    return True
