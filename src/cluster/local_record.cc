#include "cluster/local_record.h"

#include <array>
#include <sstream>

#include "common/file_util.h"
#include "common/time.h"
#include "node/admission/admission.h"

namespace warren::cluster {
namespace {

// MemAvailable of /proc/meminfo in MiB; 0 when unreadable.
uint64_t MemAvailableMb() {
  StatusOr<std::string> meminfo = ReadSmallFile("/proc/meminfo");
  if (!meminfo.ok()) return 0;
  std::istringstream in(*meminfo);
  std::string key, unit;
  uint64_t kb = 0;
  for (int i = 0; i < 64 && in >> key >> kb >> unit; ++i) {
    if (key == "MemAvailable:") return kb >> 10;
  }
  return 0;
}

double Load1() {
  StatusOr<std::string> l = ReadSmallFile("/proc/loadavg");
  if (!l.ok()) return 0;
  std::istringstream in(*l);
  double v = 0;
  in >> v;
  return v;
}

}  // namespace

NodeRecord LocalRecord(node::SandboxManager& m, const LocalNode& node) {
  NodeRecord r;
  const node::ManagerOptions& o = m.options();
  const node::NodeCounters c = m.Counters();
  r.id = o.node_id;
  r.address = node.address;
  r.version = node.version;
  r.backends = m.BackendNames();
  r.backends.insert(r.backends.end(), node.extra_backends.begin(), node.extra_backends.end());
  r.cpus = c.cpus;
  r.memory_mb = c.memory_mb;
  r.max_sandboxes = o.limits.max_sandboxes;
  r.sandboxes = c.sandboxes;
  r.free_slots = c.sandboxes >= r.max_sandboxes ? 0 : r.max_sandboxes - c.sandboxes;
  int64_t cpu = 0, mem = 0;
  for (const node::SandboxInfo& s : m.List({}, "")) {
    cpu += s.resources.cpu_millis;
    mem += s.resources.memory_mb;
  }
  r.free_cpu_millis = static_cast<int64_t>(c.cpus) * 1000 - cpu;
  r.free_memory_mb = static_cast<int64_t>(c.memory_mb) - mem;
  r.available_memory_mb = MemAvailableMb();
  r.creates_in_flight = c.creates_in_flight;
  r.creates_queued = c.creates_queued;
  r.load1 = Load1();
  for (const image::LayerInfo& l : m.layers().List()) {
    if (!l.name.empty()) r.layers.push_back(l.name);
  }
  const std::array<node::ClassUsage, 2> usage = m.ClassUsages();
  for (runtime::Qos qos : {runtime::Qos::kLatency, runtime::Qos::kBestEffort}) {
    const int i = static_cast<int>(qos);
    const node::ClassCapacity c = node::CapacityOf(o.limits, qos, usage[i]);
    r.qos[i] = QosRecord{c.overcommit,     c.bounded,         c.used.sandboxes, c.used.cpu_millis,
                         c.used.memory_mb, c.free_cpu_millis, c.free_memory_mb};
  }
  r.core_scheduling = node::CoreScheduling();
  r.drain = node.drain;
  r.updated_ns = WallNowNs();
  return r;
}

}  // namespace warren::cluster
