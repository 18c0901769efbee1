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
#if defined(__x86_64__)
  long ret;
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                   : "rcx", "r11", "memory");
  return ret;
#elif defined(__aarch64__)
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  register long x4 __asm__("x4") = e;
  __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
  return x0;
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
