#!/usr/bin/env bash
# Cut a release: `make release VERSION=X.Y.Z` (see CONTRIBUTING.md). Checks the changelog fragments and the
# plugins' version_added, sets galaxy.yml's version, releases the fragments into CHANGELOG.rst and
# changelogs/changelog.yaml with antsibull-changelog (which removes the fragments it released) and builds the
# tarball into .build/dist. It commits nothing: review `git diff`, run `make test`, commit and tag vX.Y.Z.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bin="$top/.venv/bin"
cd "$top"
export PATH="$bin:$PATH" ANSIBLE_CONFIG="$top/ansible.cfg"

version=${1:-}
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "release: VERSION must be a version X.Y.Z (semantic versioning), got '${version}'" >&2
  echo "usage: make release VERSION=1.1.0" >&2
  exit 2
fi

"$bin/python" - "$version" <<'PY'
import ast, os, sys

import yaml
from ansible.module_utils.compat.version import LooseVersion as V

version = sys.argv[1]
current = yaml.safe_load(open("galaxy.yml", encoding="utf-8"))["version"]
releases = set(yaml.safe_load(open("changelogs/changelog.yaml", encoding="utf-8"))["releases"])
problems = []
if V(version) <= V(current):
    problems.append("VERSION %s is not newer than galaxy.yml's version %s" % (version, current))
if version in releases:
    problems.append("%s is already released in changelogs/changelog.yaml" % version)
fragments = [f for f in sorted(os.listdir("changelogs/fragments") if os.path.isdir("changelogs/fragments") else [])
             if f.endswith((".yml", ".yaml"))]
if not fragments:
    problems.append("changelogs/fragments/ has no fragment: nothing to release")
elif not any("release_summary" in (yaml.safe_load(open(os.path.join("changelogs/fragments", f))) or {})
             for f in fragments):
    problems.append("no fragment has a release_summary: add changelogs/fragments/%s.yml with one" % version)


def added(node, where):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "version_added":
                yield where, str(value)
            else:
                yield from added(value, where + "." + str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from added(value, "%s[%d]" % (where, index))


# A version_added newer than the last release must be this one (antsibull-changelog lists the plugins whose
# version_added is the release's as new).
for root, _dirs, files in os.walk("plugins"):
    for name in sorted(files):
        if name.endswith(".py"):
            path = os.path.join(root, name)
            for stmt in ast.parse(open(path, encoding="utf-8").read(), path).body:
                if (isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["DOCUMENTATION"]
                        and isinstance(stmt.value, ast.Constant)):
                    for where, value in added(yaml.safe_load(stmt.value.value), path):
                        if value not in releases and value != version:
                            problems.append("%s: version_added %s is neither a release nor %s" % (where, value, version))
for problem in problems:
    print("release: " + problem, file=sys.stderr)
sys.exit(1 if problems else 0)
PY

echo "== antsibull-changelog lint"
antsibull-changelog lint
echo "== galaxy.yml: version $version"
sed -i -E "s/^version: .*/version: $version/" galaxy.yml
echo "== antsibull-changelog release --version $version"
antsibull-changelog release --version "$version"
rm -f changelogs/.plugin-cache.yaml
echo "== ansible-galaxy collection build"
mkdir -p .build/dist
ansible-galaxy collection build --force --output-path .build/dist
echo "Released $version into CHANGELOG.rst; tarball .build/dist/gpuops-sandbox-$version.tar.gz."
echo "Next: review git diff, run make test, then commit (Release $version) and tag v$version."
