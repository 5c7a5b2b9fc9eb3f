#!/usr/bin/env bash
# Sanity and the unit tier on each ansible-core meta/runtime.yml claims (`make test-cores`: 2.19, 2.20 and 2.21 by
# default; CORES="2.18" or arguments pick others: 2.17 and 2.18 are kept to show what fails there, see the 1.0.0
# release notes). The landing tier (make sanity, make unit) runs the development environment's core; this runs
# each in a virtualenv of its own under .build/cores/<version>, reused while its requirements
# (requirements/core-<version>.txt, requirements/cores.txt, the constraints and the Python) are unchanged. A core
# runs on the development environment's Python when it supports that one as a controller, else on the first
# Python it supports that the machine has (python3.X on PATH, or under pyenv's versions); with none it is
# skipped, and said so. Each step's wall and CPU time (user + system, children included) is
# printed and kept in .build/cores/<version>/times.txt. `scripts/test-cores.sh --prepare [CORE...]` only creates
# the virtualenvs.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
unset PYTHONDONTWRITEBYTECODE
# The interpreter of the development environment (see scripts/venv-python.sh): a core runs on it when it can.
dev_py=$("$top/.venv/bin/python" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
dev_version=$("$dev_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# Controller Pythons of each core (ansible-core's support matrix).
supports() {
  case "$1" in
    2.17) echo "3.10 3.11 3.12" ;;
    2.18|2.19) echo "3.11 3.12 3.13" ;;
    2.20|2.21) echo "3.12 3.13 3.14" ;;
    *) echo "" ;;
  esac
}

# The interpreter a core runs on: the development environment's when the core supports it, else the first of the
# core's controller Pythons found on this machine. Prints its path, or nothing.
python_for() {
  local version candidate
  for version in $(supports "$1"); do
    if [ "$version" == "$dev_version" ]; then echo "$dev_py"; return; fi
  done
  for version in $(supports "$1"); do
    for candidate in "$(command -v "python$version" 2>/dev/null || true)" \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/"python$version"; do
      # A pyenv shim on PATH fails when that version is not selected: only an interpreter that runs counts.
      if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c 'import venv' >/dev/null 2>&1; then
        "$candidate" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))'
        return
      fi
    done
  done
}

# --prepare: create (or check) the virtualenvs only, as a CI cache step would.
prepare=0
if [ "${1:-}" == "--prepare" ]; then prepare=1; shift; fi
if [ "$#" -gt 0 ]; then cores=("$@"); else read -r -a cores <<<"${CORES:-2.19 2.20 2.21}"; fi

# Timing: "<step> <wall s> <cpu s>" of a command (GNU time: user + system of the command and its children).
# Returns the command's exit status.
timed() {
  local step=$1 status=0 wall user sys cpu
  shift
  local log="$state/$step.time"
  /usr/bin/time -f '%e %U %S' -o "$log" "$@" || status=$?
  read -r wall user sys < <(tail -n 1 "$log")
  cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.1f", u + s }')
  echo "$step $wall $cpu" >>"$state/times.txt"
  echo "== ansible-core $core: $step took ${wall} s wall, ${cpu} s CPU (exit status $status)"
  return "$status"
}

