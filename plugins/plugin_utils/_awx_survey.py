# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Derive AWX / Automation Platform job template surveys from the roles' argument specs.

This file is private to the gpuops.sandbox collection: its interface may change at any time.

Two halves, both plain Python that raise ``SurveyError``; the lookup and filter plugins turn the
errors into Ansible errors:

* ``playbook_roles`` reads a playbook and lists the collection's roles it runs: ``roles:``,
  ``import_role`` / ``include_role`` tasks (inside blocks too), ``import_playbook`` and role
  dependencies, followed recursively; ``role_specs`` loads each role's ``meta/argument_specs.yml``
  (entry point ``main``) and ``defaults/main.yml``.
* ``survey_spec`` turns those options into an AWX survey: one question per option that a survey can
  carry faithfully. A survey answer becomes an extra variable, which wins over every inventory
  variable on every host of the job, and AWX answers are text, integers or lists of text. So an
  option is left out (and ``skipped_options`` says why) when its default is computed from other
  variables (usually per host, such as the workload type from the inventory group), when its type
  has no survey equivalent (bool, dict, raw, lists without choices), or when the caller excludes it
  (variables injected by a credential).
"""

from __future__ import annotations

import os
import re

import yaml

COLLECTION_PREFIX = "gpuops.sandbox."

# Option types that a survey question carries faithfully, and the AWX question type for each.
TEXT_TYPES = ("str", "path")
NUMBER_TYPES = {"int": "integer", "float": "float"}

# Option names that are secrets even when the spec does not say no_log.
SECRET_NAME_RE = re.compile(r"(password|passwd|secret|token|passphrase|private_key)", re.I)

# Markup of Ansible documentation (C(x), O(x), V(x), I(x), M(x), ...) reduced to its text.
_MARKUP_RE = re.compile(r"\b([A-Z]{1,3})\(([^()]*)\)")

TEXT_MAX = 1024
TEXTAREA_MAX = 4096
SURVEY_TYPES = ("text", "textarea", "password", "integer", "float", "multiplechoice", "multiselect")

ROLE_TASK_KEYS = ("import_role", "include_role", "ansible.builtin.import_role", "ansible.builtin.include_role",
                  "ansible.legacy.import_role", "ansible.legacy.include_role")
PLAYBOOK_KEYS = ("import_playbook", "ansible.builtin.import_playbook", "ansible.legacy.import_playbook")
TASK_LIST_KEYS = ("pre_tasks", "tasks", "post_tasks", "handlers")
BLOCK_KEYS = ("block", "rescue", "always")


class SurveyError(Exception):
    """A playbook, a role's files or a survey request that cannot be used."""


class _AnsibleTagLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """A safe loader that reads Ansible's tags (!unsafe, !vault) as the plain values they tag."""


def _construct_tagged(loader, suffix, node):  # pylint: disable=unused-argument
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    return loader.construct_scalar(node)


_AnsibleTagLoader.add_multi_constructor("!", _construct_tagged)


def _load_yaml(path, what):
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.load(handle, Loader=_AnsibleTagLoader)  # nosec B506 - a SafeLoader subclass
    except OSError as exc:
        raise SurveyError("cannot read %s %s: %s" % (what, path, exc.strerror or exc)) from exc
    except yaml.YAMLError as exc:
        raise SurveyError("%s %s is not valid YAML: %s" % (what, path, exc)) from exc


def _is_templated(value):
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def short_role_name(name, collection_root):
    """Return the role's name inside this collection, or None for another collection's role."""
    if not isinstance(name, str) or _is_templated(name):
        return None
    if name.startswith(COLLECTION_PREFIX):
        name = name[len(COLLECTION_PREFIX):]
    elif "." in name:
        return None
    return name if os.path.isdir(os.path.join(collection_root, "roles", name)) else None


def _role_of_entry(entry):
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict):
        return entry.get("role", entry.get("name"))
    return None


