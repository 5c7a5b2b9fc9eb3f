"""The vGPU Manager image role with real parts, on the controller (no lab VMs).

A real builder (podman or buildah, chroot isolation) builds from a base image the test imports and the
project's fixture build context; a real registry (Debian's docker-registry) on a free loopback port
serves it over TLS (a self-signed certificate the role is given as its CA) with htpasswd
authentication. The test reads what was pushed through the registry API.
"""

import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import zipfile

import pytest

from conftest import TOP, run


PLAYBOOK = os.path.join(TOP, "playbooks", "vgpu_manager_image.yml")
CONTEXT = os.path.join(TOP, "tests", "integration", "fixtures", "driver-container")
DEPS = os.path.join(TOP, "scripts", "image-test-deps.sh")
LABEL = "io.github.gpuops.vgpu-manager.run-sha256"
VERSION = "550.90.05"
OS_TAG = "ubuntu22.04"
REPOSITORY = "nvidia"
USER = "builder"
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
])


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _check(cmd, **kwargs):
    proc = subprocess.run(cmd, text=True, capture_output=True, check=False, timeout=300, **kwargs)
    if proc.returncode != 0:
        raise AssertionError("%s failed (rc=%s): %s%s" % (" ".join(cmd), proc.returncode, proc.stdout, proc.stderr))
    return proc.stdout


class Registry:
    """Debian's docker-registry on 127.0.0.1 with TLS and htpasswd, in a directory of its own."""

    def __init__(self, workdir):
        self.dir = os.path.join(workdir, "registry")
        os.makedirs(os.path.join(self.dir, "storage"))
        self.port = _free_port()
        self.host = "127.0.0.1:%d" % self.port
        self.password = "pw-" + secrets.token_hex(12)
        self.cert = os.path.join(self.dir, "registry.crt")
        key = os.path.join(self.dir, "registry.key")
        _check(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", self.cert])
        htpasswd = os.path.join(self.dir, "htpasswd")
        # bcrypt is the only hash the registry accepts; the password goes through stdin (-i).
        _check(["htpasswd", "-B", "-i", "-c", htpasswd, USER], input=self.password)
        config = os.path.join(self.dir, "config.yml")
        with open(config, "w", encoding="utf-8") as handle:
            json.dump({  # JSON is YAML: the registry reads it as its configuration.
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": os.path.join(self.dir, "storage")},
                            "delete": {"enabled": True}},
                "http": {"addr": self.host, "tls": {"certificate": self.cert, "key": key}},
                "auth": {"htpasswd": {"realm": "gpuops-test", "path": htpasswd}},
            }, handle)
        self.log = open(os.path.join(self.dir, "registry.log"), "w", encoding="utf-8")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            ["docker-registry", "serve", config], stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.ssl = ssl.create_default_context(cafile=self.cert)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise AssertionError("docker-registry exited: " + self._log_text())
            if self.status("/v2/", auth=False) == 401:
                break
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("docker-registry did not answer on %s: %s" % (self.host, self._log_text()))
            time.sleep(0.2)

    def _log_text(self):
        self.log.flush()
        with open(self.log.name, encoding="utf-8") as handle:
            return handle.read()[-3000:]

    def request(self, path, accept=None, auth=True):
        """GET path; return (status, headers, body bytes)."""
        req = urllib.request.Request("https://%s%s" % (self.host, path))
        if auth:
            token = base64.b64encode(("%s:%s" % (USER, self.password)).encode()).decode()
            req.add_header("Authorization", "Basic " + token)
        if accept:
            req.add_header("Accept", accept)
        try:
            with urllib.request.urlopen(req, context=self.ssl, timeout=10) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers, err.read()

    def status(self, path, auth=True):
        try:
            return self.request(path, auth=auth)[0]
        except OSError:
            return None

    def manifest(self, tag, name=REPOSITORY + "/vgpu-manager"):
        """(digest, manifest, image config) of a tag, or None when the registry does not have it."""
        status, headers, body = self.request("/v2/%s/manifests/%s" % (name, tag), accept=MANIFEST_TYPES)
        if status == 404:
            return None
        assert status == 200, (status, body)
        manifest = json.loads(body)
        blob = self.request("/v2/%s/blobs/%s" % (name, manifest["config"]["digest"]))
        assert blob[0] == 200, blob[0]
        return headers["Docker-Content-Digest"], manifest, json.loads(blob[2])

    def tags(self, name=REPOSITORY + "/vgpu-manager"):
        answer = self.request("/v2/%s/tags/list" % name)
        if answer[0] == 404:
            return []
        assert answer[0] == 200, answer
        return sorted(json.loads(answer[2]).get("tags") or [])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.log.close()


