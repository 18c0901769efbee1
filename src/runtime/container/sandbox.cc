#include "runtime/container/sandbox.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/child_reaper.h"
#include "common/output_pump.h"
#include "common/rollback.h"
#include "runtime/container/command.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace warren::runtime::container {

namespace {
constexpr int kNsFlags =
    CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWCGROUP;
}  // namespace

StatusOr<SpawnRequest> ContainerSandbox::PrepareSpawn(const ExecSpec& es, const char* op, bool default_term) {
  SpawnRequest req;
  req.spawn_path = st_->spawn_path;
  req.init_pidfd = pidfd_.get();
  req.ns_flags = kNsFlags;
  req.last_cap = st_->last_cap;
  req.caps = jail::DefaultCapabilityMask();
  req.seccomp = st_->have_seccomp ? &st_->seccomp : nullptr;
  req.rlimits = SandboxRlimits(spec_.resources);
  req.best_effort = spec_.qos == Qos::kBestEffort;
  std::string home;
  {
    std::string root_path = "/proc/" + std::to_string(init_pid_) + "/root";
    UniqueFd root(::open(root_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid() || PidfdSignal(pidfd_.get(), 0) != 0)
      return absl::FailedPreconditionError("sandbox " + spec_.id + " has no running init");
    ASSIGN_OR_RETURN(UserIds ids,
                     ResolveUser(es.user.empty() ? spec_.user : es.user, root.get(), st_->options.uid_range));
    req.uid = ids.uid;
    req.gid = ids.gid;
    home = std::move(ids.home);
  }
  req.cwd = es.cwd.empty() ? (spec_.workdir.empty() ? "/" : spec_.workdir) : es.cwd;
  RETURN_IF_ERROR(FillCommand(es, spec_.env, op, default_term, home, &req));
  return req;
}

StatusOr<SpawnStarted> ContainerSandbox::SpawnCommand(const SpawnRequest& req, const char* verb,
                                                      Clock::time_point deadline, bool* timed_out) {
  *timed_out = false;
  const std::string v = verb;
  auto paused = [&]() -> Status {
    return absl::AbortedError("sandbox " + spec_.id + " was paused while the " + v +
                              " was starting (resume it and retry)");
  };
  if (paused_since_ns_.load() != 0) return paused();
  const int64_t paused0 = PausedNs();
  ASSIGN_OR_RETURN(SpawnInFlight spawn, LaunchSpawn(req));
  auto keep_waiting = [&]() -> Status {
    if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed during " + v);
    if (paused_since_ns_.load() != 0) return paused();
    if (deadline != Clock::time_point::max() &&
        Clock::now() >=
            deadline + std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(PausedNs() - paused0))) {
      *timed_out = true;
      return absl::DeadlineExceededError(v + " timed out before the command started");
    }
    return absl::OkStatus();
  };
  return CollectSpawn(std::move(spawn), keep_waiting, st_->reaper, v, req.cwd);
}

void ContainerSandbox::SweepExecCgroups() {
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = lingering_.begin(); it != lingering_.end();) {
    if ((*it)->Empty() && (*it)->Remove().ok()) {
      it = lingering_.erase(it);
    } else {
      ++it;
    }
  }
}

