// fncall pool: worker jail (spawn), daemon<->zygote protocol, pool sizing.
// See fncall.h for the contract and zygote.py for the worker side.
#include "runtime/fncall/fncall.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/mount.h>
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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <absl/strings/escaping.h>
#include <nlohmann/json.hpp>

#include "common/output_pump.h"
#include "jail/cgroup.h"
#include "jail/contain.h"
#include "jail/plan.h"
#include "jail/plan_builder.h"
#include "jail/seccomp.h"
#include "jail/syscalls.h"

namespace warren::runtime {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

using jail::Clone3;
using jail::FsConfig;
using jail::FsMount;
using jail::FsOpen;
using jail::MountSetattr;
using jail::MoveMount;
using jail::OpenTree;
using jail::RawSetresgid;
using jail::RawSetresuid;

Status Errno(const std::string& what) { return ErrnoToStatus(errno, what); }

Status WriteString(const std::string& path, const std::string& v) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return Errno("open(" + path + ")");
  if (::write(fd.get(), v.data(), v.size()) != static_cast<ssize_t>(v.size()))
    return Errno("write(" + path + ", " + v + ")");
  return absl::OkStatus();
}

// ------------------------------------------------------------------ jail child
// Steps of the worker child outside the containment plan (plan.h names its own).
enum Step : int32_t { kStepRecv = 1, kStepLoopback, kStepStdio, kStepCgroupNs, kStepExec };
// Steps from kJailStep0 on are the containment plan's (plan.h), offset.
constexpr int32_t kJailStep0 = 1000;
const char* StepName(int32_t s) {
  static const char* const kNames[] = {"?",     "recvmsg(rootfs fd)",       "loopback up",
                                       "stdio", "unshare(CLONE_NEWCGROUP)", "execve(python3)"};
  return s > 0 && s < static_cast<int32_t>(sizeof kNames / sizeof kNames[0]) ? kNames[s] : "?";
}

struct WorkerPlan {
  int sock = -1;                         // child end of the setup socketpair (rootfs fd arrives here)
  int chan = -1;                         // child end of the protocol socket (becomes fd 3)
  int err_fd = -1;                       // CLOEXEC error pipe: EOF = exec'd
  int helper = -1;                       // memfd holding zygote_helper.so (becomes fd 4)
  const WarrenJailPlan* jail = nullptr;  // root, mounts, no_new_privs (WorkerJailPlan)
  std::vector<char*> argv, envp;
};

// The worker's (the zygote's) containment: the read-only root, /proc with
// the masks every sandbox gets, a read-only /dev of the common nodes (no
// terminal) with its own /dev/shm, a small /tmp, a read-only /sys holding
// only the worker's cgroup (fs/cgroup) and the limit views, then
// pivot_root. The zygote keeps its capabilities (it mounts each call's /tmp,
// /dev/shm and /proc) and drops its bounding set itself (zygote.py); each
// call process then applies CallJailPlan.
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
  b.Proc("proc", /*with_sys=*/false, -1);
  if (!lxcfs.empty()) b.LimitViews("proc", lxcfs + "/proc");
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
// no_new_privs, seccomp.
StatusOr<WarrenJailPlan> CallJailPlan(uint32_t scratch_mb, const jail::SeccompProgram* seccomp, bool lxcfs) {
  jail::PlanBuilder b;
  WarrenJailPlan& p = b.plan();
  p.ns_flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC;
  b.Mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          "size=" + std::to_string(scratch_mb) + "m,nr_inodes=65536,mode=1777")
      .Mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,nr_inodes=4096,mode=1777")
      .Proc("/proc", /*with_sys=*/false, -1);
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
  const int fds[WARREN_JAIL_MAX_FD_SLOTS] = {rootfs, -1, -1, -1};
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

// A call's environment before its own variables (the zygote's own, too:
// a call that sets none changes nothing).
json DefaultCallEnv() {
  return json{{"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", "/tmp"}, {"LANG", "C.UTF-8"}, {"TMPDIR", "/tmp"}};
}

// ------------------------------------------------------------------ framing
// The worker channel is SOCK_SEQPACKET: one send is one message. Messages of
// the helper's protocol (zygote_helper.c, which mirrors these):
struct ZygoteMsg {
  uint32_t kind;    // 'S' spawned (+ D's pidfd), 'X' D exited, 'F' clone failed, 'E' D's set-up failed
  uint32_t serial;  // of the call process
  int32_t a;        // 'X': si_code; 'F', 'E': errno
  int32_t b;        // 'X': si_status; 'E': step
};
struct CallHead {
  uint32_t magic, flags, nfds, json_len, blob_len;
};
constexpr uint32_t kCallMagic = 0x434e4657;  // "WFNC"
constexpr uint32_t kCallInMemfd = 1;
constexpr uint32_t kCallPlainPython = 2;  // python, default env, no files, no fetch: no json, blob = code
constexpr size_t kInlineMax = 64u << 10;  // bigger calls travel in a memfd
// The call process's own steps (zygote_helper.c); from kJailStep0 on, its
// containment plan's (CallJailPlan).
const char* const kHelperSteps[] = {"?",
                                    "chdir(/tmp)",
                                    "open(/proc/self/oom_score_adj)",
                                    "recvmsg(call)",
                                    "malformed call",
                                    "mmap(call memfd)",
                                    "dup3(call fds)",
                                    "getrandom(reseed)"};

