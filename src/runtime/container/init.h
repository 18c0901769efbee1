// The sandbox's first process (its "shell", then warren-init): what it is
// told (InitPlan before clone, InitParams once its sandbox is known) and what
// it does until it execs warren-init (InitChild, async-signal-safe).
#pragma once

#include <cstdint>

#include "jail/seccomp.h"

namespace warren::runtime::container {

// Child-side failure steps, reported as {step, errno}.
enum Step : int32_t {
  kStepRecvRootfs = 1, kStepUnshareCgroup, kStepHostname, kStepPrivate, kStepAttachRoot, kStepChdirRoot,
  kStepSetId, kStepMkdir, kStepProc, kStepDev, kStepDevNode, kStepDevPts, kStepShm, kStepSys, kStepMask,
  kStepPivot, kStepLoopback, kStepStdio, kStepRlimits, kStepCaps, kStepNoNewPrivs, kStepSeccomp, kStepExec,
  kStepRecvUpper, kStepKeepUpper,
  kStepRecvShared,
};

// The name of a step, for errors ("pivot_root").
const char* StepName(int32_t s);

// ------------------------------------------------------------------ plans
// What the sandbox's first process needs that does not depend on the
// sandbox, prepared before clone. The first process is spawned as a "shell"
// (namespaces made, cgroup joined by the parent) that waits for the
// sandbox-specific part (InitParams + the rootfs and upper fds, one message on
// the socket), so that a shell can be spawned ahead of time (warm pool).
struct InitPlan {
  int sock = -1;       // child end of the SCM_RIGHTS socketpair
  int err_fd = -1;     // write end of the error pipe (O_CLOEXEC: EOF = exec ok)
  int init_exe = -1;   // O_PATH fd of warren-init
  int last_cap = 40;
  // Density (see SharedMounts): after the params message, the parent sends
  // the /dev mount (a dir of the upper's tmpfs), then, when set, clones of
  // the backend's shared read-only sysfs and mask mounts.
  bool shared_sysfs = false, shared_mask = false;
  const jail::SeccompProgram* seccomp = nullptr;
};

// The sandbox-specific part, sent with the rootfs mount and upper dir fds.
struct InitParams {
  char hostname[64];   // NUL-terminated, at most 63 bytes
  char shm_opts[96];   // mount options of /dev/shm
  uint64_t nofile;
  char rootfs[1024];   // spec.dir/rootfs, NUL-terminated
  uint32_t dev_nodes_made;  // 1: the daemon made kDevNodes in the /dev dir (no bind mounts needed)
};

// Async-signal-safe: receives the InitParams message with its two fds
// (rootfs, upper). 0 on success, -EPIPE if the parent closed the socket (gave
// up), -EBADF/-EPROTO for a malformed message.
int RecvInitParams(int sock, InitParams* p, int* rootfs, int* upper);
int SendInitParams(int sock, const InitParams& p, int rootfs, int upper);

// The device nodes of a sandbox's /dev (made by BuildRootfs, or bind-mounted
// from the host by InitChild when that failed).
extern const char* const kDevNodes[6];
extern const unsigned kDevNodeNumbers[6][2];  // major, minor

// Async-signal-safe. Runs as the sandbox's first process (pid 1 of its pid
// namespace) until it execs warren-init.
[[noreturn]] void InitChild(const InitPlan& p);

}  // namespace warren::runtime::container
