// One sandbox in the node's table: what the node knows of it, its backend
// object and its bookkeeping. Shared (shared_ptr) between the table and the
// calls working on it; fields marked "table" are guarded by the table's lock.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "node/records/record.pb.h"
#include "node/sandbox_types.h"
#include "runtime/backend.h"

namespace warren::node {

struct Entry {
  SandboxInfo info;    // info.state, info.last_activity_ns, expiry: table
  CreateRequest spec;  // the normalized request (no deadline, no cancel probe)
  std::string dir;
  runtime::Backend* backend = nullptr;
  std::vector<std::string> acquired;  // digests holding a mount reference
  std::shared_ptr<runtime::Sandbox> sandbox;
  std::string backend_record;    // Sandbox::Record() of its backend; empty before Create
  bool destroy_running = false;  // table
  int inflight_execs = 0;        // table; an exec running is never idle
  std::mutex pause_mu;           // serializes Pause/Resume/Suspend of this sandbox
  // State history, persisted with the record.
  google::protobuf::RepeatedPtrField<record::Transition> transitions;
};

// Appends a state transition (state, time, reason) to the entry's history.
void AddTransition(Entry& e, SandboxState s, const std::string& reason);

}  // namespace warren::node
