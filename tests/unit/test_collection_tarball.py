# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The tarball `ansible-galaxy collection build` makes holds the collection and nothing of the checkout's test and
development machinery (galaxy.yml's build_ignore), and it installs into an empty path where its modules run."""

import ast
import glob
import json
import os
import subprocess
import sys
import tarfile

import pytest
import yaml
from ansible.module_utils.compat.version import LooseVersion as Version

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

# What ships: every file under these directories, and these files at the top.
SHIPPED_DIRS = ("plugins", "roles", "playbooks", "meta", "docs/docsite", "inventories/example", "changelogs")
SHIPPED_FILES = ("README.md", "LICENSE", "CHANGELOG.rst", "requirements.yml")
# What ansible-galaxy writes into every tarball.
GENERATED = ("MANIFEST.json", "FILES.json")
# What never ships, although it is in the checkout.
NOT_SHIPPED_DIRS = ("lab", "tests", "extensions", "scripts", "requirements", "ee", ".ci", "inventories/lab",
                    "changelogs/fragments", "docs/site", ".build", ".venv", ".cache", ".lab")
NOT_SHIPPED_FILES = ("Makefile", "ansible.cfg", "execution-environment.yml", "galaxy.yml", "CONTRIBUTING.md")


def run(cmd, cwd, env=None, timeout=300):
    proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          check=False, timeout=timeout)
    assert proc.returncode == 0, "%s: exit %d\n%s" % (" ".join(cmd), proc.returncode, proc.stdout[-4000:])
    return proc


def isolated_env(tmp_path, collections):
    """Ansible with no configuration file and only ``collections`` on its collection path: nothing of the checkout
    (whose ansible.cfg puts the checkout itself on the path) is found."""
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"ANSIBLE_CONFIG": str(cfg), "ANSIBLE_COLLECTIONS_PATH": str(collections),
                "ANSIBLE_HOME": str(tmp_path / "home"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
                "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1",
                "PATH": BIN + os.pathsep + env.get("PATH", "")})
    return env


