// Raw syscall wrappers shared by the backends that build jails (container,
// fncall): the new mount API, which glibc 2.36 does not wrap, fork-like
// clone3, and set*id without glibc's thread broadcast. All async-signal-safe
// (one syscall each); they return what the syscall returns (-1 and errno on
// failure), like their libc counterparts would.
#pragma once

#include <linux/mount.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "common/raw_syscall.h"

namespace warren::jail {

inline int FsOpen(const char* fs, unsigned flags) { return static_cast<int>(syscall(SYS_fsopen, fs, flags)); }
inline int FsConfig(int fd, unsigned cmd, const char* key, const void* val, int aux) {
  return static_cast<int>(syscall(SYS_fsconfig, fd, cmd, key, val, aux));
}
inline int FsMount(int fd, unsigned flags, unsigned attrs) {
  return static_cast<int>(syscall(SYS_fsmount, fd, flags, attrs));
}
inline int OpenTree(int dfd, const char* path, unsigned flags) {
  return static_cast<int>(syscall(SYS_open_tree, dfd, path, flags));
}
inline int MountSetattr(int dfd, const char* path, unsigned flags, mount_attr* attr) {
  return static_cast<int>(syscall(SYS_mount_setattr, dfd, path, flags, attr, sizeof(*attr)));
}
inline int MoveMount(int from_dfd, const char* from, int to_dfd, const char* to, unsigned flags) {
  return static_cast<int>(syscall(SYS_move_mount, from_dfd, from, to_dfd, to, flags));
}

// glibc's set*id() wrappers broadcast the change to every thread of the
// process (nptl setxid), taking locks: in a child forked from the
// multithreaded daemon by raw clone3 that deadlocks. Children use these.
// pidfd_open(2) / pidfd_send_signal(2) (glibc 2.36 has no wrappers): -1 and errno on failure.
inline int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }
inline int PidfdSignal(int pidfd, int sig) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}
inline int RawSetresuid(uid_t u) { return static_cast<int>(syscall(SYS_setresuid, u, u, u)); }
inline int RawSetresgid(gid_t g) { return static_cast<int>(syscall(SYS_setresgid, g, g, g)); }

// A syscall that returns -errno on failure and never touches errno. A child
// cloned with CLONE_VM but without CLONE_VFORK (a warm shell, see the
// container backend) runs concurrently with the thread that cloned it and
// shares that thread's TLS, hence its errno (and so do all its siblings):
// where such a child branches on an expected errno (EEXIST, ENOENT), it must
// use this. x86_64 and aarch64 enter the kernel directly; elsewhere libc's
// syscall() (errno then races, as documented).
inline long RawSyscall(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0) {
#ifdef WARREN_HAVE_RAW_SYSCALL
  return warren_raw_syscall6(n, a, b, c, d, e, 0);
#else
  long r = syscall(n, a, b, c, d, e);
  return r < 0 ? -errno : r;
#endif
}

// Raw fork-like clone3 (no new stack: the child continues on a copy of ours),
// exit signal SIGCHLD; with CLONE_PIDFD the pidfd is stored in *pidfd_out.
inline pid_t Clone3(uint64_t flags, int* pidfd_out) {
  struct clone_args args;
  memset(&args, 0, sizeof args);
  args.flags = flags;
  args.exit_signal = SIGCHLD;
  if (flags & CLONE_PIDFD) args.pidfd = reinterpret_cast<uint64_t>(pidfd_out);
  return static_cast<pid_t>(syscall(SYS_clone3, &args, sizeof args));
}

}  // namespace warren::jail
