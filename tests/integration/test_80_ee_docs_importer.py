"""Controller-side deliverables: the execution environment's build context, the documentation site
(with antsibull-docs lint-collection-docs) and galaxy-importer's verdict on the built collection.
None of them needs the lab."""

import glob
import os
import tarfile
import time

import yaml

import pytest

from conftest import TOP, run

# The deep slice that proves this module's claims (tests/integration/tiers.py).
pytestmark = pytest.mark.slice("cluster")


TIMINGS = {}


def timed(name, cmd, timeout):
    start = time.monotonic()
    proc = run(cmd, timeout=timeout)
    TIMINGS[name] = round(time.monotonic() - start, 1)
    print("%s: %.1f s" % (name, TIMINGS[name]))
    return proc


def test_ansible_builder_create_writes_a_complete_context(tmp_path):
    dist = tmp_path / "dist"
    run(["ansible-galaxy", "collection", "build", "--force", "--output-path", str(dist)], check=True)
    # execution-environment.yml takes the tarball from .build/dist, as `make build` leaves it.
    os.makedirs(os.path.join(TOP, ".build", "dist"), exist_ok=True)
    tarball = glob.glob(str(dist / "gpuops-sandbox-*.tar.gz"))[0]
    target = os.path.join(TOP, ".build", "dist", os.path.basename(tarball))
    os.replace(tarball, target)
    context = tmp_path / "context"
    proc = timed("ansible-builder create", ["ansible-builder", "create", "-f", "execution-environment.yml",
                                            "--context", str(context), "-v", "1"], 300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    containerfile = (context / "Containerfile").read_text()
    ee = yaml.safe_load(open(os.path.join(TOP, "execution-environment.yml"), encoding="utf-8"))
    assert 'EE_BASE_IMAGE="%s"' % ee["images"]["base_image"]["name"] in containerfile
    assert ee["dependencies"]["ansible_core"]["package_pip"] in containerfile
    assert ee["dependencies"]["ansible_runner"]["package_pip"] in containerfile
    assert "ansible-galaxy collection install --no-deps -p /usr/share/ansible/collections" in containerfile
    build = context / "_build"
    assert (build / "requirements.yml").read_text() == open(os.path.join(TOP, ee["dependencies"]["galaxy"]), encoding="utf-8").read()
    assert (build / "requirements.txt").read_text() == open(os.path.join(TOP, ee["dependencies"]["python"]), encoding="utf-8").read()
    assert (build / "bindep.txt").read_text() == open(os.path.join(TOP, ee["dependencies"]["system"]), encoding="utf-8").read()
    copied = glob.glob(str(build / "collections" / "gpuops-sandbox-*.tar.gz"))
    assert [os.path.basename(p) for p in copied] == [os.path.basename(target)]
    with tarfile.open(copied[0]) as tar:
        names = tar.getnames()
    assert "MANIFEST.json" in names and "meta/execution-environment.yml" in names
    assert any(n.startswith("roles/awx_objects/") for n in names)


def test_docs_site_builds_and_lint_collection_docs_passes():
    proc = timed("scripts/build-docs.sh", ["scripts/build-docs.sh"], 1200)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "antsibull-docs lint-collection-docs --plugin-docs" in proc.stdout
    html = os.path.join(TOP, ".build", "docs", "html")
    pages = set(os.listdir(html))
    for module in os.listdir(os.path.join(TOP, "plugins", "modules")):
        if module.endswith(".py"):
            assert "%s_module.html" % module[:-3] in pages
    for role in os.listdir(os.path.join(TOP, "roles")):
        if os.path.isfile(os.path.join(TOP, "roles", role, "meta", "argument_specs.yml")):
            assert "%s_role.html" % role in pages
    assert {"troubleshooting.html", "changelog.html", "index.html"} <= pages
    guides = os.listdir(os.path.join(html, "docsite"))
    assert {"guide_getting_started.html", "guide_host_preparation.html", "guide_lab.html", "guide_awx.html",
            "guide_measurements.html"} <= set(guides)
    troubleshooting = open(os.path.join(html, "troubleshooting.html"), encoding="utf-8").read()
    assert "gpuops.sandbox.vfio_bind" in troubleshooting


def test_galaxy_importer_accepts_the_collection():
    proc = timed("scripts/galaxy-import.sh", ["scripts/galaxy-import.sh"], 1200)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "Importer processing completed successfully" in proc.stdout
