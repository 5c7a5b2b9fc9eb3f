# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: survey_spec
short_description: Derive an AWX job template survey from the argument specs of the roles a playbook runs
version_added: 1.0.0
description:
  - Turns the options of roles (as the P(gpuops.sandbox.role_specs#lookup) lookup returns them) into an
    AWX / Automation Platform survey spec, the value of the C(survey_spec) option of
    M(awx.awx.job_template).
  - One question per option. A C(str) or C(path) option becomes a C(text) question, or a C(password)
    question when the spec marks it C(no_log) or its name says it is a secret (password, token,
    secret, passphrase, private key); an option with C(choices) becomes C(multiplechoice); C(int)
    becomes C(integer), C(float) C(float); a C(list) of strings with C(choices) becomes C(multiselect).
    C(required) and C(default) are copied, the description becomes the question's description.
  - A survey answer is an extra variable, which overrides the inventory on every host of the job. So an
    option whose role default is computed from other variables (usually a per-host inventory
    variable) gets no question, nor does an option whose type a survey cannot carry (C(bool), C(dict),
    C(raw), a C(list) without choices; set those as extra variables), nor an excluded one. The result's
    C(skipped_options) says why each was left out.
author:
  - gpuops.sandbox contributors (@gpuops)
options:
  _input:
    description: Role entries, each a dict with C(role), C(options) (the argument spec options) and C(defaults).
    type: list
    elements: dict
    required: true
  name:
    description: Name of the survey.
    type: str
    default: ""
  description:
    description: Description of the survey.
    type: str
    default: ""
  exclude:
    description: Options to leave out, such as the variables a credential of the job template injects.
    type: list
    elements: str
    default: []
  questions:
    description:
      - Extra questions, put first, for variables that are no role option (or to replace the derived
        question of an option). Each is an AWX survey question; C(variable) is required, the other keys
        have defaults.
      - C(choices_from) names a role option whose choices (and default and description) the question takes.
    type: list
    elements: dict
    default: []
  required:
    description: Options whose question is required although their argument spec gives a default.
    type: list
    elements: str
    default: []
  reference:
    description: More role entries (like O(_input)), consulted only by the C(choices_from) of O(questions).
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Survey of the host preparation job template
  ansible.builtin.set_fact:
    prepare_survey: >-
      {{ query('gpuops.sandbox.role_specs', 'playbooks/prepare_hosts.yml')
         | gpuops.sandbox.survey_spec(name='Prepare GPU hosts', exclude=['vgpu_manager_image_password']) }}

- name: A switch template asks for the new workload type, with the choices of the discover role
  ansible.builtin.set_fact:
    switch_survey: >-
      {{ query('gpuops.sandbox.role_specs', 'playbooks/switch_workload.yml')
         | gpuops.sandbox.survey_spec(questions=[{'variable': 'gpuops_workload_type', 'required': true,
                                                  'choices_from': 'discover_workload_type'}]) }}
"""

RETURN = r"""
_value:
  description: The survey spec; AWX reads C(name), C(description) and C(spec).
  type: dict
  contains:
    name:
      description: Name of the survey.
      type: str
    description:
      description: Description of the survey.
      type: str
    spec:
      description: The questions (C(question_name), C(question_description), C(variable), C(type), C(required), C(default), C(choices), C(min), C(max)).
      type: list
      elements: dict
    skipped_options:
      description: Options that got no question, each with the reason. Remove it before sending the spec to AWX.
      type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.sandbox.plugins.plugin_utils._awx_survey import SurveyError, survey_spec


def survey_spec_filter(roles, name="", description="", exclude=None, questions=None, required=None, reference=None):
    try:
        return survey_spec(roles, name=name, description=description, exclude=exclude, questions=questions,
                           required=required, reference=reference)
    except SurveyError as exc:
        raise AnsibleFilterError("survey_spec: %s" % exc) from exc


class FilterModule:
    def filters(self):
        return {"survey_spec": survey_spec_filter}
