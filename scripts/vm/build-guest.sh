#!/bin/bash
# Builds what the vm backend boots (src/runtime/vm): a full Debian 12 system
# with systemd, Debian's generic kernel, warren's guest agent as a systemd
# service on the virtio-serial port "warren.agent", and a desktop: Xorg
# (modesetting on the bochs-drm of QEMU's `-vga std`, libinput for the USB
# tablet and the PS/2 keyboard), matchbox-window-manager (one full-screen
# window, no decorations, nothing to place: the lightest WM that needs no
# clicks to show an app) and xterm as the visible app, dillo as the browser
# (FLTK, no JavaScript engine: it starts in seconds under TCG where
# firefox-esr or chromium take minutes and hundreds of MiB).
#
# The system is a LAYER over the base rootfs (the dir the base/debian-12
# layer is made from): the packages are installed in a chroot of an
# overlayfs whose lower dir is the base rootfs, and the overlay's upper dir
# (what apt added and changed, deletions as overlay whiteouts) becomes
# system.erofs. A VM's root is then the sandbox's own layers with this one
# stacked right above its base (src/runtime/vm/vm_backend.h), over a
# writable disk: one set of layers serves every backend.
#
#   build-guest.sh [--agent PATH] [--out DIR] [--base DIR] [--mirror URL]
#     --agent   the static guest agent (default: build/src/guest/agent/warren-agent)
#     --out     output dir (default: /var/cache/warren/vm)
#     --base    the base rootfs the system layer is built over
#               (default: /var/cache/warren/rootfs/debian-12, scripts/build-base-rootfs.sh)
#     --mirror  Debian mirror (default: http://deb.debian.org/debian)
#
# Output in DIR (what warrend's --vm-dir points at):
#   system.erofs  the system layer (EROFS; ~800 MB)
#   upper.img     an empty ext4 file system (sparse, 4 GiB): each VM's
#                 writable disk is a qcow2 overlay of it (the overlay's
#                 upper and work dirs)
#   vmlinuz, initrd.img   the guest's kernel and initramfs (direct boot);
#                 the initramfs's boot script `warren` (boot=warren on the
#                 kernel command line) mounts the layer disks and the
#                 writable disk and the overlay root
#   kernel.release
# Why the generic kernel (linux-image-amd64) and not linux-image-cloud-amd64:
# the cloud kernel builds no DRM, no USB and no VESA framebuffer, so it has
# no display on `-vga std` and no USB tablet; the generic one has bochs-drm,
# xhci and usbhid.
# Idempotent: DIR/system (the upper dir) is built once per package list and
# base (DIR/rootfs.stamp); system.erofs and the rest are rebuilt when the
# agent, this script or the system changed (DIR/disk.stamp).
# Must run as root (overlayfs, chroot).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
agent=$root/build/src/guest/agent/warren-agent
out=/var/cache/warren/vm
base=/var/cache/warren/rootfs/debian-12
mirror=http://deb.debian.org/debian
while (($#)); do
  case $1 in
    --agent) agent=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    *) echo "$0: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $EUID -eq 0 ]] || { echo "$0: must run as root (overlayfs, chroot)" >&2; exit 1; }
