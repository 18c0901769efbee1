#include "jail/plan_builder.h"

#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>

namespace warren::jail {

const char* const kMaskedFiles[12] = {"kcore",         "sysrq-trigger", "keys",       "kpagecount",
                                      "kpageflags",    "kpagecgroup",   "timer_list", "sched_debug",
                                      "latency_stats", "timer_stats",   "kallsyms",   "vmallocinfo"};
const char* const kMaskedDirs[4] = {"acpi", "scsi", "driver", "sys/firmware"};  // the last under /sys
const char* const kReadOnlyDirs[4] = {"sys", "bus", "fs", "irq"};

const DevNode kDevNodes[6] = {{"null", 1, 3, false},   {"zero", 1, 5, false},    {"full", 1, 7, false},
                              {"random", 1, 8, false}, {"urandom", 1, 9, false}, {"tty", 5, 0, true}};
const char* const kLxcfsProcFiles[7] = {"meminfo", "cpuinfo", "stat", "uptime", "loadavg", "swaps", "diskstats"};

const DevLink kDevLinks[6] = {{"/proc/self/fd", "fd", false},       {"/proc/self/fd/0", "stdin", false},
                              {"/proc/self/fd/1", "stdout", false}, {"/proc/self/fd/2", "stderr", false},
                              {"pts/ptmx", "ptmx", true},           {"/proc/kcore", "core", true}};

namespace {
std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}
// The parent of "proc": "" for "proc", "/" for "/proc".
std::string SysOf(const std::string& proc) { return proc.size() > 4 ? proc.substr(0, proc.size() - 4) + "sys" : "sys"; }
}  // namespace

PlanBuilder::PlanBuilder() {
  memset(&plan_, 0, sizeof plan_);
  plan_.magic = WARREN_JAIL_PLAN_MAGIC;
  plan_.size = sizeof plan_;
  plan_.root_fd_slot = -1;
}

WarrenJailMount* PlanBuilder::Next(uint32_t op, const std::string& source, const std::string& target) {
  if (!error_.ok()) return nullptr;
  if (plan_.n_mounts >= WARREN_JAIL_MAX_MOUNTS) {
    error_ = absl::InternalError("containment plan: more than " + std::to_string(WARREN_JAIL_MAX_MOUNTS) + " mounts");
    return nullptr;
  }
  WarrenJailMount* m = &plan_.mounts[plan_.n_mounts];
  if (source.size() >= sizeof m->source || target.size() >= sizeof m->target) {
    error_ = absl::InternalError("containment plan: path too long: " + source + " -> " + target);
    return nullptr;
  }
  ++plan_.n_mounts;
  m->op = op;
  m->fd_slot = -1;
  memcpy(m->source, source.c_str(), source.size() + 1);
  memcpy(m->target, target.c_str(), target.size() + 1);
  return m;
}

PlanBuilder& PlanBuilder::Mkdir(const std::string& target, uint32_t mode) {
  if (auto* m = Next(WARREN_JAIL_MKDIR, "", target)) m->mode = mode;
  return *this;
}

PlanBuilder& PlanBuilder::Mount(const std::string& source, const std::string& target, const std::string& fstype,
                                uint64_t flags, const std::string& data, uint32_t opts) {
  auto* m = Next(WARREN_JAIL_MOUNT, source, target);
  if (!m) return *this;
  if (fstype.size() >= sizeof m->fstype || data.size() >= sizeof m->data) {
    error_ = absl::InternalError("containment plan: mount options too long: " + fstype + " " + data);
    return *this;
  }
  memcpy(m->fstype, fstype.c_str(), fstype.size() + 1);
  memcpy(m->data, data.c_str(), data.size() + 1);
  m->flags = flags;
  m->opts = opts;
  return *this;
}

PlanBuilder& PlanBuilder::Bind(const std::string& source, const std::string& target, uint64_t flags, uint32_t opts) {
  if (auto* m = Next(WARREN_JAIL_BIND, source, target)) {
    m->flags = flags;
    m->opts = opts;
  }
  return *this;
}

