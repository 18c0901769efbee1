#!/bin/bash
# Builds the rootfs dir of the layer "toolset/desktop": an X desktop that a
# container or microVM sandbox runs inside itself for the desktop API
# (src/runtime/desktop/x11_desktop.h): Xvfb (the X server, framebuffer in
# a file), xdotool (input through XTEST), matchbox-window-manager, xterm,
# dillo (a light browser: firefox-esr and chromium take minutes to start
# under TCG; on a KVM host either can be stacked in a layer of its own) and
# the core X fonts. The packages' files come from this host's Debian 12
# (scripts/build-toolset-rootfs.sh: setup.sh installs them); the font
# indexes that Debian generates in maintainer scripts (fonts.dir,
# fonts.alias: the X server's default font "fixed" is found through them)
# are copied beside them. Left out: Mesa's DRI drivers (libgl1-mesa-dri,
# 160 MB with LLVM): Xvfb runs without them (no GLX acceleration; GL
# clients fall back to software where they can). Stack it over
# base/debian-12.
#
# Usage: build-toolset-desktop-rootfs.sh [DEST] [BASE_ROOTFS]
# Idempotent (a complete DEST is kept); exits non-zero on any error.
set -euo pipefail
dest=${1:-/var/cache/warren/rootfs/toolset-desktop}
base=${2:-/var/cache/warren/rootfs/debian-12}
dest=${dest%/}
here=$(cd "$(dirname "$0")" && pwd)
"$here/build-toolset-rootfs.sh" "$dest" "$base" --skip libgl1-mesa-dri xvfb xdotool matchbox-window-manager xterm dillo xfonts-base
for d in /usr/share/fonts/X11/misc; do
  for f in fonts.dir fonts.alias encodings.dir; do
    if [[ -f "$d/$f" && ! -f "$dest$d/$f" ]]; then install -D -m 0644 "$d/$f" "$dest$d/$f"; fi
  done
done
[[ -f "$dest/usr/share/fonts/X11/misc/fonts.dir" ]] ||
  { echo "$0: no fonts.dir for the core fonts (is xfonts-base installed?)" >&2; exit 1; }
