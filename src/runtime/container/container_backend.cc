// The container backend. Layout of one sandbox:
//
//   host (daemon) mount namespace: NOTHING is mounted per sandbox. The
//   writable tmpfs (upper/ + work/), the idmapped clones of the lower layers
//   and the overlay are all created as detached mounts (fsopen/fsmount,
//   open_tree(OPEN_TREE_CLONE)) and handed to the sandbox's first process over
//   a unix socket (SCM_RIGHTS); it attaches the overlay in its own private
//   mount namespace. All of a sandbox's mounts therefore die with its mount
//   namespace: killing the sandbox's processes is enough to release them,
//   which makes Destroy and Cleanup (after a daemon crash) trivially complete.
//
//   spec.dir/rootfs   empty directory, the mount point of the overlay inside
//                     the sandbox's mount namespace only (pivot_root target).
//
//   Disk limit: the kernel has no quota support, so the upper layer lives on a
//   tmpfs of size disk_mb; its pages are charged to the sandbox's memory
//   cgroup (the tmpfs is written by sandbox processes), i.e. files written to
//   the upper count against memory_mb too.
//
//   Ownership: root inside = host uid_base + slot*uid_range. The lower layers
//   are idmapped (MOUNT_ATTR_IDMAP with the sandbox's user namespace) so
//   root-owned layer files appear owned by root inside; the tmpfs root is
//   owned by the sandbox's root.
#include "runtime/container/container_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <optional>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "common/child_reaper.h"
#include "common/scoped_sigpipe.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "jail/cgroup.h"
#include "jail/contain.h"
#include "jail/seccomp.h"
#include "jail/syscalls.h"
#include "runtime/container/memory_prefetch.h"
#include "runtime/container/rooted_files.h"
#include "runtime/container/spawn.h"
#include "runtime/container/uid_slots.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace warren::runtime {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// How long a background process's spawn may take (paused time excluded).
constexpr milliseconds kStartSetupLimit{30000};
constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
constexpr int kNsFlags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC |
                         CLONE_NEWNET | CLONE_NEWCGROUP;

// ---- raw syscalls (glibc 2.36 lacks wrappers for some of them; shared ones in jail/syscalls.h)
using jail::Clone3;
using jail::FsConfig;
using jail::FsMount;
using jail::FsOpen;
using jail::MountSetattr;
using jail::MoveMount;
using jail::OpenTree;
using jail::RawSetresgid;
using jail::RawSetresuid;
using jail::PidfdOpen;
using jail::PidfdSignal;

Status Errno(const std::string& what) { return ErrnoToStatus(errno, what); }

// Reads a whole small file; nullopt on error.
std::optional<std::string> ReadSmallFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;
  std::string out;
  char buf[4096];
  for (int i = 0; i < 256; ++i) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); 0 if gone.
uint64_t ProcStartTime(pid_t pid) {
  auto s = ReadSmallFile("/proc/" + std::to_string(pid) + "/stat");
  if (!s) return 0;
  size_t rp = s->rfind(')');
  if (rp == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(s->substr(rp + 2), ' ');
  // f[0] is field 3 (state); field 22 is f[19].
  uint64_t v = 0;
  if (f.size() > 19 && absl::SimpleAtoi(f[19], &v)) return v;
  return 0;
}

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 63) return false;
  return std::all_of(id.begin(), id.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

// Child-side failure steps, reported as {step, errno}.
enum Step : int32_t {
  kStepRecvRootfs = 1, kStepUnshareCgroup, kStepHostname, kStepPrivate, kStepAttachRoot, kStepChdirRoot,
  kStepSetId, kStepMkdir, kStepProc, kStepDev, kStepDevNode, kStepDevPts, kStepShm, kStepSys, kStepMask,
  kStepPivot, kStepLoopback, kStepStdio, kStepRlimits, kStepCaps, kStepNoNewPrivs, kStepSeccomp, kStepExec,
  kStepRecvUpper, kStepKeepUpper,
  kStepRecvShared,
};

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


// Stacks for CLONE_VM children (the posix_spawn technique: the child shares
// the daemon's memory until execve instead of copying its page tables, which
// for a multi-threaded gRPC daemon costs milliseconds per fork and again at
// the child's exit). Each stack has a PROT_NONE guard page below it. The
// children run only async-signal-safe code and raw id syscalls (glibc's
// setuid would signal the daemon's threads), and the parent is suspended
// (CLONE_VFORK) until they execve or exit.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// ASan and TSan cannot follow a child onto a stack of its own
// (google/sanitizers#189; TSan's child runs on a thread it never saw start and
// crashes): sanitized builds fork the exec helper and grandchild instead.
constexpr bool kSpawnSharesMemory = false;
#else
constexpr bool kSpawnSharesMemory = true;
#endif

class ChildStacks {
 public:
  static constexpr size_t kStackBytes = 256 << 10;
  ~ChildStacks() {
    if (base_ != MAP_FAILED) ::munmap(base_, total_);
  }
  Status Map(int n) {
    page_ = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    total_ = static_cast<size_t>(n) * (page_ + kStackBytes);
    base_ = ::mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (base_ == MAP_FAILED) return ErrnoToStatus(errno, "mmap(child stacks)");
    for (int i = 0; i < n; ++i) {
      if (::mprotect(static_cast<char*>(base_) + i * (page_ + kStackBytes), page_, PROT_NONE) != 0)
        return ErrnoToStatus(errno, "mprotect(child stack guard)");
    }
    return absl::OkStatus();
  }
  // Highest address of stack i (stacks grow down).
  void* Top(int i) const { return static_cast<char*>(base_) + (i + 1) * (page_ + kStackBytes); }

 private:
  void* base_ = MAP_FAILED;
  size_t total_ = 0, page_ = 4096;
};

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

const char* const kDevNodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
const unsigned kDevNodeNumbers[][2] = {{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}};  // major, minor
const char* const kMaskFiles[] = {"proc/kcore",       "proc/sysrq-trigger", "proc/keys",        "proc/kpagecount",
                                  "proc/kpageflags",  "proc/kpagecgroup",   "proc/timer_list",  "proc/sched_debug",
                                  "proc/latency_stats", "proc/timer_stats", "proc/kallsyms",    "proc/vmallocinfo"};
const char* const kMaskDirs[] = {"proc/acpi", "proc/scsi", "sys/firmware", "proc/driver"};
const char* const kReadOnlyDirs[] = {"proc/sys", "proc/bus", "proc/fs", "proc/irq"};

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

// The cgroup limits of a sandbox spec (Create's, and what a recycled cgroup holds).
jail::CgroupLimits LimitsOf(const SandboxSpec& spec) {
  jail::CgroupLimits lim;
  lim.cpu_millis = spec.resources.cpu_millis;
  lim.memory_bytes = uint64_t{spec.resources.memory_mb} << 20;
  lim.pids = spec.resources.pids;
  return lim;
}

// The cgroup.procs a process spawned by the daemon writes to join the
// sandbox `sb` through its child cgroup `child` (an exec's or a background
// process's): the child's, plus the sandbox's own in the hierarchies where
// the child has no directory (v1: children live in the freezer hierarchy
// only). One write per hierarchy: each takes the global cgroup mutex.
StatusOr<std::vector<UniqueFd>> JoinFds(jail::Cgroup& sb, jail::Cgroup& child) {
  std::vector<UniqueFd> out;
  if (!sb.ChildrenCoverAllControllers()) {
    const std::vector<std::string> sub = child.dirs();
    for (const std::string& d : sb.dirs()) {
      const std::string prefix = d + "/";
      if (std::any_of(sub.begin(), sub.end(), [&](const std::string& c) { return c.rfind(prefix, 0) == 0; }))
        continue;
      const std::string p = prefix + "cgroup.procs";
      UniqueFd fd(::open(p.c_str(), O_WRONLY | O_CLOEXEC));
      if (!fd.valid()) return Errno("open(" + p + ")");
      out.push_back(std::move(fd));
    }
  }
  ASSIGN_OR_RETURN(std::vector<UniqueFd> own, child.OpenProcsFds());
  for (auto& f : own) out.push_back(std::move(f));
  return out;
}

// argv and envp of an exec or a background process, exact: the sandbox's
// env, then the command's over it, PATH defaulted (TERM too for a PTY); the
// paths to try for argv[0] (PATH search done by the daemon: the grandchild
// only execs). `op` names the call in errors ("exec", "start").
Status FillCommand(const ExecSpec& es, const std::map<std::string, std::string>& sandbox_env, const char* op,
                   bool default_term, SpawnRequest* req) {
  SpawnRequest& plan = *req;
  if (es.shell) {
    plan.argv = {"/bin/sh", "-c", *es.shell};
  } else {
    plan.argv = es.argv;
  }
  for (const auto& a : plan.argv) {
    if (a.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(std::string(op) + ": argv contains a NUL byte");
    }
  }
  std::map<std::string, std::string> env = sandbox_env;
  for (const auto& [k, v] : es.env) env[k] = v;
  if (!env.count("PATH")) env["PATH"] = kDefaultPath;
  if (default_term && !env.count("TERM")) env["TERM"] = "xterm";
  for (const auto& [k, v] : env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
        v.find('\0') != std::string::npos)
      return absl::InvalidArgumentError(std::string(op) + ": bad environment variable name or value for '" + k + "'");
    plan.envp.push_back(k + "=" + v);
  }
  const std::string& a0 = plan.argv[0];
  if (a0.find('/') != std::string::npos) {
    plan.candidates.push_back(a0);
  } else {
    for (absl::string_view d : absl::StrSplit(env["PATH"], ':', absl::SkipEmpty()))
      plan.candidates.push_back(std::string(d) + "/" + a0);
  }
  plan.not_found_msg = "warren: " + a0 + ": not found\n";
  return absl::OkStatus();
}

// ------------------------------------------------------------------ state
struct BackendState {
  ContainerOptions options;
  std::unique_ptr<jail::CgroupManager> cgroups;
  jail::SeccompProgram seccomp;
  bool have_seccomp = false;
  UniqueFd init_exe;  // O_PATH of warren-init
  std::string spawn_path;  // warren-spawn (spawn.h)
  SpawnReaper reaper;      // spawns given up on
  int last_cap = 40;
  // Density (see MakeSharedMounts): detached, read-only mounts every sandbox
  // gets a clone of; invalid = each sandbox mounts its own (as before).
  UniqueFd sysfs_mnt, mask_mnt;
  std::mutex mu;
  std::unique_ptr<UidSlots> uid_slots;  // host-wide (ContainerOptions::uid_lock_dir)

  StatusOr<uint32_t> TakeSlot() { return uid_slots->Take(); }
  bool TakeSpecificSlot(uint32_t k) { return uid_slots->TakeSpecific(k); }
  void ReleaseSlot(uint32_t k) { uid_slots->Release(k); }
  uid_t HostUid(uint32_t slot) const { return uid_slots->HostUid(slot); }

  // ---- cgroup recycling (ContainerOptions::recycled_cgroups)
  struct Recycled {
    std::unique_ptr<jail::Cgroup> cg;
    jail::CgroupLimits limits;  // what it holds
  };
  std::deque<Recycled> recycled;  // guarded by mu
  uint64_t recycle_seq = 0;       // guarded by mu
  uint32_t recycle_nonce = 0;     // guarded by mu

