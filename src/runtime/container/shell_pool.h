// Shells: a sandbox's first process made ahead of its sandbox (namespaces,
// id maps, cgroup), and the warm pool that keeps some ready so that a create
// skips the fork and the cgroup attach.
#pragma once

#include <poll.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "jail/cgroup.h"
#include "runtime/container/init.h"
#include "runtime/container/state.h"

namespace warren::runtime::container {

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
  std::unique_ptr<WarrenJailPlan> init_plan;  // sent at Start; names a failing step
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
                                            const jail::CgroupLimits& limits);

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
        // Out of slots, pids, ...: back off (bounded), creates spawn inline
        // meanwhile. Said once per streak of failures.
        if (failures == 0)
          Log(spdlog::level::warn, "warm shell pool: spawn failed", {{"error", sh.status().ToString()}});
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
  uint64_t seq_ = 0;              // refill thread only
  std::thread thread_;
};

// Removes the empty shell cgroups ("shell-<pid>-<n>") of daemons that are
// gone (a killed daemon's shells die, their cgroups stay). A cgroup still
// holding a process (a sandbox adopted under a v2 shell name) is left alone:
// rmdir refuses it.
void SweepStaleShellCgroups(BackendState& st);

}  // namespace warren::runtime::container
