// The node's record of one sandbox (record.proto's Sandbox) from and to a
// table entry. Written by the table at each state change.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "node/records/record.pb.h"
#include "node/table/entry.h"

namespace warren::node {

// The record of `e` in state `state`.
record::Sandbox MakeRecord(const Entry& e, SandboxState state);

// Fills `e` (info, spec, backend_record, transitions; not backend, dir or
// sandbox) from a record. `pristine_of`: the pristine layers of a record
// written before they were recorded (version < 2 without them).
void ParseRecord(const record::Sandbox& record, Entry* e,
                 const std::function<std::vector<std::string>(const std::vector<std::string>&)>& pristine_of);

// The backend's spec of a recorded sandbox (no lower dirs).
runtime::SandboxSpec SpecOf(const record::Sandbox& record);

}  // namespace warren::node
