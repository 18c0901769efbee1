// The `container` backend: Linux namespaces (user, mnt, pid, uts, ipc, net,
// cgroup) + cgroups (v1 or v2, nested under the daemon's own cgroup) +
// seccomp + dropped capabilities + no_new_privs, over an overlayfs whose
// lowerdirs are the shared read-only EROFS layer mounts and whose upper is
// private to the sandbox. PID 1 is warren-init (src/init), a tiny static
// reaper. Exec goes from the daemon into the sandbox (setns + fork); there is
// no control socket inside the sandbox.
//
// Implementation contract (the rooms of runtime/container/, see CMakeLists.txt there):
// * Nothing is mounted in the daemon's mount namespace: the upper tmpfs, the
//   idmapped lower clones and the overlay are detached mounts handed to the
//   sandbox's first process, which attaches them in its private mount
//   namespace at <spec.dir>/rootfs and pivot_roots there. Killing the
//   sandbox's processes therefore releases all of its mounts (Destroy and
//   Cleanup never need to unmount).
// * Disk limit: the kernel has no quota support, so the upper layer is a tmpfs
//   of size disk_mb (nr_inodes bounded). Its pages are ALSO charged to the
//   sandbox's memory cgroup: files written count against memory_mb.
// * Ids: root inside = host uid/gid uid_base + slot*uid_range (setgroups
//   denied). Lower layers are idmapped (MOUNT_ATTR_IDMAP) so host-root-owned
//   layer files appear owned by root inside.
// * Capabilities of root inside: CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID
//   SETUID SETPCAP NET_BIND_SERVICE SYS_CHROOT AUDIT_WRITE SETFCAP (bounding
//   set too); other users get none. no_new_privs and the seccomp profile
//   apply to every process. /proc/{kcore,keys,kpage*,sysrq-trigger,
//   timer_list,sched_debug,kallsyms,...} are masked, /proc/{sys,bus,fs,irq}
//   and /sys are read-only; /dev holds null zero full random urandom tty, a
//   private devpts and /dev/shm (tmpfs of tmpfs_mb). Network: a new netns with
//   only loopback (up).
// * Density: every superblock a sandbox holds makes EVERY memory
//   cgroup on the host bigger (16 bytes per memcg-aware shrinker id, i.e. per
//   superblock alive), so a sandbox holds only 6: overlay, upper tmpfs, proc,
//   devpts, /dev/shm, mqueue. /dev is a directory of the upper's tmpfs (outside
//   upper/: never snapshotted; counts against disk_mb); the masked dirs and
//   /sys are clones of two backend-wide read-only mounts (an empty tmpfs,
//   SB_RDONLY; sysfs of a dismantled netns: /sys/class/net is empty). See
//   bench/density and bench/RESULTS.md.
// * Exec: a helper forked from the daemon joins the sandbox cgroup and a fresh
//   per-exec sub-cgroup (v1: pids+freezer), setns()es into the init's
//   namespaces and clones the command with CLONE_PARENT, so the command is a
//   direct child of the daemon process. The daemon must therefore never call
//   waitpid(-1)/wait() (wait for specific pids only). Completion follows that
//   process (pidfd), not pipe EOF; output beyond output_cap_bytes per stream is
//   counted and discarded (daemon memory per running exec: 1 MiB buffer +
//   up to 2*output_cap_bytes). Background processes left by an exec keep
//   running in their exec cgroup until they exit or the sandbox is destroyed;
//   their later output is discarded. On timeout every process of the exec
//   cgroup gets SIGTERM, then SIGKILL after kill_grace (signalled frozen), and
//   Exec returns once that cgroup is empty.
// * The sandbox's init is a child of the daemon process that created it; after
//   a restart (Adopt) it is reparented to the host's init/subreaper, which
//   reaps it when it dies. Until it execs warren-init it dies with the daemon
//   (PR_SET_PDEATHSIG), so a crash never leaves half-created children holding
//   the daemon's fds.
// * The upper dir (detached tmpfs) stays reachable across daemon restarts:
//   warren-init keeps an fd on it (argv[1]) and is non-dumpable (sandbox
//   processes cannot open /proc/1/fd); Adopt finds it among /proc/<init>/fd
//   by the device and inode recorded at create ("upper_dev", "upper_ino").
// * Capabilities: all of them (pause, suspend, processes, export_changes).
// * Pausable = the sandbox cgroup's freezer.
// * Suspendable: ReclaimMemory (frozen sandbox) = jail::Cgroup::ReclaimMemory
//   on the sandbox cgroup; EndSuspend prefetches (memory_prefetch.h).
// * ChangeExporter: a copy of the upper dir (image::CopyDiffTree) with the
//   host ids shifted back into the sandbox's range.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/backend.h"

