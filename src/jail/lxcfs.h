// LXCFS (Debian's `lxcfs` package): a FUSE file system whose proc/meminfo,
// cpuinfo, stat, uptime, loadavg, swaps, diskstats and
// sys/devices/system/cpu/online answer each reader with its own cgroup's
// limits (MemTotal = the memory limit, MemFree/MemAvailable from its usage;
// the cpus of its CFS quota, rounded up, with --enable-cfs). Bound over the
// kernel's files in a sandbox, programs that size themselves from /proc or
// sysconf (JVM, thread pools, os.cpu_count, `free`) see the sandbox's
// limits, not the host's. Works on cgroup v1 (memory, cpu, cpuset
// hierarchies) and v2.
//
// One lxcfs per daemon run dir, mounted at <dir>/mnt. It outlives a daemon
// that leaves sandboxes running (their binds hold its FUSE connection: a
// dead lxcfs would make their /proc/meminfo fail with ENOTCONN), so the next
// daemon on the same run dir adopts it; the daemon stops it when it leaves
// no sandbox behind (Stop). lxcfs daemonizes itself: it is not the
// daemon's child.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace warren::jail {

class Lxcfs {
 public:
  // Starts lxcfs with its mount at `dir`/mnt (creating `dir`), or adopts the
  // one a previous daemon left there (pid file alive and its mount
  // answering). FailedPrecondition when lxcfs or /dev/fuse is missing
  // (callers run without it and say so); the errno of the failing step
  // otherwise. Waits up to 5 s for the mount to answer.
  static StatusOr<std::unique_ptr<Lxcfs>> Start(const std::string& dir, const std::string& binary = "lxcfs");

  // Leaves lxcfs running (see the header comment).
  ~Lxcfs() = default;

  // Kills lxcfs and detaches its mount. Sandboxes still holding binds of
  // its files then read ENOTCONN there: call only when none is left.
  void Stop();

  // Stop() of the lxcfs a daemon started at `dir` (its pid file, its mount
  // at <dir>/mnt; live or dead), for a daemon that will never come back to
  // it (node/run_dir.h FindOrphanRunDirs). Removes `dir`. Nothing at `dir`:
  // nothing done.
  static void StopAt(const std::string& dir);

  // The FUSE mount point: <dir>/mnt.
  const std::string& mount_dir() const { return mnt_; }
  // The /proc files lxcfs serves here (names under proc/, e.g. "meminfo").
  const std::vector<std::string>& proc_files() const { return proc_files_; }
  // Whether it serves sys/devices/system/cpu/online.
  bool serves_cpu_online() const { return cpu_online_; }
  pid_t pid() const { return pid_; }

 private:
  std::string dir_, mnt_;
  pid_t pid_ = -1;
  std::vector<std::string> proc_files_;
  bool cpu_online_ = false;
};

}  // namespace warren::jail
