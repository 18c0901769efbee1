#include "runtime/container/shell_pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/log.h"

namespace warren::runtime::container {

using jail::Clone3;

StatusOr<std::unique_ptr<Shell>> SpawnShell(const std::shared_ptr<BackendState>& st, const std::string& cg_rel,
                                            const jail::CgroupLimits& limits) {
  auto sh = std::make_unique<Shell>();
  sh->st = st;
  ASSIGN_OR_RETURN(sh->slot, st->TakeSlot());
  sh->has_slot = true;
  const uid_t host_uid = st->HostUid(sh->slot);
  jail::CgroupLimits had;
  if ((sh->cg = st->TakeRecycled(cg_rel, &had)) != nullptr) {
    // An unset (0) limit cannot be written back to "none": such a cgroup goes.
    if ((limits.cpu_millis == 0 && had.cpu_millis != 0) || (limits.memory_bytes == 0 && had.memory_bytes != 0) ||
        (limits.pids == 0 && had.pids != 0)) {
      (void)sh->cg->Remove();
      sh->cg.reset();
    } else if (had != limits) {
      if (Status ls = sh->cg->SetLimits(limits); !ls.ok()) {
        (void)sh->cg->Remove();
        return ls;
      }
    }
  }
  if (sh->cg == nullptr) {
    ASSIGN_OR_RETURN(sh->cg, st->cgroups->Create(cg_rel, limits));
  }
  sh->limits = limits;
  // v2: the init lives in a leaf "init" (a cgroup with controllers enabled
  // for its children holds no process). v1 has no such rule: the init joins
  // the sandbox cgroup itself, one mkdir/rmdir pair per hierarchy fewer.
  std::unique_ptr<jail::Cgroup> init_cg;
  if (sh->cg->ChildrenCoverAllControllers()) {
    ASSIGN_OR_RETURN(init_cg, sh->cg->CreateChild("init"));
  }

  int sp[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) return Errno("socketpair");
  UniqueFd sock_child(sp[1]);
  sh->sock.reset(sp[0]);
  UniqueFd err_w;
  {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Errno("pipe2");
    sh->err_r.reset(p[0]);
    err_w.reset(p[1]);
  }
  sh->plan = std::make_unique<InitPlan>();
  InitPlan& plan = *sh->plan;
  plan.sock = sock_child.get();
  plan.err_fd = err_w.get();
  plan.init_exe = st->init_exe.get();
  plan.last_cap = st->last_cap;
  plan.shared_sysfs = st->sysfs_mnt.valid();
  plan.shared_mask = st->mask_mnt.valid();
  plan.seccomp = st->have_seccomp ? &st->seccomp : nullptr;

  constexpr int kShellNs = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET;
  int pidfd_raw = -1;
  pid_t pid;
  if constexpr (kSpawnSharesMemory) {
    // CLONE_VM without CLONE_VFORK: the parent goes on while the shell waits
    // (it only runs async-signal-safe code on its own stack until execve).
    // It shares the spawning thread's TLS, errno included: its failing calls
    // during set-up (mkdir EEXIST, masks ENOENT) run after the params were
    // sent, i.e. while the creating thread blocks on the error pipe (inline
    // spawn) or while the refill thread spawns the next shell, whose error
    // classification may then be wrong: that spawn fails and is retried.
    // Nothing the create returns depends on it.
    sh->stack = std::make_unique<ChildStacks>();
    RETURN_IF_ERROR(sh->stack->Map(1));
    pid = ::clone([](void* pl) -> int { InitChild(*static_cast<const InitPlan*>(pl)); }, sh->stack->Top(0),
                  CLONE_VM | CLONE_PIDFD | kShellNs | SIGCHLD, &plan, &pidfd_raw);
    if (pid < 0) return Errno("clone(sandbox init, CLONE_VM)");
  } else {
    pid = Clone3(CLONE_PIDFD | kShellNs, &pidfd_raw);
    if (pid < 0) return Errno("clone3(sandbox init)");
    if (pid == 0) InitChild(plan);
  }
  sh->pid = pid;
  sh->pidfd.reset(pidfd_raw);
  sock_child.reset();
  err_w.reset();

  const std::string proc = "/proc/" + std::to_string(pid);
  const std::string map = "0 " + std::to_string(host_uid) + " " + std::to_string(st->options.uid_range) + "\n";
  RETURN_IF_ERROR(WriteFile(proc + "/uid_map", map));
  // setgroups stays allowed (as in Docker's and runc's user namespaces): the
  // sandbox's root may set supplementary groups within its own mapped range
  // (initgroups in su, sudo, apt's _apt sandbox, xterm's privilege drop).
  // "deny" guards a namespace made by an unprivileged user, whose dropped
  // host groups could bypass a negative group ACL; here every mapped gid is
  // the sandbox's own private range, so dropping one gains nothing.
  RETURN_IF_ERROR(WriteFile(proc + "/gid_map", map));
  // Every cgroup.procs write takes the cgroup mutex (and may wait for an RCU
  // grace period): one write per hierarchy.
  RETURN_IF_ERROR(init_cg != nullptr ? init_cg->AddProcess(pid) : sh->cg->AddProcess(pid));
  sh->userns.reset(::open((proc + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
  if (!sh->userns.valid()) return Errno("open(" + proc + "/ns/user)");
  return sh;
}

void SweepStaleShellCgroups(BackendState& st) {
  auto root = st.cgroups->Open("");
  if (!root.ok()) return;
  std::set<std::string> names;
  for (const std::string& d : (*root)->dirs()) {
    DIR* dp = ::opendir(d.c_str());
    if (dp == nullptr) continue;
    for (int i = 0; i < 1 << 20; ++i) {
      dirent* de = ::readdir(dp);
      if (de == nullptr) break;
      if (de->d_type == DT_DIR && strncmp(de->d_name, "shell-", 6) == 0) names.insert(de->d_name);
    }
    ::closedir(dp);
  }
  for (const std::string& n : names) {
    std::vector<std::string> f = absl::StrSplit(n, '-');
    pid_t owner = 0;
    if (f.size() != 3 || !absl::SimpleAtoi(f[1], &owner) || owner <= 0) continue;
    if (::kill(owner, 0) == 0) continue;  // its daemon (maybe this process) may still run
    // The dead daemon's shells notice its end (their socket's EOF) and exit
    // on their own, but maybe not yet: kill what is left and wait for the
    // cgroup to empty (rmdir of a cgroup with an exiting task fails EBUSY).
    if (auto cg = st.cgroups->Open(n); cg.ok()) {
      if (Status s = (*cg)->Destroy(std::chrono::seconds(5)); !s.ok())
        Log(spdlog::level::warn, "stale warm-shell cgroup left", {{"cgroup", n}, {"error", s.ToString()}});
    }
  }
}

}  // namespace warren::runtime::container
