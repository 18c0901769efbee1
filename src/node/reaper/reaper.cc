#include "node/reaper/reaper.h"

#include "common/log.h"

namespace warren::node {

Reaper::Reaper(SandboxTable& table, Jobs& jobs, LayerProvider& layers, std::chrono::milliseconds reap_interval,
               std::chrono::milliseconds sweep_interval)
    : table_(table), jobs_(jobs), layers_(layers), reap_interval_(reap_interval), sweep_interval_(sweep_interval) {}

Reaper::~Reaper() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (sweep_thread_.joinable()) sweep_thread_.join();
  if (reap_thread_.joinable()) reap_thread_.join();
}

void Reaper::Start() {
  if (sweep_interval_.count() > 0) sweep_thread_ = std::thread([this] { Loop(sweep_interval_, &Reaper::Sweep); });
  if (reap_interval_.count() > 0) reap_thread_ = std::thread([this] { Loop(reap_interval_, &Reaper::Reap); });
}

void Reaper::Loop(std::chrono::milliseconds interval, void (Reaper::*pass)()) {
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    cv_.wait_for(l, interval, [this] { return stopping_; });
    if (stopping_) break;
    l.unlock();
    (this->*pass)();
    l.lock();
  }
}

std::vector<std::string> Reaper::ReapOnce() {
  jobs_.Reap();
  std::vector<std::string> done;
  for (const auto& [id, reason] : table_.Expired(WallNowNs())) {
    Status s = table_.Destroy(id, reason);
    if (s.ok()) {
      done.push_back(id);
    } else if (s.code() != absl::StatusCode::kNotFound) {
      Log(spdlog::level::warn, "reaping failed", {{"sandbox", id}, {"reason", reason}, {"error", s.ToString()}});
    }
  }
  return done;
}

}  // namespace warren::node
