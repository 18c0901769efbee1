// Where a node keeps per-sandbox runtime state: the sandbox records
// (<run_dir>/sandboxes/<id>.json), the runtime dirs (<run_dir>/run/<id>,
// the rootfs mount points) and the audit logs (<run_dir>/audit/<id>.jsonl).
//
// These files live exactly as long as their sandbox, and a sandbox never
// outlives a reboot, so they belong on a tmpfs, like runc's /run/runc and
// containerd's /run/containerd: on a busy ext4 state dir, allocating and
// renaming the 5 short-lived inodes of every create cost more CPU than the
// rest of the create path (inode bitmap scans that skip recently deleted
// inodes; data flush on rename-over-existing). The state dir keeps what must
// survive a reboot (layers, snapshots, jobs.json) and gets symlinks
// <state_dir>/{sandboxes,run,audit} -> <run_dir>/..., so both paths work.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace warren::node {

// The run dir for `state_dir` (absolute). `requested` non-empty: that path
// (must be absolute). Empty: automatic, in this order:
//   * <state_dir>/sandboxes is a symlink: the directory it points into (the
//     run dir a previous daemon chose; live sandboxes may be recorded there);
//   * <state_dir>/{sandboxes,run,audit} holds a non-empty directory (the
//     layout of warren before the run dir, with live sandboxes), or the
//     state dir is itself on a tmpfs: the state dir;
//   * `run_root`'s parent (/run/warren) is a tmpfs, or run_root is one, or
//     `mount_tmpfs` and a tmpfs could be mounted on run_root (hosts without
//     a tmpfs /run: taken under a lock file next to it; the last daemon to
//     stop cleanly unmounts it, RemoveRunDirIfUnused): <run_root>/<16 hex digits of a hash of
//     state_dir>, one per state dir;
//   * otherwise the state dir.
StatusOr<std::string> ResolveRunDir(const std::string& state_dir, const std::string& requested,
                                    const std::string& run_root = "/run/warren/runtime", bool mount_tmpfs = false);

// The file in a run dir (one that is not its state dir) naming the state dir
// it serves, one line: written by LinkRunDir after the links, removed by
// RemoveRunDirIfUnused. FindOrphanRunDirs reads it.
inline constexpr const char* kStateDirFile = "state-dir";

// Creates <run_dir>/{sandboxes,run,audit} (0700) and, when run_dir is not the
// state dir, the symlinks <state_dir>/{sandboxes,run,audit} to them (an
// empty directory or a stale link in their place is replaced), then
// <run_dir>/state-dir (kStateDirFile).
// FailedPrecondition when <state_dir>/<sub> is a non-empty directory or a
// link to another run dir that still holds records.
Status LinkRunDir(const std::string& state_dir, const std::string& run_dir);

// At a clean shutdown: when run_dir is not the state dir and holds no
// record, removes the symlinks, the (empty) subdirectories and run_dir.
// Anything non-empty stays (the next daemon adopts it). Then, when the run
// root is a tmpfs ResolveRunDir mounted (its parent is no tmpfs) and nothing
// is left in it, unmounts it (the next daemon mounts it again). Best effort.
void RemoveRunDirIfUnused(const std::string& state_dir, const std::string& run_dir);

// The run dirs directly under `run_root` (the automatic ones: 16 hex digits)
// other than `own` that no state dir uses any more, so that no daemon will
// ever adopt or remove them: their state-dir file names a state dir whose
// <state_dir>/sandboxes link no longer points into them (the state dir was
// removed, or its daemon moved to another run dir), they hold no sandbox
// record and no runtime dir, and nothing is mounted at or below them. A
// daemon that was killed (kill -9, the OOM killer) and whose state dir was
// removed afterwards leaves one (with what its backends kept there, e.g. the
// microVM templates). Run dirs without a state-dir file (made by an older
// warren, or a daemon between ResolveRunDir and LinkRunDir) are never
// returned. Absolute paths; empty when run_root cannot be read.
std::vector<std::string> FindOrphanRunDirs(const std::string& run_root, const std::string& own);

}  // namespace warren::node
