// Host uid/gid ranges of container sandboxes: slot k is [base + k*range,
// base + (k+1)*range), root inside being its first id.
//
// A slot is claimed host-wide, not only in this daemon: two daemons on one
// host (each with its own state dir) never hand out overlapping ranges, or
// the sandboxes of one could signal, and share files and IPC ids with, the
// other's. The claim of slot k is the file <lock_dir>/<first host uid>:
//   * flock(LOCK_EX) held by the daemon while the slot is in use: a live
//     daemon's claim is seen by every other (the kernel drops the lock when
//     the daemon dies, however it dies);
//   * its content names the owner (the daemon's state dir), so the claim
//     survives the daemon: sandboxes outlive their daemon, and a slot whose
//     file names another owner is skipped even while unlocked, until that
//     owner re-takes it (a restart re-adopting its sandboxes) or the owner's
//     state dir no longer exists (then nothing can re-adopt them);
//   * Release empties it (the file stays: unlinking a lock file races with
//     a concurrent open of the old inode).
// With an empty lock_dir slots are only coordinated within this process.
//
// Thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::runtime {

class UidSlots {
 public:
  // Creates lock_dir (0700) if needed. `owner`: a path naming this daemon
  // across restarts (its state dir); must be absolute when lock_dir is set.
  static StatusOr<std::unique_ptr<UidSlots>> Open(std::string lock_dir, std::string owner, uint32_t count,
                                                  uint32_t uid_base, uint32_t uid_range);

  // The lowest free slot. ResourceExhausted when all `count` are taken
  // (here or by other daemons).
  StatusOr<uint32_t> Take();
  // Re-takes slot k (a re-adopted sandbox's): false when this process holds
  // it already, or another daemon (live, or dead but still existing) does.
  bool TakeSpecific(uint32_t k);
  // Gives slot k back (no-op for a slot not held).
  void Release(uint32_t k);
  uid_t HostUid(uint32_t k) const { return uid_base_ + k * uid_range_; }

 private:
  UidSlots(std::string lock_dir, std::string owner, uint32_t count, uint32_t uid_base, uint32_t uid_range)
      : lock_dir_(std::move(lock_dir)),
        owner_(std::move(owner)),
        count_(count),
        uid_base_(uid_base),
        uid_range_(uid_range) {}
  // The host-wide claim of slot k: the locked lock file, or invalid when
  // another daemon holds the slot. mu_ held.
  UniqueFd Claim(uint32_t k);

  const std::string lock_dir_;
  const std::string owner_;
  const uint32_t count_;
  const uint32_t uid_base_;
  const uint32_t uid_range_;
  std::mutex mu_;
  std::set<uint32_t> held_;             // taken by this process
  std::map<uint32_t, UniqueFd> locks_;  // their claims (lock_dir_ set)
  // Slots another daemon held when last tried, skipped by Take until then
  // (each retry costs an open and a flock).
  std::map<uint32_t, std::chrono::steady_clock::time_point> foreign_;
};

}  // namespace warren::runtime