# ansible-test bootstraps pip in its sanity venvs with a script from outside the package registries: place the
# offline equivalent (as scripts/run-sanity.sh does) for the pip version this core's ansible-test pins.
pip_bootstrap() {
  local venv_py=$1 pip_version cache="$HOME/.ansible/test/cache"
  pip_version=$("$venv_py" - <<'PY'
import os, re, ansible_test
src = open(os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py")).read()
print(re.search(r"pip='([0-9.]+)'", src).group(1))
PY
)
  mkdir -p "$cache"
  if ! ls "$cache"/pip-"$pip_version"-*.whl >/dev/null 2>&1; then
    "$venv_py" -m pip download -q --disable-pip-version-check --no-deps -d "$cache" "pip==$pip_version"
  fi
  cp "$top/scripts/sanity-pip-bootstrap.py" "$cache/get_pip_${pip_version//./_}.py"
}

# ansible-test sanity needs the collection at ansible_collections/gpuops/sandbox in its real path: a private
# copy of the tracked and new (not ignored) files, in a repository of its own.
sanity() {
  local bin=$1 work dest
  work=$(mktemp -d "$top/.build/sanity-core.XXXXXX")
  dest="$work/ansible_collections/gpuops/sandbox"
  mkdir -p "$dest"
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [ -e "$f" ] && printf '%s\0' "$f"
  done | tar --null -T - -cf - | tar -xf - -C "$dest"
  (cd "$dest" && git init -q . && git add -A >/dev/null &&
    "$bin/ansible-test" sanity --python "$py_version" --color no --venv) || { rm -rf "$work"; return 1; }
  rm -rf "$work"
}

rc=0
summary=()
for core in "${cores[@]}"; do
  pins="requirements/core-$core.txt"
  if [ ! -f "$pins" ]; then
    echo "test-cores: no $pins for ansible-core $core (cores with pins: $(ls requirements/core-*.txt | sed 's/.*core-//; s/\.txt//' | tr '\n' ' '))" >&2
    exit 2
  fi
  base_py=$(python_for "$core")
  if [ -z "$base_py" ]; then
    echo "== ansible-core $core: skipped, its controller Pythons are $(supports "$core") and this machine has none of them"
    summary+=("$core: skipped (no controller Python: $(supports "$core"))")
    continue
  fi
  py_version=$("$base_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  echo "== ansible-core $core: on Python $py_version ($base_py)"
  state="$top/.build/cores/$core"
  venv="$state/venv"
  mkdir -p "$state"
  : >"$state/times.txt"
  # The constraints of the development environment, without the core and what only its version pins.
  wanted=$(cat "$pins" requirements/cores.txt; grep -vE '^(ansible|ansible-core|resolvelib)==' requirements/constraints.txt;
    echo "python $("$base_py" -c 'import sys; print(sys.version)')")
  if [ -x "$venv/bin/python" ] && [ "$wanted" == "$(cat "$state/requirements" 2>/dev/null)" ]; then
    echo "== ansible-core $core: reusing $venv"
  else
    rm -rf "$venv" "$state/requirements"
    grep -vE '^(ansible|ansible-core|resolvelib)==' requirements/constraints.txt >"$state/constraints.txt"
    timed venv bash -c '
      set -euo pipefail
      "$1" -m venv "$2"
      "$2/bin/python" -m pip install -q --disable-pip-version-check --no-compile -r "$3" -r requirements/cores.txt -c "$4"
      # The collections this one uses (kubernetes.core, ansible.posix, ...): those the `ansible` package of the
      # development environment bundles, as a user of this core gets them from Galaxy (requirements.yml).
      "$2/bin/python" -m pip install -q --disable-pip-version-check --no-compile --no-deps \
        "$(grep -E "^ansible==" requirements/constraints.txt)"
    ' _ "$base_py" "$venv" "$pins" "$state/constraints.txt"
    echo "$wanted" >"$state/requirements"
  fi
  bin="$venv/bin"
  if [ "$prepare" == 1 ]; then summary+=("$core: virtualenv ready"); continue; fi
  "$bin/ansible" --version >"$state/version.txt" && head -n 1 "$state/version.txt"
  pip_bootstrap "$bin/python"
  export PATH="$bin:$PATH" ANSIBLE_CONFIG="$top/ansible.cfg"
  result=passed
  printf -v sanity_cmd 'set -euo pipefail; top=%q py_version=%q\n%s\nsanity %q' "$top" "$py_version" \
    "$(declare -f sanity)" "$bin"
  timed sanity bash -c "$sanity_cmd" || { result=failed; rc=1; }
  timed unit "$bin/python" -m pytest -q -p no:cacheprovider tests/unit || { result=failed; rc=1; }
  PATH=${PATH#"$bin:"}
  summary+=("$core: $result ($(awk '{ printf "%s %s s wall %s s CPU; ", $1, $2, $3 }' "$state/times.txt"))")
done
echo "== test-cores:"
printf '  %s\n' "${summary[@]}"
exit $rc
