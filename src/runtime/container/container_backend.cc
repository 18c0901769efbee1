// The container backend. Layout of one sandbox:
//
//   host (daemon) mount namespace: NOTHING is mounted per sandbox. The
//   writable tmpfs (upper/ + work/), the idmapped clones of the lower layers
//   and the overlay are all created as detached mounts (fsopen/fsmount,
//   open_tree(OPEN_TREE_CLONE)) and handed to the sandbox's first process over
//   a unix socket (SCM_RIGHTS); it attaches the overlay in its own private
//   mount namespace. All of a sandbox's mounts therefore die with its mount
//   namespace: killing the sandbox's processes is enough to release them,
//   which makes Destroy and Cleanup (after a daemon crash) trivially complete.
//
//   spec.dir/rootfs   empty directory, the mount point of the overlay inside
//                     the sandbox's mount namespace only (pivot_root target).
//
//   Disk limit: the kernel has no quota support, so the upper layer lives on a
//   tmpfs of size disk_mb; its pages are charged to the sandbox's memory
//   cgroup (the tmpfs is written by sandbox processes), i.e. files written to
//   the upper count against memory_mb too.
//
//   Ownership: root inside = host uid_base + slot*uid_range. The lower layers
//   are idmapped (MOUNT_ATTR_IDMAP with the sandbox's user namespace) so
//   root-owned layer files appear owned by root inside; the tmpfs root is
//   owned by the sandbox's root.
#include "runtime/container/container_backend.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>  // records of older daemons (ParseContainerRecord)

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/rollback.h"
#include "jail/cgroup_view.h"
#include "jail/contain.h"
#include "jail/plan.h"
#include "jail/plan_builder.h"
#include "net/sandbox_network.h"
#include "runtime/container/init.h"
#include "runtime/container/record.pb.h"
#include "runtime/container/rootfs.h"
#include "runtime/container/sandbox.h"
#include "runtime/container/shell_pool.h"
#include "runtime/container/state.h"

