#!/bin/bash
# Builds what the microvm backend boots (src/runtime/microvm): a guest kernel
# and an initramfs whose /init is warren's guest agent (src/guest/agent).
#
#   build-guest.sh [--agent PATH] [--out DIR]
#     --agent  the static guest agent (default: build/src/guest/agent/warren-agent)
#     --out    output dir (default: /var/cache/warren/microvm)
#
# Output in DIR (what warrend's --microvm-dir points at):
#   vmlinuz          the kernel of Debian's linux-image-cloud-amd64 (bzImage)
#   vmlinux          the same kernel uncompressed (an ELF with a PVH entry),
#                    when lz4 is installed: QEMU boots it directly, which
#                    skips the decompressor (~270 ms of a TCG cold boot);
#                    warrend prefers it to vmlinuz
#   initramfs.cpio   newc cpio: /init (the agent), /lib/modules/*.ko (the
#                    virtio-mmio, virtio-blk, virtio-console, virtio-rng, virtio-net,
#                    erofs and overlay modules, which that kernel builds as
#                    modules), /modules.load (their load order at boot, deps
#                    first) and /modules.net (virtio-net and its deps, loaded
#                    when the host configures the NIC)
#   kernel.release   e.g. 6.1.0-57-cloud-amd64
# The kernel package is fetched with `apt-get download` and unpacked with
# dpkg-deb into DIR/kernel/ (never installed into /boot). Idempotent: the
# kernel is unpacked once per package version, the initramfs is rebuilt
# only when the agent or the modules changed (DIR/initramfs.sha256 names its
# inputs).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
agent=$root/build/src/guest/agent/warren-agent
out=/var/cache/warren/microvm
while (($#)); do
  case $1 in
    --agent) agent=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "$0: unknown argument $1" >&2; exit 2 ;;
  esac
done
# Relative paths are the caller's (the script changes directory below).
mkdir -p "$out"
out=$(cd "$out" && pwd)
agent=$(realpath -m "$agent")
[[ -x $agent ]] || { echo "$0: guest agent $agent not found (build it: cmake --build build --target warren-agent)" >&2; exit 1; }
for tool in apt-get dpkg-deb cpio; do
  command -v $tool >/dev/null || { echo "$0: $tool is missing (apt-get install cpio)" >&2; exit 1; }
done
mkdir -p "$out"

# The modules the agent loads at boot, in this order; their dependencies (the
# "depends=" of each module's .modinfo) are added before them.
wanted=(virtio_mmio virtio_blk virtio_console virtio-rng erofs overlay)
# Loaded only when the host configures the guest's NIC (a sandbox with a
# network): a template's NIC stays unbound, so loopback-only clones have no
# eth0 and networked ones bind it after their restore.
wanted_net=(virtio_net)

# ---- kernel: the image package linux-image-cloud-amd64 depends on
meta=linux-image-cloud-amd64
pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
if [[ -z $pkg ]]; then
  echo "$0: cannot resolve $meta (apt-get update?)" >&2
  exit 1
fi
ver=$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')
release=${pkg#linux-image-}
kdir=$out/kernel/$release
if [[ ! -f $kdir/.complete || $(cat "$kdir/.complete") != "$ver" ]]; then
  echo "build-guest: fetching $pkg $ver"
  tmp=$(mktemp -d "$out/.kernel.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download -q "$pkg=$ver" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  deb=$(ls "$tmp"/*.deb)
  dpkg-deb -x "$deb" "$tmp/x"
  rm -rf "$kdir"
  mkdir -p "$kdir"
  cp "$tmp/x/boot/vmlinuz-$release" "$kdir/vmlinuz"
  cp "$tmp/x/boot/config-$release" "$kdir/config"
  mv "$tmp/x/lib/modules/$release/kernel" "$kdir/modules"
  cp "$tmp/x/lib/modules/$release/modules.builtin" "$kdir/modules.builtin"
  echo "$ver" >"$kdir/.complete"
  rm -rf "$tmp"
  trap - EXIT
fi

# ---- modules in load order (deps first)
declare -A path_of=()
while IFS= read -r -d '' f; do
  n=$(basename "$f" .ko)
  path_of[${n//-/_}]=$f
done < <(find "$kdir/modules" -name '*.ko' -print0)
declare -A seen=()
order=()
add() {
  local n=${1//-/_}
  [[ -n ${seen[$n]:-} ]] && return
  seen[$n]=1
  local f=${path_of[$n]:-}
  if [[ -z $f ]]; then
    # Built into the kernel: nothing to load.
    if ! grep -q -e "/${n}.ko\$" -e "/${1}.ko\$" "$kdir/modules.builtin"; then
      echo "$0: module $1 is neither in $pkg nor built into it" >&2
      exit 1
    fi
    return
  fi
  local deps
  deps=$(tr '\0' '\n' <"$f" | sed -n 's/^depends=//p' | head -1)
  local d
  for d in ${deps//,/ }; do add "$d"; done
  order+=("$n")
}
for m in "${wanted[@]}"; do add "$m"; done
boot_count=${#order[@]}
for m in "${wanted_net[@]}"; do add "$m"; done

# ---- initramfs (rebuilt when its inputs changed)
inputs=$( (sha256sum "$agent" | cut -d' ' -f1; for n in "${order[@]}"; do sha256sum "${path_of[$n]}" | cut -d' ' -f1; done) | sha256sum | cut -d' ' -f1)
# The uncompressed kernel: the bzImage's payload (LZ4, this kernel's
# CONFIG_KERNEL_LZ4) starts at the LZ4 legacy frame magic 02 21 4c 18; lz4
# exits 1 on the bzImage's trailer after the frame, so the result is checked
# instead: an ELF with the PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY, 0x12).
extract_vmlinux() {
  local src=$1 dst=$2 off
  command -v lz4 >/dev/null || { echo "build-guest: lz4 missing: no vmlinux (cold boots decompress vmlinuz)"; return 0; }
  off=$(LC_ALL=C grep -obUaP '\x02\x21\x4c\x18' "$src" | head -1 | cut -d: -f1)
  [[ -n $off ]] || { echo "build-guest: no LZ4 payload in $src: no vmlinux"; return 0; }
  tail -c +$((off + 1)) "$src" | lz4 -dc >"$dst.tmp" 2>/dev/null || true
  if [[ $(head -c 4 "$dst.tmp" | od -An -c | tr -d ' ') == '177ELF' ]] &&
      readelf -n "$dst.tmp" 2>/dev/null | grep -q 'Unknown note type: (0x00000012)'; then
    mv "$dst.tmp" "$dst"
  else
    rm -f "$dst.tmp"
    echo "build-guest: the payload of $src is not a PVH-bootable ELF: no vmlinux"
  fi
}
if [[ -f $out/initramfs.cpio && -f $out/initramfs.sha256 && $(cat "$out/initramfs.sha256") == "$inputs" &&
      -f $out/vmlinuz && $(cat "$out/kernel.release" 2>/dev/null) == "$release" ]]; then
  if [[ ! -f $out/vmlinux || $out/vmlinux -ot $out/vmlinuz ]]; then extract_vmlinux "$out/vmlinuz" "$out/vmlinux"; fi
  echo "build-guest: up to date ($release, ${#order[@]} modules)"
  exit 0
fi
stage=$(mktemp -d "$out/.initramfs.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib/modules" "$stage/dev" "$stage/proc" "$stage/sys" "$stage/newroot"
# The kernel opens /dev/console as init's stdio only if the initramfs has it.
mknod -m 600 "$stage/dev/console" c 5 1
install -m 0755 "$agent" "$stage/init"
: >"$stage/modules.load"
: >"$stage/modules.net"
for i in "${!order[@]}"; do
  n=${order[$i]}
  cp "${path_of[$n]}" "$stage/lib/modules/$n.ko"
  if ((i < boot_count)); then echo "$n" >>"$stage/modules.load"; else echo "$n" >>"$stage/modules.net"; fi
done
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 >"$out/initramfs.cpio.tmp")
cp "$kdir/vmlinuz" "$out/vmlinuz.tmp"
mv "$out/vmlinuz.tmp" "$out/vmlinuz"
rm -f "$out/vmlinux"
extract_vmlinux "$out/vmlinuz" "$out/vmlinux"
mv "$out/initramfs.cpio.tmp" "$out/initramfs.cpio"
echo "$release" >"$out/kernel.release"
echo "$inputs" >"$out/initramfs.sha256"
echo "build-guest: $out/vmlinuz ($release), $out/initramfs.cpio (modules: ${order[*]})"
