// The sandbox's first process (its "shell", then warren-init): what it is
// told (InitPlan before clone, its containment plan once its sandbox is known) and what
// it does until it execs warren-init (InitChild, async-signal-safe).
#pragma once

#include <cstdint>

#include "jail/plan.h"
#include "jail/seccomp.h"

namespace warren::runtime::container {

// Child-side failure steps, reported as {step, errno}; the containment
// plan's own steps from kJailStep0 on.
enum Step : int32_t {
  kStepRecvRootfs = 1,
  kStepUnshareCgroup,
  kStepLoopback,
  kStepStdio,
  kStepExec,
  kStepKeepUpper,
  kStepRecvShared,
};
// Steps of the containment plan are reported offset by this (StepName).
constexpr int32_t kJailStep0 = 1000;

// The name of a step, for errors ("pivot_root").
const char* StepName(int32_t s);

// ------------------------------------------------------------------ plans
// What the sandbox's first process needs that does not depend on the
// sandbox, prepared before clone. The first process is spawned as a "shell"
// (namespaces made, cgroup joined by the parent) that waits for the
// sandbox-specific part (its containment plan + the rootfs and upper fds, one
// message on the socket), so that a shell can be spawned ahead of time (warm pool).
struct InitPlan {
  int sock = -1;      // child end of the SCM_RIGHTS socketpair
  int err_fd = -1;    // write end of the error pipe (O_CLOEXEC: EOF = exec ok)
  int init_exe = -1;  // O_PATH fd of warren-init
  int last_cap = 40;
  // Density (see SharedMounts): after the params message, the parent sends
  // the /dev mount (a dir of the upper's tmpfs), then, when set, clones of
  // the backend's shared read-only sysfs and mask mounts.
  bool shared_sysfs = false, shared_mask = false;
  const jail::SeccompProgram* seccomp = nullptr;
};

// The sandbox-specific part is its containment plan (jail::SandboxInitPlan),
// one message sent with the rootfs mount and upper dir fds.
// Async-signal-safe: receives it. 0 on success, -EPIPE if the parent closed
// the socket (gave up), -EBADF/-EPROTO for a malformed message.
int RecvInitPlan(int sock, WarrenJailPlan* p, int* rootfs, int* upper);
int SendInitPlan(int sock, const WarrenJailPlan& p, int rootfs, int upper);

// Async-signal-safe. Runs as the sandbox's first process (pid 1 of its pid
// namespace) until it execs warren-init.
[[noreturn]] void InitChild(const InitPlan& p);

}  // namespace warren::runtime::container
