// Background processes of a container sandbox (ProcessStarter::Start) and
// the Process handle the caller pumps.
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cstring>

#include "common/child_reaper.h"
#include "common/rollback.h"
#include "runtime/container/command.h"
#include "runtime/container/sandbox.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace warren::runtime::container {

namespace {

// How long a background process's spawn may take (paused time excluded).
constexpr milliseconds kStartSetupLimit{30000};

class ContainerProcess : public Process {
 public:
  ContainerProcess(ContainerSandbox* sb, pid_t pid, UniqueFd pidfd, std::unique_ptr<jail::Cgroup> ecg,
                   uint64_t oom_before)
      : sb_(sb), pid_(pid), pidfd_(std::move(pidfd)), ecg_(std::move(ecg)), oom_before_(oom_before) {}
  ~ContainerProcess() override {
    if (!reaped_) {
      // Not waited for: reap later is impossible once we are gone, so the
      // foreground is killed with its tree rather than left a zombie.
      (void)ecg_->SignalAll(SIGKILL);
      (void)PidfdSignal(pidfd_.get(), SIGKILL);
      pollfd pfd{pidfd_.get(), POLLIN, 0};
      (void)::poll(&pfd, 1, 2000);  // bounded: a frozen sandbox delays the kill
      // Not dead yet (frozen): reaped by the process-wide reaper once it is.
      if (!TryReapPidfd(pidfd_.get())) ChildReaper::Get().Adopt(std::move(pidfd_));
    }
    sb_->ReleaseExecCgroup(std::move(ecg_));
  }
  pid_t pid() const override { return pid_; }
  int pidfd() const override { return pidfd_.get(); }
  UniqueFd TakeStdin() override { return std::move(stdin_); }
  UniqueFd TakeStdout() override { return std::move(stdout_); }
  UniqueFd TakeStderr() override { return std::move(stderr_); }
  UniqueFd TakeControl() override { return std::move(control_); }

  StatusOr<bool> TryWait(ExecOutcome* out) override {
    if (reaped_) return absl::FailedPreconditionError("process " + std::to_string(pid_) + " already reaped");
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info, WEXITED | WNOHANG) != 0)
      return Errno("waitid(P_PIDFD, " + std::to_string(pid_) + ")");
    if (info.si_pid == 0) return false;
    reaped_ = true;
    if (info.si_code == CLD_EXITED) {
      out->exit_code = info.si_status;
      out->signal = 0;
    } else {
      out->signal = info.si_status;
      out->exit_code = 128 + info.si_status;
    }
    out->oom_killed = sb_->OomKillCount() > oom_before_;
    return true;
  }

  Status Signal(int sig, bool whole_tree) override {
    if (whole_tree) return ecg_->SignalAll(sig);
    // The foreground leads its own process group (setsid in StartGrandchild).
    if (::kill(-pid_, sig) != 0 && errno != ESRCH) return Errno("kill(-" + std::to_string(pid_) + ")");
    return absl::OkStatus();
  }
  bool TreeEmpty() override { return ecg_->Empty(); }

  Status Resize(uint16_t rows, uint16_t cols) override {
    if (!master_.valid()) return absl::FailedPreconditionError("process " + std::to_string(pid_) + " has no PTY");
    winsize ws{rows, cols, 0, 0};
    if (::ioctl(master_.get(), TIOCSWINSZ, &ws) != 0) return Errno("ioctl(TIOCSWINSZ)");
    return absl::OkStatus();
  }

  UniqueFd stdin_, stdout_, stderr_, control_, master_;

 private:
  ContainerSandbox* sb_;
  pid_t pid_;
  UniqueFd pidfd_;
  std::unique_ptr<jail::Cgroup> ecg_;
  uint64_t oom_before_;
  bool reaped_ = false;
};
}  // namespace

