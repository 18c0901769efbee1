#!/bin/bash
# Builds the rootfs dir of a toolset layer from Debian packages installed on
# this host: the files each package of ROOTS' dependency closure installed
# (dpkg -L) are copied, except packages the base rootfs has and the closure
# of the packages named by --minus (a toolset this one is stacked over, e.g.
# toolset/gcc under toolset/rust). fncall's languages call the tools by the
# paths dpkg lists (alternatives symlinks such as /usr/bin/java are made by
# maintainer scripts and are not copied). Python modules get their byte code
# compiled (Debian makes it in postinst).
#
# Usage: build-toolset-rootfs.sh DEST BASE_ROOTFS [--minus "PKG..."] ROOT_PKG...
#   e.g. build-toolset-rootfs.sh /var/cache/warren/rootfs/toolset-jdk \
#          /var/cache/warren/rootfs/debian-12 openjdk-17-jdk-headless
# Idempotent: does nothing if DEST.complete (beside DEST) names the same
# ROOTS and --minus; otherwise DEST is rebuilt. Exits non-zero on any error
# (a root package not installed on the host: "apt-get install" it first).
set -euo pipefail
[[ $# -ge 3 ]] || { echo "usage: $0 DEST BASE_ROOTFS [--minus \"PKG...\"] ROOT_PKG..." >&2; exit 2; }
dest=${1%/}
base=$2
shift 2
minus=()
if [[ $1 == --minus ]]; then
  read -r -a minus <<< "$2"
  shift 2
fi
roots=("$@")
stamp="roots=${roots[*]} minus=${minus[*]}"
if [[ -e "$dest.complete" && "$(cat "$dest.complete")" == "$stamp" ]]; then
  echo "$dest already complete; nothing to do"
  exit 0
fi
for p in "${roots[@]}" "${minus[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    { echo "$0: $p is not installed on this host (apt-get install ${roots[*]} ${minus[*]})" >&2; exit 1; }
done
[[ -f "$base/var/lib/dpkg/status" ]] || { echo "$0: no base rootfs at $base" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
closure() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances --installed "$@" 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u
}
closure "${roots[@]}" > "$tmp/closure"
{
  sed -n 's/^Package: //p' "$base/var/lib/dpkg/status"
  if ((${#minus[@]})); then closure "${minus[@]}"; fi
} | sort -u > "$tmp/base"
comm -23 "$tmp/closure" "$tmp/base" > "$tmp/pkgs"
: > "$tmp/files"
while read -r p; do
  arch=$(dpkg-query -W -f='${Architecture}' "$p" 2>/dev/null || true)
  [[ -n "$arch" ]] || continue
  dpkg -L "$p" 2>/dev/null >> "$tmp/files" || dpkg -L "$p:$arch" >> "$tmp/files"
done < "$tmp/pkgs"
# The host's usrmerge symlinks (/lib -> usr/lib, ...) are left out: a
# package listing /lib/x86_64-linux-gnu/... gets a real lib/ here, merged
# into usr/ below.
sort -u "$tmp/files" | while read -r f; do
  case $f in /bin | /sbin | /lib | /lib32 | /lib64 | /libx32) continue ;; esac
  if [[ -f "$f" || -L "$f" ]]; then printf "%s\n" "${f#/}"; fi
done > "$tmp/list"
[[ -s "$tmp/list" ]] || { echo "$0: no files to copy for ${roots[*]}" >&2; exit 1; }
rm -rf --one-file-system "$dest" "$dest.tmp" "$dest.complete"
mkdir -p "$dest.tmp"
tar -C / --no-recursion -cf - -T "$tmp/list" | tar -C "$dest.tmp" -xf -
# usrmerge: keep /bin /lib ... as the base's symlinks (the overlay merges dirs).
for l in bin lib lib64 sbin; do
  if [[ -d "$dest.tmp/$l" && ! -L "$dest.tmp/$l" ]]; then
    mkdir -p "$dest.tmp/usr/$l"; cp -a "$dest.tmp/$l/." "$dest.tmp/usr/$l/"; rm -rf "$dest.tmp/$l"
  fi
done
for d in "$dest.tmp/usr/lib/python3/dist-packages"; do
  if [[ -d "$d" ]]; then /usr/bin/python3 -m compileall -q -j 0 "$d" >/dev/null; fi
done
mv "$dest.tmp" "$dest"
printf '%s' "$stamp" > "$dest.complete"
echo "$dest: $(wc -l < "$tmp/pkgs") packages, $(du -sh "$dest" | cut -f1)"
