#include "runtime/container/init.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "jail/contain.h"
#include "jail/plan.h"
#include "jail/plan_builder.h"
#include "jail/syscalls.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace warren::runtime::container {

using jail::MoveMount;
using jail::RawSetresgid;
using jail::RawSetresuid;

const char* StepName(int32_t s) {
  static const char* const kNames[] = {"?",
                                       "recvmsg(init plan, rootfs and upper fds)",
                                       "unshare(CLONE_NEWCGROUP)",
                                       "loopback up",
                                       "stdio",
                                       "execve",
                                       "fcntl(upper fd, F_SETFD)",
                                       "recvmsg(dev/sysfs/mask/cgroup view mount fd)"};
  return s > 0 && s < static_cast<int32_t>(sizeof kNames / sizeof kNames[0]) ? kNames[s] : "?";
}

namespace {

// Async-signal-safe: default dispositions and an empty mask (the daemon may
// ignore SIGPIPE or block signals in its threads).
void ResetSignals() {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) {
    if (s == SIGKILL || s == SIGSTOP) continue;
    sigaction(s, &sa, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Async-signal-safe: closes every fd >= 3 except the three given.
void CloseAllFdsExcept(std::array<int, 3> keep) {
  std::sort(keep.begin(), keep.end());
  unsigned from = 3;
  for (int k : keep) {
    if (k < static_cast<int>(from)) continue;
    if (static_cast<unsigned>(k) > from) ::syscall(SYS_close_range, from, static_cast<unsigned>(k) - 1, 0);
    from = static_cast<unsigned>(k) + 1;
  }
  ::syscall(SYS_close_range, from, ~0U, 0);
}

}  // namespace

int RecvInitPlan(int sock, WarrenJailPlan* p, int* rootfs, int* upper) {
  int fds[2] = {-1, -1};
  if (int rc = jail::RecvFds(sock, p, sizeof *p, fds, 2); rc != 0) return rc;
  *rootfs = fds[0];
  *upper = fds[1];
  p->hostname[sizeof p->hostname - 1] = '\0';
  p->root[sizeof p->root - 1] = '\0';
  return warren_jail_plan_check(p);
}

int SendInitPlan(int sock, const WarrenJailPlan& p, int rootfs, int upper) {
  const int fds[2] = {rootfs, upper};
  return jail::SendFds(sock, &p, sizeof p, fds, 2);
}

// Async-signal-safe. Runs as the sandbox's first process (pid 1 of its pid
// namespace) until it execs warren-init.
[[noreturn]] void InitChild(const InitPlan& p) {
  const int e = p.err_fd;
  ResetSignals();
  // Until exec this process holds copies of every daemon fd, including the
  // parent ends of OTHER creates' socketpairs: if the daemon dies, two
  // half-created children would wait for each other forever (and keep the
  // daemon's listening socket open). Die with the daemon instead. The kernel
  // clears this at the setresuid below, so a running sandbox is not tied to
  // the daemon's life.
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Until it execs warren-init, a (warm) shell: tell it apart in ps/comm.
  (void)::prctl(PR_SET_NAME, "warren-shell", 0, 0, 0);
  ::umask(0);
  // 1. Wait for the parent: maps written, cgroup joined, then (maybe much
  // later, for a warm shell) the sandbox's params and rootfs mount sent.
  // Every inherited fd but ours goes first: copies of the daemon's end of
  // this socket, or of another concurrent create's, would keep the receive
  // from seeing EOF if the daemon died before sending, and the child would
  // block forever holding the daemon's listening socket.
  CloseAllFdsExcept({p.sock, p.err_fd, p.init_exe});
  // The upper dir: warren-init keeps it open (argv[1]) so that a restarted
  // daemon can reach the detached upper tmpfs through /proc/<init>/fd.
  WarrenJailPlan plan;
  int rootfs = -1, upper = -1;
  if (int rc = RecvInitPlan(p.sock, &plan, &rootfs, &upper); rc != 0) {
    if (rc == -EPIPE) ::_exit(1);  // parent gave up (or died): nothing to report
    jail::ChildFail(e, kStepRecvRootfs, -rc);
  }
  // The seccomp program stays in the daemon's memory (shared, or copied at
  // the clone): the plan names its length only.
  plan.creds.filter = p.seccomp && plan.creds.n_filters ? p.seccomp->filter.data() : nullptr;
  const int dev = jail::RecvFd(p.sock);
  if (dev < 0) jail::ChildFail(e, kStepRecvShared, -dev);
  const int sysfs = p.shared_sysfs ? jail::RecvFd(p.sock) : -1;
  if (p.shared_sysfs && sysfs < 0) jail::ChildFail(e, kStepRecvShared, -sysfs);
  const int mask = p.shared_mask ? jail::RecvFd(p.sock) : -1;
  if (p.shared_mask && mask < 0) jail::ChildFail(e, kStepRecvShared, -mask);
  // The cgroup view, built by the daemon (jail/cgroup_view.h), when the plan mounts it.
  const bool has_view = warren_jail_plan_uses_slot(&plan, jail::kSlotCgroupView) != 0;
  const int cgroup_view = has_view ? jail::RecvFd(p.sock) : -1;
  if (has_view && cgroup_view < 0) jail::ChildFail(e, kStepRecvShared, -cgroup_view);
  ::close(p.sock);
  // 2. Namespaces: the cgroup namespace is created only now, after the
  // parent placed us in the sandbox cgroup, so that it is rooted there.
  if (::unshare(CLONE_NEWCGROUP) != 0) jail::ChildFail(e, kStepUnshareCgroup, errno);
  // 3. The plan: hostname, rootfs, the sandbox's root ids, mounts, masks,
  // pivot_root (jail/plan.h; raw syscalls: a warm shell shares errno with
  // the daemon thread that cloned it, see jail::RawSyscall).
  const int fds[WARREN_JAIL_MAX_FD_SLOTS] = {rootfs, dev, sysfs, mask, cgroup_view};
  int step = 0;
  if (int rc = warren_jail_enter_root(&plan, fds, &step); rc != 0) jail::ChildFail(e, kJailStep0 + step, -rc);
  if (int rc = warren_jail_mount(&plan, fds, &step); rc != 0) jail::ChildFail(e, kJailStep0 + step, -rc);
  if (mask >= 0) ::close(mask);  // unused when no masked dir exists
  if (int rc = jail::LoopbackUp(); rc != 0) jail::ChildFail(e, kStepLoopback, -rc);
  // 4. stdio -> /dev/null, then the plan's rlimits, capabilities (none),
  // no_new_privs, seccomp.
  int nul = ::open("/dev/null", O_RDWR);
  if (nul < 0 || ::dup2(nul, 0) < 0 || ::dup2(nul, 1) < 0 || ::dup2(nul, 2) < 0) jail::ChildFail(e, kStepStdio, errno);
  if (nul > 2) ::close(nul);
  ::setsid();
  ::umask(022);
  // Everything but the error pipe and the init binary fd is already
  // O_CLOEXEC or becomes so here; both of those close on exec too.
  ::syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
  if (::fcntl(upper, F_SETFD, 0) != 0) jail::ChildFail(e, kStepKeepUpper, errno);
  if (int rc = warren_jail_lockdown(&plan.creds, &step); rc != 0) jail::ChildFail(e, kJailStep0 + step, -rc);
  char arg0[] = "warren-init";
  char arg1[16];  // the upper fd number, decimal (no snprintf: async-signal-safe)
  {
    char rev[16];
    int n = 0;
    unsigned v = static_cast<unsigned>(upper);
    do rev[n++] = static_cast<char>('0' + v % 10);
    while ((v /= 10) != 0 && n < 15);
    for (int i = 0; i < n; ++i) arg1[i] = rev[n - 1 - i];
    arg1[n] = '\0';
  }
  char* argv[] = {arg0, arg1, nullptr};
  char* envp[] = {nullptr};
  ::syscall(SYS_execveat, p.init_exe, "", argv, envp, AT_EMPTY_PATH);
  jail::ChildFail(e, kStepExec, errno);
}

// The cgroup limits of a sandbox spec (Create's, and what a recycled cgroup holds).

}  // namespace warren::runtime::container
