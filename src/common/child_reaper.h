// Reaps children of the daemon that a caller could not wait for in time.
//
// The daemon must never call waitpid(-1)/wait() (exec commands are its
// direct children, waited for by pidfd: a wildcard wait would steal their
// exit status). A caller that killed a child of ours and could not see it
// exit within its own bound (a frozen sandbox, a pid namespace still tearing
// down) hands the child's pidfd to the process-wide ChildReaper instead of
// leaving a zombie: one thread polls the pidfds it holds and reaps each
// child with waitid(P_PIDFD) once it exited. Only the given children are
// reaped, never another.
//
// Thread-safe. The reaper thread starts with the first Adopt and lives until
// process exit (children still pending then are reaped by the kernel's
// reparenting of our zombies to init/the subreaper).
#pragma once

#include <cstddef>

#include "common/unique_fd.h"

namespace warren {

class ChildReaper {
 public:
  // The process-wide reaper.
  static ChildReaper& Get();

  // Takes `pidfd` (of a child of this process) and reaps that child once it
  // exited; returns at once. A pidfd of a process that is not our child (or
  // was reaped already) is dropped at the first poll.
  void Adopt(UniqueFd pidfd);

  // Children handed over and not reaped yet (tests, diagnostics).
  size_t pending() const;

 private:
  ChildReaper() = default;
  struct State;
  State& state() const;
};

// Tries to reap the child behind `pidfd` now (waitid(P_PIDFD, WEXITED|WNOHANG));
// true when it was reaped here, false while it runs or when it is not ours.
bool TryReapPidfd(int pidfd);

}  // namespace warren