// Sends one message with `fds` attached (SCM_RIGHTS), waiting for room until
// `deadline`.
Status SendMsgUntil(int sock, const std::string& data, const std::vector<int>& fds, Clock::time_point deadline) {
  iovec v{const_cast<char*>(data.data()), data.size()};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 8)];
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  if (!fds.empty()) {
    if (fds.size() > 8) return absl::InternalError("send(worker): too many fds");
    memset(cbuf, 0, sizeof cbuf);
    m.msg_control = cbuf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (int i = 0; i < (1 << 22); ++i) {
    ssize_t n = ::sendmsg(sock, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(data.size())) return absl::OkStatus();
    if (n >= 0) return absl::InternalError("sendmsg(worker): short send on a seqpacket socket");
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return Errno("sendmsg(worker)");
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return absl::DeadlineExceededError("sendmsg(worker): deadline");
    pollfd p{sock, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return absl::InternalError("sendmsg(worker): stuck");
}

// Receives one message (at most `max` bytes) and at most one fd with it
// (O_CLOEXEC; extra fds are closed), waiting until `deadline`.
Status RecvMsgUntil(int sock, size_t max, std::string* data, UniqueFd* fd, Clock::time_point deadline) {
  data->resize(max);
  for (int i = 0; i < (1 << 22); ++i) {
    iovec v{data->data(), max};
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 8)];
    msghdr m{};
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    ssize_t n = ::recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t j = 0; j < k; ++j) {
          int f;
          memcpy(&f, CMSG_DATA(c) + j * sizeof(int), sizeof f);
          if (fd != nullptr && !fd->valid()) {
            fd->reset(f);
          } else {
            ::close(f);
          }
        }
      }
      if (m.msg_flags & MSG_TRUNC) return absl::InternalError("recvmsg(worker): message too long");
      data->resize(static_cast<size_t>(n));
      return absl::OkStatus();
    }
    if (n == 0) return absl::UnavailableError("worker closed its channel");
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return Errno("recvmsg(worker)");
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return absl::DeadlineExceededError("recvmsg(worker): deadline");
    pollfd p{sock, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return absl::InternalError("recvmsg(worker): stuck");
}

StatusOr<ZygoteMsg> ParseZygoteMsg(const std::string& data) {
  ZygoteMsg m;
  if (data.size() < sizeof m) return absl::InternalError("worker sent a short message");
  memcpy(&m, data.data(), sizeof m);
  if (m.kind == 'E') {
    std::string step =
        m.b > 0 && m.b < static_cast<int32_t>(sizeof kHelperSteps / sizeof kHelperSteps[0]) ? kHelperSteps[m.b] : "?";
    if (m.b >= kJailStep0) {
      // The mount ops do not depend on the pool's options: a plan built here names them.
      auto plan = CallJailPlan(1, nullptr, true);
      step = plan.ok() ? jail::StepDescription(*plan, m.b - kJailStep0) : warren_jail_step_name(m.b - kJailStep0);
    }
    return ErrnoToStatus(m.a, "fncall call process set-up: " + step);
  }
  if (m.kind == 'F') return ErrnoToStatus(m.a, "fncall zygote: clone3(call process)");
  return m;
}

class BlobBuilder {
 public:
  json Add(const std::string& b) {
    json ref = json::array({data_.size(), b.size()});
    data_ += b;
    return ref;
  }
  std::string& data() { return data_; }

 private:
  std::string data_;
};

std::string Frame(const json& hdr, const std::string& blob) {
  std::string j = hdr.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(8 + j.size() + blob.size());
  uint32_t lens[2] = {static_cast<uint32_t>(j.size()), static_cast<uint32_t>(blob.size())};
  out.append(reinterpret_cast<const char*>(lens), sizeof lens);
  out += j;
  out += blob;
  return out;
}

// The zygote's "ready" answer to the init message (one json frame).
StatusOr<json> ReadJsonFrame(int fd, Clock::time_point deadline) {
  std::string m;
  RETURN_IF_ERROR(RecvMsgUntil(fd, 1 << 16, &m, nullptr, deadline));
  uint32_t lens[2];
  if (m.size() < sizeof lens) return absl::InternalError("worker sent a short frame");
  memcpy(lens, m.data(), sizeof lens);
  if (lens[0] > m.size() - sizeof lens) return absl::InternalError("worker sent a truncated frame");
  json hdr = json::parse(m.substr(sizeof lens, lens[0]), nullptr, false);
  if (hdr.is_discarded() || !hdr.is_object()) return absl::InternalError("worker sent malformed json");
  return hdr;
}

// One of a call's output pipes, read by warrend.
using Stream = PumpStream;  // fd, data (at most cap), total, cap

// An outcome from a wait status (nullopt: killed at the time-out, or lost).
ExecOutcome MakeOutcome(std::optional<int> wstatus, bool timed_out, Stream* out, Stream* err,
                        std::chrono::nanoseconds duration) {
  ExecOutcome r;
  if (!wstatus) {
    r.signal = SIGKILL;
    r.exit_code = 128 + SIGKILL;
  } else if (WIFSIGNALED(*wstatus)) {
    r.signal = WTERMSIG(*wstatus);
    r.exit_code = 128 + r.signal;
  } else {
    r.exit_code = WEXITSTATUS(*wstatus);
  }
  r.timed_out = timed_out;
  r.stdout_total = out->total;
  r.stderr_total = err->total;
  r.stdout_truncated = out->total > out->data.size();
  r.stderr_truncated = err->total > err->data.size();
  r.stdout_data = std::move(out->data);
  r.stderr_data = std::move(err->data);
  r.duration = duration;
  return r;
}

// ------------------------------------------------------------------ worker
// The "oom_kill N" count of a memory.oom_control / memory.events file kept
// open (a pread per call instead of two path walks through the cgroup fs).
std::optional<uint64_t> ReadOomKills(int fd) {
  char buf[1024];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  for (const char* p = buf; (p = strstr(p, "oom_kill ")) != nullptr; p += 9) {
    if (p == buf || p[-1] == '\n') return strtoull(p + 9, nullptr, 10);
  }
  return std::nullopt;
}

