// Building containment plans (plan.h) in the daemon, before the clone; the
// one list of /proc and /sys masks, the one list of /dev nodes and the
// standard mount sets every spawn path takes from here. Parent side: may
// allocate; not async-signal-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "jail/plan.h"
#include "jail/seccomp.h"

namespace warren::jail {

// Files under /proc bound over with /dev/null: kernel memory, keys, timers,
// the scheduler's internals and the magic SysRq trigger (what Docker and
// runc mask). Missing ones (a kernel without the feature) are skipped.
extern const char* const kMaskedFiles[12];
// Directories hidden under an empty read-only tmpfs. The /sys one applies
// where sysfs is mounted.
extern const char* const kMaskedDirs[4];
// /proc directories made read-only (kernel tunables, bus and fs state, irq affinity).
extern const char* const kReadOnlyDirs[4];

// A node of /dev every sandbox gets: name, major, minor; `terminal` for the
// controlling-terminal node (none in an fncall call, which has no terminal).
struct DevNode {
  const char* name;
  unsigned major, minor;
  bool terminal;
};
extern const DevNode kDevNodes[6];

// The /proc files lxcfs answers with the reader's cgroup limits.
extern const char* const kLxcfsProcFiles[7];

// The /dev symlinks (target, link name under dev/).
struct DevLink {
  const char* target;
  const char* name;
  bool terminal;  // only with a terminal (ptmx)
};
extern const DevLink kDevLinks[6];

// Builds one plan. Every Add* records the first error (a path too long for
// the plan's fixed fields, too many ops); Finish returns it.
class PlanBuilder {
 public:
  PlanBuilder();

  WarrenJailPlan& plan() { return plan_; }

  PlanBuilder& Mkdir(const std::string& target, uint32_t mode);
  PlanBuilder& Mount(const std::string& source, const std::string& target, const std::string& fstype, uint64_t flags,
                     const std::string& data, uint32_t opts = 0);
  PlanBuilder& Bind(const std::string& source, const std::string& target, uint64_t flags = 0, uint32_t opts = 0);
  PlanBuilder& MoveFd(int fd_slot, const std::string& target, uint32_t opts = 0);
  PlanBuilder& Remount(const std::string& target, uint64_t flags, const std::string& data = "");
  PlanBuilder& ReadOnly(const std::string& target, uint64_t flags, uint32_t opts = 0);
  PlanBuilder& MaskFile(const std::string& target);
  // fd_slot >= 0: the shared empty tmpfs arrives there (moved; cloned with
  // `clone_fd`: WARREN_JAIL_CLONE_FD).
  PlanBuilder& MaskDir(const std::string& target, int fd_slot, bool clone_fd = false);
  PlanBuilder& DevNode(const std::string& host_node, const std::string& target);
  PlanBuilder& Symlink(const std::string& target, const std::string& link);

  // /proc (fresh, nosuid/nodev/noexec) at `proc` ("proc" or "/proc"), then
  // its masks and read-only dirs. `with_sys`: mask /sys/firmware too (sysfs
  // is mounted). mask_fd_slot: the shared empty tmpfs for masked dirs (-1:
  // one made by the child). `clone_mask`: the slot's tmpfs is cloned, not
  // moved (one fd for every process the plan is applied in).
  PlanBuilder& Proc(const std::string& proc, bool with_sys, int mask_fd_slot, bool clone_mask = false);
  // The masks and read-only dirs alone (the proc mount made by other ops).
  PlanBuilder& ProcMasks(const std::string& proc, bool with_sys, int mask_fd_slot, bool clone_mask = false);
  // The /dev nodes bound from the host's (when the daemon could not make
  // them itself), and the /dev symlinks.
  PlanBuilder& DevNodes(const std::string& dev, bool terminal);
  PlanBuilder& DevLinks(const std::string& dev, bool terminal);

