"""The AWX / Automation Platform objects of playbooks/awx_configure.yml, rendered without a controller.

The role gpuops.sandbox.awx_objects runs for real (ansible-playbook on localhost, render mode, which
writes the objects to a file); the checks here read the playbooks and argument specs themselves,
without the plugin code that derived the surveys.
"""

import json
import os
import re
import subprocess
import sys

import jinja2
import pytest
import yaml

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULTS = os.path.join(TOP, "roles", "awx_objects", "defaults", "main.yml")
SURVEY_TYPES = {"str": "text", "path": "text", "int": "integer", "float": "float"}


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_Loader)  # noqa: S506 - SafeLoader subclass


DEFAULT_VARS = load(DEFAULTS)
TEMPLATES = DEFAULT_VARS["awx_objects_job_templates"]


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    out = tmp_path_factory.mktemp("awx") / "objects.json"
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["ansible-playbook", "playbooks/awx_configure.yml", "-e", "awx_objects_render_path=%s" % out,
                           "-e", "awx_objects_missing_playbooks=skip"], cwd=TOP, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    with open(out, encoding="utf-8") as handle:
        return json.load(handle)


def roles_of(playbook, seen=None):
    """The collection roles a playbook names, read with regular expressions (not the plugin's parser)."""
    seen = set() if seen is None else seen
    path = os.path.join(TOP, playbook)
    if path in seen:
        return []
    seen.add(path)
    text = open(path, encoding="utf-8").read()
    found = []
    for match in re.finditer(r"import_playbook:\s*(\S+)", text):
        found += roles_of(os.path.join(os.path.dirname(playbook), match.group(1)), seen)
    for match in re.finditer(r"(?:role|name):\s*(?:gpuops\.sandbox\.)?([a-z_][a-z0-9_]*)\s*$|^\s*-\s*(?:gpuops\.sandbox\.)?([a-z_][a-z0-9_]*)\s*$",
                             text, re.M):
        name = match.group(1) or match.group(2)
        if os.path.isdir(os.path.join(TOP, "roles", name)):
            found.append(name)
            meta = os.path.join(TOP, "roles", name, "meta", "main.yml")
            for dep in (load(meta) or {}).get("dependencies") or [] if os.path.isfile(meta) else []:
                dep = dep if isinstance(dep, str) else dep.get("role", dep.get("name"))
                found.append(dep.split(".")[-1])
    return found


def spec_options(role):
    path = os.path.join(TOP, "roles", role, "meta", "argument_specs.yml")
    if not os.path.isfile(path):
        return {}
    return (load(path)["argument_specs"].get("main") or {}).get("options") or {}


def injected(types):
    return {var for t in DEFAULT_VARS["awx_objects_credential_types"] if t["name"] in types
            for var in t["injectors"].get("extra_vars", {})}


@pytest.mark.parametrize("template", TEMPLATES, ids=[t["name"] for t in TEMPLATES])
def test_survey_matches_the_argument_specs(objects, template):
    if not os.path.isfile(os.path.join(TOP, template["playbook"])):
        assert template["name"] in [s["name"] for s in objects["skipped_job_templates"]]
        pytest.skip("%s does not exist yet; the job template is left out" % template["playbook"])
    rendered = {t["name"]: t for t in objects["job_templates"]}[template["name"]]
    assert rendered["playbook"] == template["playbook"]
    roles = list(dict.fromkeys(roles_of(template["playbook"])))
    assert sorted(rendered["roles"]) == sorted(roles)
    questions = {q["variable"]: q for q in rendered["survey_spec"]["spec"]}
    assert len(questions) == len(rendered["survey_spec"]["spec"]), "a variable is asked twice"
    assert rendered["survey_enabled"] == bool(questions)
    extra = {q["variable"]: q for q in template.get("questions", [])}
    exclude = injected(template.get("credential_types", [])) | set(template.get("exclude", []))
    options = {}
    for role in roles:
        defaults_path = os.path.join(TOP, "roles", role, "defaults", "main.yml")
        defaults = (load(defaults_path) or {}) if os.path.isfile(defaults_path) else {}
        for name, spec in spec_options(role).items():
            options.setdefault(name, (spec or {}, defaults))
    for name, (spec, defaults) in options.items():
        if name in extra:
            continue
        kind = spec.get("type", "str")
        askable = (kind in SURVEY_TYPES or (kind == "list" and spec.get("choices"))) and name not in exclude \
            and "{{" not in str(defaults.get(name, ""))
        if not askable:
            assert name not in questions, "%s must not be asked (type %s, excluded or computed default)" % (name, kind)
            assert name in rendered["survey_skipped_options"]
            continue
        q = questions[name]
        expected_type = ("multiselect" if kind == "list" else "multiplechoice" if spec.get("choices") else
                         "password" if spec.get("no_log") or re.search("password|token|secret", name) else SURVEY_TYPES[kind])
        assert q["type"] == expected_type, name
        if spec.get("choices"):
            assert q["choices"] == [str(c) for c in spec["choices"]], name
        default = spec.get("default")
        if kind == "list":
            assert q["default"] == "\n".join(default or []), name
        elif default is not None:
            assert q["default"] == (default if kind in ("int", "float") else str(default)), name
        assert q["required"] == (bool(spec.get("required")) or name in template.get("required", [])), name
    for name, q in questions.items():
        assert name in options or name in extra, "%s is asked but is no option of %s" % (name, roles)
        if name in extra and extra[name].get("choices_from"):
            source = extra[name]["choices_from"]
            all_specs = {}
            for role in os.listdir(os.path.join(TOP, "roles")):
                all_specs.update(spec_options(role))
            assert q["choices"] == all_specs[source]["choices"]
    for name in exclude:
        assert name not in questions