namespace warren::runtime::container {

namespace {

using jail::Clone3;
using jail::FsConfig;
using jail::FsMount;
using jail::FsOpen;
using jail::MountSetattr;
using jail::PidfdOpen;
using jail::PidfdSignal;

// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); 0 if gone.
uint64_t ProcStartTime(pid_t pid) {
  auto s = ReadSmallFile("/proc/" + std::to_string(pid) + "/stat");
  if (!s.ok()) return 0;
  size_t rp = s->rfind(')');
  if (rp == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(s->substr(rp + 2), ' ');
  // f[0] is field 3 (state); field 22 is f[19].
  uint64_t v = 0;
  if (f.size() > 19 && absl::SimpleAtoi(f[19], &v)) return v;
  return 0;
}

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 63) return false;
  return std::all_of(id.begin(), id.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

class ContainerBackend : public Backend {
 public:
  explicit ContainerBackend(std::shared_ptr<BackendState> st) : st_(std::move(st)) {
    if (st_->options.warm_shells > 0) pool_ = std::make_unique<ShellPool>(st_, st_->options.warm_shells);
  }
  std::string name() const override { return std::string(kBackendName); }
  Capabilities capabilities() const override {
    if (st_->options.network != nullptr)
      return {Capability::kPause, Capability::kSuspend, Capability::kProcesses, Capability::kExportChanges,
              Capability::kNetwork};
    return {Capability::kPause, Capability::kSuspend, Capability::kProcesses, Capability::kExportChanges};
  }
  StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  StatusOr<std::unique_ptr<Sandbox>> Adopt(const SandboxSpec& spec, const std::string& backend_record) override;
  Status Cleanup(const SandboxSpec& spec, const std::string& backend_record) override;

 private:
  // Turns a shell into the sandbox `spec` (cgroup named and limited, rootfs
  // built and sent, warren-init exec'd).
  StatusOr<std::unique_ptr<Sandbox>> FinishShell(std::unique_ptr<Shell> sh, const SandboxSpec& spec,
                                                 const jail::CgroupLimits& lim, bool limits_set);

  std::shared_ptr<BackendState> st_;
  std::unique_ptr<ShellPool> pool_;  // null: --warm-shells 0
};

StatusOr<std::unique_ptr<Sandbox>> ContainerBackend::Create(const SandboxSpec& in) {
  SandboxSpec spec = in;
  if (!ValidId(spec.id)) return absl::InvalidArgumentError("bad sandbox id '" + spec.id + "'");
  if (spec.dir.empty() || spec.dir[0] != '/') return absl::InvalidArgumentError("sandbox dir must be absolute");
  if (spec.lower_dirs.empty()) return absl::InvalidArgumentError("sandbox needs at least one lower dir");
  if (spec.hostname.empty()) spec.hostname = spec.id.substr(0, 63);
  if (spec.dir.size() + sizeof "/rootfs" > WARREN_JAIL_ROOT_MAX)
    return absl::InvalidArgumentError("sandbox dir '" + spec.dir + "' is too long (max " +
                                      std::to_string(WARREN_JAIL_ROOT_MAX - sizeof "/rootfs") + " bytes)");
  const jail::CgroupLimits lim = LimitsOf(spec);
  // Every container sandbox can start from a warm shell today (the shell
  // fixes only what all sandboxes share: namespaces, id range, seccomp);
  // an option a shell could not provide would take the spawn path below.
  if (pool_ != nullptr) {
    pool_->Predict(lim);
    if (std::unique_ptr<Shell> sh = pool_->Take()) {
      StatusOr<std::unique_ptr<Sandbox>> sb = FinishShell(std::move(sh), spec, lim, false);
      // A shell killed under us (Aborted) was cleaned up: spawn one instead.
      if (sb.ok() || sb.status().code() != absl::StatusCode::kAborted) return sb;
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Shell> sh, SpawnShell(st_, spec.id, lim));
  return FinishShell(std::move(sh), spec, lim, true);
}

StatusOr<std::unique_ptr<Sandbox>> ContainerBackend::FinishShell(std::unique_ptr<Shell> sh, const SandboxSpec& spec,
                                                                 const jail::CgroupLimits& lim, bool limits_set) {
  if (sh->cg->rel() != spec.id) {
    // A warm shell: its cgroup takes the sandbox's name (v1), or keeps its
    // own (v2 cannot rename; the record names the cgroup).
    Status rs = st_->cgroups->Rename(sh->cg->rel(), spec.id);
    if (rs.ok()) {
      ASSIGN_OR_RETURN(sh->cg, st_->cgroups->Open(spec.id));
    } else if (rs.code() != absl::StatusCode::kUnimplemented) {
      return rs;
    }
  }
  if (!limits_set) {
    const jail::CgroupLimits& had = sh->limits;
    if (had != lim) RETURN_IF_ERROR(sh->cg->SetLimits(lim));
    sh->limits = lim;
    // A warm shell inherited the refill thread's nice 10: its set-up is on
    // this create's critical path now, and its processes are the sandbox's.
    errno = 0;
    const int nice_now = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
    if (errno == 0 && ::setpriority(PRIO_PROCESS, static_cast<id_t>(sh->pid), nice_now) != 0)
      return Errno("setpriority(shell " + std::to_string(sh->pid) + ", " + std::to_string(nice_now) + ")");
  }
  Rollback rb;
  const std::string rootfs = spec.dir + "/rootfs";
  if (::mkdir(rootfs.c_str(), 0755) != 0 && errno != EEXIST) return Errno("mkdir(" + rootfs + ")");
  rb.Add([rootfs] { ::rmdir(rootfs.c_str()); });
  const uid_t host_uid = st_->HostUid(sh->slot);
  UniqueFd upper_fd, dev_mnt;
  bool dev_nodes_made = false;
  ASSIGN_OR_RETURN(UniqueFd rootfs_mnt,
                   BuildRootfs(spec, sh->userns.get(), host_uid, &upper_fd, &dev_mnt, &dev_nodes_made));

  jail::SandboxPlanOptions po;
  po.root = rootfs;
  po.hostname = spec.hostname.substr(0, 63);
  po.shm_opts = "size=" + std::to_string(spec.resources.tmpfs_mb) + "m,nr_inodes=65536,mode=1777";
  po.dev_nodes_made = dev_nodes_made;
  po.shared_sysfs = st_->sysfs_mnt.valid();
  po.shared_mask = st_->mask_mnt.valid();
  po.cgroup_dirs = sh->cg->dirs();
  UniqueFd cgroup_view;
  if (!po.cgroup_dirs.empty() && st_->detached_cgroup_view.load(std::memory_order_relaxed)) {
    if (StatusOr<UniqueFd> v = jail::DetachedCgroupView(po.cgroup_dirs); v.ok()) {
      cgroup_view = std::move(*v);
      po.cgroup_view_fd = true;
    } else if (st_->detached_cgroup_view.exchange(false)) {
      Log(spdlog::level::warn, "sandboxes build their cgroup view themselves (slower creates)",
          {{"reason", v.status().ToString()}});
    }
  }
  po.lxcfs_dir = st_->options.lxcfs_dir;
  po.nofile = spec.resources.open_files;
  po.best_effort = spec.qos == Qos::kBestEffort;
  po.last_cap = st_->last_cap;
  po.seccomp = st_->have_seccomp ? &st_->seccomp : nullptr;
  ASSIGN_OR_RETURN(WarrenJailPlan init_plan, jail::SandboxInitPlan(po));
  sh->init_plan = std::make_unique<WarrenJailPlan>(init_plan);
  if (int r = SendInitPlan(sh->sock.get(), *sh->init_plan, rootfs_mnt.get(), upper_fd.get()); r != 0) {
    // The shell holds its end until it received this: a closed socket means it died.
    if (r == -EPIPE || r == -ECONNRESET || !sh->Alive())
      return absl::AbortedError("sandbox " + spec.id + ": its shell died before setup");
    return ErrnoToStatus(-r, "sendmsg(sandbox params, rootfs and upper fds)");
  }
  RETURN_IF_ERROR(SendSharedMounts(*st_, sh->sock.get(), std::move(dev_mnt)));
  if (cgroup_view.valid()) {
    if (int r = jail::SendFd(sh->sock.get(), cgroup_view.get()); r != 0)
      return ErrnoToStatus(-r, "sendmsg(cgroup view fd)");
  }
  rootfs_mnt.reset();
  sh->sock.reset();

  // EOF on the error pipe = warren-init was exec'd.
  jail::ChildError ce;
  ssize_t n;
  do n = ::read(sh->err_r.get(), &ce, sizeof ce);
  while (n < 0 && errno == EINTR);
  if (n == sizeof ce) {
    return ErrnoToStatus(ce.err,
                         "sandbox " + spec.id + " setup: " +
                             (ce.step >= kJailStep0 ? jail::StepDescription(*sh->init_plan, ce.step - kJailStep0)
                                                    : std::string(StepName(ce.step))));
  }
  if (n != 0) return absl::InternalError("sandbox " + spec.id + " init died during setup");
  // EOF without a report: exec'd, or killed. execve sets the comm before it
  // closes the O_CLOEXEC pipe, so a process still named "warren-shell" (a
  // zombie, not reaped yet) was killed.
  if (auto comm = ReadSmallFile("/proc/" + std::to_string(sh->pid) + "/comm");
      !comm.ok() || *comm == "warren-shell\n" || !sh->Alive())
    return absl::AbortedError("sandbox " + spec.id + ": its shell died during setup");
  if (spec.qos == Qos::kBestEffort) {
    // Only now: a shell shares warrend's mm until its execve, and the kernel
    // keeps oom_score_adj equal across the processes of one mm (it would
    // reach warrend and every waiting shell). The init itself cannot write
    // its file after it changed ids (jail/plan.h warren_jail_qos_oom_score).
    // Its later children inherit it; execs set their own (warren-spawn).
    const std::string adj = "/proc/" + std::to_string(sh->pid) + "/oom_score_adj";
    RETURN_IF_ERROR(WriteFile(adj, std::to_string(WARREN_JAIL_QOS_BEST_EFFORT_OOM_SCORE_ADJ)));
  }
  const uint64_t start = ProcStartTime(sh->pid);
  auto sb =
      std::make_unique<ContainerSandbox>(st_, spec, sh->slot, sh->pid, start, std::move(sh->pidfd), std::move(sh->cg));
  sb->set_upper(std::move(upper_fd));
  sh->released = true;
  rb.Commit();
  if (Status ns = sb->AttachNetwork(); !ns.ok()) {
    (void)sb->Destroy();
    return ns;
  }
  // Like a container WORKDIR: the default cwd of every exec must exist.
  if (!spec.workdir.empty() && spec.workdir != "/") {
    Status ws = sb->files().Mkdir(spec.workdir, 0755, true);
    if (!ws.ok() && ws.code() != absl::StatusCode::kAlreadyExists) {
      (void)sb->Destroy();
      return Status(ws.code(), "sandbox " + spec.id + ": workdir: " + std::string(ws.message()));
    }
  }
  return std::unique_ptr<Sandbox>(std::move(sb));
}

// A backend record: this backend's message, or the JSON object an older
// daemon wrote (its first byte '{' is never the first byte of the binary
// message: field 15, wire type 3 is not a proto3 encoding).
Status ParseContainerRecord(const std::string& bytes, container::record::Container* r) {
  if (!bytes.empty() && bytes[0] == '{') {
    nlohmann::json j = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return absl::InvalidArgumentError("bad container sandbox record: not a JSON object");
    try {
      if (j.contains("init_pid")) r->set_init_pid(j.at("init_pid").get<int32_t>());
      if (j.contains("init_start_time")) r->set_init_start_time(j.at("init_start_time").get<uint64_t>());
      if (j.contains("slot")) r->set_slot(j.at("slot").get<uint32_t>());
      r->set_host_uid(j.value("host_uid", 0u));
      r->set_cgroup(j.value("cgroup", std::string()));
      r->set_upper_dev(j.value("upper_dev", uint64_t{0}));
      r->set_upper_ino(j.value("upper_ino", uint64_t{0}));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(std::string("bad container sandbox record: ") + e.what());
    }
    return absl::OkStatus();
  }
  if (!r->ParseFromString(bytes)) return absl::InvalidArgumentError("bad container sandbox record: unparsable");
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<Sandbox>> ContainerBackend::Adopt(const SandboxSpec& spec_in,
                                                           const std::string& backend_record) {
  container::record::Container r;
  RETURN_IF_ERROR(ParseContainerRecord(backend_record, &r));
  if (r.init_pid() <= 0 || r.init_start_time() == 0) {
    return absl::InvalidArgumentError("bad container sandbox record: no init pid and start time");
  }
  SandboxSpec spec = spec_in;
  if (spec.hostname.empty()) spec.hostname = spec.id;
  const uint32_t slot = r.slot();
  const pid_t pid = r.init_pid();
  const uint64_t start = r.init_start_time();
  const std::string cg_rel = r.cgroup().empty() ? spec.id : r.cgroup();
  UniqueFd pidfd(PidfdOpen(pid));
  if (!pidfd.valid())
    return absl::NotFoundError("sandbox " + spec.id + ": init pid " + std::to_string(pid) + " is gone");
  if (ProcStartTime(pid) != start)
    return absl::NotFoundError("sandbox " + spec.id + ": init pid " + std::to_string(pid) + " was reused");
  ASSIGN_OR_RETURN(std::unique_ptr<jail::Cgroup> cg, st_->cgroups->Open(cg_rel));
  if (!st_->TakeSpecificSlot(slot))
    return absl::AlreadyExistsError("sandbox " + spec.id + ": uid slot " + std::to_string(slot) + " already in use");
  // Exec cgroups a killed daemon left: frozen on their own if it died in
  // the middle of a SignalAll (their tasks would never run or die again),
  // empty if their exec ended while no daemon ran. The sandbox's own freezer
  // state is the node's to reconcile (Pause/Resume after Adopt).
  (void)cg->ThawDescendants();
  cg->RemoveEmptyDescendants();
  auto sb = std::make_unique<ContainerSandbox>(st_, spec, slot, pid, start, std::move(pidfd), std::move(cg));
  // Not fatal: the sandbox runs; only snapshot/grade/fork are refused (OpenUpper says why).
  (void)sb->ReattachUpper(r.upper_dev(), r.upper_ino());
  // Its policy re-applied (the restarted node's table starts empty).
  RETURN_IF_ERROR(sb->AdoptNetwork(r));
  return std::unique_ptr<Sandbox>(std::move(sb));
}

Status ContainerBackend::Cleanup(const SandboxSpec& spec, const std::string& backend_record) {
  const std::string& id = spec.id;
  const std::string& dir = spec.dir;
  if (dir.empty()) return absl::InvalidArgumentError("cleanup of sandbox '" + id + "' needs its dir");
  container::record::Container r;
  const bool have_record = !backend_record.empty() && ParseContainerRecord(backend_record, &r).ok();
  if (!ValidId(id)) return absl::InvalidArgumentError("bad sandbox id '" + id + "'");
  // A recorded init that is still the same process: kill its pid namespace.
  if (have_record && r.init_pid() > 0 && r.init_start_time() != 0) {
    pid_t pid = r.init_pid();
    UniqueFd pidfd(PidfdOpen(pid));
    if (pidfd.valid() && ProcStartTime(pid) == r.init_start_time()) (void)PidfdSignal(pidfd.get(), SIGKILL);
  }
  // Every process of the sandbox is in its cgroup; all its mounts live in its
  // own mount namespace, which dies with them.
  auto cg = st_->cgroups->Open(have_record && !r.cgroup().empty() ? r.cgroup() : id);
  if (cg.ok()) RETURN_IF_ERROR((*cg)->Destroy(milliseconds(5000)));
  // Mounts a daemon of an older layout may have left on the host under dir.
  if (auto mi = ReadSmallFile("/proc/self/mountinfo", 16 << 20); mi.ok()) {
    std::vector<std::string> targets;
    for (absl::string_view line : absl::StrSplit(*mi, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      if (f.size() > 4 && (f[4] == dir || f[4].rfind(dir + "/", 0) == 0)) targets.push_back(f[4]);
    }
    std::sort(targets.begin(), targets.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
    for (const auto& t : targets) {
      if (::umount2(t.c_str(), UMOUNT_NOFOLLOW) != 0) (void)::umount2(t.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
    }
  }
  std::string rootfs = dir + "/rootfs";
  if (::rmdir(rootfs.c_str()) != 0 && errno != ENOENT) return Errno("rmdir(" + rootfs + ")");
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST)
    return Errno("rmdir(" + dir + ")");
  if (have_record && r.network() && st_->options.network != nullptr && !st_->options.network->InUse(r.network_index()))
    RETURN_IF_ERROR(st_->options.network->Release(r.network_index()));
  if (have_record) st_->ReleaseSlot(r.slot());
  return absl::OkStatus();
}

}  // namespace
}  // namespace warren::runtime::container

namespace warren::runtime {

// The rooms of the backend (runtime/container/*.h) live in container::.
using namespace container;  // NOLINT(google-build-using-namespace)

HostFeatures ProbeHostFeatures() {
  HostFeatures f;
  if (auto m = jail::CgroupManager::Detect("warren"); m.ok()) {
    f.cgroup_version = (*m)->version();
    f.cgroup_parent = (*m)->parent();
  }
  auto maxns = ReadSmallFile("/proc/sys/user/max_user_namespaces");
  int n = 0;
  f.user_namespaces = maxns.ok() && absl::SimpleAtoi(absl::StripAsciiWhitespace(*maxns), &n) && n > 0;
  if (!f.user_namespaces) return f;
  // Idmapped mounts: a tmpfs idmapped with a real (mapped) user namespace of a
  // short-lived child, exactly what Create does with lower layers.
  int sync[2];
  if (::pipe2(sync, O_CLOEXEC) != 0) return f;
  UniqueFd sync_r(sync[0]), sync_w(sync[1]);
  pid_t pid = Clone3(CLONE_NEWUSER, nullptr);
  if (pid < 0) return f;
  if (pid == 0) {
    ::close(sync[1]);  // our copy of the write end: EOF when the parent closes its own
    char b;
    ::_exit(::read(sync_r.get(), &b, 1) < 0 ? 1 : 0);
  }
  sync_r.reset();
  const std::string proc = "/proc/" + std::to_string(pid);
  if (WriteFile(proc + "/uid_map", "0 4000000000 1\n").ok() && WriteFile(proc + "/setgroups", "deny").ok() &&
      WriteFile(proc + "/gid_map", "0 4000000000 1\n").ok()) {
    UniqueFd ns(::open((proc + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
    UniqueFd fs(FsOpen("tmpfs", FSOPEN_CLOEXEC));
    if (ns.valid() && fs.valid() && FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) == 0) {
      UniqueFd mnt(FsMount(fs.get(), FSMOUNT_CLOEXEC, 0));
      mount_attr attr;
      memset(&attr, 0, sizeof attr);
      attr.attr_set = MOUNT_ATTR_IDMAP;
      attr.userns_fd = static_cast<uint64_t>(ns.get());
      f.idmapped_mounts = mnt.valid() && MountSetattr(mnt.get(), "", AT_EMPTY_PATH, &attr) == 0;
    }
  }
  sync_w.reset();
  (void)::waitpid(pid, nullptr, 0);
  return f;
}

StatusOr<std::unique_ptr<Backend>> NewContainerBackend(const ContainerOptions& options) {
  auto st = std::make_shared<BackendState>();
  st->options = options;
  if (options.uid_range == 0 || options.max_sandboxes == 0)
    return absl::InvalidArgumentError("uid_range and max_sandboxes must be > 0");
  ASSIGN_OR_RETURN(st->uid_slots, UidSlots::Open(options.uid_lock_dir, options.uid_owner, options.max_sandboxes,
                                                 options.uid_base, options.uid_range));
  ASSIGN_OR_RETURN(st->cgroups, jail::CgroupManager::Detect(options.cgroup_name, !options.lxcfs_dir.empty()));
  st->init_exe.reset(::open(options.init_path.c_str(), O_PATH | O_CLOEXEC));
  if (!st->init_exe.valid()) return Errno("open(" + options.init_path + ")");
  st->spawn_path = options.spawn_path;
  if (st->spawn_path.empty()) {
    const size_t slash = options.init_path.rfind('/');
    st->spawn_path =
        (slash == std::string::npos ? std::string(".") : options.init_path.substr(0, slash)) + "/warren-spawn";
  }
  if (::access(st->spawn_path.c_str(), X_OK) != 0) return Errno("access(" + st->spawn_path + ", X_OK)");
  st->last_cap = jail::LastCapability();
  if (auto m = MakeSharedMaskMount(); m.ok()) st->mask_mnt = std::move(*m);
  if (auto m = MakeSharedSysfs(); m.ok()) st->sysfs_mnt = std::move(*m);
#ifdef WARREN_HAVE_SECCOMP
  ASSIGN_OR_RETURN(st->seccomp,
                   jail::CompileSeccompProfile(
                       options.seccomp_profile.empty() ? jail::DefaultSeccompProfile() : options.seccomp_profile,
                       /*binary_tree=*/true));
  st->have_seccomp = true;
#endif
  // Shell cgroups a killed daemon left (empty: its shells died with it).
  SweepStaleShellCgroups(*st);
  return std::unique_ptr<Backend>(new ContainerBackend(std::move(st)));
}

}  // namespace warren::runtime
