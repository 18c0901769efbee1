#!/bin/bash
# Builds the rootfs dir of the layer "toolset/python": pytest, git, patch,
# make (and their dependency closure) for SWE-style rollouts (warren eval),
# from the Debian 12 packages installed on this host (setup.sh installs
# them): the files each package installed (dpkg -L) are copied, except those
# of packages the base rootfs already has (python3 itself is in the base).
# Byte code is compiled for the copied Python modules (Debian generates it in
# postinst, so dpkg -L does not list it), and /etc/gitconfig trusts every
# repository (layer files may show as another owner inside a sandbox).
# Stack it over base/debian-12 (same Debian release).
#
# Usage: build-toolset-python-rootfs.sh [DEST] [BASE_ROOTFS]
# Idempotent: does nothing if DEST.complete (beside DEST) exists; a partial
# DEST is rebuilt. Exits non-zero on any error.
set -euo pipefail
dest=${1:-/var/cache/warren/rootfs/toolset-python}
base=${2:-/var/cache/warren/rootfs/debian-12}
dest=${dest%/}
if [[ -e "$dest.complete" ]]; then
  echo "$dest already complete; nothing to do"
  exit 0
fi
roots=(python3-pytest git patch make)
for p in "${roots[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    { echo "$0: install $p on the host first (apt-get install ${roots[*]})" >&2; exit 1; }
done
[[ -f "$base/var/lib/dpkg/status" ]] || { echo "$0: no base rootfs at $base" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
  --no-enhances --installed "${roots[@]}" 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u > "$tmp/closure"
# Left out: what the base has, and python3-more-itertools (a Debian
# dependency of pytest 7.2 that pytest does not import; a workspace holding
# more-itertools must test its own copy, never this one).
{ sed -n 's/^Package: //p' "$base/var/lib/dpkg/status"; echo python3-more-itertools; } | sort -u > "$tmp/base"
comm -23 "$tmp/closure" "$tmp/base" > "$tmp/pkgs"
: > "$tmp/files"
while read -r p; do
  arch=$(dpkg-query -W -f='${Architecture}' "$p" 2>/dev/null || true)
  [[ -n "$arch" ]] || continue
  dpkg -L "$p" 2>/dev/null >> "$tmp/files" || dpkg -L "$p:$arch" >> "$tmp/files"
done < "$tmp/pkgs"
sort -u "$tmp/files" | while read -r f; do
  if [[ -f "$f" || -L "$f" ]]; then printf "%s\n" "${f#/}"; fi
done > "$tmp/list"
[[ -s "$tmp/list" ]] || { echo "$0: no files to copy" >&2; exit 1; }
rm -rf --one-file-system "$dest" "$dest.tmp"
mkdir -p "$dest.tmp"
tar -C / --no-recursion -cf - -T "$tmp/list" | tar -C "$dest.tmp" -xf -
# usrmerge: keep /bin /lib ... as the base's symlinks (the overlay merges dirs).
for l in bin lib lib64 sbin; do
  if [[ -d "$dest.tmp/$l" && ! -L "$dest.tmp/$l" ]]; then
    mkdir -p "$dest.tmp/usr/$l"; cp -a "$dest.tmp/$l/." "$dest.tmp/usr/$l/"; rm -rf "$dest.tmp/$l"
  fi
done
# Byte code, as the packages' postinst would have made it (same python3.11
# as the base: both come from this Debian release).
for d in "$dest.tmp/usr/lib/python3/dist-packages" "$dest.tmp/usr/lib/python3.11"; do
  if [[ -d "$d" ]]; then /usr/bin/python3 -m compileall -q -j 0 "$d" >/dev/null; fi
done
mkdir -p "$dest.tmp/etc"
cat > "$dest.tmp/etc/gitconfig" <<'GIT'
[safe]
	directory = *
[user]
	name = warren agent
	email = agent@warren.invalid
[init]
	defaultBranch = main
GIT
mv "$dest.tmp" "$dest"
touch "$dest.complete"
echo "$dest: $(wc -l < "$tmp/pkgs") packages, $(du -sh "$dest" | cut -f1)"
