#include "node/idempotency/create_keys.h"

#include <algorithm>

#include "common/log.h"
#include "node/admission/admission.h"

namespace warren::node {

void CreateKeys::RememberLocked(const std::string& key, std::shared_ptr<Key> k) {
  if (keys_.emplace(key, std::move(k)).second) order_.push_back(key);
  // Oldest first; a key whose create still runs is kept (and with it the
  // ones after it: the bound is exceeded only while that many creates run).
  while (order_.size() > kMaxKeys) {
    auto it = keys_.find(order_.front());
    if (it != keys_.end() && !it->second->done) break;
    if (it != keys_.end()) keys_.erase(it);
    order_.pop_front();
  }
}

void CreateKeys::RememberDone(const std::string& key, const std::string& sandbox_id) {
  auto k = std::make_shared<Key>();
  k->done = true;
  k->sandbox_id = sandbox_id;
  std::lock_guard<std::mutex> l(mu_);
  RememberLocked(key, std::move(k));
}

StatusOr<SandboxInfo> CreateKeys::Create(const CreateRequest& request) {
  const std::string& key = request.request_id;
  if (key.empty()) return ops_.create(request);
  if (key.size() > 256 || HasControl(key)) {
    return absl::InvalidArgumentError("request_id=" + Quote(key) +
                                      " must be at most 256 bytes without control characters");
  }
  std::shared_ptr<Key> mine;
  {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      auto it = keys_.find(key);
      if (it == keys_.end()) break;
      std::shared_ptr<Key> k = it->second;
      if (k->abandoned) return absl::CancelledError("create request " + Quote(key) + " was abandoned by its client");
      if (k->done) {
        StatusOr<SandboxInfo> info = ops_.get(k->sandbox_id);
        // The retry of a create that made it; destroyed (or being destroyed,
        // e.g. because that first call's client gave up) since: the key
        // makes a new one.
        if (info.ok() && info->state != SandboxState::kDestroying) {
          info->main_process = k->main_process;  // started once, by the first call
          return info;
        }
        keys_.erase(it);
        break;
      }
      // A duplicate of a create in progress waits for it, until its own
      // deadline (bounded by the create queue's bound).
      const auto until = std::min(request.deadline, std::chrono::steady_clock::now() + Admission::kMaxCreateQueueWait);
      if (!cv_.wait_until(l, until, [&] { return k->done || k->abandoned; })) {
        return absl::DeadlineExceededError("create request " + Quote(key) +
                                           " is still being made by an earlier call; reached this call's deadline");
      }
    }
    mine = std::make_shared<Key>();
    RememberLocked(key, mine);
  }
  StatusOr<SandboxInfo> info = ops_.create(request);
  bool abandoned;
  {
    std::lock_guard<std::mutex> l(mu_);
    abandoned = mine->abandoned;
    mine->done = true;
    if (info.ok()) {
      mine->sandbox_id = info->id;
      mine->main_process = info->main_process;
    } else if (!abandoned) {
      // Not recorded: a retry runs again.
      auto it = keys_.find(key);
      if (it != keys_.end() && it->second == mine) keys_.erase(it);
    }
  }
  cv_.notify_all();
  if (abandoned && info.ok()) {
    Status ds = ops_.destroy(info->id, "destroy requested");
    Log(spdlog::level::info, "create abandoned by its client; sandbox destroyed",
        {{"sandbox", info->id}, {"request_id", key}, {"destroy", ds.ToString()}});
    return absl::CancelledError("create request " + Quote(key) + " was abandoned by its client");
  }
  return info;
}

Status CreateKeys::Abandon(const std::string& key) {
  if (key.empty() || key.size() > 256 || HasControl(key)) {
    return absl::InvalidArgumentError("create_request_id=" + Quote(key) +
                                      " must be 1-256 bytes without control characters");
  }
  std::string made;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = keys_.find(key);
    if (it == keys_.end()) {
      // Nothing made (yet): a tombstone, for a create still on its way.
      auto k = std::make_shared<Key>();
      k->done = true;
      k->abandoned = true;
      RememberLocked(key, std::move(k));
      return absl::OkStatus();
    }
    std::shared_ptr<Key> k = it->second;
    if (k->abandoned) return absl::OkStatus();
    k->abandoned = true;
    if (!k->done) return absl::OkStatus();  // the create destroys it when it finishes
    made = k->sandbox_id;
  }
  cv_.notify_all();
  if (made.empty()) return absl::OkStatus();
  Status ds = ops_.destroy(made, "create abandoned by its client");
  if (ds.code() == absl::StatusCode::kNotFound) return absl::OkStatus();
  return ds;
}

}  // namespace warren::node
