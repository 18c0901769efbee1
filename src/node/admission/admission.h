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
#include <string>

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

// The cpu millis (memory MiB) a QoS class may hold on this node: capacity x
// limits.overcommit[class]; -1 when the class is not counted (ratio 0).
int64_t ClassCpuBound(const NodeLimits& limits, runtime::Qos qos);
int64_t ClassMemoryBound(const NodeLimits& limits, runtime::Qos qos);

// Over-commit admission of one create (`request` normalized: resources
// filled in) against what its class holds now (`used`, the table's entries
// of that class, creating ones included). ResourceExhausted (retryable:
// another node, or later) naming the class, the resource, what the class
// holds, the request and the bound; OK when the class is not counted.
Status AdmitClass(const NodeLimits& limits, const CreateRequest& request, const ClassUsage& used);

// Parses warrend --overcommit: "CLASS=RATIO[,CLASS=RATIO]", CLASS latency
// or best-effort (each at most once), RATIO a decimal number in [0, 1000]
// (0 = not counted) into limits->overcommit. "" sets nothing. InvalidArgument
// naming --overcommit and the bad entry.
Status ParseOvercommit(const std::string& spec, NodeLimits* limits);

// One QoS class on this node: its ratio, what its sandboxes hold and what
// is left under its bound (free_* 0 and bounded false when not counted).
struct ClassCapacity {
  runtime::Qos qos = runtime::Qos::kLatency;
  double overcommit = 0;
  bool bounded = false;
  ClassUsage used;
  int64_t free_cpu_millis = 0;
  int64_t free_memory_mb = 0;
};
ClassCapacity CapacityOf(const NodeLimits& limits, runtime::Qos qos, const ClassUsage& used);

// Whether the kernel offers core scheduling (prctl PR_SCHED_CORE, 5.14+
// with CONFIG_SCHED_CORE): "available", or "absent: <why>" (probed once by
// asking this thread's cookie; EINVAL = not built in). Reported only: the
// node does not tag sandboxes with cookies.
const std::string& CoreScheduling();

}  // namespace warren::node