namespace warren::net {
class SandboxNetwork;  // net/sandbox_network.h
}  // namespace warren::net

namespace warren::runtime {

struct ContainerOptions {
  // Path of the static warren-init binary (bind-mounted read-only into
  // each sandbox as its PID 1).
  std::string init_path;
  // Path of the static warren-spawn binary that starts every exec and
  // background process inside a sandbox (src/init/warren_spawn.c); empty =
  // "warren-spawn" next to init_path.
  std::string spawn_path;
  // Sandboxes' cgroups are created under <the daemon's own cgroup>/<cgroup_name>/<id>
  // in every hierarchy used (v1) or in the unified one (v2).
  std::string cgroup_name = "warren";
  // Root inside each sandbox maps to host uid/gid uid_base + k*uid_range for
  // the k-th slot; slots are recorded and re-taken by Adopt.
  uint32_t uid_base = 1000000;
  uint32_t uid_range = 65536;
  uint32_t max_sandboxes = 16384;
  // Host-wide claims of the slots (uid_slots.h): a lock file per slot in
  // uid_lock_dir naming uid_owner (the daemon's state dir, an absolute
  // path), so that daemons on one host never share a range. "" = slots
  // coordinated within this process only.
  std::string uid_lock_dir;
  std::string uid_owner;
  // Seccomp profile (JSON, see src/jail/seccomp/default.json); empty = the
  // profile compiled into the binary.
  std::string seccomp_profile;
  // An lxcfs mount (jail/lxcfs.h) whose views of cpus and memory each
  // sandbox gets over its /proc; "" = the host's.
  std::string lxcfs_dir;
  // Warm pool: this many pre-spawned sandbox shells
  // (namespaces made, uid maps written, cgroup joined, waiting for a rootfs)
  // are kept ready by a background thread (nice 10), started by the first
  // Create; a create takes one and skips the fork and the cgroup attach.
  // Shells are no sandboxes (no record); they hold a uid slot each, are killed
  // when the backend is destroyed and die with the daemon. 0 = off.
  uint32_t warm_shells = 0;
  // Cgroup recycling: a destroyed sandbox's cgroup (emptied, its children
  // removed) is kept for the next shell instead of removed and made again,
  // when its previous tenant left less than 1 MiB of page cache and
  // anonymous memory charged to its memory cgroup (otherwise it is removed,
  // and the kernel moves what is charged to the parent). Each memory cgroup mkdir/offline costs ~0.1-0.3 ms of CPU,
  // more the more superblocks the host has ever had (one shrinker slot per
  // superblock in every memcg). At most this many wait; 0 = off.
  uint32_t recycled_cgroups = 0;
  // The node's network for sandboxes; null: a create asking for a network
  // fails (FailedPrecondition), the capability `network` is not reported.
  std::shared_ptr<net::SandboxNetwork> network;
};

// What the host kernel offers, probed once (kernel feature probing, not
// assumptions). Reported by the node status RPC.
struct HostFeatures {
  int cgroup_version = 0;        // 1 or 2
  std::string cgroup_parent;     // e.g. "/process_api/abc/warren" (v1: per controller same relative path)
  bool idmapped_mounts = false;  // mount_setattr(MOUNT_ATTR_IDMAP) works on EROFS/tmpfs
  bool user_namespaces = false;
};

StatusOr<std::unique_ptr<Backend>> NewContainerBackend(const ContainerOptions& options);
HostFeatures ProbeHostFeatures();

}  // namespace warren::runtime
