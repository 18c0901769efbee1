// The sandbox's own cgroup, read-only at /sys/fs/cgroup inside it (programs
// that size themselves from their limits read it: JVMs, Go, thread pools),
// built by the daemon as one detached mount tree that the sandbox's first
// process attaches with a single move_mount (the plan's fd slot).
//
// v1: an empty 16 KiB tmpfs with one directory per hierarchy, onto which a
// read-only clone of the sandbox's cgroup in that hierarchy is mounted; then
// the tmpfs itself is made read-only. v2: a read-only clone of the sandbox's
// cgroup directory. Everything is read-only, nosuid, nodev, noexec.
//
// Why not mounts in the child: there the view cost a tmpfs, a bind and a
// read-only remount per hierarchy (14 mount calls for six v1 hierarchies),
// and each bind's source walk from "/" through sysfs and cgroupfs dentries
// leaves RCU walk (kernfs revalidation): ~10 % of the c64 create->exec->
// destroy rate on an idle 2-core host (bench/RESULTS.md, 2026-12-02). Here
// the clones are taken relative to each hierarchy's mount point
// (jail/cgroup_path.h) and the child pays one move_mount.
//
// Mounting onto a detached tree needs Linux >= 6.15 (move_mount to a target
// in an anonymous mount namespace): older kernels answer EINVAL and the
// caller falls back to building the view in the child (PlanBuilder::
// CgroupView).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::jail {

// `dirs`: the sandbox cgroup's directory in each hierarchy (Cgroup::dirs()),
// all under /sys/fs/cgroup. Returns the detached tree's mount fd (O_CLOEXEC).
// Errors name the step and path; nothing is left (the fds close).
StatusOr<UniqueFd> DetachedCgroupView(const std::vector<std::string>& dirs);

}  // namespace warren::jail
