// Create idempotency keys (CreateRequest::request_id): a create retried with
// the same key returns the sandbox the first one made while it exists (a
// concurrent duplicate waits for the first, until its own deadline); a failed
// create is not recorded (a retry runs again); an abandoned key is refused
// (Cancelled). The last kMaxKeys keys are kept, in memory only (plus the keys
// of adopted sandboxes, re-learned from their records at start).
// Thread-safe; one lock of its own, never held while calling out.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "node/sandbox_types.h"

namespace warren::node {

class CreateKeys {
 public:
  static constexpr size_t kMaxKeys = 4096;

  // What the keys call back into (the table).
  struct Ops {
    std::function<StatusOr<SandboxInfo>(const CreateRequest&)> create;
    std::function<StatusOr<SandboxInfo>(const std::string& id)> get;
    std::function<Status(const std::string& id, const std::string& reason)> destroy;
  };
  explicit CreateKeys(Ops ops) : ops_(std::move(ops)) {}

  // Creates through ops.create, at most once per request.request_id.
  StatusOr<SandboxInfo> Create(const CreateRequest& request);
  // The client of the create with `key` gave up: its sandbox is destroyed now
  // if it was made, or by the create itself when it finishes (which then
  // returns Cancelled); the key is refused from now on. OK when nothing was
  // made (a tombstone is kept for a create still on its way).
  Status Abandon(const std::string& key);
  // A sandbox made by a create with `key` (adopted after a restart: a create
  // whose reply the crash may have lost can still be retried or abandoned).
  void RememberDone(const std::string& key, const std::string& sandbox_id);

 private:
  struct Key {
    bool done = false;       // the create finished (made `sandbox_id`, or failed and was forgotten)
    bool abandoned = false;  // its client gave up: destroy what it makes, refuse the key
    std::string sandbox_id;
    std::string main_process;  // SandboxInfo::main_process of the create's reply
  };
  void RememberLocked(const std::string& key, std::shared_ptr<Key> k);

  const Ops ops_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<Key>> keys_;  // guarded by mu_
  std::deque<std::string> order_;                     // guarded by mu_, oldest first
};

}  // namespace warren::node