PlanBuilder& PlanBuilder::MoveFd(int fd_slot, const std::string& target, uint32_t opts) {
  if (auto* m = Next(WARREN_JAIL_MOVE_FD, "", target)) {
    m->fd_slot = fd_slot;
    m->opts = opts;
  }
  return *this;
}

PlanBuilder& PlanBuilder::Remount(const std::string& target, uint64_t flags, const std::string& data) {
  auto* m = Next(WARREN_JAIL_REMOUNT, "", target);
  if (!m) return *this;
  if (data.size() >= sizeof m->data) {
    error_ = absl::InternalError("containment plan: mount options too long: " + data);
    return *this;
  }
  memcpy(m->data, data.c_str(), data.size() + 1);
  m->flags = flags;
  return *this;
}

PlanBuilder& PlanBuilder::ReadOnly(const std::string& target, uint64_t flags, uint32_t opts) {
  if (auto* m = Next(WARREN_JAIL_READ_ONLY, "", target)) {
    m->flags = flags;
    m->opts = opts;
  }
  return *this;
}

PlanBuilder& PlanBuilder::MaskFile(const std::string& target) {
  if (auto* m = Next(WARREN_JAIL_MASK_FILE, "/dev/null", target)) m->opts = WARREN_JAIL_IF_EXISTS;
  return *this;
}

PlanBuilder& PlanBuilder::MaskDir(const std::string& target, int fd_slot, bool clone_fd) {
  if (auto* m = Next(WARREN_JAIL_MASK_DIR, "", target)) {
    m->fd_slot = fd_slot;
    m->opts = WARREN_JAIL_IF_EXISTS | (clone_fd ? WARREN_JAIL_CLONE_FD : 0u);
  }
  return *this;
}

PlanBuilder& PlanBuilder::DevNode(const std::string& host_node, const std::string& target) {
  Next(WARREN_JAIL_DEV_NODE, host_node, target);
  return *this;
}

PlanBuilder& PlanBuilder::Symlink(const std::string& target, const std::string& link) {
  Next(WARREN_JAIL_SYMLINK, target, link);
  return *this;
}

PlanBuilder& PlanBuilder::Proc(const std::string& proc, bool with_sys, int mask_fd_slot, bool clone_mask) {
  Mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
  return ProcMasks(proc, with_sys, mask_fd_slot, clone_mask);
}

PlanBuilder& PlanBuilder::ProcMasks(const std::string& proc, bool with_sys, int mask_fd_slot, bool clone_mask) {
  for (const char* f : kMaskedFiles) MaskFile(Join(proc, f));
  for (const char* d : kMaskedDirs) {
    const bool sys = strncmp(d, "sys/", 4) == 0;
    if (sys && !with_sys) continue;
    MaskDir(sys ? Join(SysOf(proc), d + 4) : Join(proc, d), mask_fd_slot, clone_mask);
  }
  for (const char* d : kReadOnlyDirs) ReadOnly(Join(proc, d), MS_NOSUID | MS_NODEV | MS_NOEXEC, WARREN_JAIL_IF_EXISTS);
  return *this;
}

PlanBuilder& PlanBuilder::DevNodes(const std::string& dev, bool terminal) {
  for (const auto& n : kDevNodes) {
    if (n.terminal && !terminal) continue;
    DevNode(std::string("/dev/") + n.name, Join(dev, n.name));
  }
  return *this;
}

PlanBuilder& PlanBuilder::DevLinks(const std::string& dev, bool terminal) {
  for (const auto& l : kDevLinks) {
    if (l.terminal && !terminal) continue;
    Symlink(l.target, Join(dev, l.name));
  }
  return *this;
}

