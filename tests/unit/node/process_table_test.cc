// ManagedProcess (the pump behind streaming exec, background processes and
// sessions) over real host processes: a runtime::Sandbox whose Start() runs
// /bin/sh -c on the host with real pipes, so the pump's fd handling, ring
// buffers, back-pressure, control records, stdin and timeouts are exercised
// against the kernel.
#include "node/process_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "status_matchers.h"

namespace warren::node {
namespace {

using Clock = ManagedProcess::Clock;
using std::chrono::milliseconds;

class HostProcess final : public runtime::Process {
 public:
  HostProcess(pid_t pid, UniqueFd pidfd, UniqueFd in, UniqueFd out, UniqueFd err, UniqueFd ctl)
      : pid_(pid),
        pidfd_(std::move(pidfd)),
        in_(std::move(in)),
        out_(std::move(out)),
        err_(std::move(err)),
        ctl_(std::move(ctl)) {}
  ~HostProcess() override {
    if (!reaped_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const override { return pid_; }
  int pidfd() const override { return pidfd_.get(); }
  UniqueFd TakeStdin() override { return std::move(in_); }
  UniqueFd TakeStdout() override { return std::move(out_); }
  UniqueFd TakeStderr() override { return std::move(err_); }
  UniqueFd TakeControl() override { return std::move(ctl_); }
  StatusOr<bool> TryWait(runtime::ExecOutcome* out) override {
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == 0) return false;
    if (r < 0) return ErrnoToStatus(errno, "waitpid");
    reaped_ = true;
    if (WIFEXITED(st)) {
      out->exit_code = WEXITSTATUS(st);
    } else {
      out->signal = WTERMSIG(st);
      out->exit_code = 128 + out->signal;
    }
    return true;
  }
  Status Signal(int sig, bool) override {
    ::kill(-pid_, sig);  // the child leads its own process group
    return absl::OkStatus();
  }
  bool TreeEmpty() override { return ::kill(-pid_, 0) != 0; }
  Status Resize(uint16_t, uint16_t) override { return absl::FailedPreconditionError("no pty"); }

 private:
  pid_t pid_;
  UniqueFd pidfd_, in_, out_, err_, ctl_;
  bool reaped_ = false;
};

class HostSandbox final : public runtime::Sandbox, public runtime::ProcessStarter {
 public:
  std::string_view backend_name() const override { return "host"; }
  const std::string& id() const override { return id_; }
  StatusOr<runtime::ExecOutcome> Exec(const runtime::ExecSpec&) override { return absl::UnimplementedError("exec"); }
  runtime::SandboxFiles& files() override { std::abort(); }
  Status Destroy() override { return absl::OkStatus(); }
  std::string Record() const override { return {}; }
  pid_t init_pid() const override { return 1; }
  StatusOr<std::unique_ptr<runtime::Process>> Start(const runtime::ExecSpec& spec,
                                                    const runtime::StartOptions& so) override {
    if (!spec.shell.has_value()) return absl::InvalidArgumentError("HostSandbox starts shell specs only");
    const char* shell = spec.shell->c_str();
    int in[2], out[2], err[2], ctl[2] = {-1, -1};
    if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC) ||
        (so.control_fd && ::pipe2(ctl, O_CLOEXEC)))
      return ErrnoToStatus(errno, "pipe2");
    pid_t pid = ::fork();
    if (pid < 0) return ErrnoToStatus(errno, "fork");
    if (pid == 0) {
      ::setpgid(0, 0);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      if (so.control_fd) ::dup2(ctl[1], 3);
      ::execl("/bin/sh", "sh", "-c", shell, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    if (so.control_fd) ::close(ctl[1]);
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    return std::unique_ptr<runtime::Process>(
        new HostProcess(pid, std::move(pidfd), UniqueFd(in[1]), UniqueFd(out[0]), UniqueFd(err[0]), UniqueFd(ctl[0])));
  }

 private:
  std::string id_ = "host";
};

std::shared_ptr<ManagedProcess> Start(const std::string& cmd, ProcessOptions o = {}) {
  runtime::ExecSpec spec;
  spec.shell = cmd;
  auto mp = ManagedProcess::Start(std::make_shared<HostSandbox>(), "host", "p1", spec, o, nullptr);
  EXPECT_OK(mp);
  return *mp;
}

// Reads every stdout/stderr byte until the process finished.
std::pair<std::string, std::string> ReadAllOutput(ManagedProcess& mp, bool lossless, uint64_t* dropped) {
  std::array<uint64_t, 3> off{0, 0, 0};
  std::string out[2];
  for (int i = 0; i < 100000; ++i) {
    auto r = mp.Read(off, 1 << 16, Clock::now() + milliseconds(200));
    for (auto& c : r.chunks) {
      const int s = static_cast<int>(c.stream);
      if (s < 2) out[s] += c.data;
      if (dropped) *dropped += c.dropped;
      off[s] = c.offset + c.data.size();
    }
    if (lossless) mp.Consumed({off[0], off[1]});
    if (r.chunks.empty() && r.finished) break;
  }
  return {out[0], out[1]};
}

TEST(ManagedProcessTest, StdinIsWrittenAndClosed) {
  auto mp = Start("cat; echo done >&2; exit 3");
  ASSERT_OK(mp->Write("hello ", false));
  ASSERT_OK(mp->Write("world", true));
  EXPECT_THAT(mp->Write("late", false), ::testing::Not(IsOk()));  // closed
  auto [out, err] = ReadAllOutput(*mp, false, nullptr);
  EXPECT_EQ(out, "hello world");
  EXPECT_EQ(err, "done\n");
  ProcessStatus st = mp->Info();
  EXPECT_FALSE(st.running);
  EXPECT_EQ(st.outcome.exit_code, 3);
  EXPECT_EQ(st.outcome.stdout_total, 11u);
}

TEST(ManagedProcessTest, LosslessModeDeliversEveryByteThroughASmallWindow) {
  ProcessOptions o;
  o.lossless = true;
  o.buffer_bytes = 4096;
  auto mp = Start("head -c 3000000 /dev/zero | tr '\\0' x", o);
  std::array<uint64_t, 3> off{0, 0, 0};
  uint64_t got = 0, dropped = 0;
  for (int i = 0; i < 1000000; ++i) {
    auto r = mp->Read(off, 1000, Clock::now() + milliseconds(200));
    for (auto& c : r.chunks) {
      dropped += c.dropped;
      EXPECT_EQ(c.offset, off[static_cast<int>(c.stream)]);
      off[static_cast<int>(c.stream)] = c.offset + c.data.size();
      got += c.stream == ProcStream::kStdout ? c.data.size() : 0;
    }
    // The pump never runs further ahead of us than the window.
    EXPECT_LE(mp->Info().totals[0], off[0] + o.buffer_bytes);
    mp->Consumed({off[0], off[1]});
    if (r.chunks.empty() && r.finished) break;
  }
  EXPECT_EQ(got, 3000000u);
  EXPECT_EQ(dropped, 0u);
  EXPECT_EQ(mp->Info().outcome.exit_code, 0);
}

TEST(ManagedProcessTest, RingModeDropsOldestAndSaysHowMuch) {
  ProcessOptions o;
  o.buffer_bytes = 1000;
  auto mp = Start("seq 1 20000", o);
  ASSERT_TRUE(mp->WaitFinished(Clock::now() + std::chrono::seconds(60)));
  uint64_t dropped = 0;
  auto [out, err] = ReadAllOutput(*mp, false, &dropped);
  const uint64_t total = mp->Info().totals[0];
  EXPECT_EQ(total, 108894u);  // bytes of `seq 1 20000`
  EXPECT_EQ(out.size(), 1000u);
  EXPECT_EQ(dropped, total - 1000);
  EXPECT_EQ(out.substr(out.size() - 6), "20000\n");
}

TEST(ManagedProcessTest, ControlRecordsComeAfterEarlierOutputWithMarks) {
  ProcessOptions o;
  o.start.control_fd = true;
  // stdin sequences the two halves: one record per read of fd 3.
  auto mp = Start("printf abc; printf e >&2; printf 'one\\n' >&3; read x; printf defg; printf 'two\\n' >&3", o);
  std::vector<OutputData> ctl;
  std::array<uint64_t, 3> off{0, 0, 0};
  for (int i = 0; i < 1000 && ctl.size() < 2; ++i) {
    auto r = mp->Read(off, 1 << 16, Clock::now() + milliseconds(200));
    for (auto& c : r.chunks) {
      off[static_cast<int>(c.stream)] = c.offset + c.data.size();
      if (c.stream != ProcStream::kControl) continue;
      ctl.push_back(c);
      if (ctl.size() == 1) {
        ASSERT_OK(mp->Write("go\n", true));
      }
    }
    if (r.finished && r.chunks.empty()) break;
  }
  ASSERT_EQ(ctl.size(), 2u);
  EXPECT_EQ(ctl[0].data, "one\n");
  EXPECT_EQ(ctl[0].stdout_mark, 3u);
  EXPECT_EQ(ctl[0].stderr_mark, 1u);
  EXPECT_EQ(ctl[1].data, "two\n");
  EXPECT_EQ(ctl[1].offset, 4u);
  EXPECT_EQ(ctl[1].stdout_mark, 7u);
}

TEST(ManagedProcessTest, TimeoutKillsWithSigterm) {
  ProcessOptions o;
  o.timeout = milliseconds(100);
  auto mp = Start("exec sleep 60", o);
  ASSERT_TRUE(mp->WaitFinished(Clock::now() + std::chrono::seconds(30)));
  ProcessStatus st = mp->Info();
  EXPECT_TRUE(st.outcome.timed_out);
  EXPECT_EQ(st.outcome.signal, SIGTERM);
}

TEST(ManagedProcessTest, StopKillsARunningProcess) {
  auto mp = Start("exec sleep 60");
  const pid_t pid = mp->Info().pid;
  mp->Stop();
  EXPECT_FALSE(mp->Info().running);
  EXPECT_NE(::kill(pid, 0), 0);  // reaped: gone
}

TEST(ProcessTableTest, KeepsAtMostTheLimitAndForgetsExitedFirst) {
  ProcessTable t;
  std::vector<std::string> ids;
  for (size_t i = 0; i < kMaxProcessesPerSandbox; ++i) {
    auto mp = Start(i == 0 ? "exit 0" : "exec sleep 60");
    ids.push_back(mp->id());
    ASSERT_OK(t.Insert("sb", mp));
  }
  auto first = *t.Find("sb", ids[0]);
  ASSERT_TRUE(first->WaitFinished(Clock::now() + std::chrono::seconds(30)));
  first.reset();
  EXPECT_OK(t.Insert("sb", Start("exec sleep 60")));  // the exited one makes room
  EXPECT_EQ(t.List("sb").size(), kMaxProcessesPerSandbox);
  EXPECT_THAT(t.Insert("sb", Start("exec sleep 60")), StatusIs(absl::StatusCode::kResourceExhausted));
  t.DropSandbox("sb");
  EXPECT_TRUE(t.List("sb").empty());
  EXPECT_THAT(t.Find("sb", ids[1]), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace warren::node