def test_workflow_chains_the_templates_in_order(objects):
    present = [t["name"] for t in objects["job_templates"]]
    expected = [n for n in DEFAULT_VARS["awx_objects_workflow_nodes"] if n in present]
    nodes = objects["workflow"]["nodes"]
    assert [n["identifier"] for n in nodes] == expected
    for index, node in enumerate(nodes):
        assert node["unified_job_template"] == {"name": node["identifier"], "type": "job_template",
                                                "organization": {"name": objects["organization"]}}
        following = [{"identifier": expected[index + 1]}] if index + 1 < len(expected) else []
        assert node["related"]["success_nodes"] == following
    # The workflow asks every question of its nodes once.
    asked = [q["variable"] for q in objects["workflow"]["survey_spec"]["spec"]]
    wanted = {q["variable"] for t in objects["job_templates"] if t["name"] in expected for q in t["survey_spec"]["spec"]}
    assert len(asked) == len(set(asked)) and set(asked) == wanted


def test_inventory_has_a_group_per_workload_type(objects):
    groups = {g["name"]: g for g in objects["inventory"]["groups"]}
    choices = spec_options("discover")["discover_workload_type"]["choices"]
    for wtype in choices:
        group = groups[wtype.replace("-", "_")]
        assert group["variables"] == {"gpuops_workload_type": wtype}
    assert sorted(groups["gpu_nodes"]["children"]) == sorted(w.replace("-", "_") for w in choices)
    order = [g["name"] for g in objects["inventory"]["groups"]]
    assert order.index("gpu_nodes") > max(order.index(c) for c in groups["gpu_nodes"]["children"])


def render_injectors(ctype, inputs):
    """Render a credential type's injectors as AWX does: inputs, and tower.filename for file templates."""
    injectors = ctype["injectors"]
    files = {key.split(".", 1)[1] if "." in key else "": "/runner/env/tmp%s" % i
             for i, key in enumerate(injectors.get("file", {}))}
    tower = {"filename": files.get("") if list(files) == [""] else files}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)

    def render(value):
        return env.from_string(value).render(tower=tower, **inputs)

    return ({k: render(v) for k, v in injectors.get("file", {}).items()},
            {k: render(v) for k, v in injectors.get("env", {}).items()},
            {k: render(v) for k, v in injectors.get("extra_vars", {}).items()}, files)


def test_registry_credential_sets_the_variables_vgpu_manager_image_reads(objects):
    ctype = {t["name"]: t for t in objects["credential_types"]}["gpuops container registry"]
    fields = {f["id"]: f for f in ctype["inputs"]["fields"]}
    assert fields["password"].get("secret") is True
    extra_vars = render_injectors(ctype, {"host": "registry.example.com:5000", "username": "u", "password": "p"})[2]
    assert extra_vars == {"vgpu_manager_image_registry": "registry.example.com:5000",
                          "vgpu_manager_image_username": "u", "vgpu_manager_image_password": "p"}
    options = spec_options("vgpu_manager_image")
    assert set(extra_vars) <= set(options)
    assert options["vgpu_manager_image_password"].get("no_log") is True


def test_kubeconfig_credential_is_a_file_whose_path_the_roles_get(objects):
    ctype = {t["name"]: t for t in objects["credential_types"]}["gpuops kubeconfig"]
    assert {f["id"]: f for f in ctype["inputs"]["fields"]}["kubeconfig"].get("secret") is True
    files, env, extra_vars, paths = render_injectors(ctype, {"kubeconfig": "apiVersion: v1\nkind: Config\n"})
    assert files == {"template.kubeconfig": "apiVersion: v1\nkind: Config\n"}
    assert extra_vars == {"gpuops_kubeconfig": paths["kubeconfig"]}
    assert env == {"K8S_AUTH_KUBECONFIG": paths["kubeconfig"]}
    readers = [role for role in os.listdir(os.path.join(TOP, "roles")) if role != "awx_objects"
               and any("gpuops_kubeconfig" in open(os.path.join(d, f), encoding="utf-8").read()
                       for d, _dirs, fs in os.walk(os.path.join(TOP, "roles", role)) for f in fs if f.endswith(".yml"))]
    if not readers:
        pytest.skip("no role reads gpuops_kubeconfig yet (the cluster roles are not in the checkout)")
    assert readers
