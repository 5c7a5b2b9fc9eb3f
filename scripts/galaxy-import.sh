#!/usr/bin/env bash
# Build the collection tarball and run galaxy-importer on it, as Galaxy does on upload; exit non-zero
# when the import is rejected. galaxy-importer pins packages the development environment pins
# differently, so it has its own environment (.build/importer-venv, from requirements/galaxy-importer.txt).
# No container runtime is needed: ansible-test is not run (run_ansible_test = False), the same checks
# run as `make sanity`.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
venv="$top/.build/importer-venv"
work="$top/.build/galaxy-import"
cd "$top"

if [ ! -x "$venv/bin/python" ] || ! cmp -s requirements/galaxy-importer.txt "$venv/.requirements"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements/galaxy-importer.txt
  cp requirements/galaxy-importer.txt "$venv/.requirements"
fi

rm -rf "$work"
mkdir -p "$work/dist"
"$top/.venv/bin/ansible-galaxy" collection build --force --output-path "$work/dist" >/dev/null
tarball=$(ls "$work"/dist/gpuops-sandbox-*.tar.gz)
cat > "$work/galaxy-importer.cfg" <<'CFG'
[galaxy-importer]
LOG_LEVEL_MAIN = INFO
RUN_ANSIBLE_TEST = False
RUN_ANSIBLE_LINT = True
RUN_FLAKE8 = False
CHECK_REQUIRED_TAGS = False
REQUIRE_V1_OR_GREATER = False
CFG
export GALAXY_IMPORTER_CONFIG="$work/galaxy-importer.cfg"
export PATH="$venv/bin:$PATH" ANSIBLE_CONFIG="$top/ansible.cfg"
# The importer writes its result (the collection's metadata and docs, importer_result.json) into the directory it
# runs in: the work directory, beside the log, not the checkout.
set +e
(cd "$work" && "$venv/bin/python" -m galaxy_importer.main "$tarball") > "$work/import.log" 2>&1
rc=$?
set -e
cat "$work/import.log"
if [ "$rc" -ne 0 ] || grep -qE "^(ERROR|CRITICAL)|ImporterError|Traceback" "$work/import.log"; then
  echo "galaxy-importer rejected $(basename "$tarball") (rc=$rc)" >&2
  exit 1
fi
echo "galaxy-importer accepted $(basename "$tarball")"
