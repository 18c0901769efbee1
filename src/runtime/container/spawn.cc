#include "runtime/container/spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>

#include "common/child_reaper.h"
#include "init/spawn_plan.h"
#include "jail/plan.h"
#include "jail/plan_builder.h"
#include "jail/syscalls.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace warren::runtime {
namespace {

using jail::PidfdOpen;
using jail::PidfdSignal;

// The command's pid as the kernel stored it in the plan (CLONE_PARENT_SETTID,
// spawn_plan.h); 0 if the helper has not cloned it (yet).
pid_t PlanChildPid(int plan_fd) {
  if (plan_fd < 0) return 0;
  int32_t pid = 0;
  if (::pread(plan_fd, &pid, sizeof pid, offsetof(WarrenSpawnHeader, child_pid)) != static_cast<ssize_t>(sizeof pid))
    return 0;
  return pid > 0 ? pid : 0;
}

// The plan as one buffer (layout: spawn_plan.h).
StatusOr<std::string> EncodePlan(const SpawnRequest& r) {
  WarrenSpawnHeader h;
  memset(&h, 0, sizeof h);
  h.magic = WARREN_SPAWN_MAGIC;
  h.flags = (r.setsid ? WARREN_SPAWN_SETSID : 0u) | (r.tty ? WARREN_SPAWN_TTY : 0u) |
            (r.control_fd >= 0 ? WARREN_SPAWN_CONTROL : 0u);
  h.ns_flags = r.ns_flags;
  // The command's credentials, as a containment plan has them: a non-root
  // command gets no capability in any set (empty bounding set too, so file
  // capabilities grant nothing at execve).
  jail::PlanBuilder b;
  for (const auto& rl : r.rlimits) b.Rlimit(rl.resource, rl.limit.rlim_cur, rl.limit.rlim_max);
  b.BestEffort(r.best_effort);
  b.Ids(r.uid, r.gid, /*setgroups=*/false)
      .Capabilities(r.uid == 0 ? r.caps : 0, r.last_cap)
      .NoNewPrivs()
      .Seccomp(r.seccomp);
  RETURN_IF_ERROR(b.Finish());
  h.creds = b.plan().creds;
  h.creds.filter = nullptr;  // the program follows the header
  h.n_cgroup_fds = static_cast<uint32_t>(r.cgroup_fds.size());
  h.argc = static_cast<uint32_t>(r.argv.size());
  h.envc = static_cast<uint32_t>(r.envp.size());
  h.n_candidates = static_cast<uint32_t>(r.candidates.size());
  if (h.argc == 0) return absl::InvalidArgumentError("spawn: empty argv");
  if (h.argc > 4096) return absl::InvalidArgumentError("spawn: more than 4096 arguments");
  if (h.n_cgroup_fds > 16) return absl::InternalError("spawn: more than 16 cgroup fds");
  std::string strings;
  auto add = [&strings](const std::string& s) {
    strings.append(s);
    strings.push_back('\0');
  };
  add(r.cwd);
  add(r.not_found_msg);
  for (const auto& s : r.argv) add(s);
  for (const auto& s : r.envp) add(s);
  for (const auto& s : r.candidates) add(s);
  h.strings_bytes = static_cast<uint32_t>(strings.size());
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  if (r.seccomp)
    out.append(reinterpret_cast<const char*>(r.seccomp->filter.data()), r.seccomp->filter.size() * sizeof(sock_filter));
  out += strings;
  if (out.size() > WARREN_SPAWN_MAX_PLAN_BYTES)
    return absl::InvalidArgumentError("spawn: argv and environment exceed " +
                                      std::to_string(WARREN_SPAWN_MAX_PLAN_BYTES >> 20) + " MiB");
  return out;
}

}  // namespace

