#!/usr/bin/env bash
# Copyright (c) gpuops.sandbox contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# The integration tier (make integration) as two pytest sessions at once:
#   - the main session: every test but those below; it starts the lab's work in the background (the scenarios,
#     the module targets and what follows them), runs the API server, chart and operator tests meanwhile, reads
#     what the lab work saw and ends with site.yml;
#   - beside it, at the lab's priority, with a temporary directory of its own (its output is printed in one piece
#     at the end): the vGPU Manager image tests (a real podman build pushed to a registry on loopback), which need
#     neither the lab nor an API server, then the real charts, drain and real operator tests, which need an API
#     server but not the lab; the session takes an API server of its own (conftest.claim_kube_state: the base
#     state directory is the main session's or this one's, whichever locked it first, the other gets base-<pid>),
#     and each of those modules leaves its server as it found it.
# Measured 2026-11-28: the lab's work ended 1806 s into the tier and the main session's own chain of tests 2493 s,
# the machine about half idle in between; the image tests were 405 s of that chain. In a later run (image tests
# beside) the lab's work ended 2139 s in and the main chain 2777 s, test_72/74/75 590 s of it, run after the lab's
# work on a machine half idle: they moved beside too. The docs and galaxy-importer tests (test_80) stay in the
# main session, at its end: galaxy-importer gives ansible-lint 180 s, a limit of its own, which ansible-lint
# beside the busy lab ran past (2026-11-28).
# Extra arguments go to both sessions. Exits non-zero when either session failed.
set -uo pipefail
cd "$(dirname "$0")/.."

beside=(tests/integration/test_50_vgpu_manager_image.py tests/integration/test_72_real_charts.py
        tests/integration/test_74_drain.py tests/integration/test_75_operator.py)
mkdir -p .build
log=.build/integration-beside.log
GPUOPS_TEST_BOOST=0 GPUOPS_TEST_TIMES_JSON=.build/test-times-integration-beside.json \
    pytest -q -p no:cacheprovider --basetemp=.build/pytest-beside --durations=0 "$@" "${beside[@]}" >"$log" 2>&1 &
beside_pid=$!

ignore=()
for path in "${beside[@]}"; do
    ignore+=(--ignore "$path")
done
pytest -q --durations=0 "$@" "${ignore[@]}" tests/integration
rc=$?

wait "$beside_pid"
beside_rc=$?
echo
echo "=== the controller's tests beside the main session (${beside[*]}): exit status $beside_rc"
cat "$log"
if [ "$rc" -eq 0 ]; then
    rc=$beside_rc
fi
exit "$rc"