// Parent pid of `pid` from /proc/<pid>/stat; -1 if it is gone.
pid_t ParentPid(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return -1;
  ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* rp = strrchr(buf, ')');  // comm may contain spaces and ')'
  int ppid = -1;
  if (rp == nullptr || sscanf(rp + 1, " %*c %d", &ppid) != 1) return -1;
  return ppid;
}

// True if `pids` (a worker cgroup's) are the zygote plus at most one process
// whose parent is the zygote (its pre-forked, waiting call process).
bool OnlyZygoteAndOneChild(const std::vector<pid_t>& pids, pid_t zygote) {
  bool has_zygote = false;
  int children = 0;
  for (pid_t p : pids) {
    if (p == zygote) {
      has_zygote = true;
    } else if (ParentPid(p) == zygote) {
      ++children;
    } else {
      return false;
    }
  }
  return has_zygote && children <= 1;
}

struct Worker {
  pid_t pid = -1;
  UniqueFd pidfd;
  UniqueFd chan;
  std::unique_ptr<jail::Cgroup> cgroup;
  uint32_t slot = 0;
  uint64_t memory_bytes = 0;
  uint64_t seq = 0;
  UniqueFd oom_fd;           // the cgroup's memory.oom_control (v1) / memory.events (v2), read per call
  UniqueFd call_pidfd;       // the pre-forked call process D (its 'S' message), invalid until received
  uint32_t call_serial = 0;  // D's serial (zygote_helper.c)
  Clock::time_point last_used;

  ~Worker() {
    // Reap the worker (PID 1 of its pid namespace: its death takes every
    // call process with it) before removing the cgroup, so the cgroup is
    // already empty and its removal cannot race an exiting process.
    if (pid > 0) {
      (void)::kill(pid, SIGKILL);  // our un-reaped child: the pid cannot be reused
      (void)::waitpid(pid, nullptr, 0);
    }
    if (cgroup) (void)cgroup->Destroy(milliseconds(5000));
  }
};

struct PoolKey {
  std::vector<std::string> lower_dirs;
  bool operator<(const PoolKey& o) const { return lower_dirs < o.lower_dirs; }
};

struct Pool {
  std::deque<std::unique_ptr<Worker>> idle;
};

class FnCallPoolImpl : public FnCallPool {
 public:
  FnCallPoolImpl(FnCallOptions o, std::unique_ptr<jail::CgroupManager> cg, std::optional<jail::SeccompProgram> sc,
                 UniqueFd helper)
      : opt_(std::move(o)), cgroups_(std::move(cg)), seccomp_(std::move(sc)), helper_(std::move(helper)) {
    slots_.assign(opt_.uid_count, false);
    reaper_ = std::thread([this] { ReaperLoop(); });
  }
  ~FnCallPoolImpl() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    reaper_cv_.notify_all();
    reaper_.join();
    std::lock_guard<std::mutex> l(mu_);
    pools_.clear();  // destroys the idle workers; busy ones belong to running calls
  }

  StatusOr<FnCallResult> Call(const std::vector<std::string>& lower_dirs, const FnCallRequest& req) override;
  void Shrink(milliseconds idle_timeout) override;
  FnCallStats Stats() const override {
    std::lock_guard<std::mutex> l(mu_);
    FnCallStats s = stats_;
    s.workers = total_;
    s.pools = static_cast<uint32_t>(pools_.size());
    s.idle = 0;
    for (const auto& [k, p] : pools_) s.idle += static_cast<uint32_t>(p.idle.size());
    s.busy = s.workers - s.idle;
    return s;
  }

 private:
  StatusOr<std::unique_ptr<Worker>> Acquire(const PoolKey& key);
  void Release(const PoolKey& key, std::unique_ptr<Worker> w, bool healthy);
  StatusOr<std::unique_ptr<Worker>> Spawn(const PoolKey& key);
  void ReaperLoop();
  const FnCallOptions opt_;
  std::unique_ptr<jail::CgroupManager> cgroups_;
  std::optional<jail::SeccompProgram> seccomp_;
  UniqueFd helper_;  // sealed memfd: zygote_helper.so, fd 4 of every zygote
  mutable std::mutex mu_;
  std::condition_variable cv_;         // a worker was released or freed (Acquire waits)
  std::condition_variable reaper_cv_;  // stop_ was set
  std::map<PoolKey, Pool> pools_;
  std::vector<bool> slots_;
  uint32_t next_slot_ = 0;
  uint32_t total_ = 0;  // workers alive or being spawned
  uint64_t worker_counter_ = 0;
  FnCallStats stats_;
  bool stop_ = false;
  std::thread reaper_;
};

