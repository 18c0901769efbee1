// Streaming verbs (api/warren/v1/process.proto):
//
// `warren exec -t [-i] ID [--] CMD...`: runs CMD on a PTY through the
// streaming ExecStream call. -i streams our stdin to it as typed (when our
// stdin is a terminal it is put in raw mode for the duration, so keys such
// as Ctrl-C reach the command's terminal), without -i its stdin is closed at
// once. Our window size is sent at start and on every SIGWINCH. Output is
// written raw to stdout as it comes; the exit code is the command's.
// Interrupting the CLI (the connection dropping) kills the command's tree.
//
// `warren logs ID PROC [-f]`: the buffered stdout/stderr of a background
// process (Sandbox.spawn), to our stdout/stderr; -f keeps following until
// it exits. A note on stderr says how many bytes the ring buffer dropped.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "common/unique_fd.h"
#include "warren/v1/process.grpc.pb.h"

namespace warren::cli {
namespace {

int g_winch_fd = -1;  // write end of the SIGWINCH self-pipe

void OnWinch(int) {
  const int saved = errno;
  char c = 'w';
  (void)!::write(g_winch_fd, &c, 1);
  errno = saved;
}

// Puts a terminal fd in raw mode while alive.
class RawMode {
 public:
  explicit RawMode(int fd) : fd_(fd) {
    if (::tcgetattr(fd_, &saved_) != 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    active_ = ::tcsetattr(fd_, TCSANOW, &raw) == 0;
  }
  ~RawMode() {
    if (active_) (void)::tcsetattr(fd_, TCSANOW, &saved_);
  }

 private:
  int fd_;
  termios saved_{};
  bool active_ = false;
};

bool WindowSize(uint32_t* rows, uint32_t* cols) {
  winsize ws{};
  for (int fd : {STDOUT_FILENO, STDIN_FILENO, STDERR_FILENO}) {
    if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
      *rows = ws.ws_row;
      *cols = ws.ws_col;
      return true;
    }
  }
  return false;
}

}  // namespace

int RunExecTty(Invocation& inv) {
  StatusOr<v1::ExecRequest> req = BuildExecRequest(inv.exec);
  if (!req.ok()) return UsageError(req.status());
  if (!inv.exec.stdin_file.empty()) {
    return UsageError(absl::InvalidArgumentError("-t streams stdin (-i); --stdin-file is not supported with it"));
  }
  Client client(inv.global);
  auto stub = v1::Processes::NewStub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  auto stream = stub->ExecStream(&ctx);

  v1::ExecStreamRequest first;
  *first.mutable_exec() = *req;
  first.mutable_options()->set_pty(true);
  uint32_t rows = 24, cols = 80;
  (void)WindowSize(&rows, &cols);
  first.mutable_options()->set_rows(rows);
  first.mutable_options()->set_cols(cols);
  if (!inv.exec.read_stdin) first.set_close_stdin(true);
  if (!stream->Write(first)) {
    PrintError(FromGrpc(stream->Finish()));
    return kExitError;
  }

  // Input: our stdin (with -i) and window changes, on their own thread.
  int wp[2], sp[2];
  if (::pipe2(wp, O_CLOEXEC | O_NONBLOCK) != 0 || ::pipe2(sp, O_CLOEXEC) != 0) {
    PrintError(ErrnoToStatus(errno, "pipe2"));
    return kExitError;
  }
  UniqueFd winch_r(wp[0]), winch_w(wp[1]), stop_r(sp[0]), stop_w(sp[1]);
  g_winch_fd = winch_w.get();
  struct sigaction sa {};
  sa.sa_handler = OnWinch;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGWINCH, &sa, nullptr);
  std::unique_ptr<RawMode> raw;
  if (inv.exec.read_stdin && ::isatty(STDIN_FILENO)) raw = std::make_unique<RawMode>(STDIN_FILENO);