def _roles_in_tasks(tasks):
    """Yield the role names that a task list imports or includes, blocks included."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for key in BLOCK_KEYS:
            if key in task:
                yield from _roles_in_tasks(task[key])
        for key in ROLE_TASK_KEYS:
            if key in task:
                args = task[key]
                yield args.get("name") if isinstance(args, dict) else args


def _add_role(name, collection_root, found, seen_roles):
    """Add a role and, first, the collection roles it depends on (meta/main.yml dependencies)."""
    short = short_role_name(name, collection_root)
    if short is None or short in seen_roles:
        return
    seen_roles.add(short)
    meta_path = os.path.join(collection_root, "roles", short, "meta", "main.yml")
    if os.path.isfile(meta_path):
        meta = _load_yaml(meta_path, "role metadata") or {}
        for dep in meta.get("dependencies") or []:
            _add_role(_role_of_entry(dep), collection_root, found, seen_roles)
    found.append(short)


def playbook_roles(playbook_path, collection_root, _seen_playbooks=None, _found=None, _seen_roles=None):
    """Return the names of this collection's roles that a playbook runs, in order of first use."""
    seen_playbooks = set() if _seen_playbooks is None else _seen_playbooks
    found = [] if _found is None else _found
    seen_roles = set() if _seen_roles is None else _seen_roles
    real = os.path.realpath(playbook_path)
    if real in seen_playbooks:
        return found
    seen_playbooks.add(real)
    if not os.path.isfile(playbook_path):
        raise SurveyError("playbook %s does not exist" % playbook_path)
    plays = _load_yaml(playbook_path, "playbook") or []
    if not isinstance(plays, list):
        raise SurveyError("playbook %s is not a list of plays" % playbook_path)
    base = os.path.dirname(playbook_path)
    for play in plays:
        if not isinstance(play, dict):
            continue
        for key in PLAYBOOK_KEYS:
            if key in play:
                target = play[key]
                if isinstance(target, str) and not _is_templated(target):
                    playbook_roles(os.path.join(base, target), collection_root, seen_playbooks, found, seen_roles)
        for key in TASK_LIST_KEYS[:1]:
            for name in _roles_in_tasks(play.get(key)):
                _add_role(name, collection_root, found, seen_roles)
        for entry in play.get("roles") or []:
            _add_role(_role_of_entry(entry), collection_root, found, seen_roles)
        for key in TASK_LIST_KEYS[1:]:
            for name in _roles_in_tasks(play.get(key)):
                _add_role(name, collection_root, found, seen_roles)
    return found


def role_specs(role, collection_root, entry_point="main"):
    """Return {'role', 'options', 'defaults'} for a role: its entry point's options and raw defaults."""
    role_dir = os.path.join(collection_root, "roles", role)
    spec_path = os.path.join(role_dir, "meta", "argument_specs.yml")
    options = {}
    if os.path.isfile(spec_path):
        specs = (_load_yaml(spec_path, "argument specs") or {}).get("argument_specs") or {}
        options = (specs.get(entry_point) or {}).get("options") or {}
    defaults = {}
    defaults_path = os.path.join(role_dir, "defaults", "main.yml")
    if os.path.isfile(defaults_path):
        defaults = _load_yaml(defaults_path, "role defaults") or {}
    return {"role": role, "options": options, "defaults": defaults}


def plain_text(description):
    """Return an option description as one line of plain text, Ansible markup removed."""
    if isinstance(description, list):
        description = " ".join(str(part) for part in description)
    text = _MARKUP_RE.sub(lambda match: match.group(2), str(description or ""))
    return " ".join(text.split())


def question_name(option, role):
    """'vgpu_manager_image_driver_version' of role vgpu_manager_image -> 'Driver version'."""
    name = option[len(role) + 1:] if option.startswith(role + "_") else option
    words = name.replace("_", " ").strip()
    return (words[:1].upper() + words[1:]) or option


def is_secret(option, spec):
    return bool(spec.get("no_log")) or bool(SECRET_NAME_RE.search(option))


def skip_reason(option, spec, defaults, exclude):
    """Return why an option gets no question, or None when it gets one."""
    if option in exclude:
        return "excluded (set by a credential or by the job template)"
    if _is_templated(defaults.get(option)):
        return "its default is computed from other variables (often per host); set it in the inventory"
    kind = spec.get("type", "str")
    if kind in TEXT_TYPES or kind in NUMBER_TYPES:
        return None
    if kind == "list" and spec.get("choices") and spec.get("elements", "str") == "str":
        return None
    if kind == "bool":
        return "a survey answer is text, not a boolean; set it as an extra variable"
    if kind == "list":
        return "a list without choices has no survey question; set it as an extra variable"
    return "type %s has no survey question; set it as an extra variable" % kind


