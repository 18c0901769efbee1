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
#include "jail/syscalls.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace warren::runtime::container {

using jail::MoveMount;
using jail::RawSetresgid;
using jail::RawSetresuid;

const char* StepName(int32_t s) {
  static const char* const kNames[] = {
      "?", "recvmsg(rootfs fd)", "unshare(CLONE_NEWCGROUP)", "sethostname", "mount(/, MS_PRIVATE)",
      "move_mount(rootfs)", "chdir(rootfs)", "setresuid/setresgid(0)", "mkdir(mount point)", "mount(proc)",
      "mount(/dev tmpfs)", "bind(/dev node)", "mount(devpts)", "mount(/dev/shm)", "mount(/sys)",
      "mask /proc path", "pivot_root", "loopback up", "stdio", "setrlimit", "drop capabilities",
      "prctl(PR_SET_NO_NEW_PRIVS)", "seccomp", "execve", "recvmsg(upper fd)", "fcntl(upper fd, F_SETFD)",
      "recvmsg(dev/sysfs/mask mount fd)"};
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

int RecvInitParams(int sock, InitParams* p, int* rootfs, int* upper) {
  int fds[2] = {-1, -1};
  if (int rc = jail::RecvFds(sock, p, sizeof *p, fds, 2); rc != 0) return rc;
  *rootfs = fds[0];
  *upper = fds[1];
  p->hostname[sizeof p->hostname - 1] = '\0';
  p->shm_opts[sizeof p->shm_opts - 1] = '\0';
  p->rootfs[sizeof p->rootfs - 1] = '\0';
  return 0;
}

int SendInitParams(int sock, const InitParams& p, int rootfs, int upper) {
  const int fds[2] = {rootfs, upper};
  return jail::SendFds(sock, &p, sizeof p, fds, 2);
}

const char* const kDevNodes[6] = {"null", "zero", "full", "random", "urandom", "tty"};
const unsigned kDevNodeNumbers[6][2] = {{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}};  // major, minor
const char* const kMaskFiles[] = {"proc/kcore",       "proc/sysrq-trigger", "proc/keys",        "proc/kpagecount",
                                  "proc/kpageflags",  "proc/kpagecgroup",   "proc/timer_list",  "proc/sched_debug",
                                  "proc/latency_stats", "proc/timer_stats", "proc/kallsyms",    "proc/vmallocinfo"};
const char* const kMaskDirs[] = {"proc/acpi", "proc/scsi", "sys/firmware", "proc/driver"};
const char* const kReadOnlyDirs[] = {"proc/sys", "proc/bus", "proc/fs", "proc/irq"};

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
  InitParams ip;
  int rootfs = -1, upper = -1;
  if (int rc = RecvInitParams(p.sock, &ip, &rootfs, &upper); rc != 0) {
    if (rc == -EPIPE) ::_exit(1);  // parent gave up (or died): nothing to report
    jail::ChildFail(e, kStepRecvRootfs, -rc);
  }
  const int dev = jail::RecvFd(p.sock);
  if (dev < 0) jail::ChildFail(e, kStepRecvShared, -dev);
  const int sysfs = p.shared_sysfs ? jail::RecvFd(p.sock) : -1;
  if (p.shared_sysfs && sysfs < 0) jail::ChildFail(e, kStepRecvShared, -sysfs);
  const int mask = p.shared_mask ? jail::RecvFd(p.sock) : -1;
  if (p.shared_mask && mask < 0) jail::ChildFail(e, kStepRecvShared, -mask);
  ::close(p.sock);
  // 2. Namespaces: the cgroup namespace is created only now, after the
  // parent placed us in the sandbox cgroup, so that it is rooted there.
  if (::unshare(CLONE_NEWCGROUP) != 0) jail::ChildFail(e, kStepUnshareCgroup, errno);
  if (::sethostname(ip.hostname, strlen(ip.hostname)) != 0) jail::ChildFail(e, kStepHostname, errno);
  // 3. Mounts.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) jail::ChildFail(e, kStepPrivate, errno);
  // Still host uid 0 (owner of spec.dir) here: reach the mount point first.
  if (MoveMount(rootfs, "", AT_FDCWD, ip.rootfs, MOVE_MOUNT_F_EMPTY_PATH) != 0)
    jail::ChildFail(e, kStepAttachRoot, errno);
  ::close(rootfs);
  if (::chdir(ip.rootfs) != 0) jail::ChildFail(e, kStepChdirRoot, errno);
  // Become the sandbox's root (host uid_base) so that everything created from
  // now on belongs to it. Capabilities in the user namespace are kept.
  if (RawSetresgid(0) != 0 || RawSetresuid(0) != 0) jail::ChildFail(e, kStepSetId, errno);
  // Branches on an expected errno use RawSyscall: a warm shell shares errno
  // with the daemon thread that cloned it (see jail::RawSyscall).
  for (const char* d : {"proc", "dev", "sys", "tmp"}) {
    const long r =
        jail::RawSyscall(SYS_mkdirat, AT_FDCWD, reinterpret_cast<long>(d), strcmp(d, "tmp") == 0 ? 01777 : 0755);
    if (r < 0 && r != -EEXIST) jail::ChildFail(e, kStepMkdir, static_cast<int>(-r));
  }
  if (::mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
    jail::ChildFail(e, kStepProc, errno);
  // /dev: a directory of the upper's tmpfs (no superblock of its own).
  if (MoveMount(dev, "", AT_FDCWD, "dev", MOVE_MOUNT_F_EMPTY_PATH) != 0) jail::ChildFail(e, kStepDev, errno);
  ::close(dev);
  if (!ip.dev_nodes_made) {  // fallback: bind-mount the host's nodes
    char path[64], src[64];
    for (const char* n : kDevNodes) {
      memcpy(path, "dev/", 5);
      memcpy(src, "/dev/", 6);
      strncat(path, n, sizeof path - 8);
      strncat(src, n, sizeof src - 8);
      int fd = ::open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
      if (fd < 0) jail::ChildFail(e, kStepDevNode, errno);
      ::close(fd);
      if (::mount(src, path, nullptr, MS_BIND, nullptr) != 0) jail::ChildFail(e, kStepDevNode, errno);
    }
  }
  const char* const links[][2] = {{"/proc/self/fd", "dev/fd"},     {"/proc/self/fd/0", "dev/stdin"},
                                  {"/proc/self/fd/1", "dev/stdout"}, {"/proc/self/fd/2", "dev/stderr"},
                                  {"pts/ptmx", "dev/ptmx"},          {"/proc/kcore", "dev/core"}};
  for (const auto& l : links) (void)::symlink(l[0], l[1]);
  if (::mkdir("dev/pts", 0755) != 0 || ::mkdir("dev/shm", 01777) != 0 || ::mkdir("dev/mqueue", 0755) != 0)
    jail::ChildFail(e, kStepMkdir, errno);
  if (::mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") != 0)
    jail::ChildFail(e, kStepDevPts, errno);
  if (::mount("shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, ip.shm_opts) != 0)
    jail::ChildFail(e, kStepShm, errno);
  (void)::mount("mqueue", "dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  if (sysfs >= 0) {
    // The backend's shared read-only sysfs (of an empty netns, see SharedMounts).
    if (MoveMount(sysfs, "", AT_FDCWD, "sys", MOVE_MOUNT_F_EMPTY_PATH) != 0) jail::ChildFail(e, kStepSys, errno);
    ::close(sysfs);
  } else if (::mount("sysfs", "sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    // No sysfs for this netns/userns: an empty read-only tmpfs instead.
    if (::mount("tmpfs", "sys", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0,mode=555") != 0)
      jail::ChildFail(e, kStepSys, errno);
  }
  for (const char* m : kMaskFiles) {
    const long r =
        jail::RawSyscall(SYS_mount, reinterpret_cast<long>("/dev/null"), reinterpret_cast<long>(m), 0, MS_BIND);
    if (r < 0 && r != -ENOENT) jail::ChildFail(e, kStepMask, static_cast<int>(-r));
  }
  {
    // Masked dirs: the shared empty read-only tmpfs attached at the first
    // one, bind-mounted from there onto the others (one superblock for all
    // sandboxes); without it, a tmpfs each.
    const char* first = nullptr;
    for (const char* m : kMaskDirs) {
      const long target = reinterpret_cast<long>(m);
      long r;
      if (mask >= 0 && first == nullptr) {
        r = jail::RawSyscall(SYS_move_mount, mask, reinterpret_cast<long>(""), AT_FDCWD, target,
                             MOVE_MOUNT_F_EMPTY_PATH);
        if (r == 0) first = m;
      } else if (first != nullptr) {
        r = jail::RawSyscall(SYS_mount, reinterpret_cast<long>(first), target, 0, MS_BIND);
      } else {
        r = jail::RawSyscall(SYS_mount, reinterpret_cast<long>("tmpfs"), target, reinterpret_cast<long>("tmpfs"),
                             MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, reinterpret_cast<long>("size=0,mode=555"));
      }
      if (r < 0 && r != -ENOENT) jail::ChildFail(e, kStepMask, static_cast<int>(-r));
    }
    if (mask >= 0) ::close(mask);
  }
  for (const char* m : kReadOnlyDirs) {
    if (const long r = jail::RawSyscall(SYS_mount, reinterpret_cast<long>(m), reinterpret_cast<long>(m), 0,
                                        MS_BIND | MS_REC);
        r < 0) {
      if (r == -ENOENT) continue;
      jail::ChildFail(e, kStepMask, static_cast<int>(-r));
    }
    if (::mount(nullptr, m, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                nullptr) != 0)
      jail::ChildFail(e, kStepMask, errno);
  }
  if (::syscall(SYS_pivot_root, ".", ".") != 0) jail::ChildFail(e, kStepPivot, errno);
  if (::umount2(".", MNT_DETACH) != 0) jail::ChildFail(e, kStepPivot, errno);
  if (::chdir("/") != 0) jail::ChildFail(e, kStepPivot, errno);
  if (int rc = jail::LoopbackUp(); rc != 0) jail::ChildFail(e, kStepLoopback, -rc);
  // 4. stdio -> /dev/null, rlimits, capabilities, no_new_privs, seccomp.
  int nul = ::open("/dev/null", O_RDWR);
  if (nul < 0 || ::dup2(nul, 0) < 0 || ::dup2(nul, 1) < 0 || ::dup2(nul, 2) < 0) jail::ChildFail(e, kStepStdio, errno);
  if (nul > 2) ::close(nul);
  ::setsid();
  {
    const rlim_t nofile = static_cast<rlim_t>(ip.nofile);
    const jail::RlimitSetting rl[] = {{RLIMIT_NOFILE, {nofile, nofile}}, {RLIMIT_CORE, {0, 0}}};
    if (int rc = jail::ApplyRlimits(rl, 2); rc != 0) jail::ChildFail(e, kStepRlimits, -rc);
  }
  if (int rc = jail::DropCapabilities(0, p.last_cap); rc != 0) jail::ChildFail(e, kStepCaps, -rc);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) jail::ChildFail(e, kStepNoNewPrivs, errno);
  ::umask(022);
  // Everything but the error pipe and the init binary fd is already
  // O_CLOEXEC or becomes so here; both of those close on exec too.
  ::syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
  if (::fcntl(upper, F_SETFD, 0) != 0) jail::ChildFail(e, kStepKeepUpper, errno);
  if (p.seccomp) {
    sock_fprog prog = p.seccomp->prog();
    if (int rc = jail::InstallSeccompProgram(&prog); rc != 0) jail::ChildFail(e, kStepSeccomp, -rc);
  }
  char arg0[] = "warren-init";
  char arg1[16];  // the upper fd number, decimal (no snprintf: async-signal-safe)
  {
    char rev[16];
    int n = 0;
    unsigned v = static_cast<unsigned>(upper);
    do rev[n++] = static_cast<char>('0' + v % 10); while ((v /= 10) != 0 && n < 15);
    for (int i = 0; i < n; ++i) arg1[i] = rev[n - 1 - i];
    arg1[n] = '\0';
  }
  char* argv[] = {arg0, arg1, nullptr};
  char* envp[] = {nullptr};
  ::syscall(SYS_execveat, p.init_exe, "", argv, envp, AT_EMPTY_PATH);
  jail::ChildFail(e, kStepExec, errno);
}

}  // namespace warren::runtime::container
