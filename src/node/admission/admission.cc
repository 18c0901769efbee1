#include "node/admission/admission.h"

#include <algorithm>
#include <string>

namespace warren::node {

Admission::Admission(const NodeLimits& limits, std::function<size_t()> table_size)
    : limits_(limits),
      max_queue_(limits.max_create_queue == 0 ? 1024 : limits.max_create_queue),
      table_size_(std::move(table_size)) {}

Status Admission::TableFull(size_t n) const {
  return absl::ResourceExhaustedError("node full: " + std::to_string(n) + " sandboxes (max " +
                                      std::to_string(limits_.max_sandboxes) + "), retry later or on another node");
}

Status Admission::Admit(const CreateRequest& request) {
  std::unique_lock<std::mutex> l(mu_);
  if (size_t n = table_size_(); n >= limits_.max_sandboxes) return TableFull(n);
  if (in_flight_ < limits_.max_creates_in_flight && queue_.empty()) {
    ++in_flight_;
    return absl::OkStatus();
  }
  if (queue_.size() >= max_queue_) {
    return absl::ResourceExhaustedError(
        "node busy: " + std::to_string(in_flight_) + " creates in flight (--max-creates-in-flight=" +
        std::to_string(limits_.max_creates_in_flight) + ") and the create queue is full (" +
        std::to_string(queue_.size()) + " waiting, --max-create-queue=" + std::to_string(max_queue_) + "), retry");
  }
  Waiter me;
  const auto pos = queue_.insert(queue_.end(), &me);
  const auto start = std::chrono::steady_clock::now();
  const auto until = std::min(request.deadline, start + kMaxCreateQueueWait);
  Status result;
  for (;;) {
    if (queue_.front() == &me && in_flight_ < limits_.max_creates_in_flight) break;
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) {
      result = absl::DeadlineExceededError(
          "create waited " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count()) +
          " ms in the create queue (" + std::to_string(in_flight_) + " creates in flight, max " +
          std::to_string(limits_.max_creates_in_flight) + ") and reached its deadline");
      break;
    }
    // Woken when this waiter reaches the head with a slot free; the 100 ms
    // slice serves the deadline and `cancelled` only. `cancelled` is asked
    // once per slice, never per wake-up: gRPC's IsCancelled polls the
    // completion queue (a timed wait), costly when dozens are queued.
    if (me.cv.wait_until(l, std::min(until, now + std::chrono::milliseconds(100))) == std::cv_status::timeout &&
        request.cancelled) {
      l.unlock();
      const bool gone = request.cancelled();
      l.lock();
      if (gone) {
        result = absl::CancelledError("create cancelled by the client while queued");
        break;
      }
    }
  }
  queue_.erase(pos);
  if (result.ok()) {
    if (size_t n = table_size_(); n >= limits_.max_sandboxes) {
      result = TableFull(n);
    } else {
      ++in_flight_;
    }
  }
  // The next waiter may now be at the head (or may take the slot this one
  // left when it gave up).
  if (!queue_.empty() && in_flight_ < limits_.max_creates_in_flight) queue_.front()->cv.notify_one();
  return result;
}

void Admission::Release() {
  std::lock_guard<std::mutex> l(mu_);
  --in_flight_;
  if (!queue_.empty()) queue_.front()->cv.notify_one();
}

uint32_t Admission::in_flight() const {
  std::lock_guard<std::mutex> l(mu_);
  return in_flight_;
}

uint32_t Admission::queued() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<uint32_t>(queue_.size());
}

}  // namespace warren::node