StatusOr<std::unique_ptr<Worker>> FnCallPoolImpl::Spawn(const PoolKey& key) {
  auto w = std::make_unique<Worker>();
  uint64_t serial;
  {
    std::lock_guard<std::mutex> l(mu_);
    uint32_t i = 0;
    for (; i < opt_.uid_count && slots_[(next_slot_ + i) % opt_.uid_count]; ++i) {
    }
    if (i == opt_.uid_count) return absl::ResourceExhaustedError("fncall: no free worker uid slot");
    w->slot = (next_slot_ + i) % opt_.uid_count;
    slots_[w->slot] = true;
    next_slot_ = w->slot + 1;
    serial = ++worker_counter_;
  }
  struct SlotGuard {
    FnCallPoolImpl* self;
    uint32_t slot;
    bool armed = true;
    ~SlotGuard() {
      if (!armed) return;
      std::lock_guard<std::mutex> l(self->mu_);
      self->slots_[slot] = false;
    }
  } slot_guard{this, w->slot};
  const uid_t host_uid = opt_.uid_base + w->slot;

  jail::CgroupLimits lim;
  lim.cpu_millis = opt_.cpu_millis;
  lim.memory_bytes = uint64_t{opt_.default_memory_mb} << 20;
  lim.pids = opt_.pids;
  const std::string rel = "w" + std::to_string(::getpid()) + "-" + std::to_string(serial);
  ASSIGN_OR_RETURN(w->cgroup, cgroups_->Create(rel, lim));  // ~Worker destroys it on failure
  w->memory_bytes = lim.memory_bytes;
  for (const std::string& dir : w->cgroup->dirs()) {
    for (const char* f : {"/memory.oom_control", "/memory.events"}) {
      if (w->oom_fd.valid()) break;
      w->oom_fd.reset(::open((dir + f).c_str(), O_RDONLY | O_CLOEXEC));
      if (w->oom_fd.valid() && !ReadOomKills(w->oom_fd.get())) w->oom_fd.reset();
    }
  }

  int sp[2], ch[2], ep[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) return Errno("socketpair(setup)");
  UniqueFd setup_parent(sp[0]), setup_child(sp[1]);
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ch) != 0) return Errno("socketpair(channel)");
  UniqueFd chan_parent(ch[0]), chan_child(ch[1]);
  if (::pipe2(ep, O_CLOEXEC) != 0) return Errno("pipe2");
  UniqueFd err_r(ep[0]), err_w(ep[1]);

  // The zygote's start-up environment (zygote.py replaces it with
  // DefaultCallEnv() before any call). LD_BIND_NOW: every symbol is bound
  // when the zygote loads, so call processes do not resolve (and copy the
  // GOT pages of) the functions they call first: 180 -> 168 page faults per
  // trivial call.
  static const char* const kEnv[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",  "HOME=/tmp",
                                     "PYTHONDONTWRITEBYTECODE=1",         "LD_BIND_NOW=1", nullptr};
  std::string zsrc = ZygoteSource();
  std::string a0 = "python3", a1 = "-I", a2 = "-S", a3 = "-c";
  WorkerPlan plan;
  plan.sock = setup_child.get();
  plan.chan = chan_child.get();
  plan.err_fd = err_w.get();
  plan.helper = helper_.get();
  ASSIGN_OR_RETURN(const WarrenJailPlan worker_jail,
                   WorkerJailPlan(opt_.mount_point, w->cgroup->dirs(), opt_.lxcfs_dir));
  const WarrenJailPlan* jail_plan = &worker_jail;
  plan.jail = jail_plan;
  plan.argv = {a0.data(), a1.data(), a2.data(), a3.data(), zsrc.data(), nullptr};
  for (const char* e : kEnv) plan.envp.push_back(const_cast<char*>(e));

  int pidfd_raw = -1;
  pid_t pid =
      Clone3(CLONE_PIDFD | CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET,
             &pidfd_raw);
  if (pid < 0) return Errno("clone3(fncall worker)");
  if (pid == 0) WorkerChild(plan);
  w->pid = pid;  // from here ~Worker kills and reaps it
  w->pidfd.reset(pidfd_raw);
  setup_child.reset();
  chan_child.reset();
  err_w.reset();

  const std::string proc = "/proc/" + std::to_string(pid);
  RETURN_IF_ERROR(WriteString(proc + "/uid_map", "0 " + std::to_string(host_uid) + " 1\n"));
  RETURN_IF_ERROR(WriteString(proc + "/setgroups", "deny"));
  RETURN_IF_ERROR(WriteString(proc + "/gid_map", "0 " + std::to_string(host_uid) + " 1\n"));
  RETURN_IF_ERROR(w->cgroup->AddProcess(pid));
  ASSIGN_OR_RETURN(UniqueFd root, BuildRoot(key.lower_dirs));
  if (int r = jail::SendFd(setup_parent.get(), root.get()); r != 0) return ErrnoToStatus(-r, "sendmsg(rootfs fd)");
  root.reset();
  setup_parent.reset();
  jail::ChildError ce;
  ssize_t n;
  do n = ::read(err_r.get(), &ce, sizeof ce);
  while (n < 0 && errno == EINTR);
  if (n == sizeof ce) {
    return ErrnoToStatus(ce.err, "fncall worker setup: " +
                                     (ce.step >= kJailStep0 ? jail::StepDescription(*jail_plan, ce.step - kJailStep0)
                                                            : std::string(StepName(ce.step))));
  }
  if (n != 0) return absl::InternalError("fncall worker died during setup");

  w->chan = std::move(chan_parent);
  const auto deadline = Clock::now() + milliseconds(20000);
  ASSIGN_OR_RETURN(const WarrenJailPlan call_plan,
                   CallJailPlan(opt_.scratch_mb, seccomp_ ? &*seccomp_ : nullptr, !opt_.lxcfs_dir.empty()));
  RETURN_IF_ERROR(SendMsgUntil(
      w->chan.get(), Frame(json{{"op", "init"}, {"env", DefaultCallEnv()}}, jail::PlanBytes(call_plan)), {}, deadline));
  auto ready = ReadJsonFrame(w->chan.get(), deadline);
  if (!ready.ok() || ready->value("op", "") != "ready") {
    return absl::InternalError("fncall worker: python zygote did not start (is /usr/bin/python3 in the layers?): " +
                               ready.status().ToString());
  }
  slot_guard.armed = false;
  w->last_used = Clock::now();
  return w;
}

