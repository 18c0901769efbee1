#!/bin/bash
# Builds a C/C++ toolset rootfs dir (gcc, g++, binutils, libc6-dev and their
# dependencies) for fncall's compiled languages, from the Debian packages
# installed on this host (apt-get install g++ first): the files each package
# installed (dpkg -L) are copied, except packages the base rootfs already has.
# Stack it over base/debian-12 (same Debian release). Usage:
#   build-toolset-gcc-rootfs.sh [DEST] [BASE_ROOTFS]
set -euo pipefail
dest=${1:-/var/cache/warren/rootfs/toolset-gcc}
base=${2:-/var/cache/warren/rootfs/debian-12}
[[ -x /usr/bin/g++ ]] || { echo "$0: install g++ on the host first (apt-get install g++)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Dependency closure of gcc/g++, installed packages only.
apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
  --no-enhances --installed g++ gcc make 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u > "$tmp/closure"
# Packages the base rootfs has are left out.
sed -n 's/^Package: //p' "$base/var/lib/dpkg/status" | sort -u > "$tmp/base"
comm -23 "$tmp/closure" "$tmp/base" > "$tmp/pkgs"
: > "$tmp/files"
while read -r p; do
  arch=$(dpkg-query -W -f='${Architecture}' "$p" 2>/dev/null || true)
  [[ -n "$arch" ]] || continue
  dpkg -L "$p" 2>/dev/null >> "$tmp/files" || dpkg -L "$p:$arch" >> "$tmp/files" || true
done < "$tmp/pkgs"
sort -u "$tmp/files" | while read -r f; do
  if [[ -f "$f" || -L "$f" ]]; then printf "%s\n" "${f#/}"; fi
done > "$tmp/list"
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
tar -C / --no-recursion -cf - -T "$tmp/list" | tar -C "$dest.tmp" -xf -
# usrmerge: keep /bin /lib ... as the base's symlinks (the overlay merges dirs).
for l in bin lib lib64 sbin; do
  if [[ -d "$dest.tmp/$l" && ! -L "$dest.tmp/$l" ]]; then
    mkdir -p "$dest.tmp/usr/$l"; cp -a "$dest.tmp/$l/." "$dest.tmp/usr/$l/"; rm -rf "$dest.tmp/$l"
  fi
done
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "$dest: $(wc -l < "$tmp/pkgs") packages, $(du -sh "$dest" | cut -f1)"
