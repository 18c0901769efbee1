// One output pump for commands run to completion: feeds stdin, collects
// stdout/stderr (and any other output pipe) up to a cap per stream with
// totals counted past it, watches for the foreground's end, enforces a
// deadline with a kill ladder, and drains after the end. Used by the
// container exec (runtime/container/sandbox.cc); written so that fncall's call loop and the
// node's background-process pump can use it too (see the contract below).
//
// Contract:
//  * fds: the caller creates the pipes; the pump makes the read/write ends it
//    is given non-blocking, reads with one 64 KiB buffer per thread, and
//    resets (closes) an output fd at EOF and the stdin fd once all of
//    `stdin_data` is written or the reader is gone (EPIPE; SIGPIPE is blocked
//    in the calling thread for the pump's duration).
//  * ending: `exit_fd` becomes readable (POLLIN) when the foreground may have
//    ended (a pidfd, or a channel); `on_exit_readable` then says whether it
//    did (true: reaped; false: not yet) or fails (the pump returns the error).
//  * deadline: `deadline()` is asked on every wake (it may move, e.g. by the
//    time the sandbox spent paused); once passed, `kill(SIGTERM)` then, after
//    `kill_grace`, `kill(SIGKILL)`, repeated every 200 ms until the end is
//    seen (grace 0: SIGKILL right after SIGTERM). `timed_out` is then set in
//    the result.
//  * after the end: kAvailable takes what is already in the pipes (bounded
//    reads: background processes holding them never keep the pump), then
//    stops; kUntilEof reads until every output is at EOF, at most `linger`
//    (DeadlineExceeded naming the pump when it passes).
//  * cancellation: `cancelled()` (optional) is asked on every wake, at least
//    once a second; true ends the pump with Cancelled. The pump never blocks
//    longer than a second without asking.
// Not thread-safe: one pump per command, on the calling thread.
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
};

struct PumpOptions {
  using Clock = std::chrono::steady_clock;
  enum class AfterExit { kAvailable, kUntilEof };

  int exit_fd = -1;
  std::function<StatusOr<bool>()> on_exit_readable;
  UniqueFd* stdin_fd = nullptr;                 // write end, or nullptr/invalid: none
  std::string_view stdin_data;                  // written to stdin_fd, then it is closed
  std::function<Clock::time_point()> deadline;  // nullptr or time_point::max(): none
  std::function<void(int sig)> kill;            // the ladder's signals (whole tree)
  std::chrono::milliseconds kill_grace{500};
  AfterExit after_exit = AfterExit::kAvailable;
  std::chrono::milliseconds linger{5000};  // kUntilEof: bound after the end
  std::function<bool()> cancelled;         // optional
  std::string what = "command";            // names the pump in errors
};

struct PumpResult {
  bool timed_out = false;
  // When the ladder's last signal was due (time_point::max() if never): the
  // caller may give the rest of the tree until then.
  PumpOptions::Clock::time_point kill_at = PumpOptions::Clock::time_point::max();
};

// Runs the pump until the end was seen (and the after-exit drain is done).
// Errors: poll failing (errno), on_exit_readable's error, Cancelled,
// DeadlineExceeded (kUntilEof linger).
StatusOr<PumpResult> PumpOutput(const PumpOptions& options, std::vector<PumpStream*> streams);

}  // namespace warren