  std::thread input([&] {
    bool stdin_open = inv.exec.read_stdin;
    char buf[16 << 10];
    for (;;) {
      pollfd pfds[3] = {{stop_r.get(), POLLIN, 0}, {winch_r.get(), POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
      int n = ::poll(pfds, stdin_open ? 3 : 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || pfds[0].revents) return;
      if (pfds[1].revents) {
        char drain[64];
        while (::read(winch_r.get(), drain, sizeof drain) > 0) {
        }
        uint32_t r, c;
        if (WindowSize(&r, &c)) {
          v1::ExecStreamRequest m;
          m.set_resize_rows(r);
          m.set_resize_cols(c);
          if (!stream->Write(m)) return;
        }
      }
      if (stdin_open && pfds[2].revents) {
        ssize_t got = ::read(STDIN_FILENO, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        v1::ExecStreamRequest m;
        if (got <= 0) {
          stdin_open = false;
          m.set_close_stdin(true);
        } else {
          m.set_stdin(std::string(buf, static_cast<size_t>(got)));
        }
        if (!stream->Write(m)) return;
      }
    }
  });

  v1::ProcessEvent ev;
  v1::ExecResult result;
  bool have_result = false;
  Status out_status;
  while (stream->Read(&ev)) {
    if (ev.has_output()) {
      const int fd = ev.output().stream() == v1::OUTPUT_STREAM_STDERR ? STDERR_FILENO : STDOUT_FILENO;
      Status w = WriteAll(fd, ev.output().data(), fd == STDOUT_FILENO ? "stdout" : "stderr");
      if (!w.ok() && out_status.ok()) out_status = w;
    } else if (ev.has_exit()) {
      result = ev.exit();
      have_result = true;
      break;
    }
  }
  (void)!::write(stop_w.get(), "x", 1);
  input.join();
  ::signal(SIGWINCH, SIG_DFL);
  raw.reset();
  stream->WritesDone();
  Status st = FromGrpc(stream->Finish());
  if (!have_result) {
    PrintError(st.ok() ? absl::InternalError("the stream ended without an exit result") : st);
    return kExitError;
  }
  if (!out_status.ok()) {
    PrintError(out_status);
    return kExitError;
  }
  if (result.timed_out()) (void)WriteAll(STDERR_FILENO, "warren: timed out; the process tree was killed\n", "stderr");
  return (result.exit_code() >= 0 && result.exit_code() <= 255) ? result.exit_code() : kExitError;
}

namespace {

struct LogsArgs {
  std::string id, process;
  bool follow = false;
};

int RunLogs(const GlobalOptions& g, const LogsArgs& a) {
  Client client(g);
  auto stub = v1::Processes::NewStub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::ProcessOutputRequest req;
  req.mutable_ref()->set_sandbox_id(a.id);
  req.mutable_ref()->set_process_id(a.process);
  req.set_follow(a.follow);
  auto reader = stub->Output(&ctx, req);
  v1::ProcessEvent ev;
  while (reader->Read(&ev)) {
    if (!ev.has_output()) continue;
    const v1::OutputChunk& c = ev.output();
    if (c.stream() == v1::OUTPUT_STREAM_CONTROL) continue;
    const bool err = c.stream() == v1::OUTPUT_STREAM_STDERR;
    if (c.dropped_bytes() > 0) {
      (void)WriteAll(STDERR_FILENO,
                     absl::StrCat("warren: ", c.dropped_bytes(), " earlier bytes of ", err ? "stderr" : "stdout",
                                  " were dropped (ring buffer full)\n"),
                     "stderr");
    }
    Status w = WriteAll(err ? STDERR_FILENO : STDOUT_FILENO, c.data(), err ? "stderr" : "stdout");
    if (!w.ok()) {
      ctx.TryCancel();
      PrintError(w);
      return kExitError;
    }
  }
  Status st = FromGrpc(reader->Finish());
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  return kExitOk;
}

}  // namespace

void AddLogsCommand(CLI::App& root, Invocation& inv) {
  auto a = std::make_shared<LogsArgs>();
  CLI::App* sub = root.add_subcommand(
      "logs", "Output of a background process: warren logs ID PROC [-f] (stdout and stderr to ours)");
  sub->add_option("id", a->id, "sandbox id")->required();
  sub->add_option("process", a->process, "process id (from spawn)")->required();
  sub->add_flag("-f,--follow", a->follow, "keep following until the process exits");
  sub->callback([&inv, a] {
    inv.verb = "logs";
    inv.run = [a](Invocation& i) { return RunLogs(i.global, *a); };
  });
}

}  // namespace warren::cli
