// warren-init: PID 1 of a container sandbox. Holds the sandbox's namespaces
// and reaps every zombie reparented to it, forever. It has no control
// channel: the daemon enters the sandbox with setns from outside.
//
// Contract: exits only when killed with SIGKILL (the only signal the kernel
// delivers to a pid-namespace init from inside its namespace without a
// handler). Every catchable signal is blocked and consumed via sigwaitinfo so
// that SIGTERM/SIGINT/SIGHUP sent by sandbox code do not end the sandbox;
// SIGCHLD triggers a reap pass. Linked -static, no allocation: RSS stays far
// below 1 MiB.
//
// argv[1], if given, is a decimal fd to keep open: the daemon's handle on the
// sandbox's upper dir (a detached tmpfs), found again through
// /proc/<init>/fd after a daemon restart. warren-init makes itself
// non-dumpable so that sandbox processes (same uid, no CAP_SYS_PTRACE)
// cannot open /proc/1/fd/* and reach it; the host daemon still can.
#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static int ParseFd(const char* s) {
  int v = 0;
  if (s == NULL || *s == '\0') return -1;
  for (; *s; ++s) {
    if (*s < '0' || *s > '9' || v > 100000000) return -1;
    v = v * 10 + (*s - '0');
  }
  return v;
}

int main(int argc, char** argv) {
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, NULL);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  const int keep = argc > 1 ? ParseFd(argv[1]) : -1;
  // Close whatever else the launcher may have leaked (it passes none on purpose).
  for (int fd = 3; fd < 1024; ++fd) {
    if (fd != keep) close(fd);
  }
  for (;;) {
    // Reap everything that is already dead before sleeping again.
    for (;;) {
      int status;
      pid_t p = waitpid(-1, &status, WNOHANG);
      if (p <= 0) break;
    }
    siginfo_t info;
    if (sigwaitinfo(&all, &info) < 0 && errno != EINTR) {
      // Only EINTR is expected; anything else: avoid a busy loop.
      pause();
    }
  }
}