PlanBuilder& PlanBuilder::LimitViews(const std::string& proc, const std::string& lxcfs_proc) {
  for (const char* f : kLxcfsProcFiles) Bind(Join(lxcfs_proc, f), Join(proc, f), 0, WARREN_JAIL_IF_EXISTS);
  return *this;
}

PlanBuilder& PlanBuilder::CgroupView(const std::string& at, const std::vector<std::string>& dirs) {
  constexpr uint64_t kRo = MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
  const std::string root = "/sys/fs/cgroup/";
  const bool v2 = dirs.size() == 1 && access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0;
  if (v2) {
    Bind(dirs[0], at).Remount(at, kRo);
    return *this;
  }
  Mount("tmpfs", at, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16k,nr_inodes=64,mode=755");
  for (const std::string& d : dirs) {
    if (d.compare(0, root.size(), root) != 0) continue;
    const std::string h = d.substr(root.size(), d.find('/', root.size()) - root.size());
    const std::string target = Join(at, h);
    Mkdir(target, 0755).Bind(d, target).Remount(target, kRo);
  }
  Remount(at, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16k,nr_inodes=64,mode=755");
  return *this;
}

PlanBuilder& PlanBuilder::Rlimit(int resource, uint64_t cur, uint64_t max) {
  WarrenJailCreds& c = plan_.creds;
  if (c.n_rlimits >= WARREN_JAIL_MAX_RLIMITS) {
    if (error_.ok()) error_ = absl::InternalError("containment plan: too many rlimits");
    return *this;
  }
  c.rlimits[c.n_rlimits++] = WarrenJailRlimit{resource, 0, cur, max};
  return *this;
}

PlanBuilder& PlanBuilder::Ids(uint32_t uid, uint32_t gid, bool setgroups) {
  plan_.creds.flags |= WARREN_JAIL_SET_IDS | (setgroups ? WARREN_JAIL_SETGROUPS : 0);
  plan_.creds.uid = uid;
  plan_.creds.gid = gid;
  return *this;
}

PlanBuilder& PlanBuilder::Capabilities(uint64_t keep, int last_cap) {
  WarrenJailCreds& c = plan_.creds;
  c.flags |= WARREN_JAIL_SET_CAPS;
  c.last_cap = last_cap;
  c.cap_effective = c.cap_permitted = c.cap_bounding = keep;
  c.cap_inheritable = c.cap_ambient = 0;
  return *this;
}

PlanBuilder& PlanBuilder::NoNewPrivs() {
  plan_.creds.flags |= WARREN_JAIL_NO_NEW_PRIVS;
  return *this;
}

PlanBuilder& PlanBuilder::Seccomp(const SeccompProgram* prog) {
  if (prog == nullptr || prog->filter.empty()) {
    plan_.creds.n_filters = 0;
    plan_.creds.filter = nullptr;
  } else {
    plan_.creds.n_filters = static_cast<uint32_t>(prog->filter.size());
    plan_.creds.filter = prog->filter.data();
  }
  return *this;
}

StatusOr<WarrenJailPlan> SandboxInitPlan(const SandboxPlanOptions& o) {
  PlanBuilder b;
  WarrenJailPlan& p = b.plan();
  if (o.root.size() >= sizeof p.root)
    return absl::InvalidArgumentError("sandbox root '" + o.root + "' is too long (max " +
                                      std::to_string(sizeof p.root - 1) + " bytes)");
  if (o.hostname.size() >= sizeof p.hostname)
    return absl::InvalidArgumentError("hostname '" + o.hostname + "' is too long (max 63 bytes)");
  memcpy(p.root, o.root.c_str(), o.root.size() + 1);
  memcpy(p.hostname, o.hostname.c_str(), o.hostname.size() + 1);
  p.steps =
      WARREN_JAIL_HOSTNAME | WARREN_JAIL_PRIVATE | WARREN_JAIL_ATTACH_ROOT | WARREN_JAIL_MOUNT_IDS | WARREN_JAIL_PIVOT;
  p.root_fd_slot = kSlotRootfs;
  // Become the sandbox's root (host uid_base) before the mounts, so that
  // everything created from now on belongs to it.
  p.mount_uid = p.mount_gid = 0;
  b.Mkdir("proc", 0755).Mkdir("dev", 0755).Mkdir("sys", 0755).Mkdir("tmp", 01777);
  b.Mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
  // /dev: a directory of the upper's tmpfs (no superblock of its own).
  b.MoveFd(kSlotDev, "dev");
  if (!o.dev_nodes_made) b.DevNodes("dev", /*terminal=*/true);
  b.DevLinks("dev", /*terminal=*/true)
      .Mkdir("dev/pts", 0755)
      .Mkdir("dev/shm", 01777)
      .Mkdir("dev/mqueue", 0755)
      .Mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
      .Mount("shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, o.shm_opts)
      .Mount("mqueue", "dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, "", WARREN_JAIL_BEST_EFFORT);
  if (o.shared_sysfs) {
    b.MoveFd(kSlotSysfs, "sys");  // the backend's shared read-only sysfs (of an empty netns)
  } else {
    // No sysfs for this netns/userns: an empty read-only tmpfs instead.
    b.Mount("sysfs", "sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "", WARREN_JAIL_OR_NEXT)
        .Mount("tmpfs", "sys", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0,mode=555");
  }
  b.ProcMasks("proc", /*with_sys=*/true, o.shared_mask ? kSlotMask : -1);
  if (!o.lxcfs_dir.empty()) {
    b.LimitViews("proc", o.lxcfs_dir + "/proc")
        .Bind(o.lxcfs_dir + "/sys/devices/system/cpu/online", "sys/devices/system/cpu/online", 0,
              WARREN_JAIL_IF_EXISTS);
  }
  if (o.cgroup_view_fd) {
    b.MoveFd(kSlotCgroupView, "sys/fs/cgroup");
  } else if (!o.cgroup_dirs.empty()) {
    b.CgroupView("sys/fs/cgroup", o.cgroup_dirs);
  }
  b.Rlimit(RLIMIT_NOFILE, o.nofile, o.nofile)
      .Rlimit(RLIMIT_CORE, 0, 0)
      .BestEffort(o.best_effort)
      .Capabilities(0, o.last_cap)
      .NoNewPrivs()
      .Seccomp(o.seccomp);
  RETURN_IF_ERROR(b.Finish());
  return p;
}

std::string PlanBytes(const WarrenJailPlan& plan) {
  std::string out(reinterpret_cast<const char*>(&plan), sizeof plan);
  auto* p = reinterpret_cast<WarrenJailPlan*>(out.data());
  p->creds.filter = nullptr;
  if (plan.creds.n_filters > 0 && plan.creds.filter != nullptr)
    out.append(reinterpret_cast<const char*>(plan.creds.filter), plan.creds.n_filters * sizeof(sock_filter));
  return out;
}

std::string StepDescription(const WarrenJailPlan& plan, int step) {
  if (step >= WARREN_JAIL_STEP_MOUNT0) {
    const uint32_t i = static_cast<uint32_t>(step - WARREN_JAIL_STEP_MOUNT0);
    if (i >= plan.n_mounts) return "mount #" + std::to_string(i);
    const WarrenJailMount& m = plan.mounts[i];
    static const char* const kOps[] = {"?",         "mkdir",     "mount",    "bind",     "move_mount", "remount",
                                       "read-only", "mask file", "mask dir", "dev node", "symlink"};
    const char* op = m.op < sizeof kOps / sizeof kOps[0] ? kOps[m.op] : "?";
    std::string s = std::string(op) + "(";
    if (m.source[0]) s += std::string(m.source) + " -> ";
    s += m.target;
    if (m.fstype[0]) s += std::string(", ") + m.fstype;
    return s + ")";
  }
  return warren_jail_step_name(step);
}

}  // namespace warren::jail