  // Takes the cgroup `cg` names (empty, its sandbox dead) for a later shell
  // when there is room and its previous tenant left < 1 MiB of page cache and
  // anonymous memory charged (file pages it faulted first stay charged to
  // the cgroup that faulted them; kernel objects of the dying sandbox are
  // uncharged as they are freed, so they do not count); true =
  // taken (its children removed, renamed "shell-<daemon pid>-r<n>" so that a
  // crashed daemon's are swept like shells'). `cg` itself then names a path
  // that no longer exists: late calls through it fail with ENOENT and can
  // never reach the next tenant. Needs rename (v1); v2 cgroups are removed.
  bool Recycle(jail::Cgroup& cg, const jail::CgroupLimits& limits) {
    if (options.recycled_cgroups == 0 || cgroups->version() != 1) return false;
    {
      std::lock_guard<std::mutex> l(mu);
      if (recycled.size() >= options.recycled_cgroups) return false;
    }
    if (auto used = cg.PageMemoryUsage(); used.ok() && *used >= (1u << 20)) return false;
    // Never hand out a frozen cgroup: a shell joining it would freeze.
    if (!cg.Thaw().ok() || cg.Frozen()) return false;
    if (!cg.RemoveChildren().ok()) return false;
    std::string name;
    {
      std::lock_guard<std::mutex> l(mu);
      // A nonce per daemon start: a restarted daemon with the same pid (pid 1
      // of a container) never meets its predecessor's names.
      if (recycle_nonce == 0) recycle_nonce = static_cast<uint32_t>(Clock::now().time_since_epoch().count()) | 1;
      name = "shell-" + std::to_string(::getpid()) + "-r" + absl::StrCat(absl::Hex(recycle_nonce)) + "." +
             std::to_string(recycle_seq++);
    }
    if (!cgroups->Rename(cg.rel(), name).ok()) return false;
    auto kept = cgroups->Open(name);
    if (!kept.ok()) return true;  // renamed away, empty: the next daemon's start sweeps it
    std::lock_guard<std::mutex> l(mu);
    if (recycled.size() >= options.recycled_cgroups) {
      (void)(*kept)->Remove();
    } else {
      recycled.push_back({std::move(*kept), limits});
    }
    return true;
  }
  // A recycled cgroup named `rel` (or, when `rel` is a shell name, its own
  // shell name) with its limits in *limits, or nullptr.
  std::unique_ptr<jail::Cgroup> TakeRecycled(const std::string& rel, jail::CgroupLimits* limits) {
    for (;;) {
      Recycled r;
      {
        std::lock_guard<std::mutex> l(mu);
        if (recycled.empty()) return nullptr;
        r = std::move(recycled.front());
        recycled.pop_front();
      }
      // A shell's cgroup is only ever renamed once more (to its sandbox's id):
      // a recycled one keeps its "shell-<pid>-r<n>" name until then.
      if (r.cg->rel() == rel || (rel.rfind("shell-", 0) == 0 && r.cg->rel().rfind("shell-", 0) == 0)) {
        *limits = r.limits;
        return std::move(r.cg);
      }
      Status rs = cgroups->Rename(r.cg->rel(), rel);
      auto opened = rs.ok() ? cgroups->Open(rel) : StatusOr<std::unique_ptr<jail::Cgroup>>(rs);
      if (opened.ok()) {
        *limits = r.limits;
        return std::move(*opened);
      }
      (void)r.cg->Remove();  // gone wrong: drop it, try the next
    }
  }
  ~BackendState() {
    for (auto& r : recycled) (void)r.cg->Remove();
  }
};

// Undo list for multi-step operations: run in reverse unless Release()d.
class Rollback {
 public:
  ~Rollback() {
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) (*it)();
  }
  void Add(std::function<void()> f) { undo_.push_back(std::move(f)); }
  void Release() { undo_.clear(); }

 private:
  std::vector<std::function<void()>> undo_;
};

std::vector<jail::RlimitSetting> SandboxRlimits(const Resources& r) {
  rlim_t nofile = r.open_files;
  return {{RLIMIT_NOFILE, {nofile, nofile}}, {RLIMIT_CORE, {0, 0}}};
}

struct UserIds {
  uid_t uid = 0;
  gid_t gid = 0;
};

// Reads a file of the sandbox (resolved inside its root) that sandbox code
// controls: only a regular file, opened non-blocking (a FIFO or device put
// there by the sandbox must never hold a daemon thread), at most
// kMaxSandboxFileBytes. nullopt if it is absent, not regular or too big.
constexpr size_t kMaxSandboxFileBytes = 4 << 20;
std::optional<std::string> ReadInRoot(int root_fd, const char* rel) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  UniqueFd fd(static_cast<int>(syscall(SYS_openat2, root_fd, rel, &how, sizeof how)));
  if (!fd.valid()) return std::nullopt;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kMaxSandboxFileBytes)
    return std::nullopt;
  std::string out;
  char buf[8192];
  while (out.size() < kMaxSandboxFileBytes) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// "root", a name from the sandbox's /etc/passwd, or "uid[:gid]".
StatusOr<UserIds> ResolveUser(const std::string& user, int root_fd, uint32_t range) {
  UserIds ids;
  if (user.empty() || user == "root") return ids;
  std::vector<std::string> parts = absl::StrSplit(user, absl::MaxSplits(':', 1));
  uint32_t u, g;
  if (absl::SimpleAtoi(parts[0], &u)) {
    ids.uid = u;
    ids.gid = u;
    if (parts.size() == 2) {
      if (!absl::SimpleAtoi(parts[1], &g)) return absl::InvalidArgumentError("bad gid in user '" + user + "'");
      ids.gid = g;
    }
  } else {
    auto passwd = ReadInRoot(root_fd, "/etc/passwd");
    bool found = false;
    if (passwd) {
      for (absl::string_view line : absl::StrSplit(*passwd, '\n')) {
        std::vector<std::string> f = absl::StrSplit(line, ':');
        if (f.size() >= 4 && f[0] == parts[0] && absl::SimpleAtoi(f[2], &u) && absl::SimpleAtoi(f[3], &g)) {
          ids.uid = u;
          ids.gid = g;
          found = true;
          break;
        }
      }
    }
    if (!found) return absl::NotFoundError("user '" + parts[0] + "' not found in the sandbox's /etc/passwd");
    if (parts.size() == 2 && !absl::SimpleAtoi(parts[1], &g))
      return absl::InvalidArgumentError("bad gid in user '" + user + "'");
    if (parts.size() == 2) ids.gid = g;
  }
  if (ids.uid >= range || ids.gid >= range)
    return absl::InvalidArgumentError("user '" + user + "' is outside the sandbox's id range");
  return ids;
}

// Makes a pipe; `big`: with a 1 MiB buffer (throughput of huge outputs;
// only output pipes: each resize allocates a ring and counts against the
// user's pipe-user-pages-soft, past which the kernel refuses it anyway).
Status MakePipe(UniqueFd& r, UniqueFd& w, bool big = false) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return Errno("pipe2");
  r.reset(p[0]);
  w.reset(p[1]);
  if (big) (void)::fcntl(p[0], F_SETPIPE_SZ, 1 << 20);
  return absl::OkStatus();
}


