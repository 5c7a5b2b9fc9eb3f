#!/usr/bin/env bash
# Run `ansible-test sanity` on a copy of the checkout laid out as ansible_collections/gpuops/sandbox.
# ansible-test needs that layout in the real path (a symlink is resolved away), so the tracked and
# new, not ignored, files are copied there first. Extra arguments go to ansible-test (e.g. --test pep8).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
py="$top/.venv/bin/python"

# ansible-test bootstraps pip in its sanity venvs with a script from a host outside the package
# registries. Place an offline equivalent (scripts/sanity-pip-bootstrap.py + pip's wheel) in its cache.
pip_version=$("$py" - <<'PY'
import re, ansible_test, os
src = open(os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py")).read()
print(re.search(r"pip='([0-9.]+)'", src).group(1))
PY
)
cache="$HOME/.ansible/test/cache"
boot="$cache/get_pip_${pip_version//./_}.py"
mkdir -p "$cache"
if ! ls "$cache"/pip-"$pip_version"-*.whl >/dev/null 2>&1; then
  "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$cache" "pip==$pip_version"
fi
cp "$top/scripts/sanity-pip-bootstrap.py" "$boot"

# A private copy per run, so concurrent runs do not trample each other.
work=$(mktemp -d "$top/.build/sanity.XXXXXX")
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/gpuops/sandbox"
mkdir -p "$dest"
cd "$top"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$dest"
cd "$dest"
# A repository of its own, so ansible-test lists exactly these files.
git init -q . && git add -A >/dev/null
"$top/.venv/bin/ansible-test" sanity --python 3.11 --color no --venv "$@"
