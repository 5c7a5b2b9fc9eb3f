"""execution-environment.yml (ansible-builder schema 3) and the collection's meta/execution-environment.yml."""

import os
import re

import yaml

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(path):
    with open(os.path.join(TOP, path), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def pins(path):
    with open(os.path.join(TOP, path), encoding="utf-8") as handle:
        return dict(line.strip().split("==") for line in handle if "==" in line and not line.startswith("#"))


def test_schema_3_with_the_pinned_ansible_core_and_runner():
    ee = load("execution-environment.yml")
    assert ee["version"] == 3
    assert ee["images"]["base_image"]["name"]
    constraints = pins("requirements/constraints.txt")
    assert ee["dependencies"]["ansible_core"]["package_pip"] == "ansible-core==" + constraints["ansible-core"]
    assert ee["dependencies"]["ansible_runner"]["package_pip"] == "ansible-runner==" + constraints["ansible-runner"]


def test_dependency_files_exist_and_match_the_collection():
    ee = load("execution-environment.yml")
    deps = ee["dependencies"]
    for key in ("galaxy", "python", "system"):
        assert os.path.isfile(os.path.join(TOP, deps[key])), deps[key]
    meta = load("meta/execution-environment.yml")
    assert meta["version"] == 1
    assert meta["dependencies"]["python"] == deps["python"] and meta["dependencies"]["system"] == deps["system"]
    galaxy = {c["name"] for c in load(deps["galaxy"])["collections"]}
    assert set(load("galaxy.yml")["dependencies"]) <= galaxy
    # The AWX configuration playbook runs in the execution environment too.
    assert "awx.awx" in galaxy
    with open(os.path.join(TOP, deps["python"]), encoding="utf-8") as handle:
        names = {re.split(r"[<>=!~ ]", line.strip())[0].lower() for line in handle if line.strip() and not line.startswith("#")}
    assert {"kubernetes", "jmespath", "pyyaml"} <= names


def test_the_collection_tarball_is_built_into_the_context_and_installed():
    ee = load("execution-environment.yml")
    files = ee["additional_build_files"]
    assert any(f["src"].endswith("gpuops-sandbox-*.tar.gz") and f["dest"] == "collections" for f in files)
    steps = " ".join(ee["additional_build_steps"]["append_galaxy"])
    assert "COPY _build/collections/" in steps and "ansible-galaxy collection install" in steps
    assert "/build/collections/gpuops-sandbox-*.tar.gz" in steps
