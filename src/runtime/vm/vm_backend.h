// The `vm` backend: each sandbox is a full QEMU virtual machine (machine
// q35, SeaBIOS from Debian's seabios package, Debian's generic kernel booted
// directly, systemd as its init) with a display adapter (`-vga std`: the
// guest's bochs-drm), a USB tablet and the PS/2 keyboard, for computer-use
// agents (runtime/desktop.h: screenshots and input through QMP).
//
// The guest is what scripts/vm/build-guest.sh builds into one dir:
// <dir>/system.erofs (the system layer: systemd, Debian's kernel modules,
// Xorg, a window manager and the guest agent as a systemd service, built as
// an overlay upper dir over the base rootfs), <dir>/upper.img (an empty
// ext4), <dir>/vmlinuz, <dir>/initrd.img.
//
// The root is the sandbox's layers, as on every backend (one set of layers
// serves all): each is a read-only virtio disk (serial wl<i>, bottom
// first), the system layer stacked right above the sandbox's first layer
// (its base; the system layer was built over the base rootfs, and the
// sandbox's workspace and toolset layers win over it); the writable disk
// (serial wdisk) is a qcow2 overlay of upper.img (<disk_dir>/<id>.qcow2,
// copy-on-write: upper.img is never written), removed by destroy. The
// initramfs's boot script (boot=warren warren.layers=N) mounts them as
// /run/warren/layers/<i> and /run/warren/disk and the overlay root with
// its upper dir /run/warren/disk/upper, as a microVM's agent does.
//
// QEMU runs jailed as a microVM's does (runtime/microvm: the same launch,
// LaunchQemu, and the same pool of uids): its own cgroup
// <daemon's cgroup>/<cgroup_name>/<id> (memory = memory_mb + kVmOverheadMb,
// pids, cpu = cpu_millis), joined before exec; its own unprivileged uid/gid
// (a slot of the host-wide pool in uid_lock_dir, shared with the microvm
// backend: no capabilities, no groups); QEMU's seccomp filter (-sandbox on,
// every deny option); stdin /dev/null; its own session (it outlives the
// daemon and is re-adopted). Every host file it uses is an open fd: the
// layer files and upper.img (read-only; upper.img the qcow2 overlay's
// backing node), the overlay (read-write), the console log, the listening agent and QMP
// sockets, and per screenshot a memfd it writes the PNG into (QMP add-fd);
// the kernel and initramfs it reads as /proc/self/fd/<n>, so they must be
// readable by all (CheckVmHost).
//
// Network (spec.network.enabled, VmOptions::network set): as a microVM's
// (microvm_backend.h): the policy parsed before anything is made, the tap
// and its chain before QEMU, `-netdev tap` on a `virtio-net-pci` NIC; the
// guest agent configures eth0 (net.ifnames=0) from the first hello.
// Templates carry the NIC without a backend, so every clone matches its
// template and a networked clone plugs its own tap in; a clone without a
// network keeps that NIC unconfigured. Adopt takes the recorded network
// again; Cleanup releases it.
//
// Reused from the microvm backend (runtime/microvm): the QEMU launch into
// its own cgroup and session (qemu.h), the agent channel and its wire
// protocol (channel.h, protocol.h: exec goes to the guest agent over the
// virtio-serial port "warren.agent"), the sandbox's exec/destroy
// (MicrovmSandbox, wrapped) and its record, the accelerator choice
// (ChooseAccel: KVM only where it runs a stock guest, TCG otherwise).
//
// Files of a sandbox: <spec.dir>/agent.sock, qmp.sock (QEMU listens on
// both), console.log (the guest's serial console), qemu.log. Destroy and
// Cleanup remove them, the overlay disk, the QEMU process, its cgroup and
// give its uid back; a create that fails removes them too (rollback).
//
// Create waits for the guest agent's hello at most boot_timeout (a full
// systemd boot under TCG takes tens of seconds): DeadlineExceeded then,
// with everything removed and the console's tail in the message.
// Capabilities: pause (QMP stop/cont), suspend, processes (the guest
// agent's), export_changes (the agent streams the upper dir: snapshot, fork
// and isolated grading, as a microVM's), files() over the agent's file
// calls. InvalidArgument for a create without layers.
//
// Warm starts (template_dir set): a create restores a clone of the booted
// desktop template of its memory size and layer set (vm_template.h), built
// at the first such create; see there for what a clone shares and what it
// does not.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "runtime/backend.h"
#include "runtime/microvm/microvm_backend.h"

namespace warren::net {
class SandboxNetwork;  // net/sandbox_network.h
}  // namespace warren::net

namespace warren::runtime {

struct VmOptions {
  std::string qemu = "/usr/bin/qemu-system-x86_64";
  std::string qemu_img = "/usr/bin/qemu-img";
  std::string guest_dir;      // build-guest.sh's --out: system.erofs, upper.img, vmlinuz, initrd.img
  std::string accel = "tcg";  // "tcg", "kvm", "auto" (accel_choice's answer)
  std::shared_future<AccelChoice> accel_choice;
  std::string disk_dir;  // the overlay disks (created if missing)
  std::string cgroup_name = "warren-vm";
  std::chrono::milliseconds boot_timeout{300000};
  std::chrono::milliseconds exec_slack{30000};
  uint32_t cpus = 1;
  // QEMU's uid = gid = uid_base + slot, slots claimed host-wide in
  // uid_lock_dir in the name of disk_dir (runtime/container/uid_slots.h):
  // the same pool as MicrovmOptions' by default, so no two QEMUs on the
  // host share a uid whichever backend started them.
  std::string uid_lock_dir = "/run/warren/uid-slots";
  uint32_t uid_base = 2200000000;
  uint32_t max_vms = 4096;
  // The screen size the guest's X session sets (warren.screen= on the
  // kernel command line, applied with xrandr by build-guest.sh's session).
  uint32_t screen_width = 1024, screen_height = 768;
  // Warm starts (vm_template.h): templates kept here (emptied at start and
  // at the backend's end); empty: every create boots cold.
  std::string template_dir;
  // A template's wait, after its agent answered, until its desktop takes
  // input (vm_template.h WaitForDesktop); past it the build fails and
  // creates boot cold.
  std::chrono::milliseconds desktop_timeout{300000};
  // The node's sandbox network (--sandbox-net; null: none), shared with the
  // container and microvm backends: a networked VM gets a tap on it, as a
  // microVM does.
  std::shared_ptr<net::SandboxNetwork> network;
};

// OK when QEMU, qemu-img and the guest's files exist (the kernel and the
// initramfs readable by all); NotFound or FailedPrecondition naming the
// missing one.
Status CheckVmHost(const VmOptions& options);

StatusOr<std::unique_ptr<Backend>> NewVmBackend(const VmOptions& options);

}  // namespace warren::runtime
