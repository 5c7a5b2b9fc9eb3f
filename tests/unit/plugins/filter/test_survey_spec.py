"""Survey derivation (plugins/plugin_utils/_awx_survey.py, the survey_spec filter, the role_specs lookup)."""

import os

import pytest
import yaml

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.filter.survey_spec import FilterModule
from ansible_collections.gpuops.sandbox.plugins.plugin_utils import _awx_survey as survey


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        if isinstance(data, str):
            handle.write(data)
        else:
            yaml.safe_dump(data, handle)


def make_role(root, name, options, defaults=None, deps=None):
    write(os.path.join(root, "roles", name, "meta", "argument_specs.yml"),
          {"argument_specs": {"main": {"short_description": name, "options": options}}})
    write(os.path.join(root, "roles", name, "defaults", "main.yml"), defaults or {})
    write(os.path.join(root, "roles", name, "meta", "main.yml"), {"dependencies": deps or []})


def entry(role, options, defaults=None):
    return {"role": role, "options": options, "defaults": defaults or {}}


def by_var(spec):
    return {q["variable"]: q for q in spec["spec"]}


def test_types_choices_defaults_and_secrets():
    options = {
        "r_name": {"type": "str", "description": ["The C(name).", "Second line."], "default": "x"},
        "r_path": {"type": "path", "description": "A path.", "required": True},
        "r_mode": {"type": "str", "choices": ["a", "b"], "default": "a", "description": "Mode."},
        "r_count": {"type": "int", "default": 3, "description": "Count."},
        "r_ratio": {"type": "float", "description": "Ratio."},
        "r_kinds": {"type": "list", "elements": "str", "choices": ["p", "q"], "default": ["p", "q"], "description": "K."},
        "r_secret": {"type": "str", "no_log": True, "default": "", "description": "S."},
        "r_api_token": {"type": "str", "description": "T."},
        "r_flag": {"type": "bool", "default": False, "description": "F."},
        "r_map": {"type": "dict", "default": {}, "description": "M."},
        "r_items": {"type": "list", "elements": "str", "default": [], "description": "I."},
        "r_derived": {"type": "str", "default": "x", "description": "D."},
    }
    result = survey.survey_spec([entry("r", options, {"r_derived": "{{ other | default('x') }}"})], name="n")
    q = by_var(result)
    assert q["r_name"] == {"question_name": "Name", "question_description": "The name. Second line.", "variable": "r_name",
                           "required": False, "type": "text", "min": 0, "max": survey.TEXT_MAX, "default": "x"}
    assert q["r_path"]["required"] is True and q["r_path"]["type"] == "text" and q["r_path"]["default"] == ""
    assert q["r_mode"]["type"] == "multiplechoice" and q["r_mode"]["choices"] == ["a", "b"] and q["r_mode"]["default"] == "a"
    assert q["r_count"]["type"] == "integer" and q["r_count"]["default"] == 3
    assert q["r_ratio"]["type"] == "float"
    assert q["r_kinds"]["type"] == "multiselect" and q["r_kinds"]["default"] == "p\nq"
    assert q["r_secret"]["type"] == "password" and q["r_api_token"]["type"] == "password"
    assert set(result["skipped_options"]) == {"r_flag", "r_map", "r_items", "r_derived"}
    assert "boolean" in result["skipped_options"]["r_flag"]
    assert "computed" in result["skipped_options"]["r_derived"]
    assert [x["variable"] for x in result["spec"]][:2] == ["r_name", "r_path"]  # spec order kept


def test_exclude_required_and_extra_questions():
    roles = [entry("r", {"r_user": {"type": "str", "default": ""}, "r_version": {"type": "str", "default": ""}})]
    ref = [entry("d", {"d_type": {"type": "str", "choices": ["c", "v"], "default": "c", "description": "Type."}})]
    result = survey.survey_spec(roles, exclude=["r_user"], required=["r_version"], reference=ref,
                                questions=[{"variable": "wt", "required": True, "choices_from": "d_type"}])
    q = by_var(result)
    assert "r_user" not in q and "excluded" in result["skipped_options"]["r_user"]
    assert q["r_version"]["required"] is True
    assert result["spec"][0]["variable"] == "wt"
    assert q["wt"]["type"] == "multiplechoice" and q["wt"]["choices"] == ["c", "v"] and q["wt"]["default"] == "c"
    with pytest.raises(survey.SurveyError, match="no role of the playbook has"):
        survey.survey_spec(roles, required=["nope"])
    with pytest.raises(survey.SurveyError, match="choices_from names missing"):
        survey.survey_spec(roles, questions=[{"variable": "x", "choices_from": "missing"}])
    with pytest.raises(survey.SurveyError, match="not an AWX survey type"):
        survey.survey_spec(roles, questions=[{"variable": "x", "type": "bool"}])
    with pytest.raises(AnsibleFilterError, match="needs a variable name"):
        FilterModule().filters()["survey_spec"](roles, questions=[{"type": "text"}])


def test_an_extra_question_replaces_the_derived_one():
    roles = [entry("r", {"r_a": {"type": "str", "default": "1"}})]
    result = survey.survey_spec(roles, questions=[{"variable": "r_a", "type": "textarea", "default": "2"}])
    assert len(result["spec"]) == 1 and result["spec"][0]["type"] == "textarea" and result["spec"][0]["max"] == survey.TEXTAREA_MAX


def test_playbook_roles_follow_every_way_a_play_runs_a_role(tmp_path):
    root = str(tmp_path)
    for name in ("base", "one", "two", "three", "four", "dep"):
        make_role(root, name, {name + "_x": {"type": "str", "default": ""}}, deps=["gpuops.sandbox.dep"] if name == "four" else None)
    write(os.path.join(root, "playbooks", "inner.yml"), [{"hosts": "all", "roles": ["three"]}])
    write(os.path.join(root, "playbooks", "main.yml"), [
        {"ansible.builtin.import_playbook": "inner.yml"},
        {"hosts": "all", "pre_tasks": [{"ansible.builtin.import_role": {"name": "base"}}],
         "roles": [{"role": "gpuops.sandbox.one"}, "other.collection.role", "{{ templated }}"],
         "tasks": [{"block": [{"ansible.builtin.include_role": {"name": "gpuops.sandbox.two"}}],
                    "rescue": [{"include_role": {"name": "four"}}]},
                   {"ansible.builtin.include_role": {"name": "one"}}]},
        {"import_playbook": "inner.yml"},
    ])
    roles = survey.playbook_roles(os.path.join(root, "playbooks", "main.yml"), root)
    assert roles == ["three", "base", "one", "two", "dep", "four"]
    specs = survey.role_specs("one", root)
    assert specs["options"] == {"one_x": {"type": "str", "default": ""}}
    with pytest.raises(survey.SurveyError, match="does not exist"):
        survey.playbook_roles(os.path.join(root, "playbooks", "missing.yml"), root)
    write(os.path.join(root, "playbooks", "bad.yml"), "- hosts: [\n")
    with pytest.raises(survey.SurveyError, match="not valid YAML"):
        survey.playbook_roles(os.path.join(root, "playbooks", "bad.yml"), root)