StatusOr<std::unique_ptr<Worker>> FnCallPoolImpl::Acquire(const PoolKey& key) {
  std::unique_lock<std::mutex> l(mu_);
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  for (int i = 0; i < 1 << 20; ++i) {
    if (stop_) return absl::UnavailableError("fncall pool shutting down");
    Pool& p = pools_[key];
    if (!p.idle.empty()) {
      auto w = std::move(p.idle.back());  // LIFO: the warmest worker
      p.idle.pop_back();
      return w;
    }
    if (total_ < opt_.max_workers) break;
    // Node full: destroy an idle worker of another pool, if any, to make room.
    std::unique_ptr<Worker> victim;
    for (auto& [k, other] : pools_) {
      if (!other.idle.empty()) {
        victim = std::move(other.idle.front());
        other.idle.pop_front();
        break;
      }
    }
    if (victim) {
      const uint32_t slot = victim->slot;
      l.unlock();
      victim.reset();
      l.lock();
      slots_[slot] = false;
      --total_;
      ++stats_.discarded;
      continue;
    }
    if (total_ < opt_.max_workers) break;
    if (cv_.wait_until(l, give_up) == std::cv_status::timeout)
      return absl::ResourceExhaustedError("fncall: all " + std::to_string(opt_.max_workers) +
                                          " workers busy for 60 s; retry later");
  }
  ++total_;
  ++stats_.spawned;
  l.unlock();
  auto w = Spawn(key);
  if (!w.ok()) {
    std::lock_guard<std::mutex> g(mu_);
    --total_;
    cv_.notify_one();
  }
  return w;
}

void FnCallPoolImpl::Release(const PoolKey& key, std::unique_ptr<Worker> w, bool healthy) {
  if (healthy) {
    w->last_used = Clock::now();
    std::lock_guard<std::mutex> l(mu_);
    if (!stop_) {
      pools_[key].idle.push_back(std::move(w));
      cv_.notify_one();
      return;
    }
  }
  uint32_t slot = w->slot;
  w.reset();  // kills the worker, removes its cgroup
  std::lock_guard<std::mutex> l(mu_);
  slots_[slot] = false;
  --total_;
  ++stats_.discarded;
  cv_.notify_one();
}

void FnCallPoolImpl::Shrink(milliseconds idle_timeout) {
  std::vector<std::unique_ptr<Worker>> gone;
  {
    std::lock_guard<std::mutex> l(mu_);
    const auto cutoff = Clock::now() - idle_timeout;
    for (auto it = pools_.begin(); it != pools_.end();) {
      auto& idle = it->second.idle;
      while (!idle.empty() && idle.front()->last_used <= cutoff) {
        gone.push_back(std::move(idle.front()));
        idle.pop_front();
      }
      it = idle.empty() ? pools_.erase(it) : std::next(it);
    }
  }
  for (auto& w : gone) {
    uint32_t slot = w->slot;
    w.reset();
    std::lock_guard<std::mutex> l(mu_);
    slots_[slot] = false;
    --total_;
    ++stats_.discarded;
  }
  if (!gone.empty()) cv_.notify_all();
}

void FnCallPoolImpl::ReaperLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    reaper_cv_.wait_for(l, milliseconds(1000));
    if (stop_) break;
    l.unlock();
    Shrink(opt_.idle_timeout);
    l.lock();
  }
}

// Worker cgroups are named w<daemon pid>-<n>. A daemon that died left its
// workers' cgroups behind (the workers themselves exit when their channel
// closes); remove those whose daemon is gone. Best effort.
void RemoveStaleWorkerCgroups(jail::CgroupManager& cg) {
  const std::string parent = cg.parent();
  for (const std::string& mount : {std::string("/sys/fs/cgroup/memory"), std::string("/sys/fs/cgroup")}) {
    DIR* d = ::opendir((mount + parent).c_str());
    if (d == nullptr) continue;
    std::vector<std::string> stale;
    for (int i = 0; i < 100000; ++i) {
      dirent* e = ::readdir(d);
      if (e == nullptr) break;
      int pid = 0;
      if (e->d_type != DT_DIR || e->d_name[0] != 'w' || sscanf(e->d_name + 1, "%d-", &pid) != 1) continue;
      if (pid == ::getpid() || ::kill(pid, 0) == 0) continue;
      stale.push_back(e->d_name);
    }
    ::closedir(d);
    for (const auto& rel : stale) {
      if (auto c = cg.Open(rel); c.ok()) (void)(*c)->Destroy(milliseconds(2000));
    }
  }
}

}  // namespace

