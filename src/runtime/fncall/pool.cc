// The fncall worker pool: spawning a worker (uid slot, cgroup, jail, the
// zygote's init), handing workers out and taking them back, shrinking idle
// ones, NewFnCallPool.
#include <dirent.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "jail/cgroup.h"
#include "jail/contain.h"
#include "jail/plan.h"
#include "jail/plan_builder.h"
#include "jail/seccomp.h"
#include "jail/syscalls.h"
#include "runtime/fncall/fncall_internal.h"

namespace warren::runtime::fncall::internal {

using jail::Clone3;

std::optional<uint64_t> ReadOomKills(int fd) {
  char buf[1024];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  for (const char* p = buf; (p = strstr(p, "oom_kill ")) != nullptr; p += 9) {
    if (p == buf || p[-1] == '\n') return strtoull(p + 9, nullptr, 10);
  }
  return std::nullopt;
}

// Parent pid of `pid` from /proc/<pid>/stat; -1 if it is gone.
pid_t ParentPid(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return -1;
  ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* rp = strrchr(buf, ')');  // comm may contain spaces and ')'
  int ppid = -1;
  if (rp == nullptr || sscanf(rp + 1, " %*c %d", &ppid) != 1) return -1;
  return ppid;
}

// True if `pids` (a worker cgroup's) are the zygote plus at most one process
// whose parent is the zygote (its pre-forked, waiting call process).
bool OnlyZygoteAndOneChild(const std::vector<pid_t>& pids, pid_t zygote) {
  bool has_zygote = false;
  int children = 0;
  for (pid_t p : pids) {
    if (p == zygote) {
      has_zygote = true;
    } else if (ParentPid(p) == zygote) {
      ++children;
    } else {
      return false;
    }
  }
  return has_zygote && children <= 1;
}

StatusOr<std::unique_ptr<Worker>> FnCallPoolImpl::Spawn(const PoolKey& key) {
  auto w = std::make_unique<Worker>();
  uint64_t serial;
  {
    std::lock_guard<std::mutex> l(mu_);
    uint32_t i = 0;
    for (; i < opt_.uid_count && slots_[(next_slot_ + i) % opt_.uid_count]; ++i) {
    }
    if (i == opt_.uid_count) return absl::ResourceExhaustedError("fncall: no free worker uid slot");
    w->slot = (next_slot_ + i) % opt_.uid_count;
    slots_[w->slot] = true;
    next_slot_ = w->slot + 1;
    serial = ++worker_counter_;
  }
  struct SlotGuard {
    FnCallPoolImpl* self;
    uint32_t slot;
    bool armed = true;
    ~SlotGuard() {
      if (!armed) return;
      std::lock_guard<std::mutex> l(self->mu_);
      self->slots_[slot] = false;
    }
  } slot_guard{this, w->slot};
  const uid_t host_uid = opt_.uid_base + w->slot;

  jail::CgroupLimits lim;
  lim.cpu_millis = opt_.cpu_millis;
  lim.memory_bytes = uint64_t{opt_.default_memory_mb} << 20;
  lim.pids = opt_.pids;
  const std::string rel = "w" + std::to_string(::getpid()) + "-" + std::to_string(serial);
  ASSIGN_OR_RETURN(w->cgroup, cgroups_->Create(rel, lim));  // ~Worker destroys it on failure
  w->memory_bytes = lim.memory_bytes;
  for (const std::string& dir : w->cgroup->dirs()) {
    for (const char* f : {"/memory.oom_control", "/memory.events"}) {
      if (w->oom_fd.valid()) break;
      w->oom_fd.reset(::open((dir + f).c_str(), O_RDONLY | O_CLOEXEC));
      if (w->oom_fd.valid() && !ReadOomKills(w->oom_fd.get())) w->oom_fd.reset();
    }
  }

  int sp[2], ch[2], ep[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) return Errno("socketpair(setup)");
  UniqueFd setup_parent(sp[0]), setup_child(sp[1]);
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ch) != 0) return Errno("socketpair(channel)");
  UniqueFd chan_parent(ch[0]), chan_child(ch[1]);
  if (::pipe2(ep, O_CLOEXEC) != 0) return Errno("pipe2");
  UniqueFd err_r(ep[0]), err_w(ep[1]);

  // The zygote's start-up environment (zygote.py replaces it with
  // DefaultCallEnv() before any call). LD_BIND_NOW: every symbol is bound
  // when the zygote loads, so call processes do not resolve (and copy the
  // GOT pages of) the functions they call first: 180 -> 168 page faults per
  // trivial call.
  static const char* const kEnv[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",  "HOME=/tmp",
                                     "PYTHONDONTWRITEBYTECODE=1",         "LD_BIND_NOW=1", nullptr};
  std::string zsrc = ZygoteSource();
  std::string a0 = "python3", a1 = "-I", a2 = "-S", a3 = "-c";
  WorkerPlan plan;
  plan.sock = setup_child.get();
  plan.chan = chan_child.get();
  plan.err_fd = err_w.get();
  plan.helper = helper_.get();
  ASSIGN_OR_RETURN(const WarrenJailPlan worker_jail,
                   WorkerJailPlan(opt_.mount_point, w->cgroup->dirs(), opt_.lxcfs_dir));
  const WarrenJailPlan* jail_plan = &worker_jail;
  plan.jail = jail_plan;
  plan.argv = {a0.data(), a1.data(), a2.data(), a3.data(), zsrc.data(), nullptr};
  for (const char* e : kEnv) plan.envp.push_back(const_cast<char*>(e));

  int pidfd_raw = -1;
  pid_t pid =
      Clone3(CLONE_PIDFD | CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET,
             &pidfd_raw);
  if (pid < 0) return Errno("clone3(fncall worker)");
  if (pid == 0) WorkerChild(plan);
  w->pid = pid;  // from here ~Worker kills and reaps it
  w->pidfd.reset(pidfd_raw);
  setup_child.reset();
  chan_child.reset();
  err_w.reset();

  const std::string proc = "/proc/" + std::to_string(pid);
  RETURN_IF_ERROR(WriteString(proc + "/uid_map", "0 " + std::to_string(host_uid) + " 1\n"));
  RETURN_IF_ERROR(WriteString(proc + "/setgroups", "deny"));
  RETURN_IF_ERROR(WriteString(proc + "/gid_map", "0 " + std::to_string(host_uid) + " 1\n"));
  RETURN_IF_ERROR(w->cgroup->AddProcess(pid));
  ASSIGN_OR_RETURN(UniqueFd root, BuildRoot(key.lower_dirs));
  if (int r = jail::SendFd(setup_parent.get(), root.get()); r != 0) return ErrnoToStatus(-r, "sendmsg(rootfs fd)");
  root.reset();
  setup_parent.reset();
  jail::ChildError ce;
  ssize_t n;
  do n = ::read(err_r.get(), &ce, sizeof ce);
  while (n < 0 && errno == EINTR);
  if (n == sizeof ce) {
    return ErrnoToStatus(ce.err, "fncall worker setup: " +
                                     (ce.step >= kJailStep0 ? jail::StepDescription(*jail_plan, ce.step - kJailStep0)
                                                            : std::string(StepName(ce.step))));
  }
  if (n != 0) return absl::InternalError("fncall worker died during setup");

  w->chan = std::move(chan_parent);
  const auto deadline = Clock::now() + milliseconds(20000);
  ASSIGN_OR_RETURN(const WarrenJailPlan call_plan,
                   CallJailPlan(opt_.scratch_mb, seccomp_ ? &*seccomp_ : nullptr, !opt_.lxcfs_dir.empty()));
  RETURN_IF_ERROR(SendMsgUntil(
      w->chan.get(), Frame(json{{"op", "init"}, {"env", DefaultCallEnv()}}, jail::PlanBytes(call_plan)), {}, deadline));
  auto ready = ReadJsonFrame(w->chan.get(), deadline);
  if (!ready.ok() || ready->value("op", "") != "ready") {
    return absl::InternalError("fncall worker: python zygote did not start (is /usr/bin/python3 in the layers?): " +
                               ready.status().ToString());
  }
  slot_guard.armed = false;
  w->last_used = Clock::now();
  return w;
}

