#!/usr/bin/env bash
# Run `ansible-test sanity` on a copy of the checkout laid out as ansible_collections/gpuops/sandbox.
# ansible-test needs that layout in the real path (a symlink is resolved away), so the tracked and
# new, not ignored, files are copied there first. Extra arguments go to ansible-test (e.g. --test pep8).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest="$top/.build/sanity/ansible_collections/gpuops/sandbox"
rm -rf "$dest"
mkdir -p "$dest"
cd "$top"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$dest"
cd "$dest"
# A repository of its own, so ansible-test lists exactly these files.
git init -q . && git add -A >/dev/null
exec "$top/.venv/bin/ansible-test" sanity --python 3.11 --color no --venv "$@"