// ------------------------------------------------------------------ sandbox
class ContainerSandbox : public Sandbox {
 public:
  ContainerSandbox(std::shared_ptr<BackendState> st, SandboxSpec spec, uint32_t slot, pid_t init_pid,
                   uint64_t start_time, UniqueFd pidfd, std::unique_ptr<jail::Cgroup> cg)
      : st_(std::move(st)),
        spec_(std::move(spec)),
        slot_(slot),
        init_pid_(init_pid),
        start_time_(start_time),
        pidfd_(std::move(pidfd)),
        cgroup_(std::move(cg)),
        // Unique across daemon restarts: an adopted sandbox may still hold
        // exec cgroups (background processes) named by the previous daemon.
        exec_seq_(static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count())) {
    RootedFilesOptions fo;
    const pid_t pid = init_pid_;
    const int pidfd_raw = pidfd_.get();
    std::atomic<bool>* destroyed = &destroyed_;
    fo.open_root = [pid, pidfd_raw, destroyed]() -> StatusOr<UniqueFd> {
      if (destroyed->load()) return absl::FailedPreconditionError("sandbox destroyed");
      std::string p = "/proc/" + std::to_string(pid) + "/root";
      UniqueFd fd(::open(p.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoToStatus(errno, "open(" + p + ")");
      // The pid may have been reused if init died: the pidfd tells.
      if (PidfdSignal(pidfd_raw, 0) != 0) return absl::FailedPreconditionError("sandbox init is gone");
      return fd;
    };
    fo.host_root_uid = st_->HostUid(slot_);
    fo.host_root_gid = st_->HostUid(slot_);
    fo.id_range = st_->options.uid_range;
    files_ = NewRootedFiles(std::move(fo));
  }

  ~ContainerSandbox() override = default;

  const std::string& id() const override { return spec_.id; }
  pid_t init_pid() const override { return init_pid_; }
  SandboxFiles& files() override { return *files_; }

  nlohmann::json Record() const override {
    nlohmann::json env = nlohmann::json::object();
    for (const auto& [k, v] : spec_.env) env[k] = v;
    return {{"id", spec_.id},
            {"dir", spec_.dir},
            {"init_pid", init_pid_},
            {"init_start_time", start_time_},
            {"slot", slot_},
            {"host_uid", st_->HostUid(slot_)},
            {"cgroup", cgroup_->rel()},
            {"cgroup_dirs", cgroup_->dirs()},
            {"upper_dev", upper_dev_},
            {"upper_ino", upper_ino_},
            {"workdir", spec_.workdir},
            {"user", spec_.user},
            {"hostname", spec_.hostname},
            {"env", env},
            {"resources",
             {{"cpu_millis", spec_.resources.cpu_millis},
              {"memory_mb", spec_.resources.memory_mb},
              {"disk_mb", spec_.resources.disk_mb},
              {"pids", spec_.resources.pids},
              {"open_files", spec_.resources.open_files},
              {"tmpfs_mb", spec_.resources.tmpfs_mb}}}};
  }

  StatusOr<ExecOutcome> Exec(const ExecSpec& es) override;
  Status Destroy() override;

  // Destroy sets destroyed_ under pause_mu_: a pause can never freeze the
  // cgroup after Destroy thawed it (the cgroup may be recycled).
  Status Pause() override {
    std::lock_guard<std::mutex> l(pause_mu_);
    if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
    RETURN_IF_ERROR(cgroup_->Freeze());
    if (paused_since_ns_.load() == 0) paused_since_ns_.store(SteadyNs());
    return absl::OkStatus();
  }
  Status Resume() override {
    std::lock_guard<std::mutex> l(pause_mu_);
    if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
    RETURN_IF_ERROR(cgroup_->Thaw());
    if (int64_t since = paused_since_ns_.exchange(0); since != 0) paused_total_ns_ += SteadyNs() - since;
    return absl::OkStatus();
  }
  // Nanoseconds this sandbox has spent paused (by this process) so far: exec
  // timeouts do not count them.
  int64_t PausedNs() const {
    int64_t since = paused_since_ns_.load();
    return paused_total_ns_.load() + (since != 0 ? SteadyNs() - since : 0);
  }
  static int64_t SteadyNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  }
  // The upper tmpfs is a detached mount: the daemon keeps an fd on it, and
  // warren-init holds another (argv[1]) through which Adopt finds it again
  // after a daemon restart (ReattachUpper). A sandbox created by a warrend
  // before that existed has no upper after a restart: FailedPrecondition.
  StatusOr<UniqueFd> OpenUpper() override {
    std::lock_guard<std::mutex> l(mu_);
    if (destroyed_.load() || !upper_.valid())
      return absl::FailedPreconditionError("sandbox " + spec_.id + ": upper layer not reachable (" +
                                           (destroyed_.load() ? std::string("destroyed") : upper_error_) + ")");
    UniqueFd fd(::openat(upper_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return Errno("openat(upper of " + spec_.id + ")");
    return fd;
  }
  StatusOr<uint64_t> MemoryUsage() const override { return cgroup_->MemoryUsage(); }
  uint64_t SwapUsage() const override { return cgroup_->SwapUsage(); }
  Status ReclaimMemory() override {
    std::lock_guard<std::mutex> l(pause_mu_);
    if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
    if (paused_since_ns_.load() == 0) return absl::FailedPreconditionError("sandbox " + spec_.id + " is not paused");
    reclaimed_.store(true);  // its cgroup's settings may have moved: never recycled
    return cgroup_->ReclaimMemory();
  }
  StatusOr<uint64_t> EndSuspend(bool prefetch) override {
    if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
    uint64_t total = 0;
    if (prefetch) {
      const uint64_t swapped = cgroup_->SwapUsage();
      for (pid_t pid : cgroup_->Pids(true)) total += PrefetchMappings(pid);
      UniqueFd up;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (upper_.valid()) up.reset(::openat(upper_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      }
      // Files of the tmpfs upper (not mapped by anyone): read back at most
      // what was in swap.
      if (up.valid()) total += PrefetchFiles(up.get(), swapped);
    }
    RETURN_IF_ERROR(cgroup_->EndReclaim());
    return total;
  }
  uint32_t upper_host_root_id() const override { return st_->HostUid(slot_); }
  StatusOr<std::unique_ptr<Process>> Start(const ExecSpec& es, const StartOptions& so) override;
  // A finished Start()ed process hands its exec cgroup back: removed now when
  // empty, else kept until its last process exits (or the sandbox goes).
  void ReleaseExecCgroup(std::unique_ptr<jail::Cgroup> cg) {
    if (cg->Empty() && cg->Remove().ok()) return;
    std::lock_guard<std::mutex> l(mu_);
    if (!destroy_done_) lingering_.push_back(std::move(cg));
  }
  uint64_t OomKillCount() const { return cgroup_->OomKillCount(); }
  uint32_t upper_id_range() const override { return st_->options.uid_range; }
  void set_upper(UniqueFd fd) {
    struct stat st;
    std::lock_guard<std::mutex> l(mu_);
    if (fd.valid() && ::fstat(fd.get(), &st) == 0) {
      upper_dev_ = static_cast<uint64_t>(st.st_dev);
      upper_ino_ = static_cast<uint64_t>(st.st_ino);
    }
    upper_ = std::move(fd);
  }
  // After Adopt: finds the upper dir among warren-init's open fds (the one
  // with the recorded device and inode) and keeps an fd on it. The pidfd
  // check after the scan proves the pid was not reused meanwhile.
  Status ReattachUpper(uint64_t dev, uint64_t ino) {
    Status s = FindUpper(dev, ino);
    std::lock_guard<std::mutex> l(mu_);
    upper_error_ = s.ok() ? "" : std::string(s.message());
    return s;
  }
  Status FindUpper(uint64_t dev, uint64_t ino) {
    if (dev == 0 && ino == 0) return absl::NotFoundError("sandbox " + spec_.id + ": no upper recorded (created by an older warrend)");
    const std::string dir = "/proc/" + std::to_string(init_pid_) + "/fd";
    UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!d.valid()) return Errno("open(" + dir + ")");
    DIR* dp = ::fdopendir(d.release());
    if (dp == nullptr) return Errno("fdopendir(" + dir + ")");
    UniqueFd found;
    for (int i = 0; i < 4096 && !found.valid(); ++i) {
      dirent* de = ::readdir(dp);
      if (de == nullptr) break;
      if (de->d_name[0] == '.') continue;
      UniqueFd fd(::open((dir + "/" + de->d_name).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      struct stat st;
      if (fd.valid() && ::fstat(fd.get(), &st) == 0 && static_cast<uint64_t>(st.st_dev) == dev &&
          static_cast<uint64_t>(st.st_ino) == ino) {
        found = std::move(fd);
      }
    }
    ::closedir(dp);
    if (!found.valid()) return absl::NotFoundError("sandbox " + spec_.id + ": warren-init holds no upper fd");
    if (PidfdSignal(pidfd_.get(), 0) != 0) return absl::NotFoundError("sandbox " + spec_.id + ": init is gone");
    set_upper(std::move(found));
    return absl::OkStatus();
  }

 private:
  void SweepExecCgroups();
  // The spawn request shared by Exec and Start: ids, caps, rlimits,
  // seccomp, cwd, argv/envp (FillCommand), the sandbox's init and namespaces.
  StatusOr<SpawnRequest> PrepareSpawn(const ExecSpec& es, const char* op, bool default_term);
  // Launches warren-spawn for `req` and waits (bounded) for the command to
  // run: gives up when the sandbox is destroyed or paused (Aborted: nothing
  // of a spawn may sit frozen in a paused sandbox holding a daemon thread) or
  // `deadline` passes (sets *timed_out; paused time does not count).
  StatusOr<SpawnStarted> SpawnCommand(const SpawnRequest& req, const char* verb, Clock::time_point deadline,
                                      bool* timed_out);

  std::shared_ptr<BackendState> st_;
  SandboxSpec spec_;
  uint32_t slot_;
  pid_t init_pid_;
  uint64_t start_time_;
  UniqueFd pidfd_;
  std::unique_ptr<jail::Cgroup> cgroup_;
  std::unique_ptr<SandboxFiles> files_;
  std::atomic<bool> destroyed_{false};
  std::mutex mu_;  // guards lingering_, destroy_done_
  std::vector<std::unique_ptr<jail::Cgroup>> lingering_;  // exec cgroups with background processes
  bool destroy_done_ = false;
  std::atomic<bool> reclaimed_{false};  // ReclaimMemory ran (suspend)
  std::atomic<int> spawns_in_flight_{0};  // Exec/Start between their destroyed_ check and CollectSpawn
  // Counts a spawn in flight for its scope; false when the sandbox is destroyed.
  struct SpawnGuard {
    ContainerSandbox* sb;
    bool ok;
    explicit SpawnGuard(ContainerSandbox* s) : sb(s) {
      sb->spawns_in_flight_.fetch_add(1);
      ok = !sb->destroyed_.load();
    }
    ~SpawnGuard() { sb->spawns_in_flight_.fetch_sub(1); }
  };
  std::atomic<uint64_t> exec_seq_;
  UniqueFd upper_;  // guarded by mu_; see OpenUpper
  uint64_t upper_dev_ = 0, upper_ino_ = 0;  // guarded by mu_ (written once, before Record())
  std::string upper_error_;                 // guarded by mu_: why there is no upper_
  std::mutex pause_mu_;
  std::atomic<int64_t> paused_since_ns_{0};  // steady ns of the pause in effect, 0 = running
  std::atomic<int64_t> paused_total_ns_{0};
};

StatusOr<SpawnRequest> ContainerSandbox::PrepareSpawn(const ExecSpec& es, const char* op, bool default_term) {
  SpawnRequest req;
  req.spawn_path = st_->spawn_path;
  req.init_pidfd = pidfd_.get();
  req.ns_flags = kNsFlags;
  req.last_cap = st_->last_cap;
  req.caps = jail::DefaultCapabilityMask();
  req.seccomp = st_->have_seccomp ? &st_->seccomp : nullptr;
  req.rlimits = SandboxRlimits(spec_.resources);
  {
    std::string root_path = "/proc/" + std::to_string(init_pid_) + "/root";
    UniqueFd root(::open(root_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid() || PidfdSignal(pidfd_.get(), 0) != 0)
      return absl::FailedPreconditionError("sandbox " + spec_.id + " has no running init");
    ASSIGN_OR_RETURN(UserIds ids, ResolveUser(es.user.empty() ? spec_.user : es.user, root.get(),
                                              st_->options.uid_range));
    req.uid = ids.uid;
    req.gid = ids.gid;
  }
  req.cwd = es.cwd.empty() ? (spec_.workdir.empty() ? "/" : spec_.workdir) : es.cwd;
  RETURN_IF_ERROR(FillCommand(es, spec_.env, op, default_term, &req));
  return req;
}

StatusOr<SpawnStarted> ContainerSandbox::SpawnCommand(const SpawnRequest& req, const char* verb,
                                                      Clock::time_point deadline, bool* timed_out) {
  *timed_out = false;
  const std::string v = verb;
  auto paused = [&]() -> Status {
    return absl::AbortedError("sandbox " + spec_.id + " was paused while the " + v +
                              " was starting (resume it and retry)");
  };
  if (paused_since_ns_.load() != 0) return paused();
  const int64_t paused0 = PausedNs();
  ASSIGN_OR_RETURN(SpawnInFlight spawn, LaunchSpawn(req));
  auto keep_waiting = [&]() -> Status {
    if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed during " + v);
    if (paused_since_ns_.load() != 0) return paused();
    if (deadline != Clock::time_point::max() &&
        Clock::now() >= deadline + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::nanoseconds(PausedNs() - paused0))) {
      *timed_out = true;
      return absl::DeadlineExceededError(v + " timed out before the command started");
    }
    return absl::OkStatus();
  };
  return CollectSpawn(std::move(spawn), keep_waiting, st_->reaper, v, req.cwd);
}

void ContainerSandbox::SweepExecCgroups() {
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = lingering_.begin(); it != lingering_.end();) {
    if ((*it)->Empty() && (*it)->Remove().ok()) {
      it = lingering_.erase(it);
    } else {
      ++it;
    }
  }
}

StatusOr<ExecOutcome> ContainerSandbox::Exec(const ExecSpec& es) {
  const auto t0 = Clock::now();
  std::optional<SpawnGuard> spawning(std::in_place, this);  // until the command runs (see Destroy)
  if (!spawning->ok) return absl::FailedPreconditionError("sandbox " + spec_.id + " is destroyed");
  if (es.argv.empty() && !es.shell) return absl::InvalidArgumentError("exec: neither argv nor shell given");
  SweepExecCgroups();

  ASSIGN_OR_RETURN(SpawnRequest req, PrepareSpawn(es, "exec", /*default_term=*/false));

  // Per-exec cgroup: tracks the whole tree (setsid / double fork included).
  ASSIGN_OR_RETURN(std::unique_ptr<jail::Cgroup> ecg,
                   cgroup_->CreateChild("exec-" + std::to_string(exec_seq_.fetch_add(1))));
  Rollback rb;
  rb.Add([&ecg] { (void)ecg->Destroy(milliseconds(2000)); });
  ASSIGN_OR_RETURN(std::vector<UniqueFd> join_fds, JoinFds(*cgroup_, *ecg));
  for (auto& f : join_fds) req.cgroup_fds.push_back(f.get());

  UniqueFd in_r, in_w, out_r, out_w, err_r, err_w;
  RETURN_IF_ERROR(MakePipe(in_r, in_w));
  RETURN_IF_ERROR(MakePipe(out_r, out_w, /*big=*/true));
  RETURN_IF_ERROR(MakePipe(err_r, err_w, /*big=*/true));
  req.stdin_fd = in_r.get();
  req.stdout_fd = out_w.get();
  req.stderr_fd = err_w.get();

  // The timeout counts running time only: time the sandbox spends paused
  // moves the deadline (no burst of timeouts after a resume). It bounds the
  // spawn too: a command stopped before its execve (by a signal from inside
  // the sandbox) ends the exec as timed out.
  const auto base_deadline = es.timeout.count() > 0 ? t0 + es.timeout : Clock::time_point::max();
  const int64_t paused0 = PausedNs();
  const uint64_t oom_before = cgroup_->OomKillCount();
  bool setup_timed_out = false;
  StatusOr<SpawnStarted> spawned = SpawnCommand(req, "exec", base_deadline, &setup_timed_out);
  in_r.reset();
  out_w.reset();
  err_w.reset();
  join_fds.clear();
  if (!spawned.ok()) {
    // A failed step's processes are reaped already: the cgroup goes now. A
    // spawn given up on (destroyed, paused, timed out) may still sit frozen
    // in it: it goes with the sandbox or a later sweep, never waited for here.
    rb.Release();
    if (!(ecg->Empty() && ecg->Remove().ok())) {
      (void)ecg->SignalAll(SIGKILL);
      std::lock_guard<std::mutex> l(mu_);
      lingering_.push_back(std::move(ecg));
    }
    if (!setup_timed_out) return spawned.status();
    ExecOutcome out;
    out.timed_out = true;
    out.signal = SIGKILL;
    out.exit_code = 128 + SIGKILL;
    out.duration = Clock::now() - t0;
    return out;
  }
  spawning.reset();
  UniqueFd cpidfd = std::move(spawned->pidfd);

  ExecOutcome out;
  ScopedSigpipeBlock no_sigpipe;
  size_t stdin_off = 0;
  if (es.stdin_data.empty()) in_w.reset();
  if (in_w.valid()) ::fcntl(in_w.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(out_r.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err_r.get(), F_SETFL, O_NONBLOCK);
  // 64 KiB per read (a pipe's default capacity), one buffer per handler
  // thread: a fresh one per exec cost a memset, page faults and a heap
  // consolidation on free, for execs most of which print little.
  thread_local std::string buf(64 << 10, '\0');
  auto drain = [&](UniqueFd& fd, std::string& data, uint64_t& total, bool& trunc, int max_reads) {
    for (int i = 0; i < max_reads && fd.valid(); ++i) {
      ssize_t r = ::read(fd.get(), buf.data(), buf.size());
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return;  // EAGAIN: nothing more right now
      if (r == 0) {
        fd.reset();
        return;
      }
      total += static_cast<uint64_t>(r);
      uint64_t room = es.output_cap_bytes > data.size() ? es.output_cap_bytes - data.size() : 0;
      size_t take = static_cast<size_t>(std::min<uint64_t>(room, static_cast<uint64_t>(r)));
      data.append(buf.data(), take);
      if (take < static_cast<size_t>(r)) trunc = true;
    }
  };

  auto deadline = base_deadline;
  Clock::time_point kill_at = Clock::time_point::max();
  bool exited = false;
  siginfo_t info;
  memset(&info, 0, sizeof info);
  for (uint64_t iter = 0; !exited; ++iter) {
    pollfd pfds[4];
    int np = 0;
    pfds[np++] = {cpidfd.get(), POLLIN, 0};
    int out_i = -1, err_i = -1, in_i = -1;
    if (out_r.valid()) { out_i = np; pfds[np++] = {out_r.get(), POLLIN, 0}; }
    if (err_r.valid()) { err_i = np; pfds[np++] = {err_r.get(), POLLIN, 0}; }
    if (in_w.valid()) { in_i = np; pfds[np++] = {in_w.get(), POLLOUT, 0}; }
    if (base_deadline != Clock::time_point::max()) {
      deadline = base_deadline + std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(PausedNs() - paused0));
    }
    auto now = Clock::now();
    auto next = std::min(deadline, kill_at);
    int wait_ms = next == Clock::time_point::max()
                      ? 1000
                      : static_cast<int>(std::clamp<int64_t>(
                            std::chrono::duration_cast<milliseconds>(next - now).count() + 1, 0, 1000));
    int pr = ::poll(pfds, static_cast<nfds_t>(np), wait_ms);
    if (pr < 0 && errno != EINTR) {
      // Never leave the command behind: killed, its tree too, and reaped
      // by the ChildReaper; the exec cgroup goes with the rollback.
      Status st = Errno("poll(exec pipes)");
      (void)ecg->SignalAll(SIGKILL);
      (void)PidfdSignal(cpidfd.get(), SIGKILL);
      ChildReaper::Get().Adopt(std::move(cpidfd));
      return st;
    }
    if (out_i >= 0 && pfds[out_i].revents) drain(out_r, out.stdout_data, out.stdout_total, out.stdout_truncated, 4);
    if (err_i >= 0 && pfds[err_i].revents) drain(err_r, out.stderr_data, out.stderr_total, out.stderr_truncated, 4);
    if (in_i >= 0 && pfds[in_i].revents) {
      ssize_t w = ::write(in_w.get(), es.stdin_data.data() + stdin_off, es.stdin_data.size() - stdin_off);
      if (w > 0) stdin_off += static_cast<size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || stdin_off == es.stdin_data.size()) in_w.reset();
    }
    if (pfds[0].revents & POLLIN) {
      memset(&info, 0, sizeof info);
      if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(cpidfd.get()), &info, WEXITED | WNOHANG) == 0 &&
          info.si_pid != 0)
        exited = true;
    }
    if (base_deadline != Clock::time_point::max()) {
      deadline = base_deadline + std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(PausedNs() - paused0));
    }
    now = Clock::now();
    if (!exited && now >= deadline && !out.timed_out) {
      out.timed_out = true;
      (void)ecg->SignalAll(SIGTERM);
      kill_at = now + es.kill_grace;
    }
    if (!exited && now >= kill_at) {
      (void)ecg->SignalAll(SIGKILL);
      kill_at = now + milliseconds(200);  // re-kill until the foreground is gone
    }
  }
  // The foreground is gone: take what is already in the pipes, then stop.
  drain(out_r, out.stdout_data, out.stdout_total, out.stdout_truncated, 64);
  drain(err_r, out.stderr_data, out.stderr_total, out.stderr_truncated, 64);
  if (info.si_code == CLD_EXITED) {
    out.exit_code = info.si_status;
  } else {
    out.signal = info.si_status;
    out.exit_code = 128 + info.si_status;
  }
  // Any OOM kill in the sandbox's memcg during the exec (the victim may be a
  // child of the foreground shell, which then exits 137 by itself). Concurrent
  // execs of one sandbox share the counter.
  out.oom_killed = cgroup_->OomKillCount() > oom_before;
  if (out.timed_out) {
    // The whole tree goes: SIGTERM was sent; give the rest kill_grace, then SIGKILL.
    auto until = std::max(kill_at, Clock::now());
    for (int i = 0; i < 10000 && !ecg->Empty() && Clock::now() < until; ++i)
      std::this_thread::sleep_for(milliseconds(5));
    (void)ecg->Destroy(milliseconds(2000));
    rb.Release();
  } else {
    rb.Release();
    if (ecg->Empty() && ecg->Remove().ok()) {
      // done
    } else {
      // Background processes stay alive (documented policy) in their exec
      // cgroup until they exit or the sandbox is destroyed.
      std::lock_guard<std::mutex> l(mu_);
      lingering_.push_back(std::move(ecg));
    }
  }
  out.duration = Clock::now() - t0;
  return out;
}

