// Records of daemons before typed records (JSON, "version": 1): read once at
// start so that a daemon upgraded in place adopts the sandboxes an older one
// made; the adopted sandbox's record is rewritten in the current format.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "node/records/record.pb.h"

namespace warren::node {

// The record an older daemon wrote, converted. Its env (base64 keys and
// values, "env_b64") comes back byte-exact; its backend part is passed on as
// the JSON text the backend wrote then (backends read it, see
// Backend::Adopt). InvalidArgument for a "running" record without layers or
// resources.
StatusOr<record::Sandbox> FromLegacyRecord(const nlohmann::json& j);

}  // namespace warren::node
