// The output pump (common/output_pump.h) on host processes: caps and totals,
// stdin, the deadline's kill ladder, the two after-exit modes, cancellation.
#include "common/output_pump.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include <gtest/gtest.h>

namespace warren {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// /bin/sh -c `script` with piped stdin/stdout/stderr, in its own process group.
struct Child {
  pid_t pid = -1;
  UniqueFd pidfd, in, out, err;
  siginfo_t info{};
  std::vector<int> signals;  // sent by the ladder

  explicit Child(const char* script) {
    int i[2], o[2], e[2];
    EXPECT_EQ(::pipe2(i, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(o, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(e, O_CLOEXEC), 0);
    pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::dup2(i[0], 0);
      ::dup2(o[1], 1);
      ::dup2(e[1], 2);
      ::execl("/bin/sh", "sh", "-c", script, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    ::close(i[0]);
    ::close(o[1]);
    ::close(e[1]);
    in.reset(i[1]);
    out.reset(o[0]);
    err.reset(e[0]);
    pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  }
  ~Child() {
    if (pid > 0) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, nullptr, WNOHANG);
    }
  }
  PumpOptions Options() {
    PumpOptions o;
    o.exit_fd = pidfd.get();
    o.on_exit_readable = [this]() -> StatusOr<bool> {
      memset(&info, 0, sizeof info);
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG) != 0) return ErrnoToStatus(errno, "waitid");
      if (info.si_pid == 0) return false;
      pid = -1;
      return true;
    };
    o.kill = [this](int sig) {
      signals.push_back(sig);
      if (pid > 0) ::kill(-pid, sig);
    };
    return o;
  }
};

TEST(OutputPump, CapsEachStreamAndCountsTotals) {
  Child c("head -c 300000 /dev/zero; echo err >&2; exit 3");
  PumpStream out, err;
  out.fd = std::move(c.out);
  out.cap = 1000;
  err.fd = std::move(c.err);
  err.cap = 1 << 20;
  auto r = PumpOutput(c.Options(), {&out, &err});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->timed_out);
  EXPECT_EQ(out.total, 300000u);
  EXPECT_EQ(out.data, std::string(1000, '\0'));
  EXPECT_TRUE(out.truncated());
  EXPECT_EQ(err.data, "err\n");
  EXPECT_FALSE(err.truncated());
  EXPECT_EQ(c.info.si_code, CLD_EXITED);
  EXPECT_EQ(c.info.si_status, 3);
}

TEST(OutputPump, FeedsStdinThenClosesIt) {
  Child c("cat; echo end");
  PumpStream out;
  out.fd = std::move(c.out);
  out.cap = 1 << 20;
  const std::string big(200000, 'x');  // more than a pipe holds: written as it drains
  PumpOptions o = c.Options();
  o.stdin_fd = &c.in;
  o.stdin_data = big;
  auto r = PumpOutput(o, {&out});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(out.data, big + "end\n");
  EXPECT_FALSE(c.in.valid());
}

TEST(OutputPump, DeadlineSendsTermThenKillAfterTheGrace) {
  Child c("trap '' TERM; echo up; sleep 30");
  PumpStream out;
  out.fd = std::move(c.out);
  out.cap = 100;
  PumpOptions o = c.Options();
  const auto deadline = Clock::now() + 200ms;
  o.deadline = [deadline] { return deadline; };
  o.kill_grace = 300ms;
  const auto t0 = Clock::now();
  auto r = PumpOutput(o, {&out});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->timed_out);
  EXPECT_GE(Clock::now() - t0, 500ms);
  EXPECT_LT(Clock::now() - t0, 10s);
  ASSERT_GE(c.signals.size(), 2u);
  EXPECT_EQ(c.signals[0], SIGTERM);
  EXPECT_EQ(c.signals[1], SIGKILL);
  EXPECT_EQ(c.info.si_code, CLD_KILLED);
  EXPECT_EQ(out.data, "up\n");
}

TEST(OutputPump, AfterExitTakesWhatIsThereOrWaitsForEofWithinLinger) {
  {
    // A background child holds stdout open: kAvailable returns at once.
    Child c("(sleep 3; echo late) & echo now");
    PumpStream out;
    out.fd = std::move(c.out);
    out.cap = 100;
    const auto t0 = Clock::now();
    auto r = PumpOutput(c.Options(), {&out});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(Clock::now() - t0, 2s);
    EXPECT_EQ(out.data, "now\n");
  }
  {
    Child c("(sleep 0.3; echo late) & echo now");
    PumpStream out;
    out.fd = std::move(c.out);
    out.cap = 100;
    PumpOptions o = c.Options();
    o.after_exit = PumpOptions::AfterExit::kUntilEof;
    auto r = PumpOutput(o, {&out});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(out.data, "now\nlate\n");
  }
  {
    Child c("(sleep 5) & echo now");
    PumpStream out;
    out.fd = std::move(c.out);
    out.cap = 100;
    PumpOptions o = c.Options();
    o.after_exit = PumpOptions::AfterExit::kUntilEof;
    o.linger = 200ms;
    o.what = "test call";
    auto r = PumpOutput(o, {&out});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_NE(r.status().message().find("test call"), std::string::npos) << r.status();
  }
}

TEST(OutputPump, CancelledEndsThePump) {
  Child c("sleep 30");
  PumpStream out;
  out.fd = std::move(c.out);
  PumpOptions o = c.Options();
  const auto t0 = Clock::now();
  o.cancelled = [t0] { return Clock::now() - t0 > 100ms; };
  auto r = PumpOutput(o, {&out});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(Clock::now() - t0, 3s);
}

}  // namespace
}  // namespace warren