StatusOr<FnCallResult> FnCallPoolImpl::Call(const std::vector<std::string>& lower_dirs, const FnCallRequest& req) {
  const auto t0 = Clock::now();
  if (lower_dirs.empty()) return absl::InvalidArgumentError("fncall needs at least one layer");
  static const char* const kLangs[] = {"python", "bash", "cpp", "c"};
  if (std::find_if(std::begin(kLangs), std::end(kLangs), [&](const char* l) { return req.language == l; }) ==
      std::end(kLangs)) {
    return absl::InvalidArgumentError("fncall: unsupported language '" + req.language + "' (python, bash, cpp, c)");
  }
  for (const auto& [k, v] : req.env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos)
      return absl::InvalidArgumentError("fncall: bad env key '" + k + "'");
  }
  PoolKey key{lower_dirs};
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> w, Acquire(key));

  const uint64_t cap = std::clamp<uint64_t>(req.output_cap_bytes ? req.output_cap_bytes : 16u << 20, 1, 256u << 20);
  const uint32_t mem_mb = req.memory_mb ? req.memory_mb : opt_.default_memory_mb;
  FnCallResult res;
  auto fail = [&](const Status& s) -> StatusOr<FnCallResult> {
    Release(key, std::move(w), false);
    res.sandbox_error = "worker lost: " + s.ToString();
    res.duration = Clock::now() - t0;
    return res;
  };
  const uint64_t mem = uint64_t{mem_mb} << 20;
  if (mem != w->memory_bytes) {
    jail::CgroupLimits lim;
    lim.cpu_millis = opt_.cpu_millis;
    lim.memory_bytes = mem;
    lim.pids = opt_.pids;
    if (mem > w->memory_bytes) {
      // v1 refuses memory.limit_in_bytes above memory.memsw.limit_in_bytes:
      // raise memsw first (SetLimits writes memory, then memsw).
      for (const std::string& dir : w->cgroup->dirs()) {
        const std::string f = dir + "/memory.memsw.limit_in_bytes";
        if (::access(f.c_str(), F_OK) == 0) (void)WriteString(f, std::to_string(mem));
      }
    }
    if (Status s = w->cgroup->SetLimits(lim); !s.ok()) return fail(s);
    w->memory_bytes = mem;
  }
  auto oom_kills = [&w]() -> uint64_t {
    if (w->oom_fd.valid()) {
      if (auto v = ReadOomKills(w->oom_fd.get())) return *v;
    }
    return w->cgroup->OomKillCount();
  };
  const uint64_t oom_before = oom_kills();

  // The pre-forked call process D (cloned right after the previous call).
  if (!w->call_pidfd.valid()) {
    std::string m;
    UniqueFd pidfd;
    if (Status s = RecvMsgUntil(w->chan.get(), 256, &m, &pidfd, Clock::now() + milliseconds(20000)); !s.ok())
      return fail(s);
    auto z = ParseZygoteMsg(m);
    if (!z.ok()) return fail(z.status());
    if (z->kind != 'S' || !pidfd.valid()) return fail(absl::InternalError("worker: expected a spawned message"));
    w->call_pidfd = std::move(pidfd);
    w->call_serial = z->serial;
  }
  const bool compiled = req.language == "cpp" || req.language == "c";

  // The call's pipes: warrend keeps the read ends (the write end of stdin)
  // and hands the others to D with the call.
  Stream out, err, cout, cerr, st;
  out.cap = err.cap = cout.cap = cerr.cap = cap;
  st.cap = uint64_t{1} << 30;  // status records and fetched files (each at most cap, base64)
  UniqueFd in_r, in_w, out_w, err_w, st_w, cout_w, cerr_w;
  auto make_pipe = [](UniqueFd* r, UniqueFd* wr) -> Status {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Errno("pipe2(fncall call)");
    r->reset(p[0]);
    wr->reset(p[1]);
    return absl::OkStatus();
  };
  for (auto [r, wr] :
       {std::pair{&in_r, &in_w}, std::pair{&out.fd, &out_w}, std::pair{&err.fd, &err_w}, std::pair{&st.fd, &st_w}}) {
    if (Status s = make_pipe(r, wr); !s.ok()) return fail(s);
  }
  if (compiled) {
    if (Status s = make_pipe(&cout.fd, &cout_w); !s.ok()) return fail(s);
    if (Status s = make_pipe(&cerr.fd, &cerr_w); !s.ok()) return fail(s);
  }

  ++w->seq;
  std::string j;
  BlobBuilder blobs;
  CallHead head{kCallMagic, 0, compiled ? 6u : 4u, 0, 0};
  if (req.language == "python" && req.env.empty() && req.files.empty() && req.fetch_files.empty()) {
    head.flags |= kCallPlainPython;  // D runs it without parsing anything
    blobs.data() = req.code;
  } else {
    json env = DefaultCallEnv();
    for (const auto& [k, v] : req.env) env[k] = v;
    json files = json::array();
    for (const auto& [path, data] : req.files) {
      json ref = blobs.Add(data);
      files.push_back(json::array({path, ref[0], ref[1]}));
    }
    json hdr = {{"lang", req.language}, {"compile_timeout_ms", req.compile_timeout.count()},
                {"cap", cap},           {"env", env},
                {"files", files},       {"fetch", req.fetch_files}};
    hdr["code"] = blobs.Add(req.code);
    j = hdr.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  const std::string& blob = blobs.data();
  if (j.size() + blob.size() > (uint64_t{1} << 31)) return fail(absl::InvalidArgumentError("fncall: call too large"));
  head.json_len = static_cast<uint32_t>(j.size());
  head.blob_len = static_cast<uint32_t>(blob.size());
  std::vector<int> fds = {in_r.get(), out_w.get(), err_w.get(), st_w.get()};
  if (compiled) {
    fds.push_back(cout_w.get());
    fds.push_back(cerr_w.get());
  }
  std::string msg;
  UniqueFd memfd;
  if (j.size() + blob.size() > kInlineMax) {
    head.flags |= kCallInMemfd;
    memfd.reset(::memfd_create("warren-fncall-call", MFD_CLOEXEC));
    if (!memfd.valid()) return fail(Errno("memfd_create(warren-fncall-call)"));
    for (const std::string* part : {static_cast<const std::string*>(&j), &blob}) {
      for (size_t off = 0, i = 0; off < part->size() && i < (1u << 20); ++i) {
        ssize_t n = ::write(memfd.get(), part->data() + off, part->size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return fail(Errno("write(warren-fncall-call memfd)"));
        off += static_cast<size_t>(n);
      }
    }
    fds.push_back(memfd.get());
    msg.assign(reinterpret_cast<const char*>(&head), sizeof head);
  } else {
    msg.reserve(sizeof head + j.size() + blob.size());
    msg.assign(reinterpret_cast<const char*>(&head), sizeof head);
    msg += j;
    msg += blob;
  }
  const auto t_send = Clock::now();
  // Past this the worker stopped answering (the stage time-outs are ours).
  const auto hard = t_send + req.run_timeout + req.compile_timeout + milliseconds(30000);
  if (Status s = SendMsgUntil(w->chan.get(), msg, fds, hard); !s.ok()) return fail(s);
  for (UniqueFd* f : {&in_r, &out_w, &err_w, &st_w, &cout_w, &cerr_w, &memfd}) f->reset();

  // Feed stdin, collect output, enforce the time-outs, until D has ended
  // (the zygote's 'X') and every pipe is at EOF (D's pid namespace is gone:
  // nobody else holds the write ends).
  // Compiled languages: D enforces compile_timeout itself; the run's clock
  // starts at its first status record (the compile stage's).
  constexpr Clock::time_point kNever = Clock::time_point::max();
  Clock::time_point deadline = kNever;  // of the current stage
  if (compiled) {
    deadline = t_send + req.compile_timeout + milliseconds(5000);
  } else if (req.run_timeout.count() > 0) {
    deadline = t_send + req.run_timeout;
  }
  bool run_clock_started = !compiled;
  st.on_data = [&](std::string_view) {
    if (run_clock_started) return;
    run_clock_started = true;
    deadline = req.run_timeout.count() > 0 ? Clock::now() + req.run_timeout : kNever;
  };
  std::optional<ZygoteMsg> exited;
  Status exit_error;
  PumpOptions po;
  po.exit_fd = w->chan.get();  // readable: D ended (or its set-up failed)
  po.on_exit_readable = [&]() -> StatusOr<bool> {
    std::string m;
    exit_error = RecvMsgUntil(w->chan.get(), 256, &m, nullptr, Clock::now() + milliseconds(5000));
    if (!exit_error.ok()) return exit_error;
    auto z = ParseZygoteMsg(m);
    if (!z.ok()) return exit_error = z.status();
    if (z->kind != 'X' || z->serial != w->call_serial)
      return exit_error = absl::InternalError("worker: expected the call process's exit");
    exited = *z;
    return true;
  };
  po.stdin_fd = &in_w;
  po.stdin_data = req.stdin_data;
  po.deadline = [&] { return deadline; };
  // PID 1 of the call's pid namespace: every process of the call dies.
  po.kill = [&](int) { (void)::syscall(SYS_pidfd_send_signal, w->call_pidfd.get(), SIGKILL, nullptr, 0); };
  po.kill_grace = milliseconds(0);
  // Until every pipe is at EOF (D's pid namespace is gone: nobody else holds
  // the write ends).
  po.after_exit = PumpOptions::AfterExit::kUntilEof;
  po.linger = milliseconds(5000);
  po.cancelled = [&] { return Clock::now() >= hard; };
  po.what = "fncall call";
  StatusOr<PumpResult> pumped = PumpOutput(po, {&out, &err, &cout, &cerr, &st});
  if (!pumped.ok()) {
    if (!exit_error.ok()) return fail(exit_error);
    if (pumped.status().code() == absl::StatusCode::kCancelled)
      return fail(absl::DeadlineExceededError("fncall call process did not end"));
    if (pumped.status().code() == absl::StatusCode::kDeadlineExceeded)
      return fail(absl::InternalError("fncall: the call's pipes stayed open after it ended"));
    return fail(pumped.status());
  }
  const bool timed_out = pumped->timed_out;
  const auto run_ns = Clock::now() - t_send;
  w->call_pidfd.reset();  // the next call process announces itself with its own 'S'
  // D's wait status, from the zygote's waitid (si_code, si_status).
  int wstatus = 0;
  if (exited->a == CLD_EXITED) {
    wstatus = (exited->b & 0xff) << 8;
  } else if (exited->a == CLD_KILLED || exited->a == CLD_DUMPED) {
    wstatus = (exited->b & 0x7f) | (exited->a == CLD_DUMPED ? 0x80 : 0);
  } else {
    return fail(ErrnoToStatus(exited->b, "fncall zygote: waitid(call process)"));
  }

  // D's status records: u32 length + json each.
  std::map<std::string, json> stage;
  for (size_t off = 0; off + 4 <= st.data.size();) {
    uint32_t len;
    memcpy(&len, st.data.data() + off, sizeof len);
    if (len > st.data.size() - off - 4) break;
    json rec = json::parse(st.data.substr(off + 4, len), nullptr, false);
    off += 4 + len;
    if (!rec.is_object() || !rec.contains("stage") || !rec["stage"].is_string()) continue;
    const std::string kind = rec["stage"].get<std::string>();
    if (kind == "file") {
      const std::string path = rec.value("path", "");
      std::string data;
      if (rec.value("missing", false) || !absl::Base64Unescape(rec.value("b64", ""), &data)) {
        res.missing_files.push_back(path);
      } else {
        res.files[path] = std::move(data);
      }
    } else {
      stage[kind] = std::move(rec);
    }
  }
  auto int_of = [](const json& rec, const char* k) -> int {
    auto it = rec.find(k);
    return it != rec.end() && it->is_number_integer() ? it->get<int>() : 0;
  };
  if (stage.count("setup")) res.sandbox_error = stage["setup"].value("error", "call set-up failed");
  bool run_stage = !stage.count("setup");
  if (compiled && (stage.count("compile") || timed_out)) {
    std::optional<int> cstatus;
    bool ctimed_out = true;
    if (stage.count("compile")) {
      cstatus = int_of(stage["compile"], "status");
      ctimed_out = stage["compile"].value("timed_out", false);
    }
    res.compile = MakeOutcome(cstatus, ctimed_out, &cout, &cerr, run_ns);
    if (!cstatus || ctimed_out || *cstatus != 0) run_stage = false;
  }
  if (run_stage) {
    std::optional<int> status;
    if (stage.count("run")) {
      status = int_of(stage["run"], "status");
    } else if (req.language == "python" && !timed_out) {
      status = wstatus;  // the code ran as PID 1 itself
      // A signal emulated by the call (zygote.py, DEATH_SIGNALS): D exited
      // 128 + sig after reporting it; report it as killed by that signal.
      if (stage.count("signal")) {
        const int sig = int_of(stage["signal"], "sig");
        if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 128 + sig && sig > 0 && sig < 64) status = sig;
      }
    }
    res.run = MakeOutcome(status, timed_out, &out, &err, run_ns);
  }
  const uint64_t oom_after = oom_kills();
  if (oom_after > oom_before) {
    ExecOutcome* o = res.run ? &*res.run : (res.compile ? &*res.compile : nullptr);
    if (o) o->oom_killed = true;
  }
  // Safety net: the run stage's processes died with its pid namespace, a
  // compile stage's with its process group. After an abnormal end (or a
  // compile stage) check that only the zygote and at most one child of it
  // (the next call's pre-forked process; call processes are never the
  // zygote's children: they are D's) are left in the worker cgroup;
  // otherwise the worker is not reused.
  bool healthy = true;
  const bool abnormal = !res.sandbox_error.empty() || res.compile.has_value() ||
                        (res.run && (res.run->timed_out || res.run->oom_killed || res.run->signal != 0));
  if (abnormal && healthy) {
    healthy = false;
    for (int i = 0; i < 400 && !healthy; ++i) {  // a call process may still be exiting
      if (i > 0) ::usleep(500);
      healthy = OnlyZygoteAndOneChild(w->cgroup->Pids(true), w->pid);
    }
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.calls;
  }
  Release(key, std::move(w), healthy);
  res.duration = Clock::now() - t0;
  return res;
}

