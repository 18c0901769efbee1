// The fncall worker's jail: its containment plan and the call process's,
// the worker child between clone3 and execve of the zygote, its read-only
// root.
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "jail/contain.h"
#include "jail/plan.h"
#include "jail/plan_builder.h"
#include "jail/seccomp.h"
#include "jail/syscalls.h"
#include "runtime/fncall/fncall_internal.h"

namespace warren::runtime::fncall::internal {

using jail::FsConfig;
using jail::FsMount;
using jail::FsOpen;
using jail::MountSetattr;
using jail::OpenTree;

const char* StepName(int32_t s) {
  static const char* const kNames[] = {"?",     "recvmsg(rootfs fd)",       "loopback up",
                                       "stdio", "unshare(CLONE_NEWCGROUP)", "execve(python3)"};
  return s > 0 && s < static_cast<int32_t>(sizeof kNames / sizeof kNames[0]) ? kNames[s] : "?";
}

// The worker's (the zygote's) containment: the read-only root, a bare
// /proc, a read-only /dev of the common nodes (no terminal) with its own
// /dev/shm, a small /tmp, a read-only /sys holding only the worker's cgroup
// (fs/cgroup) and the limit views, then pivot_root. The zygote keeps its
// capabilities (it mounts each call's /tmp, /dev/shm and /proc) and drops
// its bounding set itself (zygote.py); each call process then applies
// CallJailPlan.
//
// Why the worker's /proc is bare: no untrusted code runs in the zygote, and
// every call mounts its own /proc (with the masks and limit views of every
// sandbox) over it, so masks here would only hide what no caller sees. Each
// call's clone(CLONE_NEWNS) copies the worker's whole mount table and its
// exit tears the copy down: ~22 masks and views here cost every call ~22
// mounts copied and dropped for nothing. The bare proc also keeps the
// calls' own proc mounts allowed (fs/namespace.c mount_too_revealing: a
// user namespace may mount a proc only where one is fully visible).
// Where the worker keeps lxcfs's proc files for its calls' fresh /proc.
constexpr const char* kLxcfsInWorker = "/sys/fs/lxcfs";
StatusOr<WarrenJailPlan> WorkerJailPlan(const std::string& mount_point, const std::vector<std::string>& cgroup_dirs,
                                        const std::string& lxcfs) {
  jail::PlanBuilder b;
  WarrenJailPlan& p = b.plan();
  if (mount_point.size() >= sizeof p.root) return absl::InvalidArgumentError("fncall: mount point too long");
  memcpy(p.root, mount_point.c_str(), mount_point.size() + 1);
  memcpy(p.hostname, "fncall", 7);
  p.ns_flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET;
  p.steps =
      WARREN_JAIL_HOSTNAME | WARREN_JAIL_PRIVATE | WARREN_JAIL_ATTACH_ROOT | WARREN_JAIL_MOUNT_IDS | WARREN_JAIL_PIVOT;
  p.root_fd_slot = 0;
  p.mount_uid = p.mount_gid = 0;
  b.Mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
  b.Mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=755")
      .DevNodes("dev", /*terminal=*/false)
      .DevLinks("dev", /*terminal=*/false)
      .Mkdir("dev/shm", 01777)
      .Mount("shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,nr_inodes=4096,mode=1777")
      // /dev itself read-only: root inside must not leave files there for
      // later calls (each call gets its own /dev/shm, /tmp and /proc).
      .Remount("dev", MS_RDONLY | MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=755")
      .Mount("tmpfs", "tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=64,mode=1777")
      .Mount("tmpfs", "sys", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16k,nr_inodes=64,mode=755")
      .Mkdir("sys/fs", 0755)
      .Mkdir("sys/fs/cgroup", 0755)
      .CgroupView("sys/fs/cgroup", cgroup_dirs);
  if (!lxcfs.empty()) {
    b.Mkdir("sys/fs/lxcfs", 0755).Bind(lxcfs + "/proc", "sys/fs/lxcfs", 0, WARREN_JAIL_IF_EXISTS);
    b.Mkdir("sys/devices", 0755).Mkdir("sys/devices/system", 0755).Mkdir("sys/devices/system/cpu", 0755);
    b.DevNode(lxcfs + "/sys/devices/system/cpu/online", "sys/devices/system/cpu/online");
  }
  b.Remount("sys", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16k,nr_inodes=64,mode=755").NoNewPrivs();
  RETURN_IF_ERROR(b.Finish());
  return p;
}

// A call process's containment (zygote_helper.c applies it after its clone
// into fresh mount, pid and ipc namespaces): its own /tmp (scratch, cwd) and
// /dev/shm, a fresh /proc of its pid namespace with the same masks and limit
// views as every sandbox, RLIMIT_CORE 0, no capability in any set,
// no_new_privs, seccomp. The masked dirs show clones of one empty read-only
// tmpfs the zygote makes once (its fd in kCallMaskSlot): no tmpfs
// superblock made and torn down per call.
StatusOr<WarrenJailPlan> CallJailPlan(uint32_t scratch_mb, const jail::SeccompProgram* seccomp, bool lxcfs) {
  jail::PlanBuilder b;
  WarrenJailPlan& p = b.plan();
  p.ns_flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC;
  b.Mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          "size=" + std::to_string(scratch_mb) + "m,nr_inodes=65536,mode=1777")
      .Mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,nr_inodes=4096,mode=1777")
      .Proc("/proc", /*with_sys=*/false, kCallMaskSlot, /*clone_mask=*/true);
  if (lxcfs) b.LimitViews("/proc", kLxcfsInWorker);
  b.Rlimit(RLIMIT_CORE, 0, 0).Capabilities(0, jail::LastCapability()).NoNewPrivs().Seccomp(seccomp);
  RETURN_IF_ERROR(b.Finish());
  return p;
}

// Async-signal-safe: runs between clone3 and execve of the zygote.
[[noreturn]] void WorkerChild(const WorkerPlan& p) {
  const int e = p.err_fd;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP) sigaction(s, &sa, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  ::umask(0);
  const int rootfs = jail::RecvFd(p.sock);
  if (rootfs == -EPIPE) ::_exit(1);  // parent gave up: nothing to report
  if (rootfs < 0) jail::ChildFail(e, kStepRecv, -rootfs);
  ::close(p.sock);
  // A cgroup namespace rooted at the worker's cgroup (the parent placed us
  // there before sending the root): /proc/self/cgroup names "/", matching
  // the view at /sys/fs/cgroup.
  if (::unshare(CLONE_NEWCGROUP) != 0) jail::ChildFail(e, kStepCgroupNs, errno);
  const int fds[WARREN_JAIL_MAX_FD_SLOTS] = {rootfs, -1, -1, -1, -1};
  int step = 0;
  if (int rc = warren_jail_enter_root(p.jail, fds, &step); rc != 0) jail::ChildFail(e, kJailStep0 + step, -rc);
  if (int rc = warren_jail_mount(p.jail, fds, &step); rc != 0) jail::ChildFail(e, kJailStep0 + step, -rc);
  if (int rc = jail::LoopbackUp(); rc != 0) jail::ChildFail(e, kStepLoopback, -rc);
  int nul = ::open("/dev/null", O_RDWR);
  if (nul < 0 || ::dup2(nul, 0) < 0 || ::dup2(nul, 1) < 0 || ::dup2(nul, 2) < 0) jail::ChildFail(e, kStepStdio, errno);
  if (::dup2(p.chan, 3) < 0) jail::ChildFail(e, kStepStdio, errno);  // dup2 clears CLOEXEC
  if (::dup2(p.helper, 4) < 0) jail::ChildFail(e, kStepStdio, errno);
  ::setsid();
  if (int rc = warren_jail_lockdown(&p.jail->creds, &step); rc != 0) jail::ChildFail(e, kJailStep0 + step, -rc);
  ::syscall(SYS_close_range, 5, ~0U, CLOSE_RANGE_CLOEXEC);
  ::execve("/usr/bin/python3", p.argv.data(), p.envp.data());
  jail::ChildFail(e, kStepExec, errno);
}

// Builds the detached, read-only root: the single layer mount cloned, or an
// overlay of several layers without upper (read-only by construction).
StatusOr<UniqueFd> BuildRoot(const std::vector<std::string>& lower_dirs) {
  if (lower_dirs.size() == 1) {
    const std::string& dir = lower_dirs[0];
    UniqueFd t(OpenTree(AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE));
    if (!t.valid()) return Errno("open_tree(" + dir + ", OPEN_TREE_CLONE)");
    mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if (MountSetattr(t.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) != 0)
      return Errno("mount_setattr(" + dir + ", MOUNT_ATTR_RDONLY)");
    return t;
  }
  UniqueFd ofs(FsOpen("overlay", FSOPEN_CLOEXEC));
  if (!ofs.valid()) return Errno("fsopen(overlay)");
  for (auto it = lower_dirs.rbegin(); it != lower_dirs.rend(); ++it) {
    if (FsConfig(ofs.get(), FSCONFIG_SET_STRING, "lowerdir+", it->c_str(), 0) != 0)
      return Errno("fsconfig(overlay, lowerdir+=" + *it + ")");
  }
  if (FsConfig(ofs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return Errno("fsconfig(overlay, create)");
  UniqueFd m(FsMount(ofs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!m.valid()) return Errno("fsmount(overlay)");
  return m;
}

json DefaultCallEnv() {
  return json{{"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", "/tmp"}, {"LANG", "C.UTF-8"}, {"TMPDIR", "/tmp"}};
}

}  // namespace warren::runtime::fncall::internal
