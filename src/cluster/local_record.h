// This node's record (node_record.h) from its sandbox manager and host:
// what membership publishes every refresh.
#pragma once

#include <string>
#include <vector>

#include "cluster/node_record.h"
#include "node/sandbox_manager.h"

namespace warren::cluster {

struct LocalNode {
  std::string address;  // HOST:PORT the other nodes reach this one at
  std::string version;
  bool drain = false;
  std::vector<std::string> extra_backends;  // served beside the manager's (fncall)
};

// Reads the manager's counters, its sandboxes' requests, its layers,
// /proc/meminfo and /proc/loadavg. Thread-safe (the manager's calls are).
NodeRecord LocalRecord(node::SandboxManager& manager, const LocalNode& node);

}  // namespace warren::cluster
