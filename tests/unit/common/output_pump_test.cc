// The output pump (common/output_pump.h) on host processes: caps and totals,
// stdin (fixed, or a source fed through the wake fd), back-pressure (room),
// drain order, the deadline's kill ladder, stop, the after-exit modes,
// cancellation, PTY EOF (EIO).
#include "common/output_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "status_matchers.h"

namespace warren {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// /bin/sh -c `script` with piped stdin/stdout/stderr (and fd 3 when
// `control`), in its own process group. `stdout_pipe_bytes`: the stdout
// pipe's capacity (F_SETPIPE_SZ), 0 for the default.
struct Child {
  pid_t pid = -1, pgid = -1;
  UniqueFd pidfd, in, out, err, ctl;
  siginfo_t info{};
  std::vector<int> signals;  // sent by the ladder

  explicit Child(const char* script, bool control = false, int stdout_pipe_bytes = 0) {
    int i[2], o[2], e[2], c[2] = {-1, -1};
    EXPECT_EQ(::pipe2(i, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(o, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(e, O_CLOEXEC), 0);
    if (control) {
      EXPECT_EQ(::pipe2(c, O_CLOEXEC), 0);
    }
    if (stdout_pipe_bytes > 0) {
      EXPECT_EQ(::fcntl(o[1], F_SETPIPE_SZ, stdout_pipe_bytes), stdout_pipe_bytes);
    }
    pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::dup2(i[0], 0);
      ::dup2(o[1], 1);
      ::dup2(e[1], 2);
      if (control) ::dup2(c[1], 3);
      ::execl("/bin/sh", "sh", "-c", script, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    pgid = pid;
    ::close(i[0]);
    ::close(o[1]);
    ::close(e[1]);
    if (control) ::close(c[1]);
    in.reset(i[1]);
    out.reset(o[0]);
    err.reset(e[0]);
    ctl.reset(c[0]);
    pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  }
  ~Child() {
    if (pgid > 0) ::kill(-pgid, SIGKILL);  // background children of the script too
    if (pid > 0) ::waitpid(pid, nullptr, 0);
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
  ASSERT_OK(r);
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
  ASSERT_OK(r);
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
  ASSERT_OK(r);
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
    ASSERT_OK(r);
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
    ASSERT_OK(r);
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
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kDeadlineExceeded));
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
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_LT(Clock::now() - t0, 3s);
}

// An eventfd the tests wake the pump with.
struct Waker {
  UniqueFd fd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  void Wake() const {
    uint64_t one = 1;
    (void)!::write(fd.get(), &one, sizeof one);
  }
};

TEST(OutputPump, RoomHoldsAStreamBackUntilAWakeFindsRoom) {
  // 300 kB through a 16 KiB window that a reader thread opens step by step:
  // the writer waits on the full pipe, nothing is read past the window, and
  // a stream without room is not polled (no busy loop).
  Child c("head -c 300000 /dev/zero | tr '\\0' x");
  Waker waker;
  std::mutex mu;
  uint64_t allowed = 16 << 10;  // guarded by mu
  uint64_t over = 0, room_calls = 0;
  PumpStream out;
  out.fd = std::move(c.out);
  out.cap = 1 << 20;
  out.room = [&]() -> size_t {
    std::lock_guard<std::mutex> l(mu);
    ++room_calls;
    return allowed > out.total ? allowed - out.total : 0;
  };
  out.on_data = [&](std::string_view chunk) {
    std::lock_guard<std::mutex> l(mu);
    if (out.total + chunk.size() > allowed) over += out.total + chunk.size() - allowed;
  };
  std::atomic<bool> done{false};
  std::thread reader([&] {
    for (int i = 0; i < 500 && !done; ++i) {
      std::this_thread::sleep_for(20ms);
      {
        std::lock_guard<std::mutex> l(mu);
        allowed += 16 << 10;
      }
      waker.Wake();
    }
  });
  PumpOptions o = c.Options();
  o.wake_fd = waker.fd.get();
  // Up to a pipe's worth is still held back when the command ends.
  o.after_exit = PumpOptions::AfterExit::kWhileReadable;
  o.linger_held = 10s;
  const auto t0 = Clock::now();
  auto r = PumpOutput(o, {&out});
  done = true;
  reader.join();
  ASSERT_OK(r);
  EXPECT_EQ(over, 0u);
  EXPECT_EQ(out.total, 300000u);
  EXPECT_TRUE(out.data == std::string(300000, 'x'));
  EXPECT_GE(Clock::now() - t0, 200ms);  // it waited for the window
  EXPECT_LT(room_calls, 5000u);
}

TEST(OutputPump, StdinSourceIsFedThroughWakesAndClosedOnRequest) {
  // Each chunk is queued only after cat echoed the previous one: without the
  // wake each round would wait for the pump's 1 s re-ask.
  Child c("cat; echo end");
  Waker waker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> queue;  // guarded by mu
  bool close = false;
  std::string echoed;
  int closed_calls = 0;
  PumpStream out;
  out.fd = std::move(c.out);
  out.cap = 1 << 20;
  out.on_data = [&](std::string_view chunk) {
    std::lock_guard<std::mutex> l(mu);
    echoed.append(chunk);
    cv.notify_all();
  };
  PumpOptions o = c.Options();
  o.stdin_fd = &c.in;
  o.stdin_source = [&](std::string* chunk) {
    std::lock_guard<std::mutex> l(mu);
    if (!queue.empty()) {
      *chunk = std::move(queue.front());
      queue.pop_front();
      return StdinNext::kChunk;
    }
    return close ? StdinNext::kClose : StdinNext::kWait;
  };
  o.on_stdin_closed = [&] { ++closed_calls; };
  o.wake_fd = waker.fd.get();
  std::string want;
  std::thread feeder([&] {
    for (int i = 0; i < 5; ++i) {
      const std::string line = "chunk" + std::to_string(i) + "\n";
      std::unique_lock<std::mutex> l(mu);
      queue.push_back(line);
      want += line;
      l.unlock();
      waker.Wake();
      l.lock();
      cv.wait_for(l, 10s, [&] { return echoed.size() >= want.size(); });
    }
    std::lock_guard<std::mutex> l(mu);
    close = true;
    waker.Wake();
  });
  const auto t0 = Clock::now();
  auto r = PumpOutput(o, {&out});
  feeder.join();
  ASSERT_OK(r);
  EXPECT_EQ(out.data, want + "end\n");
  EXPECT_EQ(closed_calls, 1);
  EXPECT_FALSE(c.in.valid());
  EXPECT_LT(Clock::now() - t0, 2s);
}

TEST(OutputPump, StdinSourceStopsAtEpipeAndThePumpGoesOn) {
  // The command closes its stdin: writes fail with EPIPE (not SIGPIPE), the
  // source is not asked any more and the pump follows the command to its end.
  Child c("exec 0<&-; sleep 0.2; echo ok");
  int asked = 0, closed_calls = 0;
  PumpStream out;
  out.fd = std::move(c.out);
  out.cap = 100;
  PumpOptions o = c.Options();
  o.stdin_fd = &c.in;
  o.stdin_source = [&](std::string* chunk) {
    ++asked;
    chunk->assign(64 << 10, 'y');
    return StdinNext::kChunk;
  };
  o.on_stdin_closed = [&] { ++closed_calls; };
  auto r = PumpOutput(o, {&out});
  ASSERT_OK(r);
  EXPECT_EQ(out.data, "ok\n");
  EXPECT_EQ(closed_calls, 1);
  EXPECT_LT(asked, 100);
  EXPECT_EQ(c.info.si_code, CLD_EXITED);
  EXPECT_EQ(c.info.si_status, 0);
}

TEST(OutputPump, StdinDataAndSourceAreExclusive) {
  Child c("cat");
  PumpOptions o = c.Options();
  o.stdin_fd = &c.in;
  o.stdin_data = "x";
  o.stdin_source = [](std::string*) { return StdinNext::kClose; };
  EXPECT_THAT(PumpOutput(o, {}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(OutputPump, DrainEarlierFirstTakesWhatPrecededAControlRecord) {
  // 1 MB sits in a 1 MiB stdout pipe when the record on fd 3 is read: all of
  // it is taken first (the pump's usual 4 reads per wake would take 256 KiB).
  Child c("head -c 1000000 /dev/zero; echo rec >&3; sleep 0.3", /*control=*/true, /*stdout_pipe_bytes=*/1 << 20);
  pollfd p{c.ctl.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1);  // the record (and the MB before it) are in the pipes
  PumpStream out, err, ctl;
  out.fd = std::move(c.out);
  err.fd = std::move(c.err);
  ctl.fd = std::move(c.ctl);
  ctl.cap = 100;
  ctl.drain_earlier_first = true;
  std::vector<uint64_t> marks;
  ctl.on_data = [&](std::string_view) { marks.push_back(out.total); };
  auto r = PumpOutput(c.Options(), {&out, &err, &ctl});
  ASSERT_OK(r);
  EXPECT_EQ(ctl.data, "rec\n");
  ASSERT_EQ(marks.size(), 1u);
  EXPECT_EQ(marks[0], 1000000u);
}

TEST(OutputPump, StopKillsTheTreeAndEndsThePump) {
  Child c("trap '' TERM; echo up; sleep 30 & wait");
  PumpStream out;
  out.fd = std::move(c.out);
  out.cap = 100;
  PumpOptions o = c.Options();
  const auto t0 = Clock::now();
  o.stop = [t0] { return Clock::now() - t0 > 100ms; };
  auto r = PumpOutput(o, {&out});
  ASSERT_OK(r);
  EXPECT_TRUE(r->stopped);
  EXPECT_FALSE(r->timed_out);
  EXPECT_LT(Clock::now() - t0, 3s);
  ASSERT_FALSE(c.signals.empty());
  EXPECT_EQ(c.signals[0], SIGKILL);
  EXPECT_EQ(c.info.si_code, CLD_KILLED);
  EXPECT_EQ(out.data, "up\n");
}

TEST(OutputPump, StopWaitsForTheEndAtMostStopWait) {
  // A kill that cannot take effect (e.g. a frozen sandbox): the pump gives up.
  Child c("sleep 30");
  PumpStream out;
  out.fd = std::move(c.out);
  PumpOptions o = c.Options();
  std::vector<int> sent;
  o.kill = [&](int sig) { sent.push_back(sig); };
  o.stop = [] { return true; };
  o.stop_wait = 300ms;
  o.what = "test process";
  const auto t0 = Clock::now();
  auto r = PumpOutput(o, {&out});
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_NE(r.status().message().find("test process"), std::string::npos) << r.status();
  EXPECT_GE(Clock::now() - t0, 300ms);
  EXPECT_LT(Clock::now() - t0, 3s);
  ASSERT_GE(sent.size(), 2u);  // SIGKILL, again every 200 ms
  EXPECT_EQ(sent[0], SIGKILL);
  EXPECT_EQ(sent[1], SIGKILL);
}

TEST(OutputPump, WhileReadableReadsWhatIsReadyWithinItsBounds) {
  {
    // A background child holds stdout open and silent: the pump returns.
    Child c("(sleep 30) & echo now");
    PumpStream out;
    out.fd = std::move(c.out);
    out.cap = 100;
    PumpOptions o = c.Options();
    o.after_exit = PumpOptions::AfterExit::kWhileReadable;
    o.linger = 2s;
    const auto t0 = Clock::now();
    auto r = PumpOutput(o, {&out});
    ASSERT_OK(r);
    // Not held until the background sleep ends (30 s; killed with the
    // process group at the end): within linger plus generous slack for a
    // loaded machine.
    EXPECT_LT(Clock::now() - t0, 10s);
    EXPECT_EQ(out.data, "now\n");
  }
  {
    // A background writer that is always ahead of the (slowed) pump: it
    // reads until `linger`, then returns without an error. The pump takes
    // 16 bytes a read, 1 ms apart, so what `yes` wrote before the exit alone
    // outlasts `linger` (a writer merely faster than the pump is not always
    // ahead on a loaded machine: a descheduled `yes` leaves the pipe empty
    // for a moment and the pump, rightly, returns early).
    Child c("(yes) & sleep 0.2; echo now");
    PumpStream out;
    out.fd = std::move(c.out);
    out.cap = 100;
    out.room = [] { return size_t{16}; };
    out.on_data = [](std::string_view) { std::this_thread::sleep_for(1ms); };
    PumpOptions o = c.Options();
    o.after_exit = PumpOptions::AfterExit::kWhileReadable;
    o.linger = 300ms;
    const auto t0 = Clock::now();
    auto r = PumpOutput(o, {&out});
    ASSERT_OK(r);
    EXPECT_GE(Clock::now() - t0, 500ms);  // the command's 0.2 s, then linger
    EXPECT_LT(Clock::now() - t0, 10s);    // not until the writer ends (never): slack for a loaded machine
    EXPECT_TRUE(out.fd.valid());          // the rest stays in the pipe
    EXPECT_GT(out.total, 4u);
  }
}

TEST(OutputPump, WhileReadableWaitsForAHeldStreamUpToLingerHeld) {
  for (bool reader_comes : {true, false}) {
    // 100 kB with a 70 kB window: the command ends with 30 kB left in the
    // pipe, held back until the reader makes room (or until linger_held).
    Child c("head -c 100000 /dev/zero");
    Waker waker;
    std::mutex mu;
    uint64_t allowed = 70000;  // guarded by mu
    PumpStream out;
    out.fd = std::move(c.out);
    out.room = [&]() -> size_t {
      std::lock_guard<std::mutex> l(mu);
      return allowed > out.total ? allowed - out.total : 0;
    };
    PumpOptions o = c.Options();
    o.wake_fd = waker.fd.get();
    o.after_exit = PumpOptions::AfterExit::kWhileReadable;
    o.linger = 100ms;
    o.linger_held = reader_comes ? 10s : 300ms;
    std::thread reader([&] {
      if (!reader_comes) return;
      std::this_thread::sleep_for(400ms);
      {
        std::lock_guard<std::mutex> l(mu);
        allowed = 1 << 20;
      }
      waker.Wake();
    });
    const auto t0 = Clock::now();
    auto r = PumpOutput(o, {&out});
    reader.join();
    ASSERT_OK(r);
    EXPECT_EQ(out.total, reader_comes ? 100000u : 70000u) << reader_comes;
    EXPECT_GE(Clock::now() - t0, 300ms);
    EXPECT_LT(Clock::now() - t0, 5s);
  }
}

TEST(OutputPump, PtyEndsAtEioLikeAPipeAtEof) {
  // A PTY's master reads EIO once the slave is closed everywhere: that is
  // the stream's end, not an error to wait out.
  UniqueFd master(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  ASSERT_TRUE(master.valid());
  ASSERT_EQ(::grantpt(master.get()), 0);
  ASSERT_EQ(::unlockpt(master.get()), 0);
  // Opened before the fork: a master without any open slave polls POLLHUP.
  UniqueFd slave(::open(::ptsname(master.get()), O_RDWR | O_NOCTTY | O_CLOEXEC));
  ASSERT_TRUE(slave.valid());
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(slave.get(), 1);
    ::execl("/bin/sh", "sh", "-c", "echo hi", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  slave.reset();
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  PumpStream out;
  out.fd = std::move(master);
  out.cap = 100;
  PumpOptions o;
  o.exit_fd = pidfd.get();
  o.on_exit_readable = [pid]() -> StatusOr<bool> { return ::waitpid(pid, nullptr, WNOHANG) == pid; };
  o.after_exit = PumpOptions::AfterExit::kUntilEof;
  o.linger = 2s;
  auto r = PumpOutput(o, {&out});
  ASSERT_OK(r);
  EXPECT_FALSE(out.fd.valid());
  EXPECT_NE(out.data.find("hi"), std::string::npos) << out.data;
}

}  // namespace
}  // namespace warren
