#include "node/admission/admission.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

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

namespace {
int64_t Bound(double capacity, double ratio) { return ratio > 0 ? static_cast<int64_t>(capacity * ratio) : -1; }
}  // namespace

int64_t ClassCpuBound(const NodeLimits& limits, runtime::Qos qos) {
  return Bound(1000.0 * limits.cpus, limits.overcommit[static_cast<int>(qos)]);
}

int64_t ClassMemoryBound(const NodeLimits& limits, runtime::Qos qos) {
  return Bound(static_cast<double>(limits.memory_mb), limits.overcommit[static_cast<int>(qos)]);
}

Status AdmitClass(const NodeLimits& limits, const CreateRequest& request, const ClassUsage& used) {
  runtime::Qos qos = runtime::Qos::kLatency;
  (void)runtime::ParseQos(request.qos, &qos);  // normalized: one of the two
  const double ratio = limits.overcommit[static_cast<int>(qos)];
  auto refuse = [&](const char* what, uint64_t held, uint64_t asked, int64_t bound, const char* unit) {
    return absl::ResourceExhaustedError(
        std::string("qos class ") + runtime::QosName(qos) + " is full on this node: its sandboxes hold " +
        std::to_string(held) + " " + unit + " of " + what + ", the request asks " + std::to_string(asked) +
        ", the bound is " + std::to_string(bound) + " (capacity x over-commit " + absl::StrFormat("%g", ratio) +
        ", --overcommit); retry later or on another node");
  };
  if (const int64_t b = ClassCpuBound(limits, qos);
      b >= 0 && used.cpu_millis + request.resources.cpu_millis > static_cast<uint64_t>(b)) {
    return refuse("cpu", used.cpu_millis, request.resources.cpu_millis, b, "millicpus");
  }
  if (const int64_t b = ClassMemoryBound(limits, qos);
      b >= 0 && used.memory_mb + request.resources.memory_mb > static_cast<uint64_t>(b)) {
    return refuse("memory", used.memory_mb, request.resources.memory_mb, b, "MiB");
  }
  return absl::OkStatus();
}

Status ParseOvercommit(const std::string& spec, NodeLimits* limits) {
  if (spec.empty()) return absl::OkStatus();
  bool seen[2] = {false, false};
  for (absl::string_view entry : absl::StrSplit(spec, ',')) {
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError("--overcommit entry \"" + std::string(entry) + "\": " + why +
                                        " (want CLASS=RATIO[,CLASS=RATIO], CLASS latency or best-effort, "
                                        "e.g. latency=1,best-effort=4)");
    };
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) return bad("no '='");
    runtime::Qos qos;
    if (!runtime::ParseQos(std::string(entry.substr(0, eq)), &qos)) return bad("unknown class");
    double ratio = 0;
    if (!absl::SimpleAtod(entry.substr(eq + 1), &ratio) || !(ratio >= 0 && ratio <= 1000)) {
      return bad("ratio must be a number in [0, 1000]");
    }
    if (seen[static_cast<int>(qos)]) return bad("class given twice");
    seen[static_cast<int>(qos)] = true;
    limits->overcommit[static_cast<int>(qos)] = ratio;
  }
  return absl::OkStatus();
}

ClassCapacity CapacityOf(const NodeLimits& limits, runtime::Qos qos, const ClassUsage& used) {
  ClassCapacity c;
  c.qos = qos;
  c.overcommit = limits.overcommit[static_cast<int>(qos)];
  c.used = used;
  const int64_t cpu = ClassCpuBound(limits, qos), mem = ClassMemoryBound(limits, qos);
  c.bounded = cpu >= 0;
  if (c.bounded) {
    c.free_cpu_millis = cpu - static_cast<int64_t>(used.cpu_millis);
    c.free_memory_mb = mem - static_cast<int64_t>(used.memory_mb);
  }
  return c;
}

const std::string& CoreScheduling() {
  static const std::string answer = [] {
    // PR_SCHED_CORE 62, PR_SCHED_CORE_GET 0, PIDTYPE_PID 0 (linux/prctl.h of
    // 5.14+; spelled out for older headers).
    uint64_t cookie = 0;
    if (::prctl(62, 0, 0, 0, reinterpret_cast<unsigned long>(&cookie)) == 0) return std::string("available");
    const int err = errno;
    if (err == EINVAL) return std::string("absent: prctl(PR_SCHED_CORE) EINVAL (kernel without CONFIG_SCHED_CORE)");
    if (err == ENODEV) return std::string("absent: prctl(PR_SCHED_CORE) ENODEV (no SMT on this machine)");
    return "absent: prctl(PR_SCHED_CORE): " + std::string(strerror(err));
  }();
  return answer;
}

}  // namespace warren::node
