// Processes started in sandboxes (api/warren/v1/process.proto):
// streaming exec, background processes, shell sessions and PTYs all run on a
// ManagedProcess.
//
// A ManagedProcess owns a runtime::Process (Sandbox::Start) and one pump
// thread that runs the output pump (common/output_pump.h) to move bytes
// between the process's fds and memory:
//   * stdout / stderr (with a PTY: the terminal, as stdout) go into a
//     RingBuffer per stream of `buffer_bytes`. In `lossless` mode (attached
//     streaming exec) the pump reads only while the reader's unconsumed bytes
//     fit the buffer, so a slow reader slows the command (pipe back-pressure)
//     and no byte is lost; otherwise (background) the ring drops the oldest
//     bytes and readers learn how many they missed.
//   * fd 3 (StartOptions::control_fd) goes into a bounded list of control
//     records, each stamped with the stdout/stderr totals at the time: every
//     byte the process wrote to stdout/stderr before writing to fd 3 is in
//     the rings before the record is (the pump drains both again first).
//   * stdin: writes are queued and written by the pump (never blocking the
//     caller); close() closes the pipe once the queue is written.
// Completion follows the foreground process, not pipe EOF (as Exec): once it
// is reaped, the pipes are read while they have data ready (at most 2 s
// after the end; 60 s while a lossless reader is behind), then they close.
// A timeout sends SIGTERM to the whole tree, SIGKILL after kill_grace.
// Stop() kills the whole tree and waits for the end at most 5 s.
//
// ProcessTable: the background processes of every sandbox, by sandbox id and
// process id ("p<n>"), at most kMaxProcessesPerSandbox kept per sandbox
// (exited ones are forgotten oldest first to make room; ResourceExhausted
// when all are running). DropSandbox (the sandbox was destroyed) stops and
// forgets them.
//
// Thread-safe.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "node/ring_buffer.h"
#include "runtime/backend.h"

namespace warren::node {

constexpr size_t kDefaultProcessBufferBytes = 1 << 20;  // per stream
constexpr size_t kMaxProcessBufferBytes = 64 << 20;
constexpr size_t kMaxProcessesPerSandbox = 64;

// InvalidArgument when `spec` asks for merge_stderr on a backend that cannot
// give the command one pipe for stdout and stderr.
Status CheckMergeStderr(const runtime::Sandbox& sb, const runtime::ExecSpec& spec);

enum class ProcStream : int { kStdout = 0, kStderr = 1, kControl = 2 };

struct ProcessOptions {
  runtime::StartOptions start;
  size_t buffer_bytes = kDefaultProcessBufferBytes;  // per stream (and for control records)
  bool lossless = false;                             // see the header comment
  std::chrono::milliseconds timeout{0};              // 0 = none
  std::chrono::milliseconds kill_grace{500};
};

struct OutputData {
  ProcStream stream = ProcStream::kStdout;
  std::string data;
  uint64_t offset = 0;                        // of data[0] in its stream
  uint64_t dropped = 0;                       // bytes between the asked offset and `offset` no longer held
  uint64_t stdout_mark = 0, stderr_mark = 0;  // control records only
};

struct ProcessStatus {
  std::string sandbox_id, process_id;
  std::vector<std::string> argv;
  std::optional<std::string> shell;
  bool running = true;
  runtime::ExecOutcome outcome;  // valid when !running; no data, totals set
  bool pty = false;
  int64_t started_at_ns = 0;  // unix ns
  pid_t pid = 0;
  std::array<uint64_t, 2> totals{0, 0};  // stdout, stderr
  std::array<uint64_t, 2> first_offsets{0, 0};
  size_t buffer_bytes = 0;
};

class ManagedProcess {
 public:
  using Clock = std::chrono::steady_clock;
  // Called once from the pump thread when the process finished (exited and
  // its pipes were read).
  using ExitCallback = std::function<void(const ProcessStatus&)>;

  // Starts spec in sb (Sandbox::Start) and the pump. spec.stdin_data is
  // queued as the first stdin bytes (not closed after them).
  static StatusOr<std::shared_ptr<ManagedProcess>> Start(std::shared_ptr<runtime::Sandbox> sb, std::string sandbox_id,
                                                         std::string process_id, const runtime::ExecSpec& spec,
                                                         const ProcessOptions& options, ExitCallback on_exit);
  ~ManagedProcess();  // Stop()