StatusOr<SpawnInFlight> LaunchSpawn(const SpawnRequest& req) {
  ASSIGN_OR_RETURN(std::string plan, EncodePlan(req));
  UniqueFd memfd(static_cast<int>(::syscall(SYS_memfd_create, "warren-spawn-plan", MFD_CLOEXEC)));
  if (!memfd.valid()) return ErrnoToStatus(errno, "memfd_create(warren-spawn-plan)");
  for (size_t off = 0; off < plan.size();) {
    ssize_t n = ::write(memfd.get(), plan.data() + off, plan.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoToStatus(errno, "write(warren-spawn plan)");
    off += static_cast<size_t>(n);
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2(spawn report)");
  UniqueFd rep_r(p[0]), rep_w(p[1]);

  // Target fd -> source fd (spawn_plan.h). Sources that sit on a target
  // number are first moved above every target, so no dup2 clobbers a
  // source still to be copied.
  std::vector<std::pair<int, int>> map = {{0, req.stdin_fd},
                                          {1, req.stdout_fd},
                                          {2, req.stderr_fd},
                                          {WARREN_SPAWN_FD_PLAN, memfd.get()},
                                          {WARREN_SPAWN_FD_REPORT, rep_w.get()},
                                          {WARREN_SPAWN_FD_INIT, req.init_pidfd}};
  if (req.control_fd >= 0) map.emplace_back(WARREN_SPAWN_FD_CONTROL, req.control_fd);
  for (size_t i = 0; i < req.cgroup_fds.size(); ++i)
    map.emplace_back(WARREN_SPAWN_FD_CGROUP0 + static_cast<int>(i), req.cgroup_fds[i]);
  const int first_free = WARREN_SPAWN_FD_CGROUP0 + static_cast<int>(req.cgroup_fds.size());
  std::vector<UniqueFd> moved;
  for (auto& [target, source] : map) {
    if (source < 0) return absl::InternalError("spawn: fd for " + std::to_string(target) + " missing");
    if (source < first_free) {
      UniqueFd m(::fcntl(source, F_DUPFD_CLOEXEC, first_free));
      if (!m.valid()) return ErrnoToStatus(errno, "fcntl(F_DUPFD_CLOEXEC)");
      source = m.get();
      moved.push_back(std::move(m));
    }
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  struct Cleanup {
    posix_spawn_file_actions_t* fa;
    posix_spawnattr_t* attr;
    ~Cleanup() {
      posix_spawn_file_actions_destroy(fa);
      posix_spawnattr_destroy(attr);
    }
  } cleanup{&fa, &attr};
  for (const auto& [target, source] : map) {
    if (int rc = posix_spawn_file_actions_adddup2(&fa, source, target); rc != 0)
      return ErrnoToStatus(rc, "posix_spawn_file_actions_adddup2");
  }
  if (int rc = posix_spawn_file_actions_addclosefrom_np(&fa, first_free); rc != 0)
    return ErrnoToStatus(rc, "posix_spawn_file_actions_addclosefrom_np");
  // Default dispositions and an empty mask: the daemon ignores SIGPIPE and
  // blocks signals in its threads.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  char arg0[] = "warren-spawn";
  char* argv[] = {arg0, nullptr};
  char* envp[] = {nullptr};
  pid_t pid = -1;
  if (int rc = posix_spawn(&pid, req.spawn_path.c_str(), &fa, &attr, argv, envp); rc != 0)
    return ErrnoToStatus(rc, "posix_spawn(" + req.spawn_path + ")");
  SpawnInFlight out;
  out.helper = pid;
  out.helper_pidfd.reset(PidfdOpen(pid));  // our un-reaped child: no reuse race
  if (!out.helper_pidfd.valid()) {
    Status st = ErrnoToStatus(errno, "pidfd_open(warren-spawn " + std::to_string(pid) + ")");
    (void)::kill(pid, SIGKILL);
    (void)::waitpid(pid, nullptr, 0);
    return st;
  }
  out.report = std::move(rep_r);
  out.plan = std::move(memfd);
  return out;
}

// ------------------------------------------------------------------ reaper
// An abandoned spawn is watched here only until its command's pid is known
// (from the report pipe, or from the plan once the helper is gone); every
// pidfd goes to the process-wide ChildReaper, which does the reaping.
struct SpawnReaper::Item {
  UniqueFd plan;          // to find a command whose pid was never reported
  UniqueFd report;        // invalid once EOF was read
  UniqueFd helper_pidfd;  // watched for the helper's exit (then adopted)
  bool Done() const { return !report.valid() && !helper_pidfd.valid(); }
};

SpawnReaper::SpawnReaper() = default;

SpawnReaper::~SpawnReaper() {
  stop_.store(true);
  Wake();
  if (thread_.joinable()) thread_.join();
}

void SpawnReaper::Wake() {
  if (wake_.valid()) {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }
}

namespace {
// SIGKILLs our child `pid` (by pidfd: it is un-reaped, so no reuse race) and
// leaves its reaping to the ChildReaper.
void KillAndReap(pid_t pid) {
  if (pid <= 0) return;
  UniqueFd fd(PidfdOpen(pid));
  if (!fd.valid()) return;
  (void)PidfdSignal(fd.get(), SIGKILL);
  ChildReaper::Get().Adopt(std::move(fd));
}
}  // namespace

void SpawnReaper::Abandon(SpawnInFlight spawn, pid_t child, UniqueFd child_pidfd) {
  if (child_pidfd.valid()) {
    (void)PidfdSignal(child_pidfd.get(), SIGKILL);
    ChildReaper::Get().Adopt(std::move(child_pidfd));
  }
  if (child > 0) {  // nothing left to learn from the helper
    if (spawn.helper_pidfd.valid()) ChildReaper::Get().Adopt(std::move(spawn.helper_pidfd));
    return;
  }
  auto it = std::make_unique<Item>();
  it->report = std::move(spawn.report);
  it->plan = std::move(spawn.plan);
  it->helper_pidfd = std::move(spawn.helper_pidfd);
  std::lock_guard<std::mutex> l(mu_);
  items_.push_back(std::move(it));
  if (!wake_.valid()) wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  Wake();
}

void SpawnReaper::Run() {
  while (!stop_.load()) {
    std::vector<pollfd> pfds;
    std::vector<std::pair<Item*, int>> who;  // item, 0 = report, 1 = helper
    {
      std::lock_guard<std::mutex> l(mu_);
      pfds.push_back({wake_.get(), POLLIN, 0});
      who.emplace_back(nullptr, -1);
      for (auto& it : items_) {
        if (it->report.valid()) {
          pfds.push_back({it->report.get(), POLLIN, 0});
          who.emplace_back(it.get(), 0);
        } else if (it->helper_pidfd.valid()) {
          pfds.push_back({it->helper_pidfd.get(), POLLIN, 0});
          who.emplace_back(it.get(), 1);
        }
      }
    }
    int n = ::poll(pfds.data(), pfds.size(), 1000);
    if (n < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard<std::mutex> l(mu_);
    if (pfds[0].revents) {
      uint64_t v;
      (void)!::read(wake_.get(), &v, sizeof v);
    }
    for (size_t i = 1; i < pfds.size(); ++i) {
      Item* it = who[i].first;
      if (!pfds[i].revents) continue;
      if (who[i].second == 0) {
        WarrenSpawnReport r;
        ssize_t got = ::read(it->report.get(), &r, sizeof r);
        if (got == static_cast<ssize_t>(sizeof r)) {
          if (r.step == WARREN_SPAWN_STEP_STARTED && r.err > 0) {
            KillAndReap(r.err);
            it->plan.reset();  // known: nothing more to learn
          }
        } else if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
          it->report.reset();
        }
      } else {
        // The helper exited: a command it cloned but never reported (killed
        // in between) is found in the plan.
        if (it->plan.valid()) KillAndReap(PlanChildPid(it->plan.get()));
        it->plan.reset();
        ChildReaper::Get().Adopt(std::move(it->helper_pidfd));
      }
    }
    items_.erase(std::remove_if(items_.begin(), items_.end(), [](const auto& it) { return it->Done(); }), items_.end());
  }
}

// ------------------------------------------------------------------ collect
StatusOr<SpawnStarted> CollectSpawn(SpawnInFlight spawn, const std::function<Status()>& keep_waiting,
                                    SpawnReaper& reaper, const std::string& verb, const std::string& cwd) {
  WarrenSpawnReport failure{0, 0};
  pid_t child = -1;
  UniqueFd child_pidfd;
  // Partial records: the pipe carries 8-byte records written whole
  // (PIPE_BUF), so a read returns whole ones.
  for (;;) {
    pollfd pfd{spawn.report.get(), POLLIN, 0};
    int pr = ::poll(&pfd, 1, 100);
    if (pr < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll(" + verb + " spawn report)");
    if (pr > 0) {
      WarrenSpawnReport r;
      ssize_t n = ::read(spawn.report.get(), &r, sizeof r);
      if (n < 0 && errno == EINTR) continue;
      if (n == static_cast<ssize_t>(sizeof r)) {
        if (r.step == WARREN_SPAWN_STEP_STARTED) {
          child = r.err;
          child_pidfd.reset(PidfdOpen(child));  // our (un-reaped) child: no pid reuse race
        } else if (failure.step == 0) {
          failure = r;
        }
        continue;
      }
      break;  // EOF: the helper has exited and the command has exec'd or died
    }
    if (Status s = keep_waiting(); !s.ok()) {
      reaper.Abandon(std::move(spawn), child, std::move(child_pidfd));
      return s;
    }
  }
  // EOF: the helper closed its end at exit; reap it (bounded: it is past
  // every point where it could be frozen or stopped, so this is at once).
  {
    pollfd hp{spawn.helper_pidfd.get(), POLLIN, 0};
    (void)::poll(&hp, 1, 1000);
    if (!TryReapPidfd(spawn.helper_pidfd.get())) ChildReaper::Get().Adopt(std::move(spawn.helper_pidfd));
  }
  if (child <= 0) {  // a helper killed between its clone and its report
    child = PlanChildPid(spawn.plan.get());
    if (child > 0) child_pidfd.reset(PidfdOpen(child));
  }
  if (failure.step != 0) {
    if (child > 0 && child_pidfd.valid()) {
      pollfd cp{child_pidfd.get(), POLLIN, 0};
      (void)::poll(&cp, 1, 1000);  // it exits right after its report
      if (!TryReapPidfd(child_pidfd.get())) ChildReaper::Get().Adopt(std::move(child_pidfd));
    }
    std::string what =
        verb + ": " +
        (failure.step >= WARREN_SPAWN_STEP_JAIL0
             ? std::string(warren_jail_step_name(failure.step - WARREN_SPAWN_STEP_JAIL0))
         : failure.step > 0 && failure.step < WARREN_SPAWN_STEP_COUNT ? kWarrenSpawnStepNames[failure.step]
                                                                      : "?");
    if (failure.step == WARREN_SPAWN_STEP_CHDIR) what += " " + cwd;
    if (Status s = keep_waiting(); !s.ok()) return s;  // e.g. destroyed meanwhile: say that
    return ErrnoToStatus(failure.err, what);
  }
  if (child <= 0 || !child_pidfd.valid()) {
    if (Status s = keep_waiting(); !s.ok()) return s;
    return absl::UnavailableError(verb + ": the sandbox's command helper died before starting the command");
  }
  SpawnStarted out;
  out.pid = child;
  out.pidfd = std::move(child_pidfd);
  return out;
}

}  // namespace warren::runtime
