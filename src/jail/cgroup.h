// cgroups for sandboxes (DESIGN.md §6): one interface, a v1 and a v2
// implementation, chosen by probing the host (Detect()).
//
// Every cgroup is created under the cgroup the calling process was started in
// (per controller for v1, read from /proc/self/cgroup), in a subtree named
// `name` (e.g. "warren"): <own>/<name>/<rel>. Nothing outside that subtree is
// ever written.
//
// v1: the sandbox cgroup exists in the cpu, memory, pids and freezer
// hierarchies (those present); exec sub-cgroups (CreateChild) only in the
// freezer hierarchy (pids without one): their processes join the sandbox
// cgroup itself in the others, so that memory accounting and the OOM counter
// stay on the sandbox memcg (v1 does not propagate memory events to parents)
// and every extra directory (a mkdir/rmdir under the global cgroup mutex) is
// avoided.
// v2: every cgroup lives in the unified hierarchy; controllers are enabled in
// cgroup.subtree_control down from the daemon's cgroup (best effort: a
// non-delegated hierarchy leaves the limits unset and SetLimits fails).
//
// Thread-safety: Cgroup objects are immutable after creation; concurrent calls
// on one object are safe (they only read/write cgroupfs files).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::jail {

struct CgroupLimits {
  uint32_t cpu_millis = 0;    // 1000 = one core of CFS quota; also sets the weight. 0 = unset
  uint64_t memory_bytes = 0;  // memory limit (v1 also memsw when present). 0 = unset
  uint32_t pids = 0;          // pids.max. 0 = unset
  // The best-effort QoS class (with cpu_millis set): the lowest cpu weight
  // (v1 cpu.shares 2, v2 cpu.weight 1) instead of one by cpu_millis, so a
  // latency sandbox's runnable task wins the CPU nearly every time (the
  // quota still caps it). With memory_bytes set, v1 memory.soft_limit_in_bytes
  // 0 (latency: unlimited): the kernel's global reclaim (kswapd and direct
  // reclaim, mem_cgroup_soft_limit_reclaim) takes pages from cgroups over
  // their soft limit first. v2 has no soft limit: there the class is
  // reclaimed first through its processes' oom_score_adj only (the sandbox
  // init's, inherited), and memory.low is left alone (protecting latency
  // sandboxes with it needs memory.low on every ancestor up to the root).
  bool best_effort = false;

  bool operator==(const CgroupLimits&) const = default;
};

// open(2) of a file in a cgroup file system (e.g. a cgroup.procs outside the
// Cgroup objects), with the path walk started at the hierarchy's mount point
// as every call of this file does (see cgroup.cc's CgPath). Returns the fd or
// -1 with errno set.
int OpenCgroupFile(const std::string& path, int flags);

