// Validation of a create request against this node: every field checked,
// node defaults filled in, and every resource bounded by what the node can
// grant, so that a request the node cannot honour is refused before anything
// is created (InvalidArgument naming the field, the value and the maximum),
// never by a failing setup step later.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "node/sandbox_types.h"

namespace warren::node {

// The locale a sandbox gets when its request sets neither LANG nor LC_ALL
// (Debian's libc-bin ships it in every base image).
inline constexpr char kDefaultLang[] = "C.UTF-8";

// `backends`: the names available on this node. `limits` as resolved by the
// manager (cpus, memory_mb, max_open_files probed).
StatusOr<CreateRequest> NormalizeCreate(const CreateRequest& request, const NodeLimits& limits,
                                        const std::vector<std::string>& backends);

bool ValidNodeId(const std::string& n);
bool ValidSandboxId(const std::string& id);

}  // namespace warren::node
