// What a node publishes about itself in etcd (membership.h), under
// <prefix><node id>, as JSON: where to reach it and what it can take.
// Written only by its node; read by every node's placement (placement.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace warren::cluster {

// One QoS class on the node (warrend --overcommit; node/admission/admission.h
// ClassCapacity): what its sandboxes asked for and, when the class is
// counted (bounded), what is left under capacity x overcommit.
struct QosRecord {
  double overcommit = 0;  // 0: not counted
  bool bounded = false;
  uint32_t sandboxes = 0;
  uint64_t cpu_millis = 0;
  uint64_t memory_mb = 0;
  int64_t free_cpu_millis = 0;  // bounded only
  int64_t free_memory_mb = 0;
};

struct NodeRecord {
  std::string id;       // the node id, prefix of its sandbox ids
  std::string address;  // HOST:PORT of its warren.v1 TCP listener
  std::string version;
  std::vector<std::string> backends;
  uint32_t cpus = 0;
  uint64_t memory_mb = 0;
  uint32_t max_sandboxes = 0;
  uint32_t sandboxes = 0;
  uint32_t free_slots = 0;           // max_sandboxes - sandboxes
  int64_t free_cpu_millis = 0;       // cpus x 1000 - what its sandboxes asked for (< 0 = over-committed)
  int64_t free_memory_mb = 0;        // memory_mb - what its sandboxes asked for (< 0 = over-committed)
  uint64_t available_memory_mb = 0;  // the host's MemAvailable
  uint32_t creates_in_flight = 0;
  uint32_t creates_queued = 0;
  double load1 = 0;                 // 1-minute load average
  std::vector<std::string> layers;  // cached layers, "kind/name@version"
  QosRecord qos[2];                 // index runtime::Qos: latency, best-effort
  std::string core_scheduling;      // node::CoreScheduling()
  bool drain = false;               // takes no new sandboxes
  int64_t updated_ns = 0;           // wall clock of the write

  // Set by the reader from etcd, not part of the JSON: changes on every write.
  int64_t mod_revision = 0;
};

std::string ToJson(const NodeRecord& r);
// InvalidArgument naming what is wrong when `json` is not a node record.
StatusOr<NodeRecord> NodeRecordFromJson(const std::string& json);

}  // namespace warren::cluster
