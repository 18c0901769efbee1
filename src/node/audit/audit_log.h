// Audit log of each sandbox: one JSON object per line per exec / file call /
// process event, in <dir>/<id>.jsonl (outside every sandbox), removed with
// the sandbox. Thread-safe; one lock of its own, held across the liveness
// check and the write so that a log removed by Remove is never resurrected.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace warren::node {

class AuditLog {
 public:
  // `alive(id)`: whether the sandbox is still in the table (asked under this
  // log's lock; must not call back in).
  AuditLog(std::string dir, std::function<bool(const std::string&)> alive)
      : dir_(std::move(dir)), alive_(std::move(alive)) {}

  // Appends one record; dropped for an unknown or destroyed sandbox. A failed
  // write is logged.
  void Append(const std::string& id, const nlohmann::json& entry) const;
  // Every record, oldest first (at most 64 MiB read).
  std::vector<nlohmann::json> Read(const std::string& id) const;
  // Removes the log (the sandbox was destroyed or cleaned up).
  void Remove(const std::string& id) const;

 private:
  std::string Path(const std::string& id) const { return dir_ + "/" + id + ".jsonl"; }
  const std::string dir_;
  const std::function<bool(const std::string&)> alive_;
  mutable std::mutex mu_;
};

}  // namespace warren::node