StatusOr<std::unique_ptr<Worker>> FnCallPoolImpl::Acquire(const PoolKey& key) {
  std::unique_lock<std::mutex> l(mu_);
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  for (int i = 0; i < 1 << 20; ++i) {
    if (stop_) return absl::UnavailableError("fncall pool shutting down");
    Pool& p = pools_[key];
    if (!p.idle.empty()) {
      auto w = std::move(p.idle.back());  // LIFO: the warmest worker
      p.idle.pop_back();
      return w;
    }
    if (total_ < opt_.max_workers) break;
    // Node full: destroy an idle worker of another pool, if any, to make room.
    std::unique_ptr<Worker> victim;
    for (auto& [k, other] : pools_) {
      if (!other.idle.empty()) {
        victim = std::move(other.idle.front());
        other.idle.pop_front();
        break;
      }
    }
    if (victim) {
      const uint32_t slot = victim->slot;
      l.unlock();
      victim.reset();
      l.lock();
      slots_[slot] = false;
      --total_;
      ++stats_.discarded;
      continue;
    }
    if (total_ < opt_.max_workers) break;
    if (cv_.wait_until(l, give_up) == std::cv_status::timeout)
      return absl::ResourceExhaustedError("fncall: all " + std::to_string(opt_.max_workers) +
                                          " workers busy for 60 s; retry later");
  }
  ++total_;
  ++stats_.spawned;
  l.unlock();
  auto w = Spawn(key);
  if (!w.ok()) {
    std::lock_guard<std::mutex> g(mu_);
    --total_;
    cv_.notify_one();
  }
  return w;
}

void FnCallPoolImpl::Release(const PoolKey& key, std::unique_ptr<Worker> w, bool healthy) {
  if (healthy) {
    w->last_used = Clock::now();
    std::lock_guard<std::mutex> l(mu_);
    if (!stop_) {
      pools_[key].idle.push_back(std::move(w));
      cv_.notify_one();
      return;
    }
  }
  uint32_t slot = w->slot;
  w.reset();  // kills the worker, removes its cgroup
  std::lock_guard<std::mutex> l(mu_);
  slots_[slot] = false;
  --total_;
  ++stats_.discarded;
  cv_.notify_one();
}

