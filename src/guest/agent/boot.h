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

// What the root is made of: from the kernel command line on a cold boot,
// from the host's hello in a clone of a template.
struct RootParams {
  int layers = 0;
  std::string hostname = "sandbox";
  std::string shm_mb = "64";
  uint64_t pids = 0;  // task limit of the commands' cgroup (0: none)
};

// warren.layers/hostname/shm_mb/pids of the kernel command line.
RootParams CmdlineRootParams();

// True when the kernel command line says warren.template=1: the guest is
// booted to be saved as a template, so it must not open or mount its disks
// (a clone restores the template with its own disk files behind the same
// devices) and must not read boot_id (generated on first read: clones would
// share it). Its disk driver is bound: the disks were probed at boot, with
// the template's placeholder sizes, which the host makes at least as large
// as any clone's file (a bound driver keeps the capacity it probed; EROFS
// and ext4 read only within their own size).
bool IsTemplateBoot();

// /proc, /sys and /dev (devtmpfs) mounted, fds 0-2 open (on /dev/console),
// *template_boot set (IsTemplateBoot, which needs /proc), the modules of
// /modules.load loaded in order, those of /modules.net opened. Error text
// or "".
std::string EarlySetup(bool* template_boot);

// In a template boot, what SetUpRoot needs that is the same in every
// clone: which disk has which serial (the clones have the template's
// devices), the commands' cgroup (cgroup2 mounted, controllers on,
// overcommit) and the NIC's driver (PrepareNetModules), so a clone's
// SetUpRoot and BindNic skip them. Error text or "".
std::string PrepareTemplate();

// Binds the NIC's driver (eth0 appears), once: loads the modules of
// /modules.net (virtio-net and its dependencies, opened by EarlySetup),
// which binds it, or, in a clone (PrepareTemplate loaded them), probes the
// virtio-net device. A template's NIC stays unbound, so a loopback-only
// clone has no eth0. Error text or "".
std::string BindNic();
// In a template boot (PrepareTemplate) or a desktop guest's service setup:
// the /modules.net modules loaded with the virtio bus's autoprobe off (their
// driver bound to nothing; autoprobe on again after).
std::string PrepareNetModules();

// Path of the virtio-serial port named `name` (/dev/vportNpM), waiting up
// to 2 s for it to appear; "" if it does not.
std::string FindPort(const std::string& name);

// Mounts the layers and the writable disk, stacks the overlay, moves /dev,
// /proc and /sys into it and makes it the root (switch_root: the
// initramfs is the kernel's rootfs, which pivot_root refuses, so the new
// root is moved over "/" and chroot'ed into). Error text or "".
std::string SetUpRoot(const RootParams& params);

// In a clone of a template saved with its root mounted (SetUpRoot ran in
// the template): what differs per sandbox, i.e. the hostname, the /dev/shm
// size (remounted when it differs from the template's) and the commands'
// task limit. Error text or "".
std::string ApplyIdentity(const RootParams& params);

// An fd of the overlay's upper dir on the writable disk (the sandbox's
// changes), open once SetUpRoot (or OpenServiceUpperDir) succeeded; -1 before.
int UpperDirFd();

// The agent as a service of a full guest (the vm backend): its initramfs
// mounted the overlay root with its upper dir at kServiceUpperDir
// (scripts/vm/build-guest.sh's boot script). Opens it for UpperDirFd, loads
// the NIC's driver modules unbound for BindNic (PrepareNetModules; the
// guest's udev does not load them, so a VM without a network has no eth0),
// and overcommits memory as a microVM's agent does (an allocation past the
// guest's RAM is OOM-killed when touched, not refused: exec results report
// oom_killed on every backend). An error names what failed (the agent
// serves on: without changes, or with the kernel's heuristic).
inline constexpr const char* kServiceUpperDir = "/run/warren/disk/upper";
std::string ServiceSetup();

// "uname -r" of the running kernel, and /proc/sys/kernel/random/boot_id.
std::string KernelRelease();
std::string BootId();

// Logs a line to the console (the host keeps it in console.log).
void LogLine(const std::string& line);

}  // namespace warren::guest
