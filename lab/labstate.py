# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""labstate: saved boots. A host started from the pristine image is restored from a saved boot of its shape.

The first host of a shape (the same machine, devices, memory, image and QEMU) that boots from the pristine image
is saved once it answers SSH: QEMU writes its state to a file of the machine's cache (`migrate` to a file while
the guest is paused) and the lab keeps a copy of the host's overlay disk as it was at that instant. Every later
pristine start of a host of that shape, in any checkout of the machine, starts QEMU with `-incoming` from that
file on a new overlay backed by the copy: the guest goes on from a booted system in seconds, where a cold boot
under emulation costs about 70 s of a core. Reboots, power losses and starts of a host that has worked are cold
starts, as before: only the pristine boot is replaced.

What a restored guest is told before anything uses it, through its rescue port (the second serial port, no
SSH needed): `keys` (the lab's SSH key, from the new QEMU's fw_cfg: the saved guest holds the key of the lab
that saved it) and `clock SECONDS` (its clock stood still since the save).

QEMU 7.2 cannot save a machine with the NVMe controller that stands in for the SR-IOV GPU ("State blocked by
non-migratable device"). Every host whose layout has it alone in a slot behind a port therefore boots, or is
restored, without the controller and gets it hot-plugged on its port as soon as it answers (its subsystem and
port are on the command line; the guest's PCIe hot-plug driver adds it and the nvme driver binds it, at the
address a cold boot gives it). A host whose SR-IOV function shares its slot, or sits on the root bus, boots cold.

GPUOPS_LAB_SAVED_STATES=0 boots every host cold and saves nothing; a host without a network (gpulab_network:
false) always boots cold (its boot never answers: the lab's own test of that).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time

from labcommon import read_json
from labconfig import CACHE, CPUS, MEMORY_MB, RECIPE_VERSION, LabError, log

ENV = "GPUOPS_LAB_SAVED_STATES"
STATES = os.path.join(CACHE, "states")
# Bump when what a saved boot holds changes in a way its key does not show.
FORMAT = "1"


class SavedBootError(LabError):
    """A saved boot that could not be made or used; the host boots cold instead."""


def enabled():
    value = os.environ.get(ENV, "1")
    if value not in ("0", "1"):
        raise LabError("%s=%r: expected 0 (every host boots cold) or 1 (saved boots, the default)" % (ENV, value))
    return value == "1"


def qemu_version():
    try:
        proc = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (proc.stdout.splitlines() or ["unknown"])[0]


def shape_key(image_id, accel, machine_args, version=None):
    """The key of a shape: what makes two hosts' saved boots interchangeable (the image, QEMU, the accelerator,
    memory and CPUs, and every machine and device argument, without the host's own paths and ports)."""
    data = [FORMAT, RECIPE_VERSION, image_id, version or qemu_version(), accel, MEMORY_MB, CPUS, list(machine_args)]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:20]


class SavedBoot:
    """The saved boot of one shape in the machine's cache: states/<key>/{state, disk.qcow2, saved.json}."""

    def __init__(self, key):
        self.key = key
        self.dir = os.path.join(STATES, key)
        self.state = os.path.join(self.dir, "state")
        self.disk = os.path.join(self.dir, "disk.qcow2")
        self.meta_path = os.path.join(self.dir, "saved.json")

    def meta(self):
        return read_json(self.meta_path)

    def ready(self):
        """True when its files are there, whole (the sizes recorded when they were written): the state, the disk and
        the files a host keeps beside its disk (a UEFI host's ESP disk and firmware variables, lab/labuefi.py)."""
        meta = self.meta()
        try:
            return (meta.get("key") == self.key and os.path.getsize(self.state) == meta.get("state_bytes")
                    and os.path.getsize(self.disk) == meta.get("disk_bytes")
                    and all(os.path.getsize(os.path.join(self.dir, name)) == size
                            for name, size in (meta.get("extra_bytes") or {}).items()))
        except OSError:
            return False

    def discard(self, why):
        log("saved boot %s discarded: %s" % (self.key, why))
        shutil.rmtree(self.dir, ignore_errors=True)

    @contextlib.contextmanager
    def writer(self):
        """The right to write this saved boot: yields False when another command writes it now or it is there."""
        os.makedirs(STATES, exist_ok=True)
        with open(os.path.join(STATES, self.key + ".lock"), "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield not self.ready()

    def save(self, vm, image_id, timeout=900):
        """Save the running host `vm` (booted from the pristine image, answering SSH, no SSH connection open) as
        this shape's boot: the guest is paused, its state written to a file, its overlay copied, and it runs on.
        Returns the seconds it took; raises SavedBootError (the guest running again) when QEMU refused."""
        started = time.monotonic()
        tmp_state, tmp_disk = self.state + ".tmp", self.disk + ".tmp"
        extras = {os.path.join(self.dir, name) + ".tmp": path for name, path in vm.saved_extras().items()}
        os.makedirs(self.dir, exist_ok=True)
        try:
            vm.qmp("stop")
            reply = vm.qmp("migrate", uri="exec:cat > %s" % quoted(tmp_state))
            if not reply or "error" in reply:
                raise SavedBootError("%s: QEMU did not save it: %s" % (vm.name, _why(reply)))
            deadline = time.monotonic() + timeout
            while True:
                status = ((vm.qmp("query-migrate") or {}).get("return") or {}).get("status")
                if status == "completed":
                    break
                if status in ("failed", "cancelled") or time.monotonic() > deadline:
                    raise SavedBootError("%s: saving its state ended %s" % (vm.name, status or "without an answer"))
                time.sleep(0.5)
            # The guest is paused and QEMU has flushed its disk: the overlay is the disk of that instant.
            shutil.copyfile(vm.disk, tmp_disk)
            for tmp, path in extras.items():
                shutil.copyfile(path, tmp)
        except (OSError, SavedBootError) as exc:
            for path in [tmp_state, tmp_disk] + list(extras):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            raise SavedBootError(str(exc)) from exc
        finally:
            vm.qmp("cont")
        meta = {"key": self.key, "image_id": image_id, "saved_from": vm.name, "saved_at": time.time(),
                "state_bytes": os.path.getsize(tmp_state), "disk_bytes": os.path.getsize(tmp_disk),
                "extra_bytes": {os.path.basename(tmp)[:-4]: os.path.getsize(tmp) for tmp in extras}}
        for tmp in extras:
            os.replace(tmp, tmp[:-4])
        os.replace(tmp_disk, self.disk)
        os.replace(tmp_state, self.state)
        with open(self.meta_path + ".tmp", "w") as handle:
            json.dump(meta, handle, indent=2)
        os.replace(self.meta_path + ".tmp", self.meta_path)
        prune(keep=self.key, image_id=image_id)
        return time.monotonic() - started


def prune(keep, image_id):
    """Remove the saved boots of other images (an image rebuilt or of an older recipe): they can never be used."""
    with contextlib.suppress(OSError):
        for key in os.listdir(STATES):
            path = os.path.join(STATES, key)
            if key == keep or not os.path.isdir(path):
                continue
            if read_json(os.path.join(path, "saved.json")).get("image_id") not in (None, image_id):
                shutil.rmtree(path, ignore_errors=True)


def quoted(path):
    """`path` quoted for the shell of an exec: migration URI."""
    return "'" + path.replace("'", "'\\''") + "'"


def _why(reply):
    if not reply:
        return "no answer on QMP"
    error = reply.get("error") or {}
    return error.get("desc") or json.dumps(reply)
