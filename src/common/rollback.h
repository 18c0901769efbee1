// Rollback guard for multi-step operations (gVisor cleanup.Make): each step
// registers its undo; on scope exit without Commit() the undos run in reverse
// order. Not thread-safe.
#pragma once

#include <functional>
#include <utility>
#include <vector>

namespace warren {

class Rollback {
 public:
  Rollback() = default;
  Rollback(const Rollback&) = delete;
  Rollback& operator=(const Rollback&) = delete;
  ~Rollback() {
    if (committed_) return;
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) (*it)();
  }
  void Add(std::function<void()> undo) { undo_.push_back(std::move(undo)); }
  // Every step stands: no undo runs.
  void Commit() { committed_ = true; }

 private:
  std::vector<std::function<void()>> undo_;
  bool committed_ = false;
};

}  // namespace warren
