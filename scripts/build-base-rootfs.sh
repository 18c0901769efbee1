#!/bin/bash
# Builds a minimal Debian 12 (bookworm) root file system for the base layer
# "base/debian-12": debootstrap --variant=minbase plus python3, coreutils and
# procps, trimmed for container use (no apt caches or lists).
#
# Usage: build-base-rootfs.sh DIR [MIRROR]
# Idempotent: does nothing if the marker DIR.complete (beside DIR, so it
# never ends up in the layer) exists. A partial DIR from an
# interrupted run is removed and rebuilt. Must run as root.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 DIR [MIRROR]" >&2
  exit 2
fi
dir=$1
mirror=${2:-http://deb.debian.org/debian}

dir=${dir%/}
if [[ -e "$dir.complete" ]]; then
  echo "$dir already complete; nothing to do"
  exit 0
fi
if [[ $EUID -ne 0 ]]; then
  echo "$0: must run as root (debootstrap)" >&2
  exit 1
fi

start=$(date +%s)
if [[ "$(realpath -m "$dir")" == / ]]; then
  echo "$0: refusing to build into /" >&2
  exit 1
fi
if [[ -e "$dir" ]]; then
  # Left over by an interrupted run: never trust a half-built tree. Refuse if
  # something is mounted below it (debootstrap mounts /proc and /sys).
  if grep -q " $(realpath "$dir")/" /proc/self/mountinfo; then
    echo "$0: mounts below $dir; unmount them first" >&2
    exit 1
  fi
  rm -rf --one-file-system "$dir"
fi
rm -f "$dir.complete"
mkdir -p "$dir"

debootstrap --variant=minbase --include=python3,coreutils,procps \
  bookworm "$dir" "$mirror"

# Fit for a container: no package caches or lists, no logs of the build.
chroot "$dir" apt-get clean
rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin \
       "$dir"/var/cache/debconf/*-old "$dir"/var/log/*.log \
       "$dir"/var/log/apt/* "$dir"/debootstrap
# The sandbox's hostname/resolv.conf are provided by the runtime.
: > "$dir/etc/hostname"
rm -f "$dir/etc/resolv.conf"

touch "$dir.complete"
end=$(date +%s)
echo "built $dir in $((end - start)) s ($(du -sh --one-file-system "$dir" | cut -f1))"