Status ContainerSandbox::Destroy() {
  {
    std::lock_guard<std::mutex> pl(pause_mu_);  // no Pause/Resume/Reclaim runs past this point
    destroyed_.store(true);
  }
  // A spawn helper that joined a paused sandbox is frozen in the middle of
  // its spawn: thawed, it finishes (its command dies with the sandbox below)
  // instead of holding the wait for spawns to its bound.
  (void)cgroup_->ThawTree();
  // Execs and Starts past their destroyed_ check may still be joining this
  // sandbox's cgroups: they finish (fail on the dead init) before the
  // cgroup may go to another sandbox. Bounded: a stuck one blocks recycling.
  bool spawns_drained = false;
  for (int i = 0; i < 2000; ++i) {
    if (spawns_in_flight_.load() == 0) {
      spawns_drained = true;
      break;
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (destroy_done_) return absl::OkStatus();
  // SIGKILL of the pid namespace's init kills every process in it; the cgroup
  // kill catches helpers still outside the pid namespace.
  if (pidfd_.valid()) {
    (void)PidfdSignal(pidfd_.get(), SIGKILL);
    // A paused sandbox, or an exec cgroup frozen on its own (by SignalAll
    // when a daemon was killed): a frozen task ignores SIGKILL until thawed
    // (v1), and init's exit waits for every task of its pid namespace.
    (void)cgroup_->ThawTree();
    pollfd pfd{pidfd_.get(), POLLIN, 0};
    (void)::poll(&pfd, 1, 2000);
    // init is a child of the daemon that created it (not after Adopt by
    // another process): reap it, by pidfd (its pid may be reused once
    // reaped). Still exiting after the bound: the process-wide reaper takes it.
    if (!TryReapPidfd(pidfd_.get())) {
      UniqueFd dup(::fcntl(pidfd_.get(), F_DUPFD_CLOEXEC, 3));
      ChildReaper::Get().Adopt(std::move(dup));
    }
  }
  // Emptied, the cgroup is recycled for a later shell when it can be (see
  // ContainerOptions::recycled_cgroups), else removed.
  lingering_.clear();  // exec cgroups: removed with the children below
  Status cs = cgroup_->Evacuate(milliseconds(5000));
  if (cs.ok() && (reclaimed_.load() || !spawns_drained || !st_->Recycle(*cgroup_, LimitsOf(spec_))))
    cs = cgroup_->Destroy(milliseconds(5000));
  upper_.reset();
  std::string rootfs = spec_.dir + "/rootfs";
  if (::rmdir(rootfs.c_str()) != 0 && errno != ENOENT && cs.ok()) cs = Errno("rmdir(" + rootfs + ")");
  // The runtime dir goes too when empty (the caller may keep its own files there).
  if (::rmdir(spec_.dir.c_str()) != 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST && cs.ok())
    cs = Errno("rmdir(" + spec_.dir + ")");
  if (cs.ok()) {
    destroy_done_ = true;
    st_->ReleaseSlot(slot_);
  }
  return cs;
}

// ------------------------------------------------------------------ processes (issue 3)
class ContainerProcess : public Process {
 public:
  ContainerProcess(ContainerSandbox* sb, pid_t pid, UniqueFd pidfd, std::unique_ptr<jail::Cgroup> ecg,
                   uint64_t oom_before)
      : sb_(sb), pid_(pid), pidfd_(std::move(pidfd)), ecg_(std::move(ecg)), oom_before_(oom_before) {}
  ~ContainerProcess() override {
    if (!reaped_) {
      // Not waited for: reap later is impossible once we are gone, so the
      // foreground is killed with its tree rather than left a zombie.
      (void)ecg_->SignalAll(SIGKILL);
      (void)PidfdSignal(pidfd_.get(), SIGKILL);
      pollfd pfd{pidfd_.get(), POLLIN, 0};
      (void)::poll(&pfd, 1, 2000);  // bounded: a frozen sandbox delays the kill
      // Not dead yet (frozen): reaped by the process-wide reaper once it is.
      if (!TryReapPidfd(pidfd_.get())) ChildReaper::Get().Adopt(std::move(pidfd_));
    }
    sb_->ReleaseExecCgroup(std::move(ecg_));
  }
  pid_t pid() const override { return pid_; }
  int pidfd() const override { return pidfd_.get(); }
  UniqueFd TakeStdin() override { return std::move(stdin_); }
  UniqueFd TakeStdout() override { return std::move(stdout_); }
  UniqueFd TakeStderr() override { return std::move(stderr_); }
  UniqueFd TakeControl() override { return std::move(control_); }

  StatusOr<bool> TryWait(ExecOutcome* out) override {
    if (reaped_) return absl::FailedPreconditionError("process " + std::to_string(pid_) + " already reaped");
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info, WEXITED | WNOHANG) != 0)
      return Errno("waitid(P_PIDFD, " + std::to_string(pid_) + ")");
    if (info.si_pid == 0) return false;
    reaped_ = true;
    if (info.si_code == CLD_EXITED) {
      out->exit_code = info.si_status;
      out->signal = 0;
    } else {
      out->signal = info.si_status;
      out->exit_code = 128 + info.si_status;
    }
    out->oom_killed = sb_->OomKillCount() > oom_before_;
    return true;
  }

  Status Signal(int sig, bool whole_tree) override {
    if (whole_tree) return ecg_->SignalAll(sig);
    // The foreground leads its own process group (setsid in StartGrandchild).
    if (::kill(-pid_, sig) != 0 && errno != ESRCH) return Errno("kill(-" + std::to_string(pid_) + ")");
    return absl::OkStatus();
  }
  bool TreeEmpty() override { return ecg_->Empty(); }

  Status Resize(uint16_t rows, uint16_t cols) override {
    if (!master_.valid()) return absl::FailedPreconditionError("process " + std::to_string(pid_) + " has no PTY");
    winsize ws{rows, cols, 0, 0};
    if (::ioctl(master_.get(), TIOCSWINSZ, &ws) != 0) return Errno("ioctl(TIOCSWINSZ)");
    return absl::OkStatus();
  }

  UniqueFd stdin_, stdout_, stderr_, control_, master_;

 private:
  ContainerSandbox* sb_;
  pid_t pid_;
  UniqueFd pidfd_;
  std::unique_ptr<jail::Cgroup> ecg_;
  uint64_t oom_before_;
  bool reaped_ = false;
};

