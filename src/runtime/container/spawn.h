// Starting one command (an exec or a background process) inside a container
// sandbox: warrend posix_spawns the static warren-spawn program with a plan
// (src/init/spawn_plan.h); warren-spawn joins the cgroups and namespaces
// and clones the command as warrend's child (CLONE_PARENT). Nothing that
// shares warrend's memory, signal handlers or fds ever enters a sandbox:
// the daemon thread is released at warren-spawn's execve, before any step
// the sandbox can see or stall (src/init/warren_spawn.c says why).
//
// Every wait on a spawn is bounded: CollectSpawn polls the report pipe in
// slices and asks the caller whether to go on (its deadline, a destroy, a
// pause); a spawn given up on is handed to the SpawnReaper, which kills the
// command once its pid is known and reaps what is left.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "jail/contain.h"
#include "jail/seccomp.h"

namespace warren::runtime {

struct SpawnRequest {
  std::string spawn_path;       // the warren-spawn binary
  int init_pidfd = -1;          // borrowed: pidfd of the sandbox's init (setns target)
  uint32_t ns_flags = 0;        // CLONE_NEW* to enter
  std::vector<int> cgroup_fds;  // borrowed: cgroup.procs files, joined in order
  // Borrowed: the command's stdio (for a PTY all three are the slave).
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;
  int control_fd = -1;  // borrowed: becomes the command's fd 3; -1 = none
  bool setsid = false;  // own session and process group
  bool tty = false;     // stdin is a terminal to make the controlling one
  uid_t uid = 0;        // inside the sandbox's user namespace
  gid_t gid = 0;
  uint64_t caps = 0;  // kept for uid 0; a non-root command gets none
  int last_cap = 40;
  std::vector<jail::RlimitSetting> rlimits;
  bool best_effort = false;                       // the sandbox's QoS class is best-effort (SCHED_IDLE, oom_score_adj)
  const jail::SeccompProgram* seccomp = nullptr;  // nullptr = none
  std::string cwd;
  std::string not_found_msg;  // written to stderr when no candidate execs
  std::vector<std::string> argv, envp, candidates;
};

// A warren-spawn helper on its way.
struct SpawnInFlight {
  pid_t helper = -1;
  UniqueFd helper_pidfd;
  UniqueFd report;  // read end of the report pipe
  UniqueFd plan;    // the plan's memfd: the kernel writes the command's pid into it
};

// posix_spawns warren-spawn for `req`. Errors: the plan's memfd, pipe or
// posix_spawn failed (errno kept). Thread-safe.
StatusOr<SpawnInFlight> LaunchSpawn(const SpawnRequest& req);

// Follows spawns given up on (see CollectSpawn) until their command's pid
// is known (from the report pipe, or, when the helper was killed between
// its clone and its report, from the plan), kills that command and hands
// every pidfd to the process-wide ChildReaper (common/child_reaper.h). One
// thread, started on first use, ended by the destructor.
class SpawnReaper {
 public:
  SpawnReaper();
  ~SpawnReaper();
  SpawnReaper(const SpawnReaper&) = delete;
  SpawnReaper& operator=(const SpawnReaper&) = delete;

  // Takes over a spawn: SIGKILLs its command as soon as its pid is known
  // (`child` > 0 if already known, with its pidfd); helper and command are
  // reaped by the ChildReaper.
  void Abandon(SpawnInFlight spawn, pid_t child, UniqueFd child_pidfd);

 private:
  struct Item;
  void Run();
  void Wake();
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Item>> items_;  // guarded by mu_
  std::thread thread_;                        // started by the first item
  UniqueFd wake_;                             // eventfd
  std::atomic<bool> stop_{false};
};

struct SpawnStarted {
  pid_t pid = -1;
  UniqueFd pidfd;
};

// Waits for the helper's report: the command's pid, then EOF once it execs
// (or a failed step). `keep_waiting` is asked every <= 100 ms; a non-OK
// status gives the spawn up (to `reaper`) and is returned. `verb` and `cwd`
// name the call in errors. A failed step: the step's errno as Status.
StatusOr<SpawnStarted> CollectSpawn(SpawnInFlight spawn, const std::function<Status()>& keep_waiting,
                                    SpawnReaper& reaper, const std::string& verb, const std::string& cwd);

}  // namespace warren::runtime