StatusOr<ExecOutcome> ContainerSandbox::Exec(const ExecSpec& es) {
  const auto t0 = Clock::now();
  std::optional<SpawnGuard> spawning(std::in_place, this);  // until the command runs (see Destroy)
  if (!spawning->ok) return absl::FailedPreconditionError("sandbox " + spec_.id + " is destroyed");
  if (es.argv.empty() && !es.shell) return absl::InvalidArgumentError("exec: neither argv nor shell given");
  SweepExecCgroups();

  ASSIGN_OR_RETURN(SpawnRequest req, PrepareSpawn(es, "exec", /*default_term=*/false));

  // Per-exec cgroup: tracks the whole tree (setsid / double fork included).
  ASSIGN_OR_RETURN(std::unique_ptr<jail::Cgroup> ecg,
                   cgroup_->CreateChild("exec-" + std::to_string(exec_seq_.fetch_add(1))));
  Rollback rb;
  rb.Add([&ecg] { (void)ecg->Destroy(milliseconds(2000)); });
  ASSIGN_OR_RETURN(std::vector<UniqueFd> join_fds, JoinFds(*cgroup_, *ecg));
  for (auto& f : join_fds) req.cgroup_fds.push_back(f.get());

  UniqueFd in_r, in_w, out_r, out_w, err_r, err_w;
  RETURN_IF_ERROR(MakePipe(in_r, in_w));
  RETURN_IF_ERROR(MakePipe(out_r, out_w, /*big=*/true));
  RETURN_IF_ERROR(MakePipe(err_r, err_w, /*big=*/true));
  req.stdin_fd = in_r.get();
  req.stdout_fd = out_w.get();
  req.stderr_fd = es.merge_stderr ? out_w.get() : err_w.get();

  // The timeout counts running time only: time the sandbox spends paused
  // moves the deadline (no burst of timeouts after a resume). It bounds the
  // spawn too: a command stopped before its execve (by a signal from inside
  // the sandbox) ends the exec as timed out.
  const auto base_deadline = es.timeout.count() > 0 ? t0 + es.timeout : Clock::time_point::max();
  const int64_t paused0 = PausedNs();
  const uint64_t oom_before = cgroup_->OomKillCount();
  bool setup_timed_out = false;
  StatusOr<SpawnStarted> spawned = SpawnCommand(req, "exec", base_deadline, &setup_timed_out);
  in_r.reset();
  out_w.reset();
  err_w.reset();
  join_fds.clear();
  if (!spawned.ok()) {
    // A failed step's processes are reaped already: the cgroup goes now. A
    // spawn given up on (destroyed, paused, timed out) may still sit frozen
    // in it: it goes with the sandbox or a later sweep, never waited for here.
    rb.Commit();
    if (!(ecg->Empty() && ecg->Remove().ok())) {
      (void)ecg->SignalAll(SIGKILL);
      std::lock_guard<std::mutex> l(mu_);
      lingering_.push_back(std::move(ecg));
    }
    if (!setup_timed_out) return spawned.status();
    ExecOutcome out;
    out.timed_out = true;
    out.signal = SIGKILL;
    out.exit_code = 128 + SIGKILL;
    out.duration = Clock::now() - t0;
    return out;
  }
  spawning.reset();
  UniqueFd cpidfd = std::move(spawned->pidfd);

  ExecOutcome out;
  siginfo_t info;
  memset(&info, 0, sizeof info);
  PumpStream so, se;
  so.fd = std::move(out_r);
  so.cap = es.output_cap_bytes;
  se.fd = std::move(err_r);
  se.cap = es.output_cap_bytes;
  PumpOptions po;
  po.exit_fd = cpidfd.get();
  po.on_exit_readable = [&]() -> StatusOr<bool> {
    memset(&info, 0, sizeof info);
    return ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(cpidfd.get()), &info, WEXITED | WNOHANG) == 0 &&
           info.si_pid != 0;
  };
  po.stdin_fd = &in_w;
  po.stdin_data = es.stdin_data;
  if (base_deadline != Clock::time_point::max()) {
    po.deadline = [&] {
      return base_deadline +
             std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(PausedNs() - paused0));
    };
  }
  po.kill = [&ecg](int sig) { (void)ecg->SignalAll(sig); };
  po.kill_grace = es.kill_grace;
  po.what = "exec";
  po.cancelled = es.cancelled;
  StatusOr<PumpResult> pumped = PumpOutput(po, {&so, &se});
  if (!pumped.ok()) {
    // Never leave the command behind: killed, its tree too, and reaped
    // by the ChildReaper; the exec cgroup goes with the rollback.
    (void)ecg->SignalAll(SIGKILL);
    (void)PidfdSignal(cpidfd.get(), SIGKILL);
    ChildReaper::Get().Adopt(std::move(cpidfd));
    return pumped.status();
  }
  out.timed_out = pumped->timed_out;
  const Clock::time_point kill_at = pumped->kill_at;
  out.stdout_truncated = so.truncated();
  out.stdout_total = so.total;
  out.stdout_data = std::move(so.data);
  out.stderr_truncated = se.truncated();
  out.stderr_total = se.total;
  out.stderr_data = std::move(se.data);
  if (info.si_code == CLD_EXITED) {
    out.exit_code = info.si_status;
  } else {
    out.signal = info.si_status;
    out.exit_code = 128 + info.si_status;
  }
  // Any OOM kill in the sandbox's memcg during the exec (the victim may be a
  // child of the foreground shell, which then exits 137 by itself). Concurrent
  // execs of one sandbox share the counter.
  out.oom_killed = cgroup_->OomKillCount() > oom_before;
  if (out.timed_out) {
    // The whole tree goes: SIGTERM was sent; give the rest kill_grace, then SIGKILL.
    auto until = std::max(kill_at, Clock::now());
    for (int i = 0; i < 10000 && !ecg->Empty() && Clock::now() < until; ++i)
      std::this_thread::sleep_for(milliseconds(5));
    (void)ecg->Destroy(milliseconds(2000));
    rb.Commit();
  } else {
    rb.Commit();
    if (ecg->Empty() && ecg->Remove().ok()) {
      // done
    } else {
      // Background processes stay alive (documented policy) in their exec
      // cgroup until they exit or the sandbox is destroyed.
      std::lock_guard<std::mutex> l(mu_);
      lingering_.push_back(std::move(ecg));
    }
  }
  out.duration = Clock::now() - t0;
  return out;
}