  // The sandbox's own limits where programs look for them: lxcfs's files
  // (jail/lxcfs.h; `lxcfs_proc`: its proc dir, kLxcfsProcFiles) bound over
  // `proc`'s, each where both exist.
  PlanBuilder& LimitViews(const std::string& proc, const std::string& lxcfs_proc);
  // The sandbox's cgroup, read-only, at `at` (".../sys/fs/cgroup"): an empty
  // tmpfs with one dir per v1 hierarchy (`dirs`: the host's
  // /sys/fs/cgroup/<hierarchy>/<path>) bound there, or, on v2, the one dir
  // bound at `at` itself. In a cgroup namespace rooted at the sandbox's
  // cgroup, /proc/self/cgroup then names "/" and the files match.
  PlanBuilder& CgroupView(const std::string& at, const std::vector<std::string>& dirs);

  // Credentials.
  PlanBuilder& Rlimit(int resource, uint64_t cur, uint64_t max);
  // uid/gid inside the sandbox's user namespace (setgroups(0) first when `setgroups`).
  PlanBuilder& Ids(uint32_t uid, uint32_t gid, bool setgroups);
  // Effective = permitted = bounding = `keep`; inheritable = ambient = 0.
  PlanBuilder& Capabilities(uint64_t keep, int last_cap);
  PlanBuilder& NoNewPrivs();
  // The program is referenced, not copied: it must outlive the plan's use
  // (PlanBytes copies it).
  PlanBuilder& Seccomp(const SeccompProgram* prog);

  // The best-effort QoS class (plan.h WARREN_JAIL_QOS_BEST_EFFORT): SCHED_IDLE
  // and a raised oom_score_adj, applied with the rlimits.
  PlanBuilder& BestEffort(bool on) {
    if (on) plan_.creds.flags |= WARREN_JAIL_QOS_BEST_EFFORT;
    return *this;
  }

  Status Finish() const { return error_; }

 private:
  WarrenJailMount* Next(uint32_t op, const std::string& source, const std::string& target);
  WarrenJailPlan plan_;
  Status error_;
};

// A container sandbox's first process (its init): what the daemon knows at
// Start. The shell receives the plan with the fds of its slots.
enum SandboxFdSlot : int { kSlotRootfs = 0, kSlotDev = 1, kSlotSysfs = 2, kSlotMask = 3, kSlotCgroupView = 4 };
struct SandboxPlanOptions {
  std::string root;                      // where the rootfs mount is attached (spec.dir/rootfs)
  std::string hostname;                  // at most 63 bytes
  std::string shm_opts;                  // mount options of /dev/shm
  bool dev_nodes_made = false;           // the daemon made kDevNodes in the /dev dir (else bound from the host's)
  bool shared_sysfs = false;             // a read-only sysfs arrives in kSlotSysfs (else mounted here)
  bool shared_mask = false;              // an empty read-only tmpfs for masked dirs arrives in kSlotMask
  std::vector<std::string> cgroup_dirs;  // the sandbox's cgroup, shown at /sys/fs/cgroup
  bool cgroup_view_fd = false;           // that view arrives built in kSlotCgroupView (jail/cgroup_view.h)
  std::string lxcfs_dir;                 // jail/lxcfs.h mount; "" = none
  uint64_t nofile = 0;
  int last_cap = 40;
  const SeccompProgram* seccomp = nullptr;
  bool best_effort = false;  // the best-effort QoS class (PlanBuilder::BestEffort)
};
// Mounts: rootfs attached, proc, /dev (the slot's dir: nodes, links, pts,
// shm, mqueue), /sys, the masks, the limit views, pivot_root. Credentials:
// RLIMIT_NOFILE, RLIMIT_CORE 0, no capability at all (warren-init needs
// none; commands get theirs from warren-spawn), no_new_privs, seccomp.
StatusOr<WarrenJailPlan> SandboxInitPlan(const SandboxPlanOptions& o);

// The plan as bytes: the struct, then its seccomp program (plan.h,
// warren_jail_plan_attach_filter).
std::string PlanBytes(const WarrenJailPlan& plan);

// The failing step of a plan, for errors: "mount(proc on proc/sys, ...)".
std::string StepDescription(const WarrenJailPlan& plan, int step);

}  // namespace warren::jail
