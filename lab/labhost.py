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
import signal
import socket
import subprocess
import sys
import tempfile
import time

from labcommon import free_ports, port_free, read_json
import layout as layout_mod
from labconfig import (CACHE, CLI, CPUS, INVENTORY_HOSTS, MEMORY_MB, STATE, LabError, image_path, lab_host_settings,
                       log, read_text, run)


def qemu_base_cmd(name, accel, iommu=True):
    """The machine: q35 with an emulated Intel IOMMU (its ACPI DMAR table), unless ``iommu`` is false, which
    stands for a host whose firmware has VT-d turned off."""
    machine = "q35,accel=%s" % accel
    if accel == "kvm":
        machine += ",kernel-irqchip=split"
    cmd = [
        "qemu-system-x86_64", "-name", name, "-machine", machine, "-cpu", "max" if accel == "tcg" else "host",
        "-smp", str(CPUS), "-m", str(MEMORY_MB), "-display", "none", "-monitor", "none",
    ]
    if iommu:
        cmd += ["-device", "intel-iommu,intremap=on"]
    return cmd


def stand_in_devices(nvme_serial, layout=None, host="lab host"):
    """The devices that stand in for GPUs: the host's gpulab_layout, or the default (see lab/layout.py)."""
    try:
        return layout_mod.qemu_args(layout, nvme_serial, host)
    except layout_mod.LayoutError as exc:
        raise LabError("%s (inventory %s)" % (exc, INVENTORY_HOSTS))


def accel_cache_key():
    qemu = run(["qemu-system-x86_64", "--version"], timeout=30).stdout.splitlines()[0]
    return "%s|%s" % (os.uname().release, qemu)


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


class Vm:
    """One lab host: its overlay disk, QEMU process, SSH port and console log under .lab/<name>."""

    def __init__(self, name):
        self.name = name
        self.dir = os.path.join(STATE, name)
        self.disk = os.path.join(self.dir, "disk.qcow2")
        self.pidfile = os.path.join(self.dir, "qemu.pid")
        self.qmp = os.path.join(self.dir, "qmp.sock")
        self.serial = os.path.join(self.dir, "console.log")
        self.rescue = os.path.join(self.dir, "rescue.sock")
        self.rescue_log = os.path.join(self.dir, "rescue.log")
        self.events = os.path.join(self.dir, "events.sock")
        self.follow_log = os.path.join(self.dir, "reboots.log")
        self.meta_path = os.path.join(self.dir, "vm.json")

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
        try:
            with self._qmp_session(self.qmp, timeout) as (sock, reader):
                sock.sendall(json.dumps({"execute": command}).encode() + b"\n")
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
        os.makedirs(self.dir, exist_ok=True)
        tmp = self.disk + ".tmp"
        run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", image_path(), tmp], timeout=60)
        os.replace(tmp, self.disk)
        self.save_meta(image_id=manifest["id"], created=time.time())

    def launch(self, manifest, accel, pubkey_file, rebooting=False):
        """Start QEMU; its SSH port. ``rebooting``: the guest asked for a restart (follow_reboots), so the host
        keeps its port and its console log goes on in the same file."""
        self.ensure_overlay(manifest)
        for attempt in range(1 if rebooting else 3):
            port = self.meta().get("ssh_port")
            if port and not attempt and not rebooting and not port_free(port):
                log("%s: port %d is taken by another program; using a free one" % (self.name, port))
                port = None
            if not port or attempt:
                port = free_ports(1)[0]
            for path in (self.pidfile, self.qmp, self.events, self.rescue):
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
                "-netdev", "user,id=net0,hostfwd=tcp:127.0.0.1:%d-:22" % port,
                "-device", "virtio-net-pci,netdev=net0,addr=07.0"]
            cmd = qemu_base_cmd(self.name, accel, iommu=iommu) + [
                "-drive", "file=%s,if=none,id=disk0,format=qcow2" % self.disk,
                "-device", "virtio-blk-pci,drive=disk0,addr=06.0",
            ] + nic + [
                "-fw_cfg", "name=opt/gpuops/authorized_keys,file=%s" % pubkey_file,
                "-chardev", "file,id=console,path=%s,append=on" % self.serial, "-serial", "chardev:console",
                # The rescue port (ttyS1): the guest's report when SSH does not answer (rescue_report).
                "-chardev", "socket,id=rescue,path=%s,server=on,wait=off" % self.rescue, "-serial", "chardev:rescue",
                "-qmp", "unix:%s,server=on,wait=off" % self.qmp,
                # A guest's reboot ends this QEMU; follow_reboots starts the host again (see there why).
                "-qmp", "unix:%s,server=on,wait=off" % self.events, "-action", "reboot=shutdown",
                "-pidfile", self.pidfile, "-daemonize",
            ] + stand_in_devices("gpulab-" + self.name, settings.get("gpulab_layout"), self.name)
            proc = subprocess.run(cmd, timeout=120, check=False, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            if proc.returncode == 0:
                keep_priority(self.pid())
                self.save_meta(ssh_port=port, accel=accel, started=time.time())
                self.follow()
                return port
            err = proc.stderr.strip()
            if "hostfwd" in err or "Could not set up host forwarding" in err:
                log("%s: port %d was taken; trying another" % (self.name, port))
                continue
            raise LabError("%s: QEMU did not start (rc=%s): %s" % (self.name, proc.returncode, err))
        raise LabError("%s: no free SSH port found after 3 tries" % self.name)

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
        for path in (self.pidfile, self.qmp, self.events, self.rescue):
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