void FnCallPoolImpl::Shrink(milliseconds idle_timeout) {
  std::vector<std::unique_ptr<Worker>> gone;
  {
    std::lock_guard<std::mutex> l(mu_);
    const auto cutoff = Clock::now() - idle_timeout;
    for (auto it = pools_.begin(); it != pools_.end();) {
      auto& idle = it->second.idle;
      while (!idle.empty() && idle.front()->last_used <= cutoff) {
        gone.push_back(std::move(idle.front()));
        idle.pop_front();
      }
      it = idle.empty() ? pools_.erase(it) : std::next(it);
    }
  }
  for (auto& w : gone) {
    uint32_t slot = w->slot;
    w.reset();
    std::lock_guard<std::mutex> l(mu_);
    slots_[slot] = false;
    --total_;
    ++stats_.discarded;
  }
  if (!gone.empty()) cv_.notify_all();
}

void FnCallPoolImpl::ReaperLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    reaper_cv_.wait_for(l, milliseconds(1000));
    if (stop_) break;
    l.unlock();
    Shrink(opt_.idle_timeout);
    l.lock();
  }
}

// Worker cgroups are named w<daemon pid>-<n>. A daemon that died left its
// workers' cgroups behind (the workers themselves exit when their channel
// closes); remove those whose daemon is gone. Best effort.
void RemoveStaleWorkerCgroups(jail::CgroupManager& cg) {
  const std::string parent = cg.parent();
  for (const std::string& mount : {std::string("/sys/fs/cgroup/memory"), std::string("/sys/fs/cgroup")}) {
    DIR* d = ::opendir((mount + parent).c_str());
    if (d == nullptr) continue;
    std::vector<std::string> stale;
    for (int i = 0; i < 100000; ++i) {
      dirent* e = ::readdir(d);
      if (e == nullptr) break;
      int pid = 0;
      if (e->d_type != DT_DIR || e->d_name[0] != 'w' || sscanf(e->d_name + 1, "%d-", &pid) != 1) continue;
      if (pid == ::getpid() || ::kill(pid, 0) == 0) continue;
      stale.push_back(e->d_name);
    }
    ::closedir(d);
    for (const auto& rel : stale) {
      if (auto c = cg.Open(rel); c.ok()) (void)(*c)->Destroy(milliseconds(2000));
    }
  }
}

}  // namespace warren::runtime::fncall::internal

namespace warren::runtime {

using fncall::internal::Errno;
using fncall::internal::FnCallPoolImpl;
using fncall::internal::RemoveStaleWorkerCgroups;

StatusOr<std::unique_ptr<FnCallPool>> NewFnCallPool(const FnCallOptions& options) {
  FnCallOptions o = options;
  if (o.mount_point.empty() || o.mount_point[0] != '/')
    return absl::InvalidArgumentError("fncall: mount_point must be an absolute directory");
  if (::mkdir(o.mount_point.c_str(), 0755) != 0 && errno != EEXIST) return Errno("mkdir(" + o.mount_point + ")");
  if (o.max_workers == 0) o.max_workers = 1;
  if (o.uid_count == 0) o.uid_count = 1;
  ASSIGN_OR_RETURN(auto cg, jail::CgroupManager::Detect(o.cgroup_name, !o.lxcfs_dir.empty()));
  RemoveStaleWorkerCgroups(*cg);
  std::optional<jail::SeccompProgram> sc;
  auto prog = jail::CompileSeccompProfile(o.seccomp_profile.empty() ? jail::DefaultSeccompProfile() : o.seccomp_profile,
                                          /*binary_tree=*/true);
  if (!prog.ok()) return prog.status();
  sc = std::move(*prog);
  // The zygote helper, shared read-only by every worker (sealed).
  const std::string& so = ZygoteHelperSo();
  UniqueFd helper(::memfd_create("warren-fncall-helper", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!helper.valid()) return Errno("memfd_create(warren-fncall-helper)");
  for (size_t off = 0, i = 0; off < so.size() && i < 1024; ++i) {
    ssize_t n = ::write(helper.get(), so.data() + off, so.size() - off);
    if (n <= 0) return Errno("write(warren-fncall-helper memfd)");
    off += static_cast<size_t>(n);
  }
  if (::fcntl(helper.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0)
    return Errno("fcntl(warren-fncall-helper memfd, F_ADD_SEALS)");
  // Above the fds a worker's child moves into place (3, 4): dup2 must not clobber it.
  helper.reset(::fcntl(helper.get(), F_DUPFD_CLOEXEC, 10));
  if (!helper.valid()) return Errno("fcntl(warren-fncall-helper memfd, F_DUPFD_CLOEXEC)");
  return std::unique_ptr<FnCallPool>(new FnCallPoolImpl(std::move(o), std::move(cg), std::move(sc), std::move(helper)));
}

}  // namespace warren::runtime
