// warren-init: PID 1 of a container sandbox. Holds the sandbox's namespaces
// and reaps every zombie reparented to it, forever. It has no control
// channel: the daemon enters the sandbox with setns from outside.
//
// Contract: exits only when killed with SIGKILL (the only signal the kernel
// delivers to a pid-namespace init from inside its namespace without a
// handler). Every catchable signal is blocked and consumed via sigwaitinfo so
// that SIGTERM/SIGINT/SIGHUP sent by sandbox code do not end the sandbox;
// SIGCHLD triggers a reap pass.
//
// argv[1], if given, is a decimal fd to keep open: the daemon's handle on the
// sandbox's upper dir (a detached tmpfs), found again through
// /proc/<init>/fd after a daemon restart. warren-init makes itself
// non-dumpable so that sandbox processes (same uid, no CAP_SYS_PTRACE)
// cannot open /proc/1/fd/* and reach it; the host daemon still can.
//
// Density: one of these runs in every sandbox, so it is built
// freestanding (no libc, raw syscalls, x86_64 and aarch64): no data, no heap,
// no TLS; its private memory is the few stack pages the kernel writes argv
// and auxv into (measured with bench/density/components.c: 12 KiB of
// anonymous memory and 8 KiB fewer page tables than the static glibc build's
// 43 KiB).
#include <linux/prctl.h>
#include <linux/wait.h>
#include <stddef.h>
#include <sys/syscall.h>

#include "common/freestanding_start.h"
#include "common/raw_syscall.h"

static long Sys(long n, long a, long b, long c, long d, long e) { return warren_raw_syscall6(n, a, b, c, d, e, 0); }

WARREN_FREESTANDING_START(InitMain)

#define kSigsetBytes 8  // the kernel's sigset_t (64 signals)
#define kEintr 4

static int ParseFd(const char* s) {
  int v = 0;
  if (s == NULL || *s == '\0') return -1;
  for (; *s; ++s) {
    if (*s < '0' || *s > '9' || v > 100000000) return -1;
    v = v * 10 + (*s - '0');
  }
  return v;
}

__attribute__((noreturn, used)) void InitMain(long* sp) {
  const long argc = sp[0];
  char** argv = (char**)(sp + 1);
  unsigned long all = ~0UL;  // every signal; the kernel ignores SIGKILL/SIGSTOP in a mask
  Sys(__NR_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&all, 0, kSigsetBytes, 0);
  Sys(__NR_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0);
  const int keep = argc > 1 ? ParseFd(argv[1]) : -1;
  // No fd to close: the launcher marks every fd >= 3 close-on-exec
  // (close_range(CLOSE_RANGE_CLOEXEC)) before it execs us, except `keep`.
  (void)keep;
  for (;;) {
    // Reap everything that is already dead before sleeping again.
    for (int i = 0; i < 1 << 20; ++i) {
      int status;
      if (Sys(__NR_wait4, -1, (long)&status, WNOHANG, 0, 0) <= 0) break;
    }
    long info[16];  // siginfo_t: 128 bytes
    long rc = Sys(__NR_rt_sigtimedwait, (long)&all, (long)info, 0, kSigsetBytes, 0);
    if (rc < 0 && rc != -kEintr) {
      // Only EINTR is expected; anything else: avoid a busy loop (every
      // signal is blocked, so this sleeps until SIGKILL).
      Sys(__NR_ppoll, 0, 0, 0, 0, 0);
    }
  }
}