def checkout_files(top):
    """The files of the shipped parts as they are in the checkout (bytecode aside, which ansible-galaxy skips)."""
    found = set(name for name in SHIPPED_FILES if os.path.isfile(os.path.join(top, name)))
    for part in SHIPPED_DIRS:
        for root, dirs, files in os.walk(os.path.join(top, part)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = os.path.relpath(root, top)
            if rel == "changelogs/fragments" or rel.startswith("changelogs/fragments/"):
                continue
            found.update(os.path.join(rel, f) for f in files if not f.endswith((".pyc", ".pyo")) and f[0] != ".")
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path", str(out), TOP], cwd=str(out))
    tarballs = glob.glob(str(out / "gpuops-sandbox-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    with tarfile.open(tarballs[0]) as tar:
        files = set(m.name for m in tar.getmembers() if not m.isdir())
    return tarballs[0], files


def test_tarball_holds_the_collection_and_nothing_else(built):
    _tarball, files = built
    expected = checkout_files(TOP) | set(GENERATED)
    assert sorted(expected - files) == [], "missing from the tarball"
    assert sorted(files - expected) == [], "in the tarball but not part of the collection (galaxy.yml build_ignore)"


def test_tarball_has_none_of_the_test_lab_or_development_machinery(built):
    _tarball, files = built
    leaked = sorted(f for f in files if any(f == d or f.startswith(d + "/") for d in NOT_SHIPPED_DIRS)
                    or f in NOT_SHIPPED_FILES or any(part.startswith(".") for part in f.split("/")))
    assert leaked == []


def test_tarball_has_the_parts_a_user_needs(built):
    _tarball, files = built
    for name in SHIPPED_FILES + GENERATED + ("meta/runtime.yml", "meta/execution-environment.yml",
                                             "playbooks/site.yml", "plugins/modules/vfio_bind.py",
                                             "inventories/example/hosts.yml", "changelogs/config.yaml",
                                             "changelogs/changelog.yaml"):
        assert name in files
    for part in ("plugins/module_utils/", "plugins/filter/", "roles/host_prepare/tasks/",
                 "roles/gpu_operator/meta/argument_specs.yml", "docs/docsite/rst/"):
        assert any(f.startswith(part) for f in files), part


def test_tarball_installs_into_an_empty_path_and_its_modules_run(built, tmp_path):
    tarball, _files = built
    collections = tmp_path / "collections"
    env = isolated_env(tmp_path, collections)
    # --no-deps: kubernetes.core and the others come from Galaxy, which a unit test does not reach.
    run(["ansible-galaxy", "collection", "install", "--no-deps", "-p", str(collections), tarball],
        cwd=str(tmp_path), env=env)
    installed = collections / "ansible_collections" / "gpuops" / "sandbox"
    manifest = json.loads((installed / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["namespace"] == "gpuops" and manifest["collection_info"]["name"] == "sandbox"
    assert not (installed / "tests").exists() and not (installed / "lab").exists()

    doc = json.loads(run(["ansible-doc", "--json", "gpuops.sandbox.vfio_bind"], cwd=str(tmp_path), env=env).stdout)
    entry = doc["gpuops.sandbox.vfio_bind"]["doc"]
    assert entry["filename"].startswith(str(installed) + os.sep)
    assert entry["short_description"]
    assert "addresses" in entry["options"]

    # A module of the installed collection runs (check mode, on the controller itself): gpu_facts reads sysfs only.
    proc = run(["ansible", "localhost", "-c", "local", "-i", "localhost,", "--check", "-o",
                "-e", "ansible_python_interpreter=%s" % sys.executable, "-m", "gpuops.sandbox.gpu_facts"],
               cwd=str(tmp_path), env=env)
    assert "localhost | SUCCESS" in proc.stdout, proc.stdout
    assert '"gpu_facts_gpus"' in proc.stdout


def versions_added(node, where):
    """(where, version) of every version_added in a plugin's documentation, options and suboptions included."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "version_added":
                yield where, str(value)
            else:
                yield from versions_added(value, where + "." + str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from versions_added(value, "%s[%d]" % (where, index))


def plugin_docs():
    """(path, DOCUMENTATION parsed) of every module and plugin that has one, in its .py or in the YAML file beside it
    (the filters' documentation)."""
    for root, _dirs, files in os.walk(os.path.join(TOP, "plugins")):
        for name in sorted(files):
            path = os.path.join(root, name)
            if name.endswith(".yml") and name[:-4] + ".py" in files:
                with open(path, encoding="utf-8") as handle:
                    sidecar = yaml.safe_load(handle)
                if isinstance(sidecar, dict) and "DOCUMENTATION" in sidecar:
                    yield os.path.relpath(path, TOP), sidecar["DOCUMENTATION"]
                continue
            if not name.endswith(".py"):
                continue
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read(), path)
            for stmt in tree.body:
                if (isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["DOCUMENTATION"]
                        and isinstance(stmt.value, ast.Constant)):
                    yield os.path.relpath(path, TOP), yaml.safe_load(stmt.value.value)


def test_version_added_names_a_release_or_the_next_one():
    """galaxy.yml's version is the newest release of changelogs/changelog.yaml (make release moves both), and every
    version_added is a release or newer than the newest (a plugin added since, which the next release lists)."""
    with open(os.path.join(TOP, "galaxy.yml"), encoding="utf-8") as handle:
        version = yaml.safe_load(handle)["version"]
    with open(os.path.join(TOP, "changelogs", "changelog.yaml"), encoding="utf-8") as handle:
        releases = set(yaml.safe_load(handle)["releases"])
    newest = max(releases, key=Version)
    assert version == newest, "galaxy.yml says %s, the newest release in changelogs/changelog.yaml is %s" % (
        version, newest)
    docs = list(plugin_docs())
    assert len(docs) > 30
    wrong = []
    for path, doc in docs:
        if doc.get("version_added") is None and path.split(os.sep)[1] != "doc_fragments":
            wrong.append((path, "no version_added"))
        for where, added in versions_added(doc, path):
            if added not in releases and Version(added) <= Version(newest):
                wrong.append((where, added))
    assert wrong == [], "version_added must be a release (%s) or newer than %s" % (sorted(releases), newest)
