// The guest's boot, done by the agent as PID 1 (the kernel runs the
// initramfs's /init, which is the agent): the kernel modules of the
// initramfs, the read-only layers and the writable disk mounted, overlayfs
// over them, and the root switched into it.
//
// Devices come from the host's QEMU command line (runtime/microvm): every
// virtio-blk disk carries a serial, "wl<i>" for layer i (0 = bottom) and
// "wdisk" for the writable disk (ext4, formatted by the host); the kernel
// command line says how many layers there are (warren.layers=N), the
// hostname (warren.hostname=), the /dev/shm size (warren.shm_mb=) and the
// task limit of the commands (warren.pids=, on the cgroup they all run under).
#pragma once

#include <string>

namespace warren::guest {

// /proc, /sys and /dev (devtmpfs) mounted, fds 0-2 open (on /dev/console),
// the modules of /modules.load loaded in order. Error text or "".
std::string EarlySetup();

// Path of the virtio-serial port named `name` (/dev/vportNpM), waiting up
// to 2 s for it to appear; "" if it does not.
std::string FindPort(const std::string& name);

// Mounts the layers and the writable disk, stacks the overlay, moves /dev,
// /proc and /sys into it and makes it the root (switch_root: the
// initramfs is the kernel's rootfs, which pivot_root refuses, so the new
// root is moved over "/" and chroot'ed into). Error text or "".
std::string SetUpRoot();

// "uname -r" of the running kernel, and /proc/sys/kernel/random/boot_id.
std::string KernelRelease();
std::string BootId();

// Logs a line to the console (the host keeps it in console.log).
void LogLine(const std::string& line);

}  // namespace warren::guest
