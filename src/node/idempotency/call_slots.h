// Request ids of calls on a sandbox (exec, file writes): the first call with
// (sandbox id, request id) runs, later ones get its recorded result (a
// concurrent duplicate waits for the first). At most `max_per_sandbox` per
// sandbox (oldest dropped), in memory only (lost on daemon restart). Calls
// that fail with an error are not recorded (duplicates waiting on them get
// the same error). Thread-safe; one lock of its own, never held while `run`
// runs.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "node/sandbox_types.h"

namespace warren::node {

class CallSlots {
 public:
  explicit CallSlots(size_t max_per_sandbox) : max_per_sandbox_(max_per_sandbox) {}

  // An empty request_id runs `run` unconditionally.
  StatusOr<RecordedCall> Run(const std::string& id, const std::string& request_id,
                             const std::function<StatusOr<RecordedCall>()>& run);
  // Forgets every request id of a destroyed sandbox.
  void Drop(const std::string& id);

 private:
  struct Slot {
    bool done = false;
    Status status;
    RecordedCall result;
  };
  const size_t max_per_sandbox_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::map<std::string, std::shared_ptr<Slot>>> calls_;  // id -> request id -> slot
  std::map<std::string, std::vector<std::string>> order_;                      // id -> request ids, oldest first
};

}  // namespace warren::node
