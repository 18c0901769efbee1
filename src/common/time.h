// Wall-clock timestamps as the API reports them (nanoseconds since the Unix
// epoch). For durations and deadlines use std::chrono::steady_clock instead:
// the wall clock may step.
#pragma once

#include <chrono>
#include <cstdint>

namespace warren {

// Now, in nanoseconds since the Unix epoch (system_clock).
inline int64_t WallNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace warren