def _make_run(directory, version, payload):
    path = os.path.join(directory, "NVIDIA-Linux-x86_64-%s-vgpu-kvm.run" % version)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/sh\n# fake vGPU Manager for tests\necho %s\n# %s\n" % (version, payload))
    os.chmod(path, 0o755)
    with open(path, "rb") as handle:
        return path, hashlib.sha256(handle.read()).hexdigest()


def _import_base_image(workdir, name):
    """A busybox rootfs imported as a local image: the build needs no registry to pull from."""
    rootfs = os.path.join(workdir, "rootfs")
    os.makedirs(os.path.join(rootfs, "bin"))
    os.makedirs(os.path.join(rootfs, "tmp"))
    shutil.copy2(shutil.which("busybox"), os.path.join(rootfs, "bin", "busybox"))
    for applet in ("sh", "mkdir", "chmod", "ls", "echo"):
        os.symlink("busybox", os.path.join(rootfs, "bin", applet))
    tarball = os.path.join(workdir, "rootfs.tar")
    with tarfile.open(tarball, "w") as tar:
        tar.add(rootfs, arcname=".")
    _check(["podman", "import", "--change", "ENV PATH=/bin", tarball, name])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Packages, a base image, a fake .run and a running registry; all removed afterwards."""
    proc = run([DEPS], timeout=1800)
    if proc.returncode != 0:
        pytest.fail("scripts/image-test-deps.sh could not provide the packages:\n" + proc.stdout)
    workdir = str(tmp_path_factory.mktemp("vgpu-image"))
    base = "localhost/gpuops-test-base:%s" % secrets.token_hex(4)
    _import_base_image(workdir, base)
    registry = None
    run_path, sha = _make_run(workdir, VERSION, secrets.token_hex(16))
    try:
        registry = Registry(workdir)
        yield {"dir": workdir, "base": base, "registry": registry, "run": run_path, "sha": sha}
    finally:
        if registry is not None:
            registry.stop()
        # The images this session built, intermediate layers included, carry its unique checksum label.
        built = subprocess.run(["podman", "images", "--all", "--quiet", "--filter", "label=%s=%s" % (LABEL, sha)],
                               capture_output=True, text=True, check=False, timeout=120).stdout.split()
        for images in (sorted(set(built)), [base]):
            if images:
                subprocess.run(["podman", "rmi", "--force"] + images, capture_output=True, check=False, timeout=300)


def play(env, name, **overrides):
    """Run the playbook on localhost with the test's variables (-v); return (proc, seconds)."""
    registry = env["registry"]
    variables = {
        "vgpu_manager_image_driver_version": VERSION,
        "vgpu_manager_image_run_file": env["run"],
        "vgpu_manager_image_context_dir": CONTEXT,
        "vgpu_manager_image_os_tag": OS_TAG,
        "vgpu_manager_image_registry": registry.host,
        "vgpu_manager_image_repository": REPOSITORY,
        "vgpu_manager_image_username": USER,
        "vgpu_manager_image_password": registry.password,
        "vgpu_manager_image_ca_path": registry.cert,
        "vgpu_manager_image_build_args": {"BASE_IMAGE": env["base"]},
        "ansible_python_interpreter": os.path.join(TOP, ".venv", "bin", "python"),
    }
    variables.update(overrides)
    varfile = os.path.join(env["dir"], name + ".json")
    with open(varfile, "w", encoding="utf-8") as handle:
        json.dump(variables, handle)
    os.chmod(varfile, 0o600)
    start = time.monotonic()
    # JSON results: messages stay on one line, and facts can be read back.
    proc = run(["ansible-playbook", "-v", "-i", "localhost,", "-c", "local", PLAYBOOK, "-e", "@" + varfile], timeout=1200,
               env={"ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_NOCOLOR": "1"})
    seconds = time.monotonic() - start
    # Neither the password in use nor the registry's real one may appear, whatever happened.
    for password in sorted({registry.password, variables["vgpu_manager_image_password"]}):
        basic = base64.b64encode(("%s:%s" % (USER, password)).encode()).decode()
        for secret in (password, basic):
            assert secret not in proc.stdout, "a password appears in the playbook output"
    assert "Traceback" not in proc.stdout, proc.stdout[-4000:]
    return proc, seconds


