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
#include <sys/mount.h>
#include <sys/prctl.h>
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

#include <nlohmann/json.hpp>

#include "jail/cgroup.h"
#include "jail/contain.h"
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
enum Step : int32_t {
  kStepRecv = 1, kStepPrivate, kStepAttachRoot, kStepChdirRoot, kStepSetId, kStepProc, kStepDev, kStepDevNode,
  kStepShm, kStepTmp, kStepPivot, kStepHostname, kStepLoopback, kStepStdio, kStepNoNewPrivs, kStepExec,
};
const char* StepName(int32_t s) {
  static const char* const kNames[] = {"?", "recvmsg(rootfs fd)", "mount(/, MS_PRIVATE)", "move_mount(rootfs)",
                                       "chdir(rootfs)", "setresuid/setresgid(0)", "mount(proc)",
                                       "mount(/dev tmpfs)", "bind(/dev node)", "mount(/dev/shm)",
                                       "mount(/tmp)", "pivot_root", "sethostname", "loopback up", "stdio",
                                       "prctl(PR_SET_NO_NEW_PRIVS)", "execve(python3)"};
  return s > 0 && s < static_cast<int32_t>(sizeof kNames / sizeof kNames[0]) ? kNames[s] : "?";
}

struct WorkerPlan {
  int sock = -1;     // child end of the setup socketpair (rootfs fd arrives here)
  int chan = -1;     // child end of the protocol socket (becomes fd 3)
  int err_fd = -1;   // CLOEXEC error pipe: EOF = exec'd
  std::string mount_point;
  std::vector<char*> argv, envp;
};

