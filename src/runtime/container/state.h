// What the container backend's rooms share: the backend's state (options,
// cgroups, seccomp, uid slots, shared mounts, recycled cgroups) and small
// helpers. Private to runtime/container/.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/unique_fd.h"
#include "jail/cgroup.h"
#include "jail/seccomp.h"
#include "jail/syscalls.h"
#include "runtime/backend.h"
#include "runtime/container/container_backend.h"
#include "runtime/container/spawn.h"
#include "runtime/container/uid_slots.h"

namespace warren::runtime::container {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kBackendName = "container";

using jail::PidfdOpen;
using jail::PidfdSignal;

inline Status Errno(const std::string& what) { return ErrnoToStatus(errno, what); }

// The cgroup limits of a sandbox spec (Create's, and what a recycled cgroup holds).
jail::CgroupLimits LimitsOf(const SandboxSpec& spec);

struct BackendState {
  ContainerOptions options;
  std::unique_ptr<jail::CgroupManager> cgroups;
  jail::SeccompProgram seccomp;
  bool have_seccomp = false;
  UniqueFd init_exe;       // O_PATH of warren-init
  std::string spawn_path;  // warren-spawn (spawn.h)
  SpawnReaper reaper;      // spawns given up on
  int last_cap = 40;
  // Density (see MakeSharedMounts): detached, read-only mounts every sandbox
  // gets a clone of; invalid = each sandbox mounts its own (as before).
  UniqueFd sysfs_mnt, mask_mnt;
  // The cgroup view is built here per sandbox (jail/cgroup_view.h) until the
  // kernel refuses (before Linux 6.15): then each sandbox builds its own.
  std::atomic<bool> detached_cgroup_view{true};
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

}  // namespace warren::runtime::container