StatusOr<std::unique_ptr<Process>> ContainerSandbox::Start(const ExecSpec& es, const StartOptions& so) {
  std::optional<SpawnGuard> spawning(std::in_place, this);  // until the command runs (see Destroy)
  if (!spawning->ok) return absl::FailedPreconditionError("sandbox " + spec_.id + " is destroyed");
  if (es.argv.empty() && !es.shell) return absl::InvalidArgumentError("start: neither argv nor shell given");
  SweepExecCgroups();

  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(SpawnRequest plan, PrepareSpawn(es, "start", /*default_term=*/so.pty));
  plan.setsid = true;

  ASSIGN_OR_RETURN(std::unique_ptr<jail::Cgroup> ecg,
                   cgroup_->CreateChild("exec-" + std::to_string(exec_seq_.fetch_add(1))));
  Rollback rb;
  rb.Add([&ecg] {
    if (ecg) (void)ecg->Destroy(milliseconds(2000));
  });
  ASSIGN_OR_RETURN(std::vector<UniqueFd> join_fds, JoinFds(*cgroup_, *ecg));
  for (auto& f : join_fds) plan.cgroup_fds.push_back(f.get());

  UniqueFd in_r, in_w, out_r, out_w, err_r, err_w, ctl_r, ctl_w, master, slave;
  if (so.pty) {
    // The sandbox's own devpts instance (mounted newinstance by InitChild):
    // the terminal shows up as /dev/pts/N inside.
    const std::string ptmx = "/proc/" + std::to_string(init_pid_) + "/root/dev/pts/ptmx";
    master.reset(::open(ptmx.c_str(), O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!master.valid()) return Errno("open(" + ptmx + ")");
    int unlock = 0;
    if (::ioctl(master.get(), TIOCSPTLCK, &unlock) != 0) return Errno("ioctl(TIOCSPTLCK)");
    slave.reset(::ioctl(master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!slave.valid()) return Errno("ioctl(TIOCGPTPEER)");
    // Owned by the command's user as seen inside (created by the daemon's host root).
    const uid_t host = st_->HostUid(slot_);
    if (::fchown(slave.get(), host + plan.uid, host + plan.gid) != 0) return Errno("fchown(pty slave)");
    winsize ws{so.rows == 0 ? uint16_t{24} : so.rows, so.cols == 0 ? uint16_t{80} : so.cols, 0, 0};
    if (::ioctl(master.get(), TIOCSWINSZ, &ws) != 0) return Errno("ioctl(TIOCSWINSZ)");
    plan.stdin_fd = plan.stdout_fd = plan.stderr_fd = slave.get();
    plan.tty = true;
  } else {
    RETURN_IF_ERROR(MakePipe(in_r, in_w));
    RETURN_IF_ERROR(MakePipe(out_r, out_w, /*big=*/true));
    RETURN_IF_ERROR(MakePipe(err_r, err_w, /*big=*/true));
    plan.stdin_fd = in_r.get();
    plan.stdout_fd = out_w.get();
    plan.stderr_fd = err_w.get();
  }
  if (so.control_fd) {
    RETURN_IF_ERROR(MakePipe(ctl_r, ctl_w));
    plan.control_fd = ctl_w.get();
  }

  const uint64_t oom_before = cgroup_->OomKillCount();
  // Bounded like an exec's spawn; a background process has no run-time
  // limit of its own here, so its start gets kStartSetupLimit.
  bool setup_timed_out = false;
  StatusOr<SpawnStarted> started = SpawnCommand(plan, "start", t0 + kStartSetupLimit, &setup_timed_out);
  in_r.reset();
  out_w.reset();
  err_w.reset();
  ctl_w.reset();
  slave.reset();
  join_fds.clear();
  if (!started.ok()) {
    rb.Release();  // as in Exec: never wait here for what a given-up spawn left
    if (!(ecg->Empty() && ecg->Remove().ok())) {
      (void)ecg->SignalAll(SIGKILL);
      std::lock_guard<std::mutex> l(mu_);
      lingering_.push_back(std::move(ecg));
    }
    if (setup_timed_out)
      return absl::UnavailableError("start: the command did not start within " +
                                    std::to_string(kStartSetupLimit.count()) + " ms (stopped before its execve?)");
    return started.status();
  }
  SpawnStarted& spawned = *started;
  spawning.reset();
  const pid_t child = spawned.pid;
  UniqueFd cpidfd = std::move(spawned.pidfd);
  auto proc = std::make_unique<ContainerProcess>(this, child, std::move(cpidfd), std::move(ecg), oom_before);
  rb.Release();
  if (so.pty) {
    proc->stdin_.reset(::fcntl(master.get(), F_DUPFD_CLOEXEC, 3));
    if (!proc->stdin_.valid()) return Errno("fcntl(F_DUPFD_CLOEXEC, pty master)");
    proc->master_.reset(::fcntl(master.get(), F_DUPFD_CLOEXEC, 3));
    if (!proc->master_.valid()) return Errno("fcntl(F_DUPFD_CLOEXEC, pty master)");
    proc->stdout_ = std::move(master);
  } else {
    proc->stdin_ = std::move(in_w);
    proc->stdout_ = std::move(out_r);
    proc->stderr_ = std::move(err_r);
  }
  proc->control_ = std::move(ctl_r);
  return std::unique_ptr<Process>(std::move(proc));
}

// Builds the detached overlay mount (tmpfs upper + idmapped lowers).
// *upper_out receives an O_RDONLY directory fd on the upper dir (kept by the
// daemon for snapshots; it pins the tmpfs until closed); *dev_out a detached
// clone (nosuid, noexec) of the tmpfs's dev/ dir, the sandbox's /dev: its
// own superblock would cost every memory cgroup on the host (density, see
// MakeSharedMounts). Files in /dev count against disk_mb; dev/ is outside
// upper/, so never part of a snapshot.
// /etc/hosts for images that have none (a debootstrapped Debian has none:
// `localhost` then does not resolve, and test suites that bind or connect
// to it fail). Like Docker's, written per sandbox, here into the upper: the
// loopback names and the sandbox's hostname (127.0.1.1, Debian's
// convention). An image's own /etc/hosts is left alone; one we wrote (a
// snapshot or fork of a sandbox carries it in a layer) is written again with
// this sandbox's hostname.
constexpr char kEtcHostsMark[] = "# warren: generated for this sandbox\n";

Status SeedEtcHosts(int upper_fd, const SandboxSpec& spec, uid_t host_uid) {
  for (auto it = spec.lower_dirs.rbegin(); it != spec.lower_dirs.rend(); ++it) {  // top layer first
    // One component at a time from the layer's root: a symlink /etc in a
    // layer is never resolved on the host.
    UniqueFd root(::open(it->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid()) return Errno("open(" + *it + ")");
    UniqueFd etc(::openat(root.get(), "etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!etc.valid()) {
      if (errno == ENOENT) continue;
      return absl::OkStatus();  // /etc is not a directory here: the image's own business
    }
    UniqueFd f(::openat(etc.get(), "hosts", O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
    if (!f.valid()) {
      if (errno == ENOENT) continue;
      return absl::OkStatus();  // present (a symlink, ...): the image's own
    }
    struct stat st;
    if (::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) return absl::OkStatus();
    char head[sizeof kEtcHostsMark - 1];
    if (::read(f.get(), head, sizeof head) != static_cast<ssize_t>(sizeof head) ||
        memcmp(head, kEtcHostsMark, sizeof head) != 0) {
      return absl::OkStatus();
    }
    break;  // ours, from a snapshot: replace it
  }
  if (::mkdirat(upper_fd, "etc", 0755) != 0 && errno != EEXIST) return Errno("mkdirat(upper, etc)");
  if (::fchownat(upper_fd, "etc", host_uid, host_uid, AT_SYMLINK_NOFOLLOW) != 0) return Errno("fchownat(upper, etc)");
  UniqueFd f(::openat(upper_fd, "etc/hosts", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!f.valid()) return Errno("openat(upper, etc/hosts)");
  std::string text = std::string(kEtcHostsMark) + "127.0.0.1\tlocalhost\n";
  if (!spec.hostname.empty()) text += "127.0.1.1\t" + spec.hostname + "\n";
  text += "::1\tlocalhost ip6-localhost ip6-loopback\n";
  if (::write(f.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return Errno("write(upper, etc/hosts)");
  }
  if (::fchown(f.get(), host_uid, host_uid) != 0) return Errno("fchown(upper, etc/hosts)");
  return absl::OkStatus();
}

StatusOr<UniqueFd> BuildRootfs(const SandboxSpec& spec, int userns_fd, uid_t host_uid, UniqueFd* upper_out,
                               UniqueFd* dev_out, bool* dev_nodes_made) {
  // 1. tmpfs for upper/ and work/: its size is the disk limit.
  UniqueFd fsfd(FsOpen("tmpfs", FSOPEN_CLOEXEC));
  if (!fsfd.valid()) return Errno("fsopen(tmpfs)");
  const uint64_t inodes = std::max<uint64_t>(16384, uint64_t{spec.resources.disk_mb} * 256);
  const std::string size = std::to_string(spec.resources.disk_mb) + "m", ino = std::to_string(inodes),
                    uid = std::to_string(host_uid);
  for (const auto& [k, v] : std::vector<std::pair<const char*, std::string>>{
           {"size", size}, {"nr_inodes", ino}, {"mode", "0755"}, {"uid", uid}, {"gid", uid}}) {
    if (FsConfig(fsfd.get(), FSCONFIG_SET_STRING, k, v.c_str(), 0) != 0)
      return Errno(std::string("fsconfig(tmpfs, ") + k + "=" + v + ")");
  }
  if (FsConfig(fsfd.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return Errno("fsconfig(tmpfs, create)");
  UniqueFd tmnt(FsMount(fsfd.get(), FSMOUNT_CLOEXEC, 0));
  if (!tmnt.valid()) return Errno("fsmount(tmpfs)");
  for (const char* d : {"upper", "work", "dev"}) {
    if (::mkdirat(tmnt.get(), d, 0755) != 0) return Errno(std::string("mkdirat(tmpfs, ") + d + ")");
    if (::fchownat(tmnt.get(), d, host_uid, host_uid, AT_SYMLINK_NOFOLLOW) != 0)
      return Errno(std::string("fchownat(tmpfs, ") + d + ")");
  }
  // The device nodes of /dev, made here by host root on this tmpfs (created
  // in the initial user namespace, so its nodes open; the sandbox can never
  // make one: mknod needs CAP_MKNOD there): 6 bind mounts fewer per sandbox
  // to set up and tear down. Any failure: the shell bind-mounts the host's.
  *dev_nodes_made = true;
  for (size_t i = 0; i < sizeof kDevNodes / sizeof kDevNodes[0]; ++i) {
    const std::string path = std::string("dev/") + kDevNodes[i];
    if (::mknodat(tmnt.get(), path.c_str(), S_IFCHR | 0666, makedev(kDevNodeNumbers[i][0], kDevNodeNumbers[i][1])) != 0 ||
        ::fchmodat(tmnt.get(), path.c_str(), 0666, 0) != 0) {
      for (size_t j = 0; j <= i; ++j) (void)::unlinkat(tmnt.get(), (std::string("dev/") + kDevNodes[j]).c_str(), 0);
      *dev_nodes_made = false;
      break;
    }
  }
  UniqueFd upper(::openat(tmnt.get(), "upper", O_PATH | O_DIRECTORY | O_CLOEXEC));
  UniqueFd work(::openat(tmnt.get(), "work", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!upper.valid() || !work.valid()) return Errno("openat(tmpfs, upper|work)");
  upper_out->reset(::openat(upper.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!upper_out->valid()) return Errno("openat(tmpfs upper, O_RDONLY)");
  dev_out->reset(OpenTree(tmnt.get(), "dev", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
  if (!dev_out->valid()) return Errno("open_tree(tmpfs dev, OPEN_TREE_CLONE)");
  {
    mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;
    if (MountSetattr(dev_out->get(), "", AT_EMPTY_PATH, &attr) != 0)
      return Errno("mount_setattr(tmpfs dev, nosuid|noexec)");
  }

  RETURN_IF_ERROR(SeedEtcHosts(upper_out->get(), spec, host_uid));

  // 2. Idmapped, read-only clones of the lower layers.
  std::vector<UniqueFd> lowers;
  for (const auto& dir : spec.lower_dirs) {
    UniqueFd l(OpenTree(AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE));
    if (!l.valid()) return Errno("open_tree(" + dir + ", OPEN_TREE_CLONE)");
    mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY;
    attr.userns_fd = static_cast<uint64_t>(userns_fd);
    if (MountSetattr(l.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) != 0) {
      // File systems that cannot be idmapped (overlayfs, some network file
      // systems): fall back to a plain read-only clone. Its files then appear
      // owned by nobody (65534) inside, but stay readable per their modes.
      if (errno != EINVAL && errno != EOPNOTSUPP && errno != EPERM)
        return Errno("mount_setattr(" + dir + ", MOUNT_ATTR_IDMAP)");
      attr.attr_set = MOUNT_ATTR_RDONLY;
      attr.userns_fd = 0;
      if (MountSetattr(l.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) != 0)
        return Errno("mount_setattr(" + dir + ", MOUNT_ATTR_RDONLY)");
    }
    lowers.push_back(std::move(l));
  }

  // 3. The overlay, layers given by fd (top first).
  UniqueFd ofs(FsOpen("overlay", FSOPEN_CLOEXEC));
  if (!ofs.valid()) return Errno("fsopen(overlay)");
  for (auto it = lowers.rbegin(); it != lowers.rend(); ++it) {
    if (FsConfig(ofs.get(), FSCONFIG_SET_FD, "lowerdir+", nullptr, it->get()) != 0)
      return Errno("fsconfig(overlay, lowerdir+)");
  }
  if (FsConfig(ofs.get(), FSCONFIG_SET_FD, "upperdir", nullptr, upper.get()) != 0)
    return Errno("fsconfig(overlay, upperdir)");
  if (FsConfig(ofs.get(), FSCONFIG_SET_FD, "workdir", nullptr, work.get()) != 0)
    return Errno("fsconfig(overlay, workdir)");
  if (FsConfig(ofs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return Errno("fsconfig(overlay, create)");
  UniqueFd omnt(FsMount(ofs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV));
  if (!omnt.valid()) return Errno("fsmount(overlay)");
  return omnt;
}

Status WriteString(const std::string& path, const std::string& v) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return Errno("open(" + path + ")");
  if (::write(fd.get(), v.data(), v.size()) != static_cast<ssize_t>(v.size()))
    return Errno("write(" + path + ", " + v + ")");
  return absl::OkStatus();
}

// ---- density: mounts shared by every sandbox (issue 3).
// Each superblock costs more than its own few KiB: every superblock registers
// a memcg-aware shrinker, and EVERY memory cgroup on the host holds a
// per-shrinker slot for each shrinker id up to the highest one in use (16
// bytes each, in 1 KiB units, measured in bench/density: components.c), so
// per-sandbox superblocks make each sandbox's memcg grow with the number of
// sandboxes. Read-only, empty or namespace-neutral file systems are therefore
// mounted once by the backend and cloned into each sandbox:
//   mask   an empty tmpfs, read-only at the superblock (SB_RDONLY: the
//          sandbox's root, privileged only in its own user namespace, cannot
//          remount it writable), over /proc/{acpi,scsi,driver}, /sys/firmware;
//   sysfs  sysfs of a network namespace made for it on a short-lived thread
//          (sysfs holds only a passive reference: once the thread is gone,
//          the netns is dismantled and no process can ever enter it),
//          read-only. Sandboxes see the host's devices as with a sysfs of
//          their own; /sys/class/net is empty (the sandbox's lo shows in
//          /proc/net and over netlink). Files are owned by host root: not
//          writable inside.
// Both fail soft: a sandbox then mounts its own, as before.
StatusOr<UniqueFd> MakeSharedMaskMount() {
  UniqueFd fs(FsOpen("tmpfs", FSOPEN_CLOEXEC));
  if (!fs.valid()) return Errno("fsopen(tmpfs)");
  for (const auto& [k, v] : std::vector<std::pair<const char*, const char*>>{
           {"size", "4k"}, {"nr_inodes", "16"}, {"mode", "0555"}}) {
    if (FsConfig(fs.get(), FSCONFIG_SET_STRING, k, v, 0) != 0)
      return Errno(std::string("fsconfig(tmpfs, ") + k + "=" + v + ")");
  }
  if (FsConfig(fs.get(), FSCONFIG_SET_FLAG, "ro", nullptr, 0) != 0) return Errno("fsconfig(tmpfs, ro)");
  if (FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return Errno("fsconfig(tmpfs, create)");
  UniqueFd mnt(FsMount(fs.get(), FSMOUNT_CLOEXEC,
                       MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
  if (!mnt.valid()) return Errno("fsmount(mask tmpfs)");
  return mnt;
}

// sysfs is tagged with the network namespace of the task that creates it: a
// short-lived thread enters a fresh netns (a per-thread attribute) for that.
StatusOr<UniqueFd> MakeSharedSysfs() {
  StatusOr<UniqueFd> out = absl::InternalError("sysfs thread did not run");
  std::thread t([&out] {
    if (::unshare(CLONE_NEWNET) != 0) {
      out = Errno("unshare(CLONE_NEWNET) for the shared sysfs");
      return;
    }
    UniqueFd fs(FsOpen("sysfs", FSOPEN_CLOEXEC));
    if (!fs.valid()) {
      out = Errno("fsopen(sysfs)");
      return;
    }
    if (FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
      out = Errno("fsconfig(sysfs, create)");
      return;
    }
    UniqueFd mnt(FsMount(fs.get(), FSMOUNT_CLOEXEC,
                         MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
    if (!mnt.valid()) {
      out = Errno("fsmount(sysfs)");
      return;
    }
    out = std::move(mnt);
  });
  t.join();
  return out;
}

// Sends the sandbox's /dev mount, then a fresh detached clone of each shared
// mount the backend has (the order InitChild receives them in).
Status SendSharedMounts(const BackendState& st, int sock, UniqueFd dev) {
  if (int r = jail::SendFd(sock, dev.get()); r != 0) return ErrnoToStatus(-r, "sendmsg(dev fd)");
  for (const UniqueFd* m : {&st.sysfs_mnt, &st.mask_mnt}) {
    if (!m->valid()) continue;
    UniqueFd c(OpenTree(m->get(), "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH));
    if (!c.valid()) return Errno(std::string("open_tree(shared ") + (m == &st.sysfs_mnt ? "sysfs" : "mask") +
                                 ", OPEN_TREE_CLONE)");
    if (int r = jail::SendFd(sock, c.get()); r != 0) return ErrnoToStatus(-r, "sendmsg(shared mount fd)");
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------ shells
// A sandbox's first process before it knows its sandbox (see InitPlan): its
// namespaces exist, its uid/gid maps are written, it has joined its cgroup
// (named cg_rel) and waits on `sock` for the sandbox's params and rootfs.
// Destroying a Shell that was not Release()d kills the process, reaps it and
// removes its cgroup and uid slot: a failed or unused shell leaves nothing.
struct Shell {
  std::shared_ptr<BackendState> st;
  uint32_t slot = 0;
  bool has_slot = false;
  pid_t pid = -1;
  UniqueFd pidfd, sock, err_r, userns;
  std::unique_ptr<jail::Cgroup> cg;
  jail::CgroupLimits limits;  // set on cg at spawn
  bool released = false;
  // With kSpawnSharesMemory the shell shares the daemon's memory until it
  // execs warren-init (no page-table copy at spawn, none to tear down at
  // exec): it runs on `stack` and reads `plan`, both kept until it exec'd or
  // was reaped (declared last: freed after the destructor's kill and reap).
  std::unique_ptr<InitPlan> plan;
  std::unique_ptr<ChildStacks> stack;

  Shell() = default;
  Shell(const Shell&) = delete;
  Shell& operator=(const Shell&) = delete;
  ~Shell() {
    if (released) return;
    if (pid > 0) {
      (void)::kill(pid, SIGKILL);  // our un-reaped child: the pid cannot be reused
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    if (cg != nullptr) (void)cg->Destroy(milliseconds(5000));
    if (has_slot) st->ReleaseSlot(slot);
  }
  // False once the process exited (a zombie included: its pidfd is readable).
  bool Alive() const {
    if (!pidfd.valid()) return false;
    pollfd pfd{pidfd.get(), POLLIN, 0};
    return ::poll(&pfd, 1, 0) == 0;
  }
};

// Spawns a shell whose cgroup is <subtree>/<cg_rel> (with `limits`, may be
// all-zero = unset). On error nothing is left.
StatusOr<std::unique_ptr<Shell>> SpawnShell(const std::shared_ptr<BackendState>& st, const std::string& cg_rel,
                                            const jail::CgroupLimits& limits) {
  auto sh = std::make_unique<Shell>();
  sh->st = st;
  ASSIGN_OR_RETURN(sh->slot, st->TakeSlot());
  sh->has_slot = true;
  const uid_t host_uid = st->HostUid(sh->slot);
  jail::CgroupLimits had;
  if ((sh->cg = st->TakeRecycled(cg_rel, &had)) != nullptr) {
    // An unset (0) limit cannot be written back to "none": such a cgroup goes.
    if ((limits.cpu_millis == 0 && had.cpu_millis != 0) || (limits.memory_bytes == 0 && had.memory_bytes != 0) ||
        (limits.pids == 0 && had.pids != 0)) {
      (void)sh->cg->Remove();
      sh->cg.reset();
    } else if (had.cpu_millis != limits.cpu_millis || had.memory_bytes != limits.memory_bytes ||
               had.pids != limits.pids) {
      if (Status ls = sh->cg->SetLimits(limits); !ls.ok()) {
        (void)sh->cg->Remove();
        return ls;
      }
    }
  }
  if (sh->cg == nullptr) {
    ASSIGN_OR_RETURN(sh->cg, st->cgroups->Create(cg_rel, limits));
  }
  sh->limits = limits;
  // v2: the init lives in a leaf "init" (a cgroup with controllers enabled
  // for its children holds no process). v1 has no such rule: the init joins
  // the sandbox cgroup itself, one mkdir/rmdir pair per hierarchy fewer.
  std::unique_ptr<jail::Cgroup> init_cg;
  if (sh->cg->ChildrenCoverAllControllers()) {
    ASSIGN_OR_RETURN(init_cg, sh->cg->CreateChild("init"));
  }

  int sp[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) return Errno("socketpair");
  UniqueFd sock_child(sp[1]);
  sh->sock.reset(sp[0]);
  UniqueFd err_w;
  {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Errno("pipe2");
    sh->err_r.reset(p[0]);
    err_w.reset(p[1]);
  }
  sh->plan = std::make_unique<InitPlan>();
  InitPlan& plan = *sh->plan;
  plan.sock = sock_child.get();
  plan.err_fd = err_w.get();
  plan.init_exe = st->init_exe.get();
  plan.last_cap = st->last_cap;
  plan.shared_sysfs = st->sysfs_mnt.valid();
  plan.shared_mask = st->mask_mnt.valid();
  plan.seccomp = st->have_seccomp ? &st->seccomp : nullptr;

  constexpr int kShellNs = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET;
  int pidfd_raw = -1;
  pid_t pid;
  if constexpr (kSpawnSharesMemory) {
    // CLONE_VM without CLONE_VFORK: the parent goes on while the shell waits
    // (it only runs async-signal-safe code on its own stack until execve).
    // It shares the spawning thread's TLS, errno included: its failing calls
    // during set-up (mkdir EEXIST, masks ENOENT) run after the params were
    // sent, i.e. while the creating thread blocks on the error pipe (inline
    // spawn) or while the refill thread spawns the next shell, whose error
    // classification may then be wrong: that spawn fails and is retried.
    // Nothing the create returns depends on it.
    sh->stack = std::make_unique<ChildStacks>();
    RETURN_IF_ERROR(sh->stack->Map(1));
    pid = ::clone([](void* pl) -> int { InitChild(*static_cast<const InitPlan*>(pl)); }, sh->stack->Top(0),
                  CLONE_VM | CLONE_PIDFD | kShellNs | SIGCHLD, &plan, &pidfd_raw);
    if (pid < 0) return Errno("clone(sandbox init, CLONE_VM)");
  } else {
    pid = Clone3(CLONE_PIDFD | kShellNs, &pidfd_raw);
    if (pid < 0) return Errno("clone3(sandbox init)");
    if (pid == 0) InitChild(plan);
  }
  sh->pid = pid;
  sh->pidfd.reset(pidfd_raw);
  sock_child.reset();
  err_w.reset();

  const std::string proc = "/proc/" + std::to_string(pid);
  const std::string map = "0 " + std::to_string(host_uid) + " " + std::to_string(st->options.uid_range) + "\n";
  RETURN_IF_ERROR(WriteString(proc + "/uid_map", map));
  RETURN_IF_ERROR(WriteString(proc + "/setgroups", "deny"));
  RETURN_IF_ERROR(WriteString(proc + "/gid_map", map));
  // Every cgroup.procs write takes the cgroup mutex (and may wait for an RCU
  // grace period): one write per hierarchy.
  RETURN_IF_ERROR(init_cg != nullptr ? init_cg->AddProcess(pid) : sh->cg->AddProcess(pid));
  sh->userns.reset(::open((proc + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
  if (!sh->userns.valid()) return Errno("open(" + proc + "/ns/user)");
  return sh;
}

// The warm pool: keeps `target` shells spawned by a background thread (nice
// 10) so that a create skips the fork and the cgroup attach. Shell cgroups
// are named "shell-<daemon pid>-<n>" and renamed to the sandbox id when taken
// (v1; v2 keeps the name, recorded in the sandbox record). Shells die with
// the daemon: the pool's destructor kills them; if the daemon is killed they
// get SIGKILL (PR_SET_PDEATHSIG, the refill thread is their parent) or see
// their socket close; their empty cgroups are removed by the next daemon
// (SweepStaleShellCgroups).
class ShellPool {
 public:
  ShellPool(std::shared_ptr<BackendState> st, uint32_t target) : st_(std::move(st)), target_(target) {}
  ~ShellPool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    shells_.clear();  // kills them, removes their cgroups
  }
  uint32_t target() const { return target_; }
  // Limits of the latest create: new shells get them ahead of time, so that
  // a create asking the same (the common case: one trainer's sandboxes are
  // alike) writes no limit on its critical path.
  void Predict(const jail::CgroupLimits& l) {
    std::lock_guard<std::mutex> g(mu_);
    predicted_ = l;
  }
  // A live shell, or nullptr when the pool is empty (the caller spawns one).
  // The first call starts the refill thread (after the node re-adopted its
  // sandboxes, so shells never hold a uid slot a recorded sandbox needs).
  std::unique_ptr<Shell> Take() {
    std::unique_ptr<Shell> out;
    std::vector<std::unique_ptr<Shell>> dead;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!started_) {
        started_ = true;
        thread_ = std::thread([this] { Loop(); });
      }
      while (!shells_.empty() && out == nullptr) {
        std::unique_ptr<Shell> s = std::move(shells_.front());
        shells_.pop_front();
        if (s->Alive()) {
          out = std::move(s);
        } else {
          dead.push_back(std::move(s));
        }
      }
    }
    cv_.notify_all();
    return out;  // `dead` ones are destroyed here, outside the lock
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu_);
    return shells_.size();
  }

 private:
  void Loop() {
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
    int failures = 0;
    for (;;) {
      std::vector<std::unique_ptr<Shell>> dead;
      {
        std::unique_lock<std::mutex> l(mu_);
        // Every second, shells that died (killed from outside) are dropped
        // (reaped, cgroup removed) and replaced.
        while (!stop_ && shells_.size() >= target_) {
          cv_.wait_for(l, std::chrono::seconds(1));
          for (auto it = shells_.begin(); it != shells_.end();) {
            if ((*it)->Alive()) {
              ++it;
            } else {
              dead.push_back(std::move(*it));
              it = shells_.erase(it);
            }
          }
        }
        if (stop_) return;
      }
      dead.clear();
      jail::CgroupLimits lim;
      {
        std::lock_guard<std::mutex> g(mu_);
        lim = predicted_;
      }
      auto sh = SpawnShell(st_, "shell-" + std::to_string(::getpid()) + "-" + std::to_string(seq_++), lim);
      if (!sh.ok()) {
        // Out of slots, pids, ...: back off (bounded), creates spawn inline meanwhile.
        failures = std::min(failures + 1, 6);
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait_for(l, milliseconds(50 << failures), [&] { return stop_; });
        if (stop_) return;
        continue;
      }
      failures = 0;
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;  // *sh dies with this scope
      shells_.push_back(std::move(*sh));
    }
  }

  std::shared_ptr<BackendState> st_;
  const uint32_t target_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Shell>> shells_;
  bool started_ = false, stop_ = false;
  jail::CgroupLimits predicted_;  // guarded by mu_
  uint64_t seq_ = 0;  // refill thread only
  std::thread thread_;
};

// Removes the empty shell cgroups ("shell-<pid>-<n>") of daemons that are
// gone (a killed daemon's shells die, their cgroups stay). A cgroup still
// holding a process (a sandbox adopted under a v2 shell name) is left alone:
// rmdir refuses it.
void SweepStaleShellCgroups(BackendState& st) {
  auto root = st.cgroups->Open("");
  if (!root.ok()) return;
  std::set<std::string> names;
  for (const std::string& d : (*root)->dirs()) {
    DIR* dp = ::opendir(d.c_str());
    if (dp == nullptr) continue;
    for (int i = 0; i < 1 << 20; ++i) {
      dirent* de = ::readdir(dp);
      if (de == nullptr) break;
      if (de->d_type == DT_DIR && strncmp(de->d_name, "shell-", 6) == 0) names.insert(de->d_name);
    }
    ::closedir(dp);
  }
  for (const std::string& n : names) {
    std::vector<std::string> f = absl::StrSplit(n, '-');
    pid_t owner = 0;
    if (f.size() != 3 || !absl::SimpleAtoi(f[1], &owner) || owner <= 0) continue;
    if (::kill(owner, 0) == 0) continue;  // its daemon (maybe this process) may still run
    if (auto cg = st.cgroups->Open(n); cg.ok()) (void)(*cg)->Remove();
  }
}

// ------------------------------------------------------------------ backend
class ContainerBackend : public Backend {
 public:
  explicit ContainerBackend(std::shared_ptr<BackendState> st) : st_(std::move(st)) {
    if (st_->options.warm_shells > 0) pool_ = std::make_unique<ShellPool>(st_, st_->options.warm_shells);
  }
  std::string name() const override { return "container"; }
  StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  StatusOr<std::unique_ptr<Sandbox>> Adopt(const nlohmann::json& record) override;
  Status Cleanup(const nlohmann::json& record) override;

 private:
  // Turns a shell into the sandbox `spec` (cgroup named and limited, rootfs
  // built and sent, warren-init exec'd).
  StatusOr<std::unique_ptr<Sandbox>> FinishShell(std::unique_ptr<Shell> sh, const SandboxSpec& spec,
                                                 const jail::CgroupLimits& lim, bool limits_set);

  std::shared_ptr<BackendState> st_;
  std::unique_ptr<ShellPool> pool_;  // null: --warm-shells 0
};

StatusOr<std::unique_ptr<Sandbox>> ContainerBackend::Create(const SandboxSpec& in) {
  SandboxSpec spec = in;
  if (!ValidId(spec.id)) return absl::InvalidArgumentError("bad sandbox id '" + spec.id + "'");
  if (spec.dir.empty() || spec.dir[0] != '/') return absl::InvalidArgumentError("sandbox dir must be absolute");
  if (spec.lower_dirs.empty()) return absl::InvalidArgumentError("sandbox needs at least one lower dir");
  if (spec.hostname.empty()) spec.hostname = spec.id.substr(0, 63);
  if (spec.dir.size() + sizeof "/rootfs" > sizeof InitParams{}.rootfs)
    return absl::InvalidArgumentError("sandbox dir '" + spec.dir + "' is too long (max " +
                                      std::to_string(sizeof InitParams{}.rootfs - sizeof "/rootfs") + " bytes)");
  const jail::CgroupLimits lim = LimitsOf(spec);
  // Every container sandbox can start from a warm shell today (the shell
  // fixes only what all sandboxes share: namespaces, id range, seccomp);
  // an option a shell could not provide would take the spawn path below.
  if (pool_ != nullptr) {
    pool_->Predict(lim);
    if (std::unique_ptr<Shell> sh = pool_->Take()) {
      StatusOr<std::unique_ptr<Sandbox>> sb = FinishShell(std::move(sh), spec, lim, false);
      // A shell killed under us (Aborted) was cleaned up: spawn one instead.
      if (sb.ok() || sb.status().code() != absl::StatusCode::kAborted) return sb;
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Shell> sh, SpawnShell(st_, spec.id, lim));
  return FinishShell(std::move(sh), spec, lim, true);
}

StatusOr<std::unique_ptr<Sandbox>> ContainerBackend::FinishShell(std::unique_ptr<Shell> sh, const SandboxSpec& spec,
                                                                 const jail::CgroupLimits& lim, bool limits_set) {
  if (sh->cg->rel() != spec.id) {
    // A warm shell: its cgroup takes the sandbox's name (v1), or keeps its
    // own (v2 cannot rename; the record names the cgroup).
    Status rs = st_->cgroups->Rename(sh->cg->rel(), spec.id);
    if (rs.ok()) {
      ASSIGN_OR_RETURN(sh->cg, st_->cgroups->Open(spec.id));
    } else if (rs.code() != absl::StatusCode::kUnimplemented) {
      return rs;
    }
  }
  if (!limits_set) {
    const jail::CgroupLimits& had = sh->limits;
    if (had.cpu_millis != lim.cpu_millis || had.memory_bytes != lim.memory_bytes || had.pids != lim.pids)
      RETURN_IF_ERROR(sh->cg->SetLimits(lim));
    sh->limits = lim;
    // A warm shell inherited the refill thread's nice 10: its set-up is on
    // this create's critical path now, and its processes are the sandbox's.
    errno = 0;
    const int nice_now = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
    if (errno == 0 && ::setpriority(PRIO_PROCESS, static_cast<id_t>(sh->pid), nice_now) != 0)
      return Errno("setpriority(shell " + std::to_string(sh->pid) + ", " + std::to_string(nice_now) + ")");
  }
  Rollback rb;
  const std::string rootfs = spec.dir + "/rootfs";
  if (::mkdir(rootfs.c_str(), 0755) != 0 && errno != EEXIST) return Errno("mkdir(" + rootfs + ")");
  rb.Add([rootfs] { ::rmdir(rootfs.c_str()); });
  const uid_t host_uid = st_->HostUid(sh->slot);
  UniqueFd upper_fd, dev_mnt;
  bool dev_nodes_made = false;
  ASSIGN_OR_RETURN(UniqueFd rootfs_mnt,
                   BuildRootfs(spec, sh->userns.get(), host_uid, &upper_fd, &dev_mnt, &dev_nodes_made));

  InitParams ip;
  memset(&ip, 0, sizeof ip);
  snprintf(ip.hostname, sizeof ip.hostname, "%s", spec.hostname.substr(0, 63).c_str());
  snprintf(ip.shm_opts, sizeof ip.shm_opts, "size=%um,nr_inodes=65536,mode=1777", spec.resources.tmpfs_mb);
  ip.nofile = spec.resources.open_files;
  ip.dev_nodes_made = dev_nodes_made ? 1 : 0;
  snprintf(ip.rootfs, sizeof ip.rootfs, "%s", rootfs.c_str());
  if (int r = SendInitParams(sh->sock.get(), ip, rootfs_mnt.get(), upper_fd.get()); r != 0) {
    // The shell holds its end until it received this: a closed socket means it died.
    if (r == -EPIPE || r == -ECONNRESET || !sh->Alive())
      return absl::AbortedError("sandbox " + spec.id + ": its shell died before setup");
    return ErrnoToStatus(-r, "sendmsg(sandbox params, rootfs and upper fds)");
  }
  RETURN_IF_ERROR(SendSharedMounts(*st_, sh->sock.get(), std::move(dev_mnt)));
  rootfs_mnt.reset();
  sh->sock.reset();

  // EOF on the error pipe = warren-init was exec'd.
  jail::ChildError ce;
  ssize_t n;
  do n = ::read(sh->err_r.get(), &ce, sizeof ce); while (n < 0 && errno == EINTR);
  if (n == sizeof ce) {
    return ErrnoToStatus(ce.err, "sandbox " + spec.id + " setup: " + StepName(ce.step));
  }
  if (n != 0) return absl::InternalError("sandbox " + spec.id + " init died during setup");
  // EOF without a report: exec'd, or killed. execve sets the comm before it
  // closes the O_CLOEXEC pipe, so a process still named "warren-shell" (a
  // zombie, not reaped yet) was killed.
  if (auto comm = ReadSmallFile("/proc/" + std::to_string(sh->pid) + "/comm");
      !comm || *comm == "warren-shell\n" || !sh->Alive())
    return absl::AbortedError("sandbox " + spec.id + ": its shell died during setup");
  const uint64_t start = ProcStartTime(sh->pid);
  auto sb = std::make_unique<ContainerSandbox>(st_, spec, sh->slot, sh->pid, start, std::move(sh->pidfd),
                                               std::move(sh->cg));
  sb->set_upper(std::move(upper_fd));
  sh->released = true;
  rb.Release();
  // Like a container WORKDIR: the default cwd of every exec must exist.
  if (!spec.workdir.empty() && spec.workdir != "/") {
    Status ws = sb->files().Mkdir(spec.workdir, 0755, true);
    if (!ws.ok() && ws.code() != absl::StatusCode::kAlreadyExists) {
      (void)sb->Destroy();
      return Status(ws.code(), "sandbox " + spec.id + ": workdir: " + std::string(ws.message()));
    }
  }
  return std::unique_ptr<Sandbox>(std::move(sb));
}

StatusOr<std::unique_ptr<Sandbox>> ContainerBackend::Adopt(const nlohmann::json& r) {
  SandboxSpec spec;
  uint32_t slot;
  pid_t pid;
  uint64_t start;
  std::string cg_rel;
  try {
    spec.id = r.at("id").get<std::string>();
    spec.dir = r.at("dir").get<std::string>();
    pid = r.at("init_pid").get<pid_t>();
    start = r.at("init_start_time").get<uint64_t>();
    slot = r.at("slot").get<uint32_t>();
    cg_rel = r.value("cgroup", spec.id);
    spec.workdir = r.value("workdir", std::string("/"));
    spec.user = r.value("user", std::string("root"));
    spec.hostname = r.value("hostname", spec.id);
    if (r.contains("env")) {
      for (const auto& [k, v] : r.at("env").items()) spec.env[k] = v.get<std::string>();
    }
    if (r.contains("resources")) {
      const auto& x = r.at("resources");
      spec.resources.cpu_millis = x.value("cpu_millis", spec.resources.cpu_millis);
      spec.resources.memory_mb = x.value("memory_mb", spec.resources.memory_mb);
      spec.resources.disk_mb = x.value("disk_mb", spec.resources.disk_mb);
      spec.resources.pids = x.value("pids", spec.resources.pids);
      spec.resources.open_files = x.value("open_files", spec.resources.open_files);
      spec.resources.tmpfs_mb = x.value("tmpfs_mb", spec.resources.tmpfs_mb);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(std::string("bad container sandbox record: ") + e.what());
  }
  UniqueFd pidfd(PidfdOpen(pid));
  if (!pidfd.valid()) return absl::NotFoundError("sandbox " + spec.id + ": init pid " + std::to_string(pid) + " is gone");
  if (ProcStartTime(pid) != start)
    return absl::NotFoundError("sandbox " + spec.id + ": init pid " + std::to_string(pid) + " was reused");
  ASSIGN_OR_RETURN(std::unique_ptr<jail::Cgroup> cg, st_->cgroups->Open(cg_rel));
  if (!st_->TakeSpecificSlot(slot))
    return absl::AlreadyExistsError("sandbox " + spec.id + ": uid slot " + std::to_string(slot) + " already in use");
  // Exec cgroups a killed daemon left: frozen on their own if it died in
  // the middle of a SignalAll (their tasks would never run or die again),
  // empty if their exec ended while no daemon ran. The sandbox's own freezer
  // state is the node's to reconcile (Pause/Resume after Adopt).
  (void)cg->ThawDescendants();
  cg->RemoveEmptyDescendants();
  auto sb = std::make_unique<ContainerSandbox>(st_, spec, slot, pid, start, std::move(pidfd), std::move(cg));
  // Not fatal: the sandbox runs; only snapshot/grade/fork are refused (OpenUpper says why).
  (void)sb->ReattachUpper(r.value("upper_dev", uint64_t{0}), r.value("upper_ino", uint64_t{0}));
  return std::unique_ptr<Sandbox>(std::move(sb));
}

Status ContainerBackend::Cleanup(const nlohmann::json& r) {
  std::string id, dir;
  try {
    id = r.at("id").get<std::string>();
    dir = r.at("dir").get<std::string>();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(std::string("cleanup record needs id and dir: ") + e.what());
  }
  if (!ValidId(id)) return absl::InvalidArgumentError("bad sandbox id '" + id + "'");
  // A recorded init that is still the same process: kill its pid namespace.
  if (r.contains("init_pid") && r.contains("init_start_time")) {
    pid_t pid = r["init_pid"].get<pid_t>();
    UniqueFd pidfd(PidfdOpen(pid));
    if (pidfd.valid() && ProcStartTime(pid) == r["init_start_time"].get<uint64_t>())
      (void)PidfdSignal(pidfd.get(), SIGKILL);
  }
  // Every process of the sandbox is in its cgroup; all its mounts live in its
  // own mount namespace, which dies with them.
  auto cg = st_->cgroups->Open(r.value("cgroup", id));
  if (cg.ok()) RETURN_IF_ERROR((*cg)->Destroy(milliseconds(5000)));
  // Mounts a daemon of an older layout may have left on the host under dir.
  if (auto mi = ReadSmallFile("/proc/self/mountinfo")) {
    std::vector<std::string> targets;
    for (absl::string_view line : absl::StrSplit(*mi, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      if (f.size() > 4 && (f[4] == dir || f[4].rfind(dir + "/", 0) == 0)) targets.push_back(f[4]);
    }
    std::sort(targets.begin(), targets.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
    for (const auto& t : targets) {
      if (::umount2(t.c_str(), UMOUNT_NOFOLLOW) != 0) (void)::umount2(t.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
    }
  }
  std::string rootfs = dir + "/rootfs";
  if (::rmdir(rootfs.c_str()) != 0 && errno != ENOENT) return Errno("rmdir(" + rootfs + ")");
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST)
    return Errno("rmdir(" + dir + ")");
  if (r.contains("slot")) st_->ReleaseSlot(r["slot"].get<uint32_t>());
  return absl::OkStatus();
}

}  // namespace

HostFeatures ProbeHostFeatures() {
  HostFeatures f;
  if (auto m = jail::CgroupManager::Detect("warren"); m.ok()) {
    f.cgroup_version = (*m)->version();
    f.cgroup_parent = (*m)->parent();
  }
  auto maxns = ReadSmallFile("/proc/sys/user/max_user_namespaces");
  int n = 0;
  f.user_namespaces = maxns && absl::SimpleAtoi(absl::StripAsciiWhitespace(*maxns), &n) && n > 0;
  if (!f.user_namespaces) return f;
  // Idmapped mounts: a tmpfs idmapped with a real (mapped) user namespace of a
  // short-lived child, exactly what Create does with lower layers.
  int sync[2];
  if (::pipe2(sync, O_CLOEXEC) != 0) return f;
  UniqueFd sync_r(sync[0]), sync_w(sync[1]);
  pid_t pid = Clone3(CLONE_NEWUSER, nullptr);
  if (pid < 0) return f;
  if (pid == 0) {
    ::close(sync[1]);  // our copy of the write end: EOF when the parent closes its own
    char b;
    ::_exit(::read(sync_r.get(), &b, 1) < 0 ? 1 : 0);
  }
  sync_r.reset();
  const std::string proc = "/proc/" + std::to_string(pid);
  if (WriteString(proc + "/uid_map", "0 4000000000 1\n").ok() && WriteString(proc + "/setgroups", "deny").ok() &&
      WriteString(proc + "/gid_map", "0 4000000000 1\n").ok()) {
    UniqueFd ns(::open((proc + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
    UniqueFd fs(FsOpen("tmpfs", FSOPEN_CLOEXEC));
    if (ns.valid() && fs.valid() && FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) == 0) {
      UniqueFd mnt(FsMount(fs.get(), FSMOUNT_CLOEXEC, 0));
      mount_attr attr;
      memset(&attr, 0, sizeof attr);
      attr.attr_set = MOUNT_ATTR_IDMAP;
      attr.userns_fd = static_cast<uint64_t>(ns.get());
      f.idmapped_mounts = mnt.valid() && MountSetattr(mnt.get(), "", AT_EMPTY_PATH, &attr) == 0;
    }
  }
  sync_w.reset();
  (void)::waitpid(pid, nullptr, 0);
  return f;
}

StatusOr<std::unique_ptr<Backend>> NewContainerBackend(const ContainerOptions& options) {
  auto st = std::make_shared<BackendState>();
  st->options = options;
  if (options.uid_range == 0 || options.max_sandboxes == 0)
    return absl::InvalidArgumentError("uid_range and max_sandboxes must be > 0");
  ASSIGN_OR_RETURN(st->uid_slots, UidSlots::Open(options.uid_lock_dir, options.uid_owner, options.max_sandboxes,
                                                 options.uid_base, options.uid_range));
  ASSIGN_OR_RETURN(st->cgroups, jail::CgroupManager::Detect(options.cgroup_name));
  st->init_exe.reset(::open(options.init_path.c_str(), O_PATH | O_CLOEXEC));
  if (!st->init_exe.valid()) return Errno("open(" + options.init_path + ")");
  st->spawn_path = options.spawn_path;
  if (st->spawn_path.empty()) {
    const size_t slash = options.init_path.rfind('/');
    st->spawn_path = (slash == std::string::npos ? std::string(".") : options.init_path.substr(0, slash)) + "/warren-spawn";
  }
  if (::access(st->spawn_path.c_str(), X_OK) != 0) return Errno("access(" + st->spawn_path + ", X_OK)");
  st->last_cap = jail::LastCapability();
  if (auto m = MakeSharedMaskMount(); m.ok()) st->mask_mnt = std::move(*m);
  if (auto m = MakeSharedSysfs(); m.ok()) st->sysfs_mnt = std::move(*m);
#ifdef WARREN_HAVE_SECCOMP
  ASSIGN_OR_RETURN(st->seccomp, jail::CompileSeccompProfile(options.seccomp_profile.empty()
                                                                ? jail::DefaultSeccompProfile()
                                                                : options.seccomp_profile,
                                                            /*binary_tree=*/true));
  st->have_seccomp = true;
#endif
  // Shell cgroups a killed daemon left (empty: its shells died with it).
  SweepStaleShellCgroups(*st);
  return std::unique_ptr<Backend>(new ContainerBackend(std::move(st)));
}

}  // namespace warren::runtime
