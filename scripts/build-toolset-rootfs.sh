#!/bin/bash
# Builds the rootfs dir of a toolset layer from Debian packages installed on
# this host: the files each package of ROOTS' dependency closure installed
# (dpkg -L) are copied, except packages the base rootfs has and the closure
# of the packages named by --minus (a toolset this one is stacked over, e.g.
# toolset/gcc under toolset/rust). --skip names packages whose dependencies
# are not followed: they, and what only they pull in, stay out (scipy's
# build-time python3-pythran pulls g++ and boost; a closure subtracted with
# --minus would take numpy out with it). fncall's languages call the tools by
# the paths dpkg lists. Alternatives links (/usr/lib/.../libblas.so.3,
# /usr/bin/java: made by maintainer scripts, not listed by dpkg) are made for
# every host alternative group with a candidate among the copied files (the
# highest-priority such candidate, linked directly, not via /etc/alternatives).
# Python modules get their byte code compiled (Debian makes it in postinst).
#
# Usage: build-toolset-rootfs.sh DEST BASE_ROOTFS [--minus "PKG..."] [--skip "PKG..."] ROOT_PKG...
#   e.g. build-toolset-rootfs.sh /var/cache/warren/rootfs/toolset-jdk \
#          /var/cache/warren/rootfs/debian-12 openjdk-17-jdk-headless
# Idempotent: does nothing if DEST.complete (beside DEST) names the same
# ROOTS and --minus; otherwise DEST is rebuilt. Exits non-zero on any error
# (a root package not installed on the host: "apt-get install" it first).
set -euo pipefail
[[ $# -ge 3 ]] || { echo "usage: $0 DEST BASE_ROOTFS [--minus \"PKG...\"] [--skip \"PKG...\"] ROOT_PKG..." >&2; exit 2; }
dest=${1%/}
base=$2
shift 2
minus=()
skip=()
while [[ $# -ge 2 && ( $1 == --minus || $1 == --skip ) ]]; do
  if [[ $1 == --minus ]]; then read -r -a minus <<< "$2"; else read -r -a skip <<< "$2"; fi
  shift 2
done
roots=("$@")
[[ ${#roots[@]} -ge 1 ]] || { echo "$0: no ROOT_PKG given" >&2; exit 2; }
stamp="roots=${roots[*]} minus=${minus[*]}${skip[*]:+ skip=${skip[*]}}"
if [[ -e "$dest.complete" && "$(cat "$dest.complete")" == "$stamp" ]]; then
  echo "$dest already complete; nothing to do"
  exit 0
fi
for p in "${roots[@]}" "${minus[@]}" "${skip[@]}"; do
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
# The closure of ROOTS without entering the --skip packages: apt-cache's
# recursive listing (each package, then its dependencies indented) read as
# a graph and walked from the roots.
closure_skipping() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances --installed "${roots[@]}" 2>/dev/null |
    /usr/bin/python3 -c '
import re, sys
skip, roots = set(sys.argv[1].split()), sys.argv[2].split()
graph, cur = {}, None
for line in sys.stdin:
    if not line.startswith(" "):
        cur = line.strip()
        graph.setdefault(cur, set())
        continue
    m = re.match(r"^ *\|?[A-Za-z]+: (.*)$", line)
    dep = (m.group(1) if m else line).strip()
    if cur is not None and dep and not dep.startswith("<"):
        graph[cur].add(dep)
seen, todo = set(), list(roots)
while todo:
    p = todo.pop()
    if p in seen or p in skip:
        continue
    seen.add(p)
    todo.extend(graph.get(p, ()))
print("\n".join(sorted(seen)))
' "${skip[*]}" "${roots[*]}"
}
if ((${#skip[@]})); then closure_skipping | sort -u > "$tmp/closure"; else closure "${roots[@]}" > "$tmp/closure"; fi
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
# Alternatives links whose target this toolset ships (see the top).
update-alternatives --get-selections | while read -r name _ _; do
  q=$(update-alternatives --query "$name" 2>/dev/null) || continue
  link=$(sed -n 's/^Link: //p' <<< "$q")
  best=$(awk '/^Alternative: /{a=$2} /^Priority: /{if (a != "") print $2, a; a=""}' <<< "$q" | sort -rn |
    while read -r _ cand; do
      if [[ -e "$dest.tmp/${cand#/}" || -L "$dest.tmp/${cand#/}" ]]; then echo "$cand"; break; fi
    done)
  if [[ -n "$link" && -n "$best" && ! -e "$dest.tmp/${link#/}" && ! -L "$dest.tmp/${link#/}" ]]; then
    mkdir -p "$(dirname "$dest.tmp/${link#/}")"
    ln -s "$best" "$dest.tmp/${link#/}"
  fi
done
for d in "$dest.tmp/usr/lib/python3/dist-packages"; do
  if [[ -d "$d" ]]; then /usr/bin/python3 -m compileall -q -j 0 "$d" >/dev/null; fi
done
mv "$dest.tmp" "$dest"
printf '%s' "$stamp" > "$dest.complete"
echo "$dest: $(wc -l < "$tmp/pkgs") packages, $(du -sh "$dest" | cut -f1)"