namespace {
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}
}  // namespace

StatusOr<ExecOutcome> FnCallRunner::Exec(const ExecSpec& spec) {
  if (!spec.user.empty() && spec.user != "root")
    return absl::InvalidArgumentError("fncall: calls run as root of their worker; user '" + spec.user +
                                      "' is not supported");
  if (!spec.cwd.empty() && spec.cwd != "/tmp" && spec.cwd.rfind("/tmp/", 0) != 0)
    return absl::InvalidArgumentError("fncall: cwd must be under /tmp (the scratch dir), got '" + spec.cwd + "'");
  FnCallRequest req;
  req.language = "bash";
  std::string script;
  if (!spec.cwd.empty())
    script += "mkdir -p " + ShellQuote(spec.cwd) + " && cd " + ShellQuote(spec.cwd) + " || exit 125\n";
  if (spec.shell) {
    script += *spec.shell;
  } else {
    if (spec.argv.empty()) return absl::InvalidArgumentError("fncall: exec needs argv or shell");
    script += "exec";
    for (const auto& a : spec.argv) {
      if (a.find('\0') != std::string::npos) return absl::InvalidArgumentError("fncall: NUL byte in argv");
      script += " " + ShellQuote(a);
    }
  }
  req.code = std::move(script);
  req.stdin_data = spec.stdin_data;
  req.env = spec.env;
  req.run_timeout = spec.timeout;
  req.memory_mb = memory_mb_;
  req.output_cap_bytes = spec.output_cap_bytes;
  ASSIGN_OR_RETURN(FnCallResult r, pool_->Call(lower_dirs_, req));
  if (!r.sandbox_error.empty()) return absl::InternalError("fncall: " + r.sandbox_error);
  if (!r.run) return absl::InternalError("fncall: the call produced no run outcome");
  return std::move(*r.run);
}

