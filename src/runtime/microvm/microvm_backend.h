// The `microvm` backend: each sandbox is a QEMU microVM (qemu.h) booting
// Debian's cloud kernel straight into warren's guest agent (src/guest/agent,
// PID 1 of the guest), which mounts the sandbox's EROFS layers (the same
// image files containers use, attached as read-only virtio-blk disks),
// stacks overlayfs over a private ext4 disk of disk_mb and serves commands
// over a virtio-serial channel (protocol.h, channel.h).
//
// Implementation contract:
// * Files: <spec.dir>/agent.sock (the channel; QEMU listens on it),
//   console.log (the guest's serial console), qemu.log (QEMU's own
//   messages); the writable disk <disk_dir>/<id>.img (sparse, on the node's
//   disk rather than the run dir's tmpfs). Destroy and Cleanup remove them all.
// * QEMU runs jailed: its own cgroup <daemon's cgroup>/<cgroup_name>/<id>
//   (memory = memory_mb + qemu.h's kQemuOverheadMb, pids, cpu = cpu_millis;
//   v1 or v2), joined before exec; its own unprivileged uid/gid (no
//   capabilities; every file it uses is passed as an open fd); QEMU's
//   seccomp filter (-sandbox on, every deny option); stdin /dev/null; its
//   own session: it survives a daemon restart and is
//   re-adopted by pid (checked against its recorded start time) and socket.
//   Cleanup kills whatever is in that cgroup, so a VM of a create that a
//   crash interrupted is found without a record.
// * Create waits for the agent's hello at most boot_timeout: DeadlineExceeded
//   then, with QEMU killed and every file removed. A guest whose root could
//   not be set up (bad layer image) fails Create with FailedPrecondition and
//   the agent's reason; QEMU exiting during boot too, with the console's tail.
// * Exec: the agent runs the command in a per-exec cgroup inside the guest;
//   the timeout (SIGTERM to the tree, SIGKILL after kill_grace) is enforced
//   there. The host waits for the result at most timeout + kill_grace +
//   exec_slack; a guest that does not answer by then fails the call with
//   DeadlineExceeded.
// * Warm starts (template_dir set): a create restores a clone of the
//   template for its shape (template.h) and falls back to a cold boot, with
//   the reason in the log, when there is no template or the restore fails
//   before the guest answered. A template with its root per layer set and
//   disk size comes first (template.h, GetRooted), the bare one after.
// * Pool (pool_size > 0): a thread keeps up to pool_size clones of the
//   template with its root that the last create used restored, given a
//   fresh RNG seed and warmed up by one command (TCG translates the guest
//   code a clone runs anew in every QEMU: the hello and the first exec
//   then find it translated), each in a cgroup pool-<h>-<k> (h: a hash of
//   disk_dir, so that daemons sharing a parent cgroup keep their pools
//   apart; the lowest CPU
//   weight: the pool fills on CPU the sandboxes leave idle) with a disk
//   <disk_dir>/pool-<k>-u<uid slot>.img and its sockets in
//   <template_dir>/pool-<k>. A create that finds one takes it: its cgroup
//   is renamed to the sandbox's and given its limits (cgroup v1; on v2,
//   which cannot rename, or without cpu_millis, QEMU moves into a new
//   cgroup and what it was charged in the pool stays behind), its disk and sockets are renamed to
//   the sandbox's, and its first hello with setup_root sets the clock, the
//   RNG (reseeded again), hostname, /dev/shm and task limit; boot_id is read
//   for the first time then. Its miss path is the clone above. Pool VMs
//   are not sandboxes: the backend's end destroys them, and a daemon
//   started after a kill -9 kills what is left in its pool-<h>-<k> cgroups and
//   removes their disks (NewMicrovmBackend).
// * Files: also <spec.dir>/qmp.sock (QEMU's monitor, every VM) and, while
//   suspended, <disk_dir>/<id>.vmstate (the saved VM).
// * Capabilities: pause (QMP stop/cont), suspend (the stopped VM saved to
//   its state file and its QEMU ended; restored on resume), processes (the
//   agent's, relayed: process.h) and export_changes (the overlay upper as a
//   tar from the agent: changes.h), all in sandbox.h; files() over the
//   agent's file calls (files.h).
// * Adopt: a VM with a state file is suspended (a QEMU in its cgroup then is
//   a restore cut short, killed); else its QEMU is the recorded pid or the
//   one process in its cgroup (a restore after a suspend gave it a new pid).
// * Hostname: spec.hostname goes on the kernel command line; only
//   [A-Za-z0-9.-] is accepted.
// * Network (spec.network.enabled, MicrovmOptions::network set): the tap and
//   the policy are made before QEMU starts (a policy the node refuses fails
//   the create before anything else); the guest's NIC gets its address,
//   route, resolver and MAC (02:57 + its IPv4 address) in the first hello.
//   Templates always carry a NIC (without a backend), so that networked
//   and loopback-only VMs clone the same template; a clone of a sandbox
//   without a network keeps that NIC unconfigured and unplugged.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>

