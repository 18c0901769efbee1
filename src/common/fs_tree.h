// File-tree helpers every room shares.
#pragma once

#include <string>

#include "common/status.h"

namespace warren {

// Removes `path` recursively without following symlinks and without crossing
// into other mounts (an entry on another device is an error, left in place).
// OK when `path` does not exist. Bounded by depth 4096 (FailedPrecondition).
Status RemoveTree(const std::string& path);

}  // namespace warren
