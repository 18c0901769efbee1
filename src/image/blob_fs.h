// The read cache as files (DESIGN.md §4): a read-only FUSE file system,
// served by this process over /dev/fuse (no libfuse), whose root holds one
// regular file per store blob, <mountpoint>/<hex>, each read through a
// ReadCache. The node mounts its EROFS layers file-backed from these files
// instead of from the store, so every block the kernel reads is served by
// the cache (on demand, chunk by chunk) and counted.
//
// Protocol subset: INIT, LOOKUP, FORGET/BATCH_FORGET, GETATTR, OPEN, READ,
// RELEASE, FLUSH, OPENDIR/READDIR/RELEASEDIR (an empty listing), STATFS,
// DESTROY; everything else ENOSYS. Files are opened FOPEN_DIRECT_IO: the
// EROFS mount above keeps the page cache, a second copy in FUSE's would be
// waste. A name that is not 64 lower-case hex, or no blob of the store, is
// ENOENT.
//
// Node ids are a function of the name (the first 63 bits of the hex, >= 2),
// so a restarted server answers for files the kernel looked up under the
// previous one; a second name with the same id is refused (EIO, logged).
// An id is kept while the kernel holds a lookup of it (FORGET drops it), so
// the table is bounded by the kernel's inodes; Forget(hex) asks the kernel
// to drop a name it no longer needs (FUSE_NOTIFY_INVAL_ENTRY). OPEN and
// RELEASE of a file are ReadCache::OpenLayer / CloseLayer of its blob.
//
// Lifetime: with a `holder_path` (the warren-fuse-fd program,
// src/init/warren_fuse_fd.c), a holder process keeps a second fd of the
// connection, so it outlives this process: reads of EROFS layers mounted
// from these files wait in the kernel while no server runs, and Mount() in
// a restarted daemon finds the holder of the same mount point (its argv),
// takes the fd back with pidfd_getfd(2), has the kernel re-queue the
// requests the dead server had taken (FUSE_NOTIFY_RESEND) and serves on.
// Without a holder the connection dies with this process.
// Shutdown() (and the destructor) end the threads; when no EROFS mount in
// this mount namespace still uses a file here (or there is no holder) they
// also detach the mount (MNT_DETACH) and kill the holder, otherwise both
// are left for the next daemon. Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "image/read_cache.h"

namespace warren::image {

class BlobFs {
 public:
  // Serves the file system at `mountpoint` (created 0700 if absent) with
  // `threads` server threads: adopts the connection of a previous daemon's
  // holder of this mount point when both the holder and the mount are
  // there (adopted() is then true); otherwise kills such a holder, detaches
  // a stale mount there, mounts anew and (with holder_path) starts a
  // holder. Errors name the syscall and path; nothing is left mounted and
  // no holder is left running by a failed Mount.
  static StatusOr<std::unique_ptr<BlobFs>> Mount(ReadCache* cache, const std::string& mountpoint, int threads = 4,
                                                 const std::string& holder_path = "");
  ~BlobFs();
  void Shutdown();
  // For a daemon started without the read cache: a previous daemon's files
  // at `mountpoint` (its mount, its holder) are detached and ended, so that
  // layers still mounted from them read EIO instead of waiting for a server
  // that will not come (logged when there was something to end).
  static void Abandon(const std::string& mountpoint);
  // Asks the kernel to forget <mountpoint>/<hex> (its layer is unmounted):
  // its FORGET then drops the node id. Best effort (ENOENT: not cached).
  void Forget(const std::string& hex);
  bool adopted() const { return adopted_; }
  pid_t holder_pid() const { return holder_pid_; }
  // Node ids the server holds (names the kernel has looked up and not
  // forgotten).
  size_t node_count() const;
  // The path of a blob's file: <mountpoint>/<hex>.
  std::string Path(const std::string& hex) const { return mountpoint_ + "/" + hex; }
  const std::string& mountpoint() const { return mountpoint_; }

 private:
  BlobFs(ReadCache* cache, std::string mountpoint) : cache_(cache), mountpoint_(std::move(mountpoint)) {}
  struct Node {
    std::string hex;
    uint64_t nlookup = 0;  // 0 for a name adopted from a mount (the kernel's count is unknown)
  };
  Status MountFresh(const std::string& holder_path);
  Status StartHolder(const std::string& holder_path);
  void KillHolder();
  // The blob names EROFS mounts in this mount namespace hold open here.
  std::vector<std::string> MountedHexes() const;
  // Adds the names of MountedHexes() to nodes_ (restart, unknown node id);
  // open_layers: also ReadCache::OpenLayer each (the mounts' open files).
  void AdoptMountedNodes(bool open_layers);
  std::string HexOf(uint64_t id);
  void Forgotten(uint64_t id, uint64_t nlookup);
  void Serve();
  // Handles one request; writes its reply (if any) to the device.
  void Handle(const char* req, size_t len, std::vector<char>& reply_buf);

  ReadCache* cache_;
  const std::string mountpoint_;
  UniqueFd dev_;
  UniqueFd wake_;  // eventfd: Shutdown wakes the threads' poll
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
  UniqueFd holder_pidfd_;  // the warren-fuse-fd process, if any
  pid_t holder_pid_ = -1;
  bool holder_is_child_ = false;  // started by this process: reaped here
  bool adopted_ = false;
  bool own_mount_ = false;  // the mount at mountpoint_ is this server's (made or adopted)
  mutable std::mutex ids_mu_;
  std::unordered_map<uint64_t, Node> nodes_;  // guarded by ids_mu_
};

}  // namespace warren::image
