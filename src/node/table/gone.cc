#include "node/table/gone.h"

#include <ctime>

#include "node/sandbox_types.h"

namespace warren::node {

void GoneMemory::Remember(const std::string& id, const std::string& reason) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::lock_guard<std::mutex> l(mu_);
  if (order_.size() < kRemembered) {
    order_.push_back(id);
  } else {
    gone_.erase(order_[next_]);
    order_[next_] = id;
    next_ = (next_ + 1) % kRemembered;
  }
  gone_[id] = std::string("destroyed at ") + when + " (" + reason + ")";
}

Status GoneMemory::NotFound(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = gone_.find(id);
  if (it == gone_.end()) return absl::NotFoundError("sandbox " + Quote(id) + " not found");
  return absl::NotFoundError("sandbox " + Quote(id) + " not found: " + it->second);
}

}  // namespace warren::node
