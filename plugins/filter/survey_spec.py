# -*- coding: utf-8 -*-
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

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