def results(output):
    """Every task result the -v output shows, parsed."""
    decoder = json.JSONDecoder()
    found = []
    for match in re.finditer(r"^(?:ok|changed|fatal): \[localhost\](?: FAILED!)? => ", output, re.M):
        try:
            found.append(decoder.raw_decode(output, match.end())[0])
        except ValueError:
            pass
    return found


def fact(output, name):
    values = [r["ansible_facts"][name] for r in results(output) if name in r.get("ansible_facts", {})]
    assert values, "no fact %s in the output" % name
    return values[-1]


def recap(output):
    match = re.search(r"^localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output, re.M)
    assert match, output[-3000:]
    return {"ok": int(match.group(1)), "changed": int(match.group(2)), "failed": int(match.group(4))}


def assert_failed_before_push(env, proc, message, tags_before):
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert recap(proc.stdout)["failed"] == 1
    assert message in proc.stdout, proc.stdout[-4000:]
    assert env["registry"].tags() == tags_before, "something was pushed"


@pytest.fixture(scope="module")
def first_push(env):
    proc, seconds = play(env, "first")
    print("\nvgpu_manager_image: first build and push took %.1f s" % seconds)
    assert proc.returncode == 0, proc.stdout[-6000:]
    return proc


def test_first_build_and_push(env, first_push):
    registry = env["registry"]
    assert recap(first_push.stdout)["changed"] >= 2  # the build and the push
    assert "not in the registry; building it with podman" in first_push.stdout
    found = registry.manifest(VERSION + "-" + OS_TAG)
    assert found, "the tag was not pushed"
    digest, manifest, config = found
    assert manifest["mediaType"] in MANIFEST_TYPES
    labels = config["config"]["Labels"]
    assert labels[LABEL] == env["sha"]
    assert labels["version"] == VERSION
    assert config["config"]["Entrypoint"] == ["nvidia-driver", "init"]
    assert "DRIVER_VERSION=" + VERSION in config["config"]["Env"]
    assert digest.startswith("sha256:")
    assert registry.tags() == [VERSION + "-" + OS_TAG]
    # The Helm values for the GPU Operator, as the role exposes them.
    assert fact(first_push.stdout, "vgpu_manager_image_helm_values") == {"vgpuManager": {
        "enabled": True, "repository": "%s/%s" % (registry.host, REPOSITORY), "image": "vgpu-manager",
        "version": VERSION, "imagePullSecrets": ["vgpu-manager-registry"]}}
    assert fact(first_push.stdout, "vgpu_manager_image_digest") == digest
    assert fact(first_push.stdout, "vgpu_manager_image_built") is True


def test_rerun_changes_nothing(env, first_push):
    registry = env["registry"]
    before = registry.manifest(VERSION + "-" + OS_TAG)[0]
    proc, seconds = play(env, "rerun")
    print("\nvgpu_manager_image: no-op re-run took %.1f s" % seconds)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert recap(proc.stdout)["changed"] == 0, proc.stdout[-6000:]
    assert "nothing to do" in proc.stdout
    assert fact(proc.stdout, "vgpu_manager_image_built") is False
    assert fact(proc.stdout, "vgpu_manager_image_digest") == before
    assert "TASK [gpuops.sandbox.vgpu_manager_image : Build the image]" not in proc.stdout
    assert "TASK [gpuops.sandbox.vgpu_manager_image : Push the image]" not in proc.stdout
    assert registry.manifest(VERSION + "-" + OS_TAG)[0] == before


def test_wrong_password(env, first_push):
    tags = env["registry"].tags()
    run_path = _make_run(env["dir"], "550.90.06", "wrong password")[0]
    proc = play(env, "wrong-password", vgpu_manager_image_password="not-the-password-" + secrets.token_hex(4),
                vgpu_manager_image_driver_version="550.90.06", vgpu_manager_image_run_file=run_path)[0]
    assert_failed_before_push(env, proc, "Authentication refused", tags)
    assert "answered 401 for user builder" in proc.stdout


def test_missing_run(env, first_push):
    tags = env["registry"].tags()
    missing = os.path.join(env["dir"], "NVIDIA-Linux-x86_64-550.90.07-vgpu-kvm.run")
    proc = play(env, "missing-run", vgpu_manager_image_driver_version="550.90.07", vgpu_manager_image_run_file=missing)[0]
    assert_failed_before_push(env, proc, "The vGPU Manager file %s was not found" % missing, tags)


def test_mismatched_version(env, first_push):
    tags = env["registry"].tags()
    proc = play(env, "mismatch", vgpu_manager_image_driver_version="550.90.08")[0]
    assert_failed_before_push(
        env, proc, "Version mismatch: NVIDIA-Linux-x86_64-%s-vgpu-kvm.run is vGPU Manager %s, but "
        "vgpu_manager_image_driver_version is 550.90.08" % (VERSION, VERSION), tags)


def test_checksum_mismatch(env, first_push):
    tags = env["registry"].tags()
    proc = play(env, "checksum", vgpu_manager_image_run_sha256="0" * 64, vgpu_manager_image_force=True)[0]
    assert_failed_before_push(env, proc, "Checksum mismatch: NVIDIA-Linux-x86_64-%s-vgpu-kvm.run has sha256 %s"
                              % (VERSION, env["sha"]), tags)


def test_missing_os_directory(env, first_push):
    tags = env["registry"].tags()
    proc = play(env, "os-dir", vgpu_manager_image_os_tag="rhel9")[0]
    assert_failed_before_push(env, proc, "has no vgpu-manager/rhel9/Dockerfile. OS directories there: ubuntu22.04", tags)


def test_registry_unreachable(env, first_push):
    tags = env["registry"].tags()
    proc = play(env, "unreachable", vgpu_manager_image_registry="127.0.0.1:%d" % _free_port())[0]
    assert_failed_before_push(env, proc, "Registry unreachable", tags)


def test_bundle_of_the_same_run_changes_nothing(env, first_push):
    """The .run taken from the vGPU software zip is the same file: the image in the registry is kept."""
    bundle = os.path.join(env["dir"], "NVIDIA-GRID-Linux-KVM-%s.zip" % VERSION)
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.write(env["run"], "Host_Drivers/" + os.path.basename(env["run"]))
        archive.writestr("Guest_Drivers/NVIDIA-Linux-x86_64-550.90.07-grid.run", "guest driver\n")
    before = env["registry"].manifest(VERSION + "-" + OS_TAG)[0]
    proc = play(env, "bundle", vgpu_manager_image_run_file="", vgpu_manager_image_bundle=bundle)[0]
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert recap(proc.stdout)["changed"] == 0, proc.stdout[-6000:]
    assert "nothing to do" in proc.stdout
    assert env["registry"].manifest(VERSION + "-" + OS_TAG)[0] == before


def test_force_rebuilds(env, first_push):
    registry = env["registry"]
    proc, seconds = play(env, "force", vgpu_manager_image_force=True)
    print("\nvgpu_manager_image: forced rebuild and push took %.1f s" % seconds)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "rebuilt and pushed as asked" in proc.stdout
    assert recap(proc.stdout)["changed"] >= 2
    digest, config = [registry.manifest(VERSION + "-" + OS_TAG)[i] for i in (0, 2)]
    assert config["config"]["Labels"][LABEL] == env["sha"]
    assert digest.startswith("sha256:")
