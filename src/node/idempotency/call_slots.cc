#include "node/idempotency/call_slots.h"

#include <chrono>

namespace warren::node {

StatusOr<RecordedCall> CallSlots::Run(const std::string& id, const std::string& request_id,
                                      const std::function<StatusOr<RecordedCall>()>& run) {
  if (request_id.empty()) return run();
  if (request_id.size() > 256 || HasControl(request_id)) {
    return absl::InvalidArgumentError("request_id=" + Quote(request_id) +
                                      " must be at most 256 bytes without control characters");
  }
  std::shared_ptr<Slot> slot;
  {
    std::unique_lock<std::mutex> l(mu_);
    auto& m = calls_[id];
    auto it = m.find(request_id);
    if (it != m.end()) {
      slot = it->second;
      // A duplicate of a call in progress waits for it (bounded: a day).
      if (!cv_.wait_for(l, std::chrono::hours(24), [&] { return slot->done; })) {
        return absl::UnavailableError("request " + request_id + " is still running; retry");
      }
      if (!slot->status.ok()) return slot->status;
      return slot->result;
    }
    slot = std::make_shared<Slot>();
    m[request_id] = slot;
    order_[id].push_back(request_id);
  }
  StatusOr<RecordedCall> r = run();
  {
    std::lock_guard<std::mutex> l(mu_);
    slot->done = true;
    auto cit = calls_.find(id);
    if (r.ok()) {
      slot->result = *r;
    } else {
      slot->status = r.status();
      // Not recorded: a later retry runs again.
      if (cit != calls_.end()) {
        auto sit = cit->second.find(request_id);
        if (sit != cit->second.end() && sit->second == slot) cit->second.erase(sit);
      }
    }
    auto oit = order_.find(id);
    if (cit != calls_.end() && oit != order_.end()) {
      std::vector<std::string>& order = oit->second;
      size_t drop = 0;
      while (order.size() - drop > max_per_sandbox_) {
        auto sit = cit->second.find(order[drop]);
        if (sit != cit->second.end() && !sit->second->done) break;  // oldest still running
        if (sit != cit->second.end()) cit->second.erase(sit);
        ++drop;
      }
      order.erase(order.begin(), order.begin() + static_cast<long>(drop));
      if (cit->second.empty()) {
        calls_.erase(cit);
        order_.erase(oit);
      }
    }
  }
  cv_.notify_all();
  return r;
}

void CallSlots::Drop(const std::string& id) {
  {
    std::lock_guard<std::mutex> l(mu_);
    calls_.erase(id);
    order_.erase(id);
  }
  cv_.notify_all();
}

}  // namespace warren::node
