#!/usr/bin/env bash
# Install the host packages the local lab needs, or name the missing ones when that is not possible.
# Safe to re-run: it only calls apt-get when something is missing.
set -euo pipefail
declare -A pkg_for=(
  [qemu-system-x86_64]=qemu-system-x86
  [qemu-img]=qemu-utils
  [debootstrap]=debootstrap
  [sfdisk]=fdisk
  [mkfs.ext4]=e2fsprogs
  [ssh]=openssh-client
  [ssh-keygen]=openssh-client
  [make]=make
  [gcc]=gcc
  [xz]=xz-utils
  [dpkg-deb]=dpkg
)
missing=()
for cmd in "${!pkg_for[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg_for[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "The lab needs these packages, which are not installed: ${missing[*]}" >&2
  echo "Install them (Debian/Ubuntu: sudo apt-get install ${missing[*]}) and run again." >&2
  exit 1
fi
echo "Installing lab packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
timeout 600 apt-get update -qq
timeout 1200 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
