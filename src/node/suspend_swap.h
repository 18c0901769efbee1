// Swap for suspended sandboxes (DESIGN.md §5 "suspend"): reclaiming
// a frozen sandbox's anonymous and tmpfs pages needs swap. When the host has
// none, warrend sets up a zram device (compressed RAM) as swap at start.
//
// EnsureSuspendSwap is idempotent and host-wide: it takes an flock on
// <run_dir>/suspend-swap.lock (several daemons on one host), records the
// device it set up in <run_dir>/suspend-swap (/run is a tmpfs: the record
// dies with a reboot, as the zram device does), and
//   * adopts that device when it is already swapped on (daemon restart);
//   * leaves a host that already has swap alone (uses it, changes nothing);
//   * otherwise initializes /dev/zram0 if unused, else a hot-added zram
//     device (/sys/class/zram-control/hot_add): comp_algorithm lz4 when
//     offered, disksize, mkswap (util-linux), swapon(2) with priority 100.
// A failed set-up undoes its steps (reset, hot_remove) and returns the error;
// the daemon then runs without swap (suspend only drops page cache). The
// swap is never removed by warrend: sandboxes' pages may live in it across
// daemon restarts.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace warren::node {

struct SuspendSwapOptions {
  std::string mode = "auto";  // "auto" | "none" (never touch the host's swap)
  uint64_t zram_size_mb = 0;  // uncompressed capacity; 0 = a quarter of MemTotal
  std::string run_dir = "/run/warren";
  std::string sysfs = "/sys";  // for tests
};

struct SuspendSwap {
  // "disabled" (mode none), "host" (the host's own swap, untouched),
  // "adopted" (zram warrend set up earlier), "created" (set up now),
  // "absent" (mode auto but nothing could be set up: see the error).
  std::string how;
  std::string device;       // e.g. "/dev/zram0"; for "host" the first swap device
  uint64_t size_bytes = 0;  // total active swap
};

// Errors: InvalidArgument for a bad mode; the errno of the failing step
// (open/write of a sysfs file, mkswap exit status, swapon) otherwise.
StatusOr<SuspendSwap> EnsureSuspendSwap(const SuspendSwapOptions& options);

}  // namespace warren::node
