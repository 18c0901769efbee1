// Helpers of the snapshot room (internal).
#pragma once

#include <cstdint>

#include "runtime/backend.h"

namespace warren::node {

// Pauses a running sandbox for a consistent read of its changes; resumes on
// destruction unless it was already paused (by the node or a snapshot). A
// backend that cannot pause exports unfrozen.
class FreezeGuard {
 public:
  FreezeGuard(runtime::Sandbox* sb, bool want) : sb_(runtime::As<runtime::Pausable>(*sb)) {
    if (want && sb_ != nullptr) frozen_ = sb_->Pause().ok();
  }
  FreezeGuard(const FreezeGuard&) = delete;
  FreezeGuard& operator=(const FreezeGuard&) = delete;
  ~FreezeGuard() { Release(); }
  void Release() {
    if (frozen_) (void)sb_->Resume();
    frozen_ = false;
  }

 private:
  runtime::Pausable* sb_;
  bool frozen_ = false;
};

// What a snapshot or grade may copy from a sandbox: its disk limit (the
// size of its upper) plus a quarter for metadata and chunk indexes.
inline uint64_t CopyLimitBytes(const runtime::Resources& r) {
  const uint64_t disk = uint64_t{r.disk_mb} << 20;
  return disk + disk / 4;
}

}  // namespace warren::node
