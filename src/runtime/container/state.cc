#include "runtime/container/state.h"

namespace warren::runtime::container {

// The cgroup limits of a sandbox spec (Create's, and what a recycled cgroup holds).
jail::CgroupLimits LimitsOf(const SandboxSpec& spec) {
  jail::CgroupLimits lim;
  lim.cpu_millis = spec.resources.cpu_millis;
  lim.memory_bytes = uint64_t{spec.resources.memory_mb} << 20;
  lim.pids = spec.resources.pids;
  lim.best_effort = spec.qos == Qos::kBestEffort;
  return lim;
}

}  // namespace warren::runtime::container
