// Memory of recently destroyed sandbox ids (bounded, oldest forgotten first)
// with why and when, so that a call on a sandbox the node destroyed (TTL,
// idle timeout, lease, job) says so instead of looking like a mistyped id.
// In memory only: a restarted daemon answers a plain NotFound. Thread-safe.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace warren::node {

class GoneMemory {
 public:
  static constexpr size_t kRemembered = 4096;
  void Remember(const std::string& id, const std::string& reason);
  // NotFound for `id`, naming when and why it was destroyed if remembered.
  Status NotFound(const std::string& id) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> gone_;  // id -> "destroyed at <UTC> (<reason>)"
  std::vector<std::string> order_;           // ring of kRemembered ids
  size_t next_ = 0;
};

}  // namespace warren::node
