/* The plan warrend hands to warren-spawn (src/init/warren_spawn.c): how to
 * start one command (an exec or a background process) inside a container
 * sandbox. C and C++; one definition of the wire format for both sides.
 *
 * Layout of the plan (a sealed memfd at fd WARREN_SPAWN_FD_PLAN, host byte
 * order: writer and reader are the same machine and build):
 *   struct WarrenSpawnHeader             (with the command's credentials: a
 *                                         containment plan's WarrenJailCreds)
 *   struct sock_filter[creds.n_filters]  (the seccomp program; 0 = none)
 *   strings, each NUL-terminated, in this order:
 *     cwd, not_found_msg, argv[argc], envp[envc], candidates[n_candidates]
 *
 * fds of warren-spawn when it starts (posix_spawn's file actions; every
 * other fd is closed):
 *   0, 1, 2   the command's stdin, stdout, stderr (the PTY slave for a PTY)
 *   3         the plan
 *   4         the report pipe: ChildReport records, then EOF once the
 *             command runs (close-on-exec) or every process has exited
 *   5         a pidfd of the sandbox's init (setns target)
 *   6         the control pipe's write end (fd 3 of the command), or closed
 *   7..       n_cgroup_fds cgroup.procs files to write "0" into, in order
 */
#ifndef WARREN_INIT_SPAWN_PLAN_H_
#define WARREN_INIT_SPAWN_PLAN_H_

#include <stdint.h>

#include "jail/plan.h"

#define WARREN_SPAWN_MAGIC 0x57535031u /* "WSP1" */
#define WARREN_SPAWN_MAX_PLAN_BYTES (64u << 20)

#define WARREN_SPAWN_FD_PLAN 3
#define WARREN_SPAWN_FD_REPORT 4
#define WARREN_SPAWN_FD_INIT 5
#define WARREN_SPAWN_FD_CONTROL 6
#define WARREN_SPAWN_FD_CGROUP0 7

/* flags */
#define WARREN_SPAWN_SETSID 0x1u  /* own session and process group (background processes) */
#define WARREN_SPAWN_TTY 0x2u     /* fd 0 is a terminal: make it the controlling one */
#define WARREN_SPAWN_CONTROL 0x4u /* fd 6 becomes the command's fd 3 */

struct WarrenSpawnHeader {
  uint32_t magic;
  uint32_t flags;
  uint32_t ns_flags; /* CLONE_NEW* set for setns(init pidfd) */
  uint32_t n_cgroup_fds;
  uint32_t argc, envc, n_candidates;
  uint32_t strings_bytes;
  /* Written by the kernel, not the daemon: warren-spawn maps the plan's
   * first page shared and clones the command with CLONE_PARENT_SETTID
   * pointing here, so the command's pid (in warrend's pid namespace) is in
   * the plan before clone returns: warrend finds its child even when the
   * helper is killed before it could report it. 0 until then. */
  int32_t child_pid;
  uint32_t pad;
  /* rlimits, ids, capabilities, no_new_privs, seccomp (filter: NULL here,
   * the program follows the header), applied by the plan's executor
   * (jail/plan.c). */
  struct WarrenJailCreds creds;
};

/* Report records on fd 4: step 0 = "started", err = the command's pid in
 * the daemon's pid namespace; any other step = that step failed with errno
 * `err` (the command did not run): a WarrenSpawnStep, or
 * WARREN_SPAWN_STEP_JAIL0 + a step of the containment plan (plan.h). */
struct WarrenSpawnReport {
  int32_t step;
  int32_t err;
};

enum WarrenSpawnStep {
  WARREN_SPAWN_STEP_STARTED = 0,
  WARREN_SPAWN_STEP_PLAN,
  WARREN_SPAWN_STEP_CGROUP,
  WARREN_SPAWN_STEP_SETGROUPS,
  WARREN_SPAWN_STEP_SETNS,
  WARREN_SPAWN_STEP_FORK,
  WARREN_SPAWN_STEP_CHDIR,
  WARREN_SPAWN_STEP_SESSION,
  WARREN_SPAWN_STEP_FDS,
  WARREN_SPAWN_STEP_COUNT,
  WARREN_SPAWN_STEP_JAIL0 = 1000
};

static const char* const kWarrenSpawnStepNames[WARREN_SPAWN_STEP_COUNT] = {
    "started",    "read plan",        "join cgroup", "setgroups", "setns(pidfd)", "clone(CLONE_PARENT)",
    "chdir(cwd)", "setsid/TIOCSCTTY", "fds"};

#endif /* WARREN_INIT_SPAWN_PLAN_H_ */
