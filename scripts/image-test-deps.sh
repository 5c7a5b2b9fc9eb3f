#!/usr/bin/env bash
# Install the host packages the vGPU Manager image test needs (a builder, a registry, htpasswd and a
# static busybox for the base image), or name the missing ones when that is not possible.
# Safe to re-run: it only calls apt-get when something is missing. Called by the session fixture of
# tests/integration/test_50_vgpu_manager_image.py.
set -euo pipefail
declare -A pkg_for=(
  [buildah]=buildah
  [podman]=podman
  [docker-registry]=docker-registry
  [htpasswd]=apache2-utils
  [busybox]=busybox-static
  [openssl]=openssl
)
missing=()
for cmd in "${!pkg_for[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg_for[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "The image test needs these packages, which are not installed: ${missing[*]}" >&2
  echo "Install them (Debian/Ubuntu: sudo apt-get install ${missing[*]}) and run again." >&2
  exit 1
fi
echo "Installing image test packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
timeout 600 apt-get update -qq
# The registry package starts a system service on install; keep it from doing so (the test runs its own).
policy=/usr/sbin/policy-rc.d
created_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && created_policy=1
fi
trap 'if [ -n "$created_policy" ]; then rm -f "$policy"; fi' EXIT
timeout 1200 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