def option_question(option, spec, role):
    """Return the AWX survey question for one option (that skip_reason accepted)."""
    kind = spec.get("type", "str")
    choices = spec.get("choices")
    default = spec.get("default")
    question = {
        "question_name": question_name(option, role),
        "question_description": plain_text(spec.get("description")),
        "variable": option,
        "required": bool(spec.get("required", False)),
    }
    if kind in NUMBER_TYPES:
        question["type"] = NUMBER_TYPES[kind]
        question["default"] = "" if default is None else default
    elif kind == "list":
        question["type"] = "multiselect"
        question["choices"] = [str(choice) for choice in choices]
        question["default"] = "\n".join(str(item) for item in (default or []))
    elif choices:
        question["type"] = "multiplechoice"
        question["choices"] = [str(choice) for choice in choices]
        question["default"] = "" if default is None else str(default)
    else:
        question["type"] = "password" if is_secret(option, spec) else "text"
        question["min"] = 0
        question["max"] = TEXT_MAX
        question["default"] = "" if default is None else str(default)
    return question


def _extra_question(extra, options):
    """Complete a question the caller gives: `choices_from` copies an option's choices and default."""
    if not isinstance(extra, dict) or not extra.get("variable"):
        raise SurveyError("an extra survey question needs a variable name: %r" % (extra,))
    question = {key: value for key, value in extra.items() if key != "choices_from"}
    source = extra.get("choices_from")
    if source:
        if source not in options:
            raise SurveyError("question %s: choices_from names %s, which no role of the playbook has"
                              % (extra["variable"], source))
        spec = options[source][1]
        if not spec.get("choices"):
            raise SurveyError("question %s: option %s has no choices" % (extra["variable"], source))
        question.setdefault("type", "multiplechoice")
        question["choices"] = [str(choice) for choice in spec["choices"]]
        question.setdefault("question_description", plain_text(spec.get("description")))
        if spec.get("default") is not None:
            question.setdefault("default", str(spec["default"]))
    question.setdefault("question_name", question_name(extra["variable"], ""))
    question.setdefault("question_description", "")
    question.setdefault("required", False)
    question.setdefault("type", "text")
    question.setdefault("default", "")
    if question["type"] in ("text", "password", "textarea"):
        question.setdefault("min", 0)
        question.setdefault("max", TEXTAREA_MAX if question["type"] == "textarea" else TEXT_MAX)
    if question["type"] not in SURVEY_TYPES:
        raise SurveyError("question %s: type %r is not an AWX survey type (%s)"
                          % (extra["variable"], question["type"], ", ".join(SURVEY_TYPES)))
    if question["type"] in ("multiplechoice", "multiselect") and not question.get("choices"):
        raise SurveyError("question %s: a %s question needs choices" % (extra["variable"], question["type"]))
    return question


def _collect_options(roles):
    options = {}
    for entry in roles or []:
        if not isinstance(entry, dict) or "role" not in entry:
            raise SurveyError("expected role entries with role, options and defaults, got %r" % (entry,))
        for option, spec in (entry.get("options") or {}).items():
            options.setdefault(option, (entry["role"], spec or {}, entry.get("defaults") or {}))
    return options


def survey_spec(roles, name="", description="", exclude=None, questions=None, required=None, reference=None):
    """Return an AWX survey spec for the roles (as role_specs returns them).

    The result is ``{'name', 'description', 'spec': [questions], 'skipped_options': {option: reason}}``;
    the last key documents what was left out and is no part of AWX's survey format. ``questions`` are
    extra questions put first (for playbook variables that are no role option); an extra question for
    a role option replaces the derived one. ``required`` lists options whose question is required
    although their spec has a default (a playbook that cannot do without them). ``reference`` holds
    more role entries, consulted only by the ``choices_from`` of extra questions.
    """
    exclude = set(exclude or [])
    required = set(required or [])
    options = _collect_options(roles)
    lookup = dict(_collect_options(reference))
    lookup.update(options)
    unknown = sorted(required - set(options))
    if unknown:
        raise SurveyError("required names options that no role of the playbook has: %s" % ", ".join(unknown))
    spec_list = []
    taken = set()
    for extra in questions or []:
        question = _extra_question(extra, lookup)
        if question["variable"] in taken:
            raise SurveyError("question %s is given twice" % question["variable"])
        taken.add(question["variable"])
        spec_list.append(question)
    skipped = {}
    for option, (role, spec, defaults) in options.items():
        if option in taken:
            continue
        reason = skip_reason(option, spec, defaults, exclude)
        if reason:
            skipped[option] = reason
            continue
        question = option_question(option, spec, role)
        if option in required:
            question["required"] = True
        spec_list.append(question)
        taken.add(option)
    return {"name": name, "description": description, "spec": spec_list, "skipped_options": skipped}