StatusOr<std::unique_ptr<Process>> ContainerSandbox::Start(const ExecSpec& es, const StartOptions& so) {
  std::optional<SpawnGuard> spawning(std::in_place, this);  // until the command runs (see Destroy)
  if (!spawning->ok) return absl::FailedPreconditionError("sandbox " + spec_.id + " is destroyed");
  if (es.argv.empty() && !es.shell) return absl::InvalidArgumentError("start: neither argv nor shell given");
  SweepExecCgroups();

  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(SpawnRequest plan, PrepareSpawn(es, "start", /*default_term=*/so.pty));
  plan.setsid = true;

  ASSIGN_OR_RETURN(std::unique_ptr<jail::Cgroup> ecg,
                   cgroup_->CreateChild("exec-" + std::to_string(exec_seq_.fetch_add(1))));
  Rollback rb;
  rb.Add([&ecg] {
    if (ecg) (void)ecg->Destroy(milliseconds(2000));
  });
  ASSIGN_OR_RETURN(std::vector<UniqueFd> join_fds, JoinFds(*cgroup_, *ecg));
  for (auto& f : join_fds) plan.cgroup_fds.push_back(f.get());

  UniqueFd in_r, in_w, out_r, out_w, err_r, err_w, ctl_r, ctl_w, master, slave;
  if (so.pty) {
    // The sandbox's own devpts instance (mounted newinstance by InitChild):
    // the terminal shows up as /dev/pts/N inside.
    const std::string ptmx = "/proc/" + std::to_string(init_pid_) + "/root/dev/pts/ptmx";
    master.reset(::open(ptmx.c_str(), O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!master.valid()) return Errno("open(" + ptmx + ")");
    int unlock = 0;
    if (::ioctl(master.get(), TIOCSPTLCK, &unlock) != 0) return Errno("ioctl(TIOCSPTLCK)");
    slave.reset(::ioctl(master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!slave.valid()) return Errno("ioctl(TIOCGPTPEER)");
    // Owned by the command's user as seen inside (created by the daemon's host root).
    const uid_t host = st_->HostUid(slot_);
    if (::fchown(slave.get(), host + plan.uid, host + plan.gid) != 0) return Errno("fchown(pty slave)");
    winsize ws{so.rows == 0 ? uint16_t{24} : so.rows, so.cols == 0 ? uint16_t{80} : so.cols, 0, 0};
    if (::ioctl(master.get(), TIOCSWINSZ, &ws) != 0) return Errno("ioctl(TIOCSWINSZ)");
    plan.stdin_fd = plan.stdout_fd = plan.stderr_fd = slave.get();
    plan.tty = true;
  } else {
    RETURN_IF_ERROR(MakePipe(in_r, in_w));
    RETURN_IF_ERROR(MakePipe(out_r, out_w, /*big=*/true));
    RETURN_IF_ERROR(MakePipe(err_r, err_w, /*big=*/true));
    plan.stdin_fd = in_r.get();
    plan.stdout_fd = out_w.get();
    plan.stderr_fd = es.merge_stderr ? out_w.get() : err_w.get();
  }
  if (so.control_fd) {
    RETURN_IF_ERROR(MakePipe(ctl_r, ctl_w));
    plan.control_fd = ctl_w.get();
  }

  const uint64_t oom_before = cgroup_->OomKillCount();
  // Bounded like an exec's spawn; a background process has no run-time
  // limit of its own here, so its start gets kStartSetupLimit.
  bool setup_timed_out = false;
  StatusOr<SpawnStarted> started = SpawnCommand(plan, "start", t0 + kStartSetupLimit, &setup_timed_out);
  in_r.reset();
  out_w.reset();
  err_w.reset();
  ctl_w.reset();
  slave.reset();
  join_fds.clear();
  if (!started.ok()) {
    rb.Commit();  // as in Exec: never wait here for what a given-up spawn left
    if (!(ecg->Empty() && ecg->Remove().ok())) {
      (void)ecg->SignalAll(SIGKILL);
      std::lock_guard<std::mutex> l(mu_);
      lingering_.push_back(std::move(ecg));
    }
    if (setup_timed_out)
      return absl::UnavailableError("start: the command did not start within " +
                                    std::to_string(kStartSetupLimit.count()) + " ms (stopped before its execve?)");
    return started.status();
  }
  SpawnStarted& spawned = *started;
  spawning.reset();
  const pid_t child = spawned.pid;
  UniqueFd cpidfd = std::move(spawned.pidfd);
  auto proc = std::make_unique<ContainerProcess>(this, child, std::move(cpidfd), std::move(ecg), oom_before);
  rb.Commit();
  if (so.pty) {
    proc->stdin_.reset(::fcntl(master.get(), F_DUPFD_CLOEXEC, 3));
    if (!proc->stdin_.valid()) return Errno("fcntl(F_DUPFD_CLOEXEC, pty master)");
    proc->master_.reset(::fcntl(master.get(), F_DUPFD_CLOEXEC, 3));
    if (!proc->master_.valid()) return Errno("fcntl(F_DUPFD_CLOEXEC, pty master)");
    proc->stdout_ = std::move(master);
  } else {
    proc->stdin_ = std::move(in_w);
    proc->stdout_ = std::move(out_r);
    proc->stderr_ = std::move(err_r);
  }
  proc->control_ = std::move(ctl_r);
  return std::unique_ptr<Process>(std::move(proc));
}

}  // namespace warren::runtime::container