Status ContainerSandbox::Destroy() {
  {
    std::lock_guard<std::mutex> pl(pause_mu_);  // no Pause/Resume/Reclaim runs past this point
    destroyed_.store(true);
  }
  // A spawn helper that joined a paused sandbox is frozen in the middle of
  // its spawn: thawed, it finishes (its command dies with the sandbox below)
  // instead of holding the wait for spawns to its bound.
  (void)cgroup_->ThawTree();
  // Execs and Starts past their destroyed_ check may still be joining this
  // sandbox's cgroups: they finish (fail on the dead init) before the
  // cgroup may go to another sandbox. Bounded: a stuck one blocks recycling.
  bool spawns_drained = false;
  for (int i = 0; i < 2000; ++i) {
    if (spawns_in_flight_.load() == 0) {
      spawns_drained = true;
      break;
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (destroy_done_) return absl::OkStatus();
  // SIGKILL of the pid namespace's init kills every process in it; the cgroup
  // kill catches helpers still outside the pid namespace.
  if (pidfd_.valid()) {
    (void)PidfdSignal(pidfd_.get(), SIGKILL);
    // A paused sandbox, or an exec cgroup frozen on its own (by SignalAll
    // when a daemon was killed): a frozen task ignores SIGKILL until thawed
    // (v1), and init's exit waits for every task of its pid namespace.
    (void)cgroup_->ThawTree();
    pollfd pfd{pidfd_.get(), POLLIN, 0};
    (void)::poll(&pfd, 1, 2000);
    // init is a child of the daemon that created it (not after Adopt by
    // another process): reap it, by pidfd (its pid may be reused once
    // reaped). Still exiting after the bound: the process-wide reaper takes it.
    if (!TryReapPidfd(pidfd_.get())) {
      UniqueFd dup(::fcntl(pidfd_.get(), F_DUPFD_CLOEXEC, 3));
      ChildReaper::Get().Adopt(std::move(dup));
    }
  }
  // Its netns dies with its processes, and the veth pair with it; the
  // node's side (link, filter, address) goes now, not when the kernel gets to it.
  Status ns = ReleaseNetwork();
  // Emptied, the cgroup is recycled for a later shell when it can be (see
  // ContainerOptions::recycled_cgroups), else removed.
  lingering_.clear();  // exec cgroups: removed with the children below
  // A task still exiting (or frozen by a concurrent exec timeout's
  // SignalAll) may take longer than one round under load: three rounds.
  Status cs = cgroup_->Evacuate(milliseconds(5000));
  for (int round = 1; round < 3 && absl::IsUnavailable(cs); ++round) cs = cgroup_->Evacuate(milliseconds(5000));
  if (cs.ok() && (reclaimed_.load() || !spawns_drained || !st_->Recycle(*cgroup_, LimitsOf(spec_))))
    cs = cgroup_->Destroy(milliseconds(5000));
  upper_.reset();
  std::string rootfs = spec_.dir + "/rootfs";
  if (::rmdir(rootfs.c_str()) != 0 && errno != ENOENT && cs.ok()) cs = Errno("rmdir(" + rootfs + ")");
  // The runtime dir goes too when empty (the caller may keep its own files there).
  if (::rmdir(spec_.dir.c_str()) != 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST && cs.ok())
    cs = Errno("rmdir(" + spec_.dir + ")");
  if (cs.ok()) cs = ns;
  if (cs.ok()) {
    destroy_done_ = true;
    st_->ReleaseSlot(slot_);
  }
  return cs;
}

}  // namespace warren::runtime::container
