// The host-side steps warrend takes before it serves: finding warren-init,
// locking the state dir, claiming the socket path, reading tokens, raising
// the fd limit, bounding the heap, setting up swap for suspend.
//
// Called once, from the daemon's main thread, in the order of daemon.cc.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::warrend {

// The warren-init binary: `flag` (--init-path) if given, else next to
// warrend, ../init/warren-init, or /usr/lib/warren/warren-init; real path.
StatusOr<std::string> FindInit(const std::string& flag);

// Holds an exclusive lock on <state_dir>/warrend.lock for the daemon's life
// (the fd returned; it also holds the daemon's pid). A POSIX record lock (not
// flock): it belongs to this process only, so children forked by backends
// never keep it alive after the daemon dies. FailedPrecondition naming the
// other daemon's pid when one holds it.
StatusOr<UniqueFd> LockStateDir(const std::string& state_dir);

// Makes `path`'s directory and removes a socket file left by a daemon that
// died; FailedPrecondition when a live process serves it or it is not a socket.
Status PrepareSocket(const std::string& path);

// Where the lxcfs of the daemon with run dir `run_dir` lives (jail/lxcfs.h):
// /run/warren/lxcfs/<16 hex digits of FNV-1a of run_dir>. Under /run/warren
// (searchable by every sandbox's root, which binds its files by path): a run
// dir of the operator's choice may sit below a directory only root can
// search. Stable across builds, so that a restart adopts it.
std::string LxcfsDir(const std::string& run_dir);

// Removes the run dirs under `run_root` that no state dir uses any more
// (node/run_dir.h FindOrphanRunDirs: left by a daemon killed before its
// state dir was removed), with what they hold: the QEMUs of the microVM
// templates and warm pool kept there (`qemu`: the binary, matched with the
// dir in their command lines) and their lxcfs (LxcfsDir). Logs each one.
// Returns how many were removed.
int RemoveOrphanRunDirs(const std::string& run_root, const std::string& own_run_dir, const std::string& qemu);

// The token in the first line of `path` (trailing whitespace dropped);
// InvalidArgument when shorter than 16 characters.
StatusOr<std::string> ReadToken(const std::string& path);

// The daemon holds fds per sandbox (init pidfd, upper dir) and per running
// exec/process; a 1024 soft limit (systemd's default) would stop it near 500
// sandboxes long before memory does. Raises the soft RLIMIT_NOFILE to the
// hard limit; returns {soft before, soft after}.
std::pair<uint64_t, uint64_t> RaiseNofileLimit();

// The daemon's heap stays bounded in steady state. glibc's defaults let it
// grow with the load's history, not its size: (1) the mmap threshold is
// dynamic, raised to the size of every large block freed (up to 32 MiB), so
// after the first big exec output (up to 2 x output_cap) every later one is
// carved from an arena, whose freed middle is never returned; (2) each of up
// to 8 x cores arenas (one per thread that ever contended) keeps its own free
// memory. So: a fixed threshold (blocks >= 1 MiB are mmapped and unmapped on
// free), at most 4 arenas, and every 10 s malloc_trim(0) hands the free
// pages inside the arenas back (MADV_DONTNEED; a few ms of CPU).
void BoundHeap();

// Swap for suspended sandboxes (node/suspend_swap.h): `mode` "auto" sets up
// zram when the host has none, "none" disables. Logs what it did; a failure
// is logged, not fatal (suspend then gives back only page cache).
void SetUpSuspendSwap(const std::string& mode, uint64_t zram_size_mb);

}  // namespace warren::warrend
