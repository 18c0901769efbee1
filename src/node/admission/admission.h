// Admission of creates: at most max_creates_in_flight creates run at once;
// later ones wait in a bounded FIFO queue (served strictly in order, each
// until its deadline, bounded by kMaxCreateQueueWait, or until its client
// cancels); refused at once (ResourceExhausted, retryable) only when the queue
// or the table is full. Thread-safe; one lock of its own (never held while
// calling out, except `table_size`, which must not call back in).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>

#include "common/status.h"
#include "node/sandbox_types.h"

namespace warren::node {

class Admission {
 public:
  // Longest a create waits in the queue when its request has no (earlier)
  // deadline.
  static constexpr auto kMaxCreateQueueWait = std::chrono::minutes(5);

  // `table_size`: sandboxes in the table now (checked against max_sandboxes).
  Admission(const NodeLimits& limits, std::function<size_t()> table_size);

  // Takes a create slot (release it with Release()), or says why not.
  Status Admit(const CreateRequest& request);
  void Release();

  uint32_t in_flight() const;
  uint32_t queued() const;

 private:
  Status TableFull(size_t n) const;

  const NodeLimits limits_;
  const uint32_t max_queue_;
  const std::function<size_t()> table_size_;
  mutable std::mutex mu_;
  uint32_t in_flight_ = 0;  // guarded by mu_
  // Each queued create waits on its own condition variable; only the head is
  // woken when a slot frees (no herd of timed waits).
  struct Waiter {
    std::condition_variable cv;
  };
  std::list<Waiter*> queue_;  // guarded by mu_
};

}  // namespace warren::node
