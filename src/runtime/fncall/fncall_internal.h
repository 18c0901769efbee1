// Internal to the fncall backend: what its pieces (worker_jail.cc,
// channel.cc, pool.cc, call.cc) share. Not part of the backend's API
// (fncall.h). See fncall.h for the contract and zygote.py for the worker
// side.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "jail/cgroup.h"
#include "jail/plan.h"
#include "jail/seccomp.h"
#include "runtime/fncall/fncall.h"

namespace warren::runtime::fncall::internal {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

inline Status Errno(const std::string& what) { return ErrnoToStatus(errno, what); }

inline Status WriteString(const std::string& path, const std::string& v) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return Errno("open(" + path + ")");
  if (::write(fd.get(), v.data(), v.size()) != static_cast<ssize_t>(v.size()))
    return Errno("write(" + path + ", " + v + ")");
  return absl::OkStatus();
}

// ------------------------------------------------------------------ jail child
// (worker_jail.cc)
// Steps of the worker child outside the containment plan (plan.h names its own).
enum Step : int32_t { kStepRecv = 1, kStepLoopback, kStepStdio, kStepCgroupNs, kStepExec };
// Steps from kJailStep0 on are the containment plan's (plan.h), offset.
constexpr int32_t kJailStep0 = 1000;
const char* StepName(int32_t s);

struct WorkerPlan {
  int sock = -1;                         // child end of the setup socketpair (rootfs fd arrives here)
  int chan = -1;                         // child end of the protocol socket (becomes fd 3)
  int err_fd = -1;                       // CLOEXEC error pipe: EOF = exec'd
  int helper = -1;                       // memfd holding zygote_helper.so (becomes fd 4)
  const WarrenJailPlan* jail = nullptr;  // root, mounts, no_new_privs (WorkerJailPlan)
  std::vector<char*> argv, envp;
};

// The worker's (the zygote's) containment (the read-only root, its /proc,
// /dev, /tmp and /sys, pivot_root); see worker_jail.cc.
StatusOr<WarrenJailPlan> WorkerJailPlan(const std::string& mount_point, const std::vector<std::string>& cgroup_dirs,
                                        const std::string& lxcfs);
// A call process's containment (zygote_helper.c applies it); see worker_jail.cc.
StatusOr<WarrenJailPlan> CallJailPlan(uint32_t scratch_mb, const jail::SeccompProgram* seccomp, bool lxcfs);
// The call plan's fd slot of the empty read-only tmpfs behind its masked
// dirs (zygote_helper.c makes it; without it each call makes its own).
inline constexpr int kCallMaskSlot = 0;
// Async-signal-safe: runs between clone3 and execve of the zygote.
[[noreturn]] void WorkerChild(const WorkerPlan& p);
// Builds the detached, read-only root: the single layer mount cloned, or an
// overlay of several layers without upper (read-only by construction).
StatusOr<UniqueFd> BuildRoot(const std::vector<std::string>& lower_dirs);
// A call's environment before its own variables (the zygote's own, too:
// a call that sets none changes nothing).
json DefaultCallEnv();

// ------------------------------------------------------------------ framing
// (channel.cc)
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

// Sends one message with `fds` attached (SCM_RIGHTS), waiting for room until
// `deadline`.
Status SendMsgUntil(int sock, const std::string& data, const std::vector<int>& fds, Clock::time_point deadline);
// Receives one message (at most `max` bytes) and at most one fd with it
// (O_CLOEXEC; extra fds are closed), waiting until `deadline`.
Status RecvMsgUntil(int sock, size_t max, std::string* data, UniqueFd* fd, Clock::time_point deadline);
StatusOr<ZygoteMsg> ParseZygoteMsg(const std::string& data);
std::string Frame(const json& hdr, const std::string& blob);
// The zygote's "ready" answer to the init message (one json frame).
StatusOr<json> ReadJsonFrame(int fd, Clock::time_point deadline);

// ------------------------------------------------------------------ worker
// (pool.cc)
// The "oom_kill N" count of a memory.oom_control / memory.events file kept
// open (a pread per call instead of two path walks through the cgroup fs).
std::optional<uint64_t> ReadOomKills(int fd);
// True if `pids` (a worker cgroup's) are the zygote plus at most one process
// whose parent is the zygote (its pre-forked, waiting call process).
bool OnlyZygoteAndOneChild(const std::vector<pid_t>& pids, pid_t zygote);

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

}  // namespace warren::runtime::fncall::internal
