#!/usr/bin/env bash
# Install the host packages the local lab needs, or name the missing ones when that is not possible.
# Safe to re-run: it only calls apt-get when something is missing.
# The cluster lab (lab/kubelab.py) runs etcd 3.5 or newer: on Debian 12, whose etcd-server is 3.4,
# that one package comes from Debian 13 (trixie), added as an apt source pinned low so nothing else
# is ever taken from it.
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
  [openssl]=openssl
  [etcd]=etcd-server
)
# Files of packages that install no command: the UEFI firmware a lab host with gpulab_boot: uefi boots.
declare -A pkg_for_file=(
  [/usr/share/OVMF/OVMF_CODE_4M.fd]=ovmf
)
# Packages whose version must be at least this (major.minor), and the Debian suite that has one.
declare -A min_version=([etcd-server]=3.5)
declare -A newer_suite=([etcd-server]=trixie)
TRIXIE_LIST=/etc/apt/sources.list.d/gpuops-trixie.sources
TRIXIE_PIN=/etc/apt/preferences.d/gpuops-trixie

# major.minor of an installed package, empty when it is not installed.
installed_version() {
  dpkg-query -W -f '${Status} ${Version}\n' "$1" 2>/dev/null |
    awk '$3 == "installed" { sub(/^[0-9]+:/, "", $4); split($4, v, "."); print v[1] "." v[2] }' || true
}

version_lt() {  # version_lt 3.4 3.5 -> true
  [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$1" ]
}

# The Debian mirror this host already uses for its own suite (deb822 or one-line sources).
debian_mirror() {
  local codename="$1"
  { grep -hs -A4 '^URIs:' /etc/apt/sources.list.d/*.sources | awk -v s="$codename" '
      /^URIs:/ { uri = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) { print uri; exit } }'
    grep -hs "^deb .* $codename main" /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
      awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }'
  } | grep -v security | head -n1 || true
}

# Add a newer Debian suite with pin priority 1: apt takes a package from it only when asked by name.
add_suite() {
  local suite="$1" codename mirror
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
  [ "$codename" = "$suite" ] && return 0
  mirror="$(debian_mirror "$codename")"
  if [ -z "$mirror" ]; then
    echo "Cannot find the Debian mirror of $codename in /etc/apt/sources.list*; add $suite by hand." >&2
    exit 1
  fi
  local want
  want="$(printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$mirror" "$suite")"
  if [ "$(cat "$TRIXIE_LIST" 2>/dev/null)" != "$want" ]; then
    printf '%s\n' "$want" >"$TRIXIE_LIST"
  fi
  printf 'Package: *\nPin: release n=%s\nPin-Priority: 1\n' "$suite" >"$TRIXIE_PIN"
}

missing=()
for cmd in "${!pkg_for[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg_for[$cmd]}")
done
for file in "${!pkg_for_file[@]}"; do
  [ -e "$file" ] || missing+=("${pkg_for_file[$file]}")
done
too_old=()
for pkg in "${!min_version[@]}"; do
  have="$(installed_version "$pkg")"
  if [ -n "$have" ] && version_lt "$have" "${min_version[$pkg]}"; then
    too_old+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && [ ${#too_old[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" "${too_old[@]}" | sed '/^$/d' | sort -u)
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "The lab needs these packages, which are not installed (or too old): ${missing[*]}" >&2
  echo "Install them (Debian/Ubuntu: sudo apt-get install ${missing[*]}; etcd-server ${min_version[etcd-server]}" \
    "or newer) and run again." >&2
  exit 1
fi
echo "Installing lab packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
timeout 600 apt-get update -qq
targets=()
suite_added=no
for pkg in "${missing[@]}"; do
  if [ -n "${min_version[$pkg]:-}" ]; then
    candidate="$(apt-cache policy "$pkg" | awk '/Candidate:/ { sub(/^[0-9]+:/, "", $2); split($2, v, "."); print v[1] "." v[2] }')"
    if [ -z "$candidate" ] || [ "$candidate" = "(none)." ] || version_lt "$candidate" "${min_version[$pkg]}"; then
      add_suite "${newer_suite[$pkg]}"
      suite_added=yes
      targets+=("$pkg/${newer_suite[$pkg]}")
      continue
    fi
  fi
  targets+=("$pkg")
done
[ "$suite_added" = no ] || timeout 600 apt-get update -qq
timeout 1200 apt-get install -y -qq --no-install-recommends "${targets[@]}" >/dev/null