class Cgroup {
 public:
  virtual ~Cgroup() = default;
  // Path relative to the subtree root, e.g. "sb-1" or "sb-1/exec-3".
  virtual const std::string& rel() const = 0;
  // One directory per hierarchy this cgroup exists in.
  virtual std::vector<std::string> dirs() const = 0;
  virtual Status SetLimits(const CgroupLimits& limits) = 0;
  // Moves a process (and, v2, its threads) into this cgroup in every hierarchy.
  virtual Status AddProcess(pid_t pid) = 0;
  // O_WRONLY|O_CLOEXEC fds of cgroup.procs, one per hierarchy: a freshly
  // forked child joins the cgroup with write(fd, "0", 1) (async-signal-safe).
  virtual StatusOr<std::vector<UniqueFd>> OpenProcsFds() = 0;
  // True when a child cgroup covers every controller of this one (v2), so a
  // process joins only the child; false for v1, where a process must also
  // join this cgroup for the controllers children lack (memory, cpu). v2's
  // no-internal-process rule forbids joining a cgroup that has children.
  virtual bool ChildrenCoverAllControllers() const = 0;
  // Creates (or opens if it exists) a sub-cgroup (see header comment for v1).
  virtual StatusOr<std::unique_ptr<Cgroup>> CreateChild(const std::string& name) = 0;
  // Pids (host pid namespace) of this cgroup and, if `recursive`, its
  // descendants, read from the hierarchy that tracks all processes
  // (freezer/pids for v1).
  virtual std::vector<pid_t> Pids(bool recursive) const = 0;
  virtual bool Empty() const { return Pids(true).empty(); }
  // Freezes/thaws the cgroup and its descendants; Freeze waits (bounded by
  // 5 s) until the kernel reports the frozen state. When it does not (a task
  // that cannot freeze now: exiting, in the middle of a fork or an exec), the
  // cgroup is thawed again (a cgroup left FREEZING would freeze its tasks
  // one by one, later) and Freeze returns Aborted: retryable, nothing
  // changed.
  virtual Status Freeze() = 0;
  // Thaw writes this cgroup's own state only: a descendant frozen on its
  // own (v1 freezer.state / v2 cgroup.freeze written on it) stays frozen.
  virtual Status Thaw() = 0;
  // Thaws this cgroup and every descendant, each by its own state: what a
  // freeze interrupted by a crash (an exec cgroup frozen by SignalAll when
  // the daemon was killed) leaves behind. Needed before a kill: a v1-frozen
  // task does not act on SIGKILL until it is thawed. The first error is
  // returned after every cgroup was tried.
  virtual Status ThawTree() = 0;
  // The same for the descendants only: this cgroup's own state is kept (a
  // paused sandbox stays frozen while its exec cgroups are reconciled).
  virtual Status ThawDescendants() = 0;
  // True while the kernel reports the cgroup frozen or freezing (v1
  // freezer.state not THAWED, v2 cgroup.events "frozen 1"); false without a
  // freezer or when unreadable.
  virtual bool Frozen() const = 0;
  // Sends `sig` to every process of the subtree with the subtree frozen, so
  // that no process forks its way out between listing and signalling.
  // SIGKILL on v2 uses cgroup.kill.
  virtual Status SignalAll(int sig) = 0;
  // The memory cgroup's oom_kill counter (v1 memory.oom_control, v2
  // memory.events); 0 when not available.
  virtual uint64_t OomKillCount() const = 0;
  // ---- memory reclaim (suspend)
  // Bytes charged to the memory cgroup (v1 memory.usage_in_bytes, v2
  // memory.current); NotFound without a memory controller.
  virtual StatusOr<uint64_t> MemoryUsage() const = 0;
  // Bytes of page cache and anonymous memory charged to the memory cgroup
  // (v1 memory.stat cache + rss, v2 memory.stat file + anon): what a dead
  // tenant's charges that persist consist of (kernel objects of a dying
  // sandbox are uncharged as they are freed). NotFound without a memory
  // controller.
  virtual StatusOr<uint64_t> PageMemoryUsage() const = 0;
  // Bytes of this cgroup's memory in swap (v1 memory.stat "swap", v2
  // memory.swap.current); 0 when not accounted.
  virtual uint64_t SwapUsage() const = 0;
  // Pushes as much of the cgroup's memory (anon, tmpfs/shmem, page cache) out
  // as the kernel can: v1 writes memory.force_empty (works with tasks in the
  // cgroup, frozen or not; reclaims with swap), v2 lets the cgroup swap
  // (memory.swap.max = max) and writes its usage to memory.reclaim. Anonymous
  // and tmpfs pages need swap on the host. Blocks until done (about 1 s per
  // GiB into zram here). Errors name the file.
  virtual Status ReclaimMemory() = 0;
  // Undoes what ReclaimMemory changed besides the reclaim itself (v2:
  // memory.swap.max back to 0, so a running sandbox does not swap); v1: no-op.
  virtual Status EndReclaim() = 0;
  // Removes the cgroup's descendants then itself (they must be empty).
  // NotFound is not an error (idempotent).
  virtual Status Remove() = 0;
  // Removes the cgroup's descendants (they must be empty), keeps itself.
  Status RemoveChildren();
  // Removes the descendants that hold no process (rmdir refuses the others:
  // they stay). For a cgroup nobody else adds children to meanwhile.
  void RemoveEmptyDescendants();
  // Kills everything (SIGKILL) until the subtree is empty, thawing the whole
  // subtree (ThawTree) each round, for at most `timeout` (Unavailable then,
  // naming the pids left; the subtree thawed).
  Status Evacuate(std::chrono::milliseconds timeout);
  // Evacuate, then Remove (retried while an exiting task still detaches).
  Status Destroy(std::chrono::milliseconds timeout);
};

class CgroupManager {
 public:
  virtual ~CgroupManager() = default;
  // Probes the host: v2 if /sys/fs/cgroup is a cgroup2 mount with the
  // memory controller available, else v1 (memory, pids, freezer required;
  // cpu optional). FailedPrecondition if neither works.
  // `view_hierarchies` (v1): Create also makes the cgroup in the cpuset and
  // cpuacct hierarchies, which set no limit of ours but through which lxcfs
  // computes a reader's cpus and cpu usage (jail/lxcfs.h); without lxcfs
  // views they are two more mkdir/rmdir/join per sandbox for nothing. Open,
  // Rename and removal find a cgroup in every hierarchy either way.
  static StatusOr<std::unique_ptr<CgroupManager>> Detect(const std::string& name, bool view_hierarchies = true);
  // The v2 implementation on the cgroup2 file system mounted at `mount`,
  // subtree <mount><own "0::" cgroup>/<name>, whatever Detect would pick
  // (tests exercise the v2 paths on a hybrid host's /sys/fs/cgroup/unified,
  // where no controller is enabled: limits cannot be set there, processes,
  // freeze and kill work). FailedPrecondition if `mount` is not cgroup2.
  static StatusOr<std::unique_ptr<CgroupManager>> OpenV2(const std::string& mount, const std::string& name);
  // Mount point of the host's cgroup2 file system ("" if none).
  static std::string FindCgroup2Mount();
  virtual int version() const = 0;
  // "<own path>/<name>" of the memory controller (v1) or unified (v2),
  // e.g. "/process_api/abc/warren".
  virtual std::string parent() const = 0;
  // Creates <subtree>/<rel> (parents as needed) with the given limits. On
  // failure nothing new is left behind.
  virtual StatusOr<std::unique_ptr<Cgroup>> Create(const std::string& rel, const CgroupLimits& limits) = 0;
  // An existing cgroup (nothing is created); NotFound if absent everywhere.
  virtual StatusOr<std::unique_ptr<Cgroup>> Open(const std::string& rel) = 0;
  // Renames <subtree>/<from> to <subtree>/<to> (both direct children of the
  // subtree root) in every hierarchy, processes and limits staying where they
  // are: how a pre-spawned warm shell's cgroup takes its sandbox's name
  // (the fast path). v1 only (cgroupfs v1 supports rename(2) within one
  // parent); v2's cgroupfs refuses rename: Unimplemented. On failure nothing
  // is renamed (earlier hierarchies are renamed back).
  virtual Status Rename(const std::string& from, const std::string& to) {
    (void)from;
    (void)to;
    return absl::UnimplementedError("cgroup rename is not supported by cgroup v" + std::to_string(version()));
  }
};

}  // namespace warren::jail
