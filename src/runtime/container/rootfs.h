// A container sandbox's file systems, made by the daemon as detached mounts:
// the overlay (tmpfs upper + idmapped lower layers), its /dev, its
// /etc/hosts, and the read-only mounts every sandbox shares (density).
#pragma once

#include <sys/types.h>

#include "common/status.h"
#include "common/unique_fd.h"
#include "runtime/backend.h"
#include "runtime/container/state.h"

namespace warren::runtime::container {

// Builds the detached overlay mount (tmpfs upper + idmapped lowers).
// *upper_out receives an O_RDONLY directory fd on the upper dir (kept by the
// daemon for snapshots; it pins the tmpfs until closed); *dev_out a detached
// clone (nosuid, noexec) of the tmpfs's dev/ dir, the sandbox's /dev: its
// own superblock would cost every memory cgroup on the host (density, see
// MakeSharedMounts). Files in /dev count against disk_mb; dev/ is outside
// upper/, so never part of a snapshot.
StatusOr<UniqueFd> BuildRootfs(const SandboxSpec& spec, int userns_fd, uid_t host_uid, UniqueFd* upper_out,
                               UniqueFd* dev_out, bool* dev_nodes_made);

// The shared read-only mounts (see rootfs.cc): an empty tmpfs for the masked
// /proc and /sys dirs, and a sysfs of an empty network namespace.
StatusOr<UniqueFd> MakeSharedMaskMount();
StatusOr<UniqueFd> MakeSharedSysfs();

// Sends the sandbox's /dev mount, then a fresh detached clone of each shared
// mount the backend has (the order InitChild receives them in).
Status SendSharedMounts(const BackendState& st, int sock, UniqueFd dev);

}  // namespace warren::runtime::container