[[ -f $base/var/lib/dpkg/status ]] || { echo "$0: no base rootfs at $base (scripts/build-base-rootfs.sh)" >&2; exit 1; }
base=$(cd "$base" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
agent=$(realpath -m "$agent")
[[ -x $agent ]] || { echo "$0: guest agent $agent not found (build it: cmake --build build --target warren-agent)" >&2; exit 1; }
for tool in mkfs.erofs mke2fs chroot; do
  command -v $tool >/dev/null || { echo "$0: $tool is missing (apt-get install erofs-utils e2fsprogs)" >&2; exit 1; }
done
start=$(date +%s)

packages=(systemd-sysv udev linux-image-amd64 initramfs-tools zstd
  xserver-xorg-core xserver-xorg-input-libinput xinit x11-xserver-utils
  xterm xfonts-base matchbox-window-manager dillo)
# The system's inputs: the package list and the base it is installed over.
rootfs_key=$( (printf '%s\n' v2 "$mirror" "${packages[@]}"; sha256sum "$base/var/lib/dpkg/status" | cut -d' ' -f1) |
  sha256sum | cut -c1-16)
upper=$out/system
work=$out/system.work
rootfs=$out/root  # the overlay (base + upper) while this script runs
mounted=()
cleanup() {
  local m
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mount_root() {
  mkdir -p "$upper" "$work" "$rootfs"
  mount -t overlay overlay -o "lowerdir=$base,upperdir=$upper,workdir=$work" "$rootfs" && mounted+=("$rootfs")
}
umount_all() {
  cleanup
  mounted=()
}

# The configuration of the root, applied at every disk build (cheap; the
# packages stay in DIR/rootfs).
configure_root() {
  # The system: the root is the initramfs's overlay (boot script below),
  # nothing in fstab; no password logins, no timers or gettys that compete
  # with the sandbox for a TCG vCPU.
  echo "# the root: an overlay of the sandbox's layers, mounted by the initramfs (boot=warren)" >"$rootfs/etc/fstab"
  echo sandbox >"$rootfs/etc/hostname"
  for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
           man-db.timer getty@tty1.service getty-static.service serial-getty@ttyS0.service systemd-timesyncd.service; do
    ln -sf /dev/null "$rootfs/etc/systemd/system/$u"
  done
  ln -sf /lib/systemd/system/multi-user.target "$rootfs/etc/systemd/system/default.target"

  # The initramfs's boot script (initramfs-tools: boot=warren sources
  # /scripts/warren and calls its mountroot): the root is an overlay of the
  # layer disks (virtio serials wl0..wl<N-1>, bottom first, N from
  # warren.layers=) under the writable disk (serial wdisk, ext4: its upper/
  # and work/), as a microVM's agent mounts it (src/guest/agent/boot.cc).
  # Mounted under /run/warren, which init moves into the root: the agent
  # finds the upper dir there (snapshots export it). klibc's tools only.
  mkdir -p "$rootfs/etc/initramfs-tools/scripts"
  cat >"$rootfs/etc/initramfs-tools/scripts/warren" <<'BOOT'
# shellcheck shell=sh
warren_disks() {
  found=0
  for b in /sys/block/vd*; do
    [ -e "$b/serial" ] || continue
    s=$(cat "$b/serial")
    case $s in wdisk | wl[0-9] | wl[0-9][0-9]) eval "dev_$s=/dev/${b##*/}"; found=$((found + 1)) ;; esac
  done
}
mountroot() {
  n=
  for arg in $(cat /proc/cmdline); do
    case $arg in warren.layers=*) n=${arg#warren.layers=} ;; esac
  done
  [ -n "$n" ] || panic "warren: no warren.layers= on the kernel command line"
  for m in virtio_pci virtio_blk erofs overlay ext4; do modprobe -q $m; done
  wait_for_udev 10
  tries=0
  warren_disks
  while [ "$found" -lt $((n + 1)) ] && [ $tries -lt 20 ]; do
    sleep 1
    tries=$((tries + 1))
    warren_disks
  done
  [ "$found" -ge $((n + 1)) ] || panic "warren: $found of $((n + 1)) disks (wl0..wl$((n - 1)), wdisk) found"
  mkdir -p /run/warren/disk
  mount -t ext4 -o noatime,nodev "$dev_wdisk" /run/warren/disk || panic "warren: mount of the writable disk failed"
  mkdir -p /run/warren/disk/upper /run/warren/disk/work
  lower=
  i=0
  while [ $i -lt "$n" ]; do
    eval "d=\$dev_wl$i"
    mkdir -p /run/warren/layers/$i
    mount -t erofs -o ro,nodev "$d" /run/warren/layers/$i || panic "warren: mount of layer $i ($d) failed"
    lower=/run/warren/layers/$i${lower:+:$lower}
    i=$((i + 1))
  done
  mount -t overlay -o "lowerdir=$lower,upperdir=/run/warren/disk/upper,workdir=/run/warren/disk/work" overlay \
    "${rootmnt:?}" || panic "warren: the overlay root failed"
}
BOOT

  # The NIC's driver is loaded by the agent when the sandbox has a network
  # (its first hello names an address), never by udev: a VM without one has
  # no link but lo, as a container (templates carry an unplugged NIC).
  echo "blacklist virtio_net" >"$rootfs/etc/modprobe.d/warren-net.conf"

  # The agent (the binary itself is copied at disk time, below).
  cat >"$rootfs/etc/systemd/system/warren-agent.service" <<'UNIT'
[Unit]
Description=warren guest agent (virtio-serial port warren.agent)
DefaultDependencies=no
After=local-fs.target systemd-udevd.service
Wants=systemd-udevd.service

[Service]
ExecStart=/usr/local/sbin/warren-agent --service
Restart=always
RestartSec=200ms

[Install]
WantedBy=sysinit.target
UNIT
  ln -sf /etc/systemd/system/warren-agent.service "$rootfs/etc/systemd/system/sysinit.target.wants/warren-agent.service"

  # The desktop: X on vt7 as root, no screen saver or DPMS (a blanked
  # screen would change screenshots by itself), the session's end restarts it.
  mkdir -p "$rootfs/etc/warren"
  cat >"$rootfs/etc/warren/xsession" <<'XS'
#!/bin/sh
# The session's messages (the desktop service's journal has X's).
exec >/tmp/xsession.log 2>&1
# The screen size the host asked for (warren.screen=WxH on the kernel
# command line); X otherwise takes the display's preferred mode.
size=$(sed -n 's/.*warren\.screen=\([0-9]*x[0-9]*\).*/\1/p' /proc/cmdline)
[ -n "$size" ] && xrandr -s "$size"
xsetroot -solid '#204060'
matchbox-window-manager -use_titlebar no -use_cursor yes &
exec xterm -bg white -fg black -fn 10x20 -e /bin/bash -l
XS
  chmod 755 "$rootfs/etc/warren/xsession"
  cat >"$rootfs/etc/systemd/system/warren-desktop.service" <<'UNIT'
[Unit]
Description=warren desktop (Xorg, matchbox, xterm)
After=systemd-udevd.service systemd-udev-trigger.service

[Service]
Environment=HOME=/root
WorkingDirectory=/root
ExecStart=/usr/bin/xinit /etc/warren/xsession -- /usr/lib/xorg/Xorg :0 vt7 -nolisten tcp -noreset -s 0 -dpms
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
UNIT
  ln -sf /etc/systemd/system/warren-desktop.service "$rootfs/etc/systemd/system/multi-user.target.wants/warren-desktop.service"
}

if [[ ! -f $out/rootfs.stamp || $(cat "$out/rootfs.stamp") != "$rootfs_key" ]]; then
  rm -f "$out/rootfs.stamp" "$out/disk.stamp"
  for d in "$upper" "$work" "$rootfs" "$out/rootfs"; do  # (rootfs: an older build's whole-system dir)
    if grep -q " $d[/ ]" /proc/self/mountinfo; then
      echo "$0: mounts at or below $d; unmount them first" >&2
      exit 1
    fi
    rm -rf --one-file-system "$d"
  done
  rm -f "$out/disk.img"
  echo "build-guest: installing ${#packages[@]} packages over $base into $upper"
  mount_root
  # Only the modules that find and mount the root go into the initramfs
  # (small: TCG decompresses and loads it slowly); the rest come from the
  # root via udev.
  mkdir -p "$rootfs/etc/initramfs-tools/conf.d"
  echo "MODULES=list" >"$rootfs/etc/initramfs-tools/conf.d/warren.conf"
  echo "COMPRESS=zstd" >>"$rootfs/etc/initramfs-tools/conf.d/warren.conf"
  printf '%s\n' virtio_pci virtio_blk ext4 erofs overlay >>"$rootfs/etc/initramfs-tools/modules"
  printf 'do_symlinks = no\n' >"$rootfs/etc/kernel-img.conf"
  mount -t proc proc "$rootfs/proc" && mounted+=("$rootfs/proc")
  echo "deb $mirror bookworm main" >"$rootfs/etc/apt/sources.list"
  # The host's resolver for apt (the base has none: a sandbox's comes from
  # its runtime); removed after, so the layer holds none either.
  cp -L /etc/resolv.conf "$rootfs/etc/resolv.conf"
  chroot "$rootfs" apt-get update -q
  DEBIAN_FRONTEND=noninteractive chroot "$rootfs" apt-get install -y -q --no-install-recommends "${packages[@]}"
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/apt/* "$rootfs/etc/resolv.conf"
  umount_all
  echo "$rootfs_key" >"$out/rootfs.stamp"
fi

release=$(basename "$(ls -d "$upper"/usr/lib/modules/*/ "$upper"/lib/modules/*/ 2>/dev/null | head -1)")
[[ -n $release ]] || { echo "$0: no kernel modules in $upper" >&2; exit 1; }
# The disk's inputs: the system, the agent and this script (configure_root,
# the boot script).
disk_key=$( (cat "$out/rootfs.stamp"; sha256sum "$agent" "$0" | cut -d' ' -f1) | sha256sum | cut -c1-16)
if [[ ! -f $out/disk.stamp || $(cat "$out/disk.stamp") != "$disk_key" || ! -f $out/system.erofs ]]; then
  rm -f "$out/disk.stamp"
  mount_root
  configure_root
  install -m 755 "$agent" "$rootfs/usr/local/sbin/warren-agent"
  mount -t proc proc "$rootfs/proc" && mounted+=("$rootfs/proc")
  chroot "$rootfs" update-initramfs -u -k "$release" >/dev/null
  # Readable by all: QEMU runs as an unprivileged uid and reads them itself
  # (the vm backend's CheckVmHost); the disks it gets as open fds.
  install -m 644 "$rootfs/boot/vmlinuz-$release" "$out/vmlinuz.tmp" && mv "$out/vmlinuz.tmp" "$out/vmlinuz"
  install -m 644 "$rootfs/boot/initrd.img-$release" "$out/initrd.img.tmp" && mv "$out/initrd.img.tmp" "$out/initrd.img"
  umount_all
  echo "$release" >"$out/kernel.release"
  rm -f "$out/system.erofs.tmp" "$out/upper.img.tmp"
  # The upper dir as it is: overlay whiteouts (0/0 character devices) and
  # opaque dirs (trusted.overlay.opaque) keep their meaning in a lower layer.
  mkfs.erofs --quiet "$out/system.erofs.tmp" "$upper"
  mke2fs -q -t ext4 -L warren-upper "$out/upper.img.tmp" 4G
  mv "$out/system.erofs.tmp" "$out/system.erofs"
  mv "$out/upper.img.tmp" "$out/upper.img"
  echo "$disk_key" >"$out/disk.stamp"
fi
end=$(date +%s)
echo "build-guest: $out ready ($release, system layer $(du -h "$out/system.erofs" | cut -f1)) in $((end - start)) s"
