#!/usr/bin/env bash
# Build the documentation site into .build/docs (HTML in .build/docs/html):
# antsibull-docs renders every module, plugin and role of the collection (DOCUMENTATION and
# meta/argument_specs.yml) with the guides of docs/docsite/, scripts/gen-troubleshooting.py adds the
# troubleshooting page generated from the modules' source, CHANGELOG.rst becomes the changelog page,
# and Sphinx builds the site with warnings as errors. Sphinx needs an older docutils than the
# development environment pins, so the site has its own environment (.build/docs-venv, from
# requirements/docs.txt). Runs `antsibull-docs lint-collection-docs --plugin-docs` first.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
venv="$top/.build/docs-venv"
out="$top/.build/docs"
cd "$top"

if [ ! -x "$venv/bin/sphinx-build" ] || ! cmp -s requirements/docs.txt "$venv/.requirements"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements/docs.txt
  cp requirements/docs.txt "$venv/.requirements"
fi
export PATH="$venv/bin:$PATH"
# The collection as it ships: built with galaxy.yml's build_ignore and unpacked, so the docs describe
# what users install (and nothing of the checkout's caches or environments).
rm -rf "$out"
mkdir -p "$out/dist"
chmod 700 "$out"
"$top/.venv/bin/ansible-galaxy" collection build --force --output-path "$out/dist" >/dev/null
coll="$out/collections/ansible_collections/gpuops/sandbox"
mkdir -p "$coll"
tar -xzf "$out"/dist/gpuops-sandbox-*.tar.gz -C "$coll"
# The collections it depends on (kubernetes.core, ansible.posix, ...) come from the `ansible` package of
# the development environment.
deps=$("$top/.venv/bin/python" -c 'import ansible_collections, os; print(os.path.dirname(list(ansible_collections.__path__)[-1]))')
export ANSIBLE_COLLECTIONS_PATH="$out/collections:$deps"
export ANSIBLE_CONFIG="$top/ansible.cfg"

echo "== $SECONDS s: antsibull-docs lint-collection-docs --plugin-docs"
antsibull-docs lint-collection-docs --plugin-docs "$coll"

echo "== $SECONDS s: rendering the collection's documentation"
src="$out/src"
mkdir -p "$src/rst"
chmod 700 "$src" "$src/rst"   # antsibull-docs wants its output directory private
cp docs/site/conf.py "$src/conf.py"
antsibull-docs --config-file docs/site/antsibull-docs.cfg collection --use-current --squash-hierarchy \
  --fail-on-error --cleanup everything --dest-dir "$src/rst" gpuops.sandbox

"$top/.venv/bin/python" scripts/gen-troubleshooting.py --root "$coll" --output "$src/rst/troubleshooting.rst"
{
  printf '.. _ansible_collections.gpuops.sandbox.docsite.changelog:\n\n'
  cat CHANGELOG.rst
} > "$src/rst/changelog.rst"
cat >> "$src/rst/index.rst" <<'RST'

More
----

.. toctree::
   :maxdepth: 1

   troubleshooting
   changelog
RST

echo "== $SECONDS s: sphinx-build (warnings are errors)"
sphinx-build -q -b html -W --keep-going -c "$src" "$src/rst" "$out/html"
echo "docs: $out/html/index.html"