const char* const kDevNodes[] = {"null", "zero", "full", "random", "urandom"};

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
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) jail::ChildFail(e, kStepPrivate, errno);
  if (MoveMount(rootfs, "", AT_FDCWD, p.mount_point.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
    jail::ChildFail(e, kStepAttachRoot, errno);
  ::close(rootfs);
  if (::chdir(p.mount_point.c_str()) != 0) jail::ChildFail(e, kStepChdirRoot, errno);
  if (RawSetresgid(0) != 0 || RawSetresuid(0) != 0) jail::ChildFail(e, kStepSetId, errno);
  if (::mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
    jail::ChildFail(e, kStepProc, errno);
  if (::mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=755") != 0)
    jail::ChildFail(e, kStepDev, errno);
  {
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
  const char* const links[][2] = {{"/proc/self/fd", "dev/fd"},
                                  {"/proc/self/fd/0", "dev/stdin"},
                                  {"/proc/self/fd/1", "dev/stdout"},
                                  {"/proc/self/fd/2", "dev/stderr"}};
  for (const auto& l : links) (void)::symlink(l[0], l[1]);
  if (::mkdir("dev/shm", 01777) != 0) jail::ChildFail(e, kStepShm, errno);
  if (::mount("shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,nr_inodes=4096,mode=1777") != 0)
    jail::ChildFail(e, kStepShm, errno);
  // /dev itself read-only: root inside must not leave files there for later
  // calls (each call gets its own /dev/shm, /tmp and /proc).
  if (::mount(nullptr, "dev", nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC,
              "size=64k,nr_inodes=64,mode=755") != 0)
    jail::ChildFail(e, kStepDev, errno);
  if (::mount("tmpfs", "tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=64,mode=1777") != 0)
    jail::ChildFail(e, kStepTmp, errno);
  if (::syscall(SYS_pivot_root, ".", ".") != 0) jail::ChildFail(e, kStepPivot, errno);
  if (::umount2(".", MNT_DETACH) != 0) jail::ChildFail(e, kStepPivot, errno);
  if (::chdir("/") != 0) jail::ChildFail(e, kStepPivot, errno);
  if (::sethostname("fncall", 6) != 0) jail::ChildFail(e, kStepHostname, errno);
  if (int rc = jail::LoopbackUp(); rc != 0) jail::ChildFail(e, kStepLoopback, -rc);
  int nul = ::open("/dev/null", O_RDWR);
  if (nul < 0 || ::dup2(nul, 0) < 0 || ::dup2(nul, 1) < 0 || ::dup2(nul, 2) < 0) jail::ChildFail(e, kStepStdio, errno);
  if (::dup2(p.chan, 3) < 0) jail::ChildFail(e, kStepStdio, errno);  // dup2 clears CLOEXEC
  ::setsid();
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) jail::ChildFail(e, kStepNoNewPrivs, errno);
  ::syscall(SYS_close_range, 4, ~0U, CLOSE_RANGE_CLOEXEC);
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

// ------------------------------------------------------------------ framing
Status WriteAllUntil(int fd, const std::string& data, Clock::time_point deadline) {
  size_t off = 0;
  for (int i = 0; off < data.size() && i < (1 << 22); ++i) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) return Errno("send(worker)");
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return absl::DeadlineExceededError("send(worker): deadline");
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return off == data.size() ? absl::OkStatus() : absl::InternalError("send(worker): stuck");
}

Status ReadExactUntil(int fd, char* buf, size_t len, Clock::time_point deadline) {
  size_t off = 0;
  for (int i = 0; off < len && i < (1 << 22); ++i) {
    ssize_t n = ::recv(fd, buf + off, len - off, MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("worker closed its channel");
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return Errno("recv(worker)");
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return absl::DeadlineExceededError("recv(worker): deadline");
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return off == len ? absl::OkStatus() : absl::InternalError("recv(worker): stuck");
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

constexpr uint32_t kMaxFrame = 1u << 30;

StatusOr<std::pair<json, std::string>> ReadFrame(int fd, Clock::time_point deadline) {
  uint32_t lens[2];
  RETURN_IF_ERROR(ReadExactUntil(fd, reinterpret_cast<char*>(lens), sizeof lens, deadline));
  if (lens[0] > kMaxFrame || lens[1] > kMaxFrame) return absl::InternalError("worker frame too large");
  std::string j(lens[0], '\0'), blob(lens[1], '\0');
  RETURN_IF_ERROR(ReadExactUntil(fd, j.data(), j.size(), deadline));
  RETURN_IF_ERROR(ReadExactUntil(fd, blob.data(), blob.size(), deadline));
  json hdr = json::parse(j, nullptr, false);
  if (hdr.is_discarded() || !hdr.is_object()) return absl::InternalError("worker sent malformed json");
  return std::make_pair(std::move(hdr), std::move(blob));
}

StatusOr<std::string> Slice(const std::string& blob, const json& ref) {
  if (!ref.is_array() || ref.size() != 2) return absl::InternalError("worker sent a bad blob ref");
  uint64_t off = ref[0].get<uint64_t>(), len = ref[1].get<uint64_t>();
  if (off > blob.size() || len > blob.size() - off) return absl::InternalError("worker blob ref out of range");
  return blob.substr(off, len);
}

StatusOr<ExecOutcome> ParseOutcome(const json& o, const std::string& blob, uint64_t cap) {
  ExecOutcome r;
  try {
    r.exit_code = o.at("exit_code").get<int>();
    r.signal = o.at("signal").get<int>();
    r.timed_out = o.at("timed_out").get<bool>();
    r.stdout_total = o.at("stdout_total").get<uint64_t>();
    r.stderr_total = o.at("stderr_total").get<uint64_t>();
    r.duration = std::chrono::nanoseconds(o.at("duration_ns").get<int64_t>());
    ASSIGN_OR_RETURN(r.stdout_data, Slice(blob, o.at("stdout")));
    ASSIGN_OR_RETURN(r.stderr_data, Slice(blob, o.at("stderr")));
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("worker sent a bad outcome: ") + e.what());
  }
  r.stdout_truncated = r.stdout_total > r.stdout_data.size() || r.stdout_data.size() > cap;
  r.stderr_truncated = r.stderr_total > r.stderr_data.size() || r.stderr_data.size() > cap;
  return r;
}

// ------------------------------------------------------------------ worker
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
  FnCallPoolImpl(FnCallOptions o, std::unique_ptr<jail::CgroupManager> cg, std::optional<jail::SeccompProgram> sc)
      : opt_(std::move(o)), cgroups_(std::move(cg)), seccomp_(std::move(sc)) {
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
  // Whether a worker should pre-fork its next call process after this call
  // (zygote.py): yes while at most <cpus> workers are busy (this one included)
  // (latency mode: the fork leaves the next call's critical path), no when
  // the node is saturated (throughput mode: pre-forking costs CPU per call).
  bool PreforkNext() const {
    std::lock_guard<std::mutex> l(mu_);
    uint32_t idle = 0;
    for (const auto& [k, p] : pools_) idle += static_cast<uint32_t>(p.idle.size());
    return total_ - idle <= ncpus_;
  }

  const FnCallOptions opt_;
  std::unique_ptr<jail::CgroupManager> cgroups_;
  std::optional<jail::SeccompProgram> seccomp_;
  mutable std::mutex mu_;
  std::condition_variable cv_;         // a worker was released or freed (Acquire waits)
  std::condition_variable reaper_cv_;  // stop_ was set
  std::map<PoolKey, Pool> pools_;
  std::vector<bool> slots_;
  uint32_t next_slot_ = 0;
  uint32_t total_ = 0;  // workers alive or being spawned
  uint64_t worker_counter_ = 0;
  const uint32_t ncpus_ = std::max(1u, std::thread::hardware_concurrency());
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

  int sp[2], ch[2], ep[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) return Errno("socketpair(setup)");
  UniqueFd setup_parent(sp[0]), setup_child(sp[1]);
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ch) != 0) return Errno("socketpair(channel)");
  UniqueFd chan_parent(ch[0]), chan_child(ch[1]);
  if (::pipe2(ep, O_CLOEXEC) != 0) return Errno("pipe2");
  UniqueFd err_r(ep[0]), err_w(ep[1]);

  static const char* const kEnv[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/tmp",
                                     "PYTHONDONTWRITEBYTECODE=1", nullptr};
  std::string zsrc = ZygoteSource();
  std::string a0 = "python3", a1 = "-I", a2 = "-S", a3 = "-c";
  WorkerPlan plan;
  plan.sock = setup_child.get();
  plan.chan = chan_child.get();
  plan.err_fd = err_w.get();
  plan.mount_point = opt_.mount_point;
  plan.argv = {a0.data(), a1.data(), a2.data(), a3.data(), zsrc.data(), nullptr};
  for (const char* e : kEnv) plan.envp.push_back(const_cast<char*>(e));

  int pidfd_raw = -1;
  pid_t pid = Clone3(CLONE_PIDFD | CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC |
                         CLONE_NEWNET,
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
  if (int r = jail::SendFd(setup_parent.get(), root.get()); r != 0)
    return ErrnoToStatus(-r, "sendmsg(rootfs fd)");
  root.reset();
  setup_parent.reset();
  jail::ChildError ce;
  ssize_t n;
  do n = ::read(err_r.get(), &ce, sizeof ce); while (n < 0 && errno == EINTR);
  if (n == sizeof ce) return ErrnoToStatus(ce.err, std::string("fncall worker setup: ") + StepName(ce.step));
  if (n != 0) return absl::InternalError("fncall worker died during setup");

  w->chan = std::move(chan_parent);
  const auto deadline = Clock::now() + milliseconds(20000);
  std::string bpf;
  if (seccomp_) {
    bpf.assign(reinterpret_cast<const char*>(seccomp_->filter.data()),
               seccomp_->filter.size() * sizeof(sock_filter));
  }
  RETURN_IF_ERROR(
      WriteAllUntil(w->chan.get(), Frame(json{{"op", "init"}, {"scratch_mb", opt_.scratch_mb}}, bpf), deadline));
  auto ready = ReadFrame(w->chan.get(), deadline);
  if (!ready.ok() || ready->first.value("op", "") != "ready") {
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
    return absl::InvalidArgumentError("fncall: unsupported language '" + req.language +
                                      "' (python, bash, cpp, c)");
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
  const uint64_t oom_before = w->cgroup->OomKillCount();

  BlobBuilder blobs;
  json env = json::object();
  env["PATH"] = "/usr/local/bin:/usr/bin:/bin";
  env["HOME"] = "/tmp";
  env["LANG"] = "C.UTF-8";
  env["TMPDIR"] = "/tmp";
  for (const auto& [k, v] : req.env) env[k] = v;
  json files = json::array();
  for (const auto& [path, data] : req.files) {
    json ref = blobs.Add(data);
    files.push_back(json::array({path, ref[0], ref[1]}));
  }
  json hdr = {{"op", "call"},
              {"seq", ++w->seq},
              {"lang", req.language},
              {"timeout_ms", req.run_timeout.count()},
              {"compile_timeout_ms", req.compile_timeout.count()},
              {"cap", cap},
              {"prefork", PreforkNext()},
              {"env", env},
              {"files", files},
              {"fetch", req.fetch_files}};
  hdr["code"] = blobs.Add(req.code);
  hdr["stdin"] = blobs.Add(req.stdin_data);
  // The zygote enforces the stage time-outs; this deadline only catches a
  // worker that stopped answering.
  const auto deadline = Clock::now() + req.run_timeout + req.compile_timeout + milliseconds(30000);
  if (Status s = WriteAllUntil(w->chan.get(), Frame(hdr, blobs.data()), deadline); !s.ok()) return fail(s);
  auto frame = ReadFrame(w->chan.get(), deadline);
  if (!frame.ok()) return fail(frame.status());
  const json& r = frame->first;
  const std::string& blob = frame->second;
  if (r.value("seq", uint64_t{0}) != w->seq) return fail(absl::InternalError("worker answered out of sequence"));
  res.sandbox_error = r.value("error", "");
  try {
    if (r.contains("compile") && r["compile"].is_object()) {
      auto o = ParseOutcome(r["compile"], blob, cap);
      if (!o.ok()) return fail(o.status());
      res.compile = std::move(*o);
    }
    if (r.contains("run") && r["run"].is_object()) {
      auto o = ParseOutcome(r["run"], blob, cap);
      if (!o.ok()) return fail(o.status());
      res.run = std::move(*o);
    }
    for (const auto& f : r.value("files", json::array())) {
      auto data = Slice(blob, json::array({f.at(1), f.at(2)}));
      if (!data.ok()) return fail(data.status());
      res.files[f.at(0).get<std::string>()] = std::move(*data);
    }
    for (const auto& m : r.value("missing", json::array())) res.missing_files.push_back(m.get<std::string>());
  } catch (const std::exception& e) {
    return fail(absl::InternalError(std::string("worker sent a bad response: ") + e.what()));
  }
  const uint64_t oom_after = w->cgroup->OomKillCount();
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
  bool healthy = !r.value("fatal", false);
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
  if (!spec.cwd.empty()) script += "mkdir -p " + ShellQuote(spec.cwd) + " && cd " + ShellQuote(spec.cwd) + " || exit 125\n";
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
  auto prog = jail::CompileSeccompProfile(
      o.seccomp_profile.empty() ? jail::DefaultSeccompProfile() : o.seccomp_profile, /*binary_tree=*/true);
  if (!prog.ok()) return prog.status();
  sc = std::move(*prog);
  return std::unique_ptr<FnCallPool>(new FnCallPoolImpl(std::move(o), std::move(cg), std::move(sc)));
}

}  // namespace warren::runtime