StatusOr<std::unique_ptr<FnCallPool>> NewFnCallPool(const FnCallOptions& options) {
  FnCallOptions o = options;
  if (o.mount_point.empty() || o.mount_point[0] != '/')
    return absl::InvalidArgumentError("fncall: mount_point must be an absolute directory");
  if (::mkdir(o.mount_point.c_str(), 0755) != 0 && errno != EEXIST) return Errno("mkdir(" + o.mount_point + ")");
  if (o.max_workers == 0) o.max_workers = 1;
  if (o.uid_count == 0) o.uid_count = 1;
  ASSIGN_OR_RETURN(auto cg, jail::CgroupManager::Detect(o.cgroup_name));
  RemoveStaleWorkerCgroups(*cg);
  std::optional<jail::SeccompProgram> sc;
  auto prog = jail::CompileSeccompProfile(o.seccomp_profile.empty() ? jail::DefaultSeccompProfile() : o.seccomp_profile,
                                          /*binary_tree=*/true);
  if (!prog.ok()) return prog.status();
  sc = std::move(*prog);
  // The zygote helper, shared read-only by every worker (sealed).
  const std::string& so = ZygoteHelperSo();
  UniqueFd helper(::memfd_create("warren-fncall-helper", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!helper.valid()) return Errno("memfd_create(warren-fncall-helper)");
  for (size_t off = 0, i = 0; off < so.size() && i < 1024; ++i) {
    ssize_t n = ::write(helper.get(), so.data() + off, so.size() - off);
    if (n <= 0) return Errno("write(warren-fncall-helper memfd)");
    off += static_cast<size_t>(n);
  }
  if (::fcntl(helper.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0)
    return Errno("fcntl(warren-fncall-helper memfd, F_ADD_SEALS)");
  // Above the fds a worker's child moves into place (3, 4): dup2 must not clobber it.
  helper.reset(::fcntl(helper.get(), F_DUPFD_CLOEXEC, 10));
  if (!helper.valid()) return Errno("fcntl(warren-fncall-helper memfd, F_DUPFD_CLOEXEC)");
  return std::unique_ptr<FnCallPool>(new FnCallPoolImpl(std::move(o), std::move(cg), std::move(sc), std::move(helper)));
}

}  // namespace warren::runtime