  const std::string& id() const { return process_id_; }

  // Queues data for stdin, then closes it if `close`. FailedPrecondition once
  // stdin was closed or the process finished.
  Status Write(std::string data, bool close);
  // whole_tree: every process of the tree; else the foreground's process group.
  Status Signal(int sig, bool whole_tree);
  Status Resize(uint16_t rows, uint16_t cols);

  struct ReadResult {
    std::vector<OutputData> chunks;  // stdout, stderr, control: each at most max_bytes
    bool finished = false;           // the process finished (no more output will come)
  };
  // Output at or past offsets (stdout, stderr, control). Waits until there is
  // some, the process finished, Interrupt() was called or `deadline` passed.
  ReadResult Read(const std::array<uint64_t, 3>& offsets, size_t max_bytes, Clock::time_point deadline);
  // Lossless mode: the reader consumed stdout/stderr up to these offsets.
  void Consumed(const std::array<uint64_t, 2>& offsets);
  // Wakes every blocked Read (e.g. its client went away).
  void Interrupt();
  // Waits until finished or deadline; returns finished.
  bool WaitFinished(Clock::time_point deadline);
  ProcessStatus Info() const;
  // Kills the tree if it still runs and waits (bounded) for the pump to end.
  void Stop();

 private:
  ManagedProcess(std::shared_ptr<runtime::Sandbox> sb, std::unique_ptr<runtime::Process> proc, std::string sandbox_id,
                 std::string process_id, const runtime::ExecSpec& spec, const ProcessOptions& options,
                 ExitCallback on_exit);
  void Pump();
  // Bytes the pump may read into stream s now (lossless back-pressure).
  // Requires mu_.
  size_t Room(int s) const;
  // Keeps a chunk of stream s (ring or control record). Pump thread.
  void Append(int s, std::string_view chunk);
  void Wake();

  const std::shared_ptr<runtime::Sandbox> sb_;  // keeps the Sandbox object alive for proc_
  std::unique_ptr<runtime::Process> proc_;
  const std::string sandbox_id_, process_id_;
  const ProcessOptions options_;
  ExitCallback on_exit_;
  UniqueFd in_, out_[3], wake_;  // out_: stdout, stderr, control (pump thread only, except wake_)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  ProcessStatus status_;  // guarded by mu_
  RingBuffer rings_[2];
  struct ControlRecord {
    uint64_t offset;
    std::string data;
    uint64_t stdout_mark, stderr_mark;
  };
  std::deque<ControlRecord> control_;
  uint64_t control_total_ = 0, control_held_ = 0;
  std::array<uint64_t, 2> consumed_{0, 0};
  std::deque<std::string> stdin_queue_;
  bool stdin_close_ = false, stdin_closed_ = false;
  bool finished_ = false, stopping_ = false;
  uint64_t interrupts_ = 0;
  std::thread pump_;
};

class ProcessTable {
 public:
  ProcessTable() = default;
  ~ProcessTable();  // stops every process
  ProcessTable(const ProcessTable&) = delete;
  ProcessTable& operator=(const ProcessTable&) = delete;

  // A new process id for sandbox_id ("p<n>", never reused by this table).
  std::string NewId();
  // Keeps mp under sandbox_id; ResourceExhausted when the sandbox already has
  // kMaxProcessesPerSandbox running processes (exited ones are forgotten).
  Status Insert(const std::string& sandbox_id, std::shared_ptr<ManagedProcess> mp);
  StatusOr<std::shared_ptr<ManagedProcess>> Find(const std::string& sandbox_id, const std::string& process_id) const;
  std::vector<std::shared_ptr<ManagedProcess>> List(const std::string& sandbox_id) const;
  // Stops and forgets the sandbox's processes.
  void DropSandbox(const std::string& sandbox_id);

 private:
  mutable std::mutex mu_;
  uint64_t next_ = 1;
  // sandbox id -> processes, oldest first
  std::map<std::string, std::vector<std::shared_ptr<ManagedProcess>>> by_sandbox_;
};

}  // namespace warren::node
