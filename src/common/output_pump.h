// The one output pump of warren: moves bytes between a command's pipes and
// memory until the command ends, with the deadline's kill ladder. Used by the
// container exec (runtime/container/sandbox.cc), fncall's calls
// (runtime/fncall/call.cc) and the node's background processes
// (node/process_table.cc, streaming exec, sessions, PTYs).
//
// Contract:
//  * fds: the caller creates the pipes; the pump makes the read/write ends it
//    is given non-blocking, reads with one 64 KiB buffer per thread, and
//    resets (closes) an output fd at EOF or on a read error (EIO: a PTY
//    whose slave side is closed everywhere).
//  * output: each stream's chunks go to `on_data` (optional) and into `data`
//    up to `cap`; `total` counts every byte read. `room` (optional) is asked
//    before every read and every poll: at most that many bytes are read, and
//    a stream with room 0 is not read at all until a later wake finds room,
//    so the writer blocks on the full pipe and no byte is lost (back-pressure
//    for a slow reader). A stream with `drain_earlier_first` is read only
//    after every earlier stream in the list was drained (as far as its room
//    allows), before each read: what the command wrote to those before
//    writing to this one is taken first (fd 3 control records after the
//    stdout/stderr bytes that preceded them).
//  * stdin: either `stdin_data` (written, then the fd is closed) or
//    `stdin_source` (asked for the next chunk whenever the pump has written
//    all it had, on every wake; kWait: nothing yet; kClose: close after what
//    was written), never both. The fd is closed (reset) at kClose, when all
//    of `stdin_data` is written, when the reader is gone (EPIPE; SIGPIPE is
//    blocked in the calling thread for the pump's duration), or at the end;
//    `on_stdin_closed` (optional) is then called once.
//  * wakes: `wake_fd` (optional, an eventfd the pump reads to zero) ends the
//    pump's wait so that it asks `stdin_source`, every `room`, `stop`,
//    `cancelled` and `deadline` again (e.g. after new stdin, a reader that
//    consumed output, or a stop request). Without it they are asked at
//    least once a second.
//  * ending: `exit_fd` becomes readable (POLLIN) when the foreground may have
//    ended (a pidfd, or a channel); `on_exit_readable` then says whether it
//    did (true: reaped; false: not yet) or fails (the pump returns the error).
//  * deadline: `deadline()` is asked on every wake (it may move, e.g. by the
//    time the sandbox spent paused); once passed, `kill(SIGTERM)` then, after
//    `kill_grace`, `kill(SIGKILL)`, repeated every 200 ms until the end is
//    seen (grace 0: SIGKILL right after SIGTERM). `timed_out` is then set in
//    the result.
//  * stop: once `stop()` (optional) is true, `kill(SIGKILL)`, repeated every
//    200 ms, and the end is waited for at most `stop_wait` (DeadlineExceeded
//    naming the pump when it passes); then what is already in the pipes is
//    taken (as kAvailable) and the pump returns with `stopped` set. A stop
//    during the after-exit drain ends it the same way.
//  * after the end (`room` applies throughout): kAvailable takes what is
//    already in the pipes (bounded reads: background processes holding them
//    never keep the pump), then stops; kWhileReadable keeps reading while
//    some stream has data ready or is held back by its room (a slow
//    reader), and stops once none has, at most `linger` after the end, or
//    `linger_held` while a stream is held back (reaching the bound is not an
//    error: the rest stays in the pipe); kUntilEof reads until every output
//    is at EOF, at most `linger` (DeadlineExceeded naming the pump when it
//    passes).
//  * cancellation: `cancelled()` (optional) is asked on every wake, at least
//    once a second; true ends the pump with Cancelled. The pump never blocks
//    longer than a second without asking.
// Callbacks run on the calling thread, inside PumpOutput. Not thread-safe:
// one pump per command, on the calling thread (other threads reach it only
// through what its callbacks read and through `wake_fd`).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren {

// One output pipe: what the pump keeps of it and how much there was.
struct PumpStream {
  UniqueFd fd;         // read end; reset at EOF
  uint64_t cap = 0;    // bytes kept in `data`
  std::string data;    // at most `cap` bytes
  uint64_t total = 0;  // bytes read (kept or not)
  bool truncated() const { return total > data.size(); }
  // Optional: called with each chunk read (before the cap applies).
  std::function<void(std::string_view)> on_data;
  // Optional: bytes the pump may read now (0: none; back-pressure).
  std::function<size_t()> room;
  // Earlier streams are drained before each read of this one (see above).
  bool drain_earlier_first = false;
};

// What a stdin source has for the pump.
enum class StdinNext { kWait, kChunk, kClose };

struct PumpOptions {
  using Clock = std::chrono::steady_clock;
  enum class AfterExit { kAvailable, kWhileReadable, kUntilEof };

  int exit_fd = -1;
  std::function<StatusOr<bool>()> on_exit_readable;
  UniqueFd* stdin_fd = nullptr;  // write end, or nullptr/invalid: none
  std::string_view stdin_data;   // written to stdin_fd, then it is closed
  // Or: fills *chunk and returns kChunk, or kWait, or kClose.
  std::function<StdinNext(std::string* chunk)> stdin_source;
  std::function<void()> on_stdin_closed;        // optional
  int wake_fd = -1;                             // optional eventfd
  std::function<Clock::time_point()> deadline;  // nullptr or time_point::max(): none
  std::function<void(int sig)> kill;            // the ladder's signals (whole tree)
  std::chrono::milliseconds kill_grace{500};
  std::function<bool()> stop;  // optional
  std::chrono::milliseconds stop_wait{5000};
  AfterExit after_exit = AfterExit::kAvailable;
  std::chrono::milliseconds linger{5000};       // kWhileReadable, kUntilEof: bound after the end
  std::chrono::milliseconds linger_held{5000};  // kWhileReadable: bound while a stream is held back
  std::function<bool()> cancelled;              // optional
  std::string what = "command";                 // names the pump in errors
};

struct PumpResult {
  bool timed_out = false;
  bool stopped = false;  // stop() ended the pump
  // When the ladder's last signal was due (time_point::max() if never): the
  // caller may give the rest of the tree until then.
  PumpOptions::Clock::time_point kill_at = PumpOptions::Clock::time_point::max();
};

// Runs the pump until the end was seen (and the after-exit drain is done).
// Errors: InvalidArgument (more than 8 streams; both stdin_data and
// stdin_source), poll failing (errno), on_exit_readable's error, Cancelled,
// DeadlineExceeded (kUntilEof linger; stop_wait).
StatusOr<PumpResult> PumpOutput(const PumpOptions& options, const std::vector<PumpStream*>& streams);

}  // namespace warren
