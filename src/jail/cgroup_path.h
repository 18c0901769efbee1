// Path walks into the host's cgroup file systems that start at the mount
// point of the hierarchy they lie under, not at "/" (DESIGN.md §6).
//
// Why: every walk through /sys/fs/cgroup crosses sysfs's "fs" dentry, and a
// kernfs dentry is revalidated outside RCU walk under its root's kernfs_rwsem
// (kernfs_dop_revalidate): sysfs's one rwsem, which network namespace
// teardown (cleanup_net removing each loopback's sysfs files) holds for
// write. With dozens of creates and destroys at once, cgroup calls queued
// behind it (an off-CPU profile of the c64 loop: most of the daemon's blocked
// time was kernfs_dop_revalidate on the way to /sys/fs/cgroup/...;
// bench/RESULTS.md, 2026-12-02 08:00). The mount points come from
// /proc/self/mountinfo at first use and their O_PATH fds are kept for the
// life of the process; a path under none of them is walked as given.
//
// Each function is its syscall with the path routed: the same return value
// and errno.
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <string>

namespace warren::jail {

struct CgPath {
  int dirfd;        // a hierarchy's mount point, or AT_FDCWD
  std::string rel;  // relative to dirfd ("." for the mount point itself); absolute with AT_FDCWD
};
CgPath RouteCgroupPath(const std::string& path);

int CgOpen(const char* path, int flags);
int CgAccess(const char* path);  // F_OK
int CgMkdir(const char* path, mode_t mode);
int CgRmdir(const char* path);
int CgRename(const char* from, const char* to);
DIR* CgOpendir(const char* path);  // closedir() it

}  // namespace warren::jail
