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
#   build-guest.sh [--agent PATH] [--out DIR] [--mirror URL]
#     --agent   the static guest agent (default: build/src/guest/agent/warren-agent)
#     --out     output dir (default: /var/cache/warren/vm)
#     --mirror  Debian mirror (default: http://deb.debian.org/debian)
#
# Output in DIR (what warrend's --vm-dir points at):
#   disk.img     raw ext4 image of the root (sparse); each VM boots a qcow2
#                overlay of it (copy-on-write, the base never written)
#   vmlinuz, initrd.img   the guest's kernel and initramfs (direct boot)
#   kernel.release
# Why the generic kernel (linux-image-amd64) and not linux-image-cloud-amd64:
# the cloud kernel builds no DRM, no USB and no VESA framebuffer, so it has
# no display on `-vga std` and no USB tablet; the generic one has bochs-drm,
# xhci and usbhid.
# Time here (2 cores, Debian's mirror): 297 s cold (debootstrap ~2.5 min,
# 146 packages / 171 MB, the 4 GiB sparse disk.img with 968 MB used),
# measured with a C++ build beside it; 0.4 s when current.
# Idempotent: DIR/rootfs is built once per package list (DIR/rootfs.stamp);
# disk.img is rebuilt when the agent or the rootfs changed (DIR/disk.stamp).
# Must run as root (debootstrap, chroot).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
agent=$root/build/src/guest/agent/warren-agent
out=/var/cache/warren/vm
mirror=http://deb.debian.org/debian
while (($#)); do
  case $1 in
    --agent) agent=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    *) echo "$0: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $EUID -eq 0 ]] || { echo "$0: must run as root (debootstrap, chroot)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
agent=$(realpath -m "$agent")
[[ -x $agent ]] || { echo "$0: guest agent $agent not found (build it: cmake --build build --target warren-agent)" >&2; exit 1; }
for tool in debootstrap mke2fs chroot; do
  command -v $tool >/dev/null || { echo "$0: $tool is missing (apt-get install debootstrap e2fsprogs)" >&2; exit 1; }
done
start=$(date +%s)

packages=(systemd-sysv udev linux-image-amd64 initramfs-tools zstd
  xserver-xorg-core xserver-xorg-input-libinput xinit x11-xserver-utils
  xterm xfonts-base matchbox-window-manager dillo)
# The root's inputs: this script's rootfs part and the package list.
rootfs_key=$(printf '%s\n' v1 "$mirror" "${packages[@]}" | sha256sum | cut -c1-16)
rootfs=$out/rootfs
mounted=()
cleanup() {
  local m
  for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT

# The configuration of the root, applied at every disk build (cheap; the
# packages stay in DIR/rootfs).
configure_root() {
  # The system: root on the first virtio disk, no password logins, no
  # timers or gettys that compete with the sandbox for a TCG vCPU.
  echo "/dev/vda / ext4 defaults,noatime 0 1" >"$rootfs/etc/fstab"
  echo sandbox >"$rootfs/etc/hostname"
  for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
           man-db.timer getty@tty1.service getty-static.service serial-getty@ttyS0.service systemd-timesyncd.service; do
    ln -sf /dev/null "$rootfs/etc/systemd/system/$u"
  done
  ln -sf /lib/systemd/system/multi-user.target "$rootfs/etc/systemd/system/default.target"

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
  if [[ -e $rootfs ]]; then
    if grep -q " $rootfs/" /proc/self/mountinfo; then
      echo "$0: mounts below $rootfs; unmount them first" >&2
      exit 1
    fi
    rm -rf --one-file-system "$rootfs"
  fi
  echo "build-guest: debootstrap into $rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror"
  # Only the modules that find and mount the root go into the initramfs
  # (small: TCG decompresses and loads it slowly); the rest come from the
  # root via udev.
  mkdir -p "$rootfs/etc/initramfs-tools/conf.d"
  echo "MODULES=list" >"$rootfs/etc/initramfs-tools/conf.d/warren.conf"
  echo "COMPRESS=zstd" >>"$rootfs/etc/initramfs-tools/conf.d/warren.conf"
  printf '%s\n' virtio_pci virtio_blk ext4 >>"$rootfs/etc/initramfs-tools/modules"
  printf 'do_symlinks = no\n' >"$rootfs/etc/kernel-img.conf"
  mount -t proc proc "$rootfs/proc" && mounted+=("$rootfs/proc")
  echo "deb $mirror bookworm main" >"$rootfs/etc/apt/sources.list"
  chroot "$rootfs" apt-get update -q
  DEBIAN_FRONTEND=noninteractive chroot "$rootfs" apt-get install -y -q --no-install-recommends "${packages[@]}"
  chroot "$rootfs" apt-get clean
  umount "$rootfs/proc"; mounted=()
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/apt/*

  echo "$rootfs_key" >"$out/rootfs.stamp"
fi

release=$(basename "$(ls -d "$rootfs"/lib/modules/*/ | head -1)")
# The disk's inputs: the rootfs, the agent and this script (configure_root).
disk_key=$( (cat "$out/rootfs.stamp"; sha256sum "$agent" "$0" | cut -d' ' -f1) | sha256sum | cut -c1-16)
if [[ ! -f $out/disk.stamp || $(cat "$out/disk.stamp") != "$disk_key" || ! -f $out/disk.img ]]; then
  rm -f "$out/disk.stamp"
  configure_root
  install -m 755 "$agent" "$rootfs/usr/local/sbin/warren-agent"
  # Readable by all: QEMU runs as an unprivileged uid and reads them itself
  # (the vm backend's CheckVmHost); disk.img it gets as an open fd.
  install -m 644 "$rootfs/boot/vmlinuz-$release" "$out/vmlinuz.tmp" && mv "$out/vmlinuz.tmp" "$out/vmlinuz"
  install -m 644 "$rootfs/boot/initrd.img-$release" "$out/initrd.img.tmp" && mv "$out/initrd.img.tmp" "$out/initrd.img"
  echo "$release" >"$out/kernel.release"
  rm -f "$out/disk.img.tmp"
  mke2fs -q -t ext4 -L warren-vm -d "$rootfs" "$out/disk.img.tmp" 4G
  mv "$out/disk.img.tmp" "$out/disk.img"
  echo "$disk_key" >"$out/disk.stamp"
fi
end=$(date +%s)
echo "build-guest: $out ready ($release, $(du -sh "$out/disk.img" | cut -f1) used) in $((end - start)) s"
