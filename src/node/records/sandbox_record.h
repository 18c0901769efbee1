// The persisted record of one sandbox: what a restarted daemon needs to adopt
// it (or to clean up after it). Written by the table at each state change.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "node/table/entry.h"

namespace warren::node {

// The record of `e` in state `state`.
nlohmann::json MakeRecord(const Entry& e, SandboxState state);

// Fills `e` (info, spec, backend_record, transitions; not backend, dir or
// sandbox) from a record. `pristine_of`: the pristine layers of a record
// written before they were recorded. InvalidArgument for a malformed record.
Status ParseRecord(const nlohmann::json& record, Entry* e,
                   const std::function<std::vector<std::string>(const std::vector<std::string>&)>& pristine_of);

}  // namespace warren::node