#include "runtime/backend.h"

namespace warren::net {
class SandboxNetwork;  // net/sandbox_network.h
}  // namespace warren::net

namespace warren::runtime {

// The accelerator microVMs run on and why.
struct AccelChoice {
  std::string accel;  // "kvm" or "tcg"
  std::string reason;
};

struct MicrovmOptions {
  std::string qemu = "/usr/bin/qemu-system-x86_64";
  // bzImage and initramfs (scripts/microvm/build-guest.sh writes both into
  // one dir: <dir>/vmlinuz, <dir>/initramfs.cpio).
  std::string kernel;
  std::string initrd;
  // "tcg", "kvm" or "auto". KVM is used only where it runs a stock guest
  // (on PVM-based hosts it does not: the guest hangs); "auto" takes
  // accel_choice's answer (ChooseAccel), waiting for it at the first create.
  std::string accel = "tcg";
  std::shared_future<AccelChoice> accel_choice;
  // Where the writable disks live (created if missing).
  std::string disk_dir;
  // Warm starts by cloning templates (template.h) kept here (emptied at
  // start and at the backend's end); empty: every create boots cold.
  std::string template_dir;
  // Clones kept restored and warmed up ahead of the creates that take them
  // (with template_dir): up to this many of the template with its root
  // that the last create used; 0: none (every create restores its clone).
  uint32_t pool_size = 2;
  std::string cgroup_name = "warren-microvm";
  // Each VM's QEMU runs as its own uid = gid = uid_base + slot, slots
  // claimed host-wide in uid_lock_dir (runtime/container/uid_slots.h) in the
  // name of disk_dir; a template's QEMU as uid_base + max_vms.
  std::string uid_lock_dir = "/run/warren/uid-slots";
  uint32_t uid_base = 2200000000;
  uint32_t max_vms = 4096;
  std::chrono::milliseconds boot_timeout{60000};
  std::chrono::milliseconds exec_slack{30000};
  uint32_t cpus = 1;  // vCPUs per VM
  // The node's sandbox network (--sandbox-net; null: none). With it, a
  // create asking for a network gets a tap on it behind a virtio-net NIC
  // (sandbox.h) and the backend reports Capability::kNetwork.
  std::shared_ptr<net::SandboxNetwork> network;
};

// "tcg" or "kvm": ready at once, the reason naming the configuration.
// "auto": runs the KVM probe (kvm_probe.h, bounded by its 1 s deadline) in a
// thread of its own, so the caller is not held up; kvm where it runs a stock
// guest, tcg otherwise, with the probe's reason. InvalidArgument for any
// other value.
StatusOr<std::shared_future<AccelChoice>> ChooseAccel(const std::string& accel);

// What MicrovmOptions' files must be for the backend to be offered; OK or
// NotFound/FailedPrecondition naming the missing one.
Status CheckMicrovmHost(const MicrovmOptions& options);

StatusOr<std::unique_ptr<Backend>> NewMicrovmBackend(const MicrovmOptions& options);

}  // namespace warren::runtime
