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
// Lifetime: the mount lives as long as the server's connection; a mounted
// EROFS layer above it keeps working only while this process serves it.
// Shutdown() (and the destructor) detach the mount (MNT_DETACH) and end the
// threads; EROFS mounts still holding a file then read EIO for what their
// page cache lacks. Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "image/read_cache.h"

namespace warren::image {

class BlobFs {
 public:
  // Mounts at `mountpoint` (created 0700 if absent; a stale mount of a
  // previous daemon there is detached first) and starts `threads` server
  // threads. Errors name the syscall and path; nothing is left mounted.
  static StatusOr<std::unique_ptr<BlobFs>> Mount(ReadCache* cache, const std::string& mountpoint, int threads = 4);
  ~BlobFs();
  void Shutdown();
  // The path of a blob's file: <mountpoint>/<hex>.
  std::string Path(const std::string& hex) const { return mountpoint_ + "/" + hex; }
  const std::string& mountpoint() const { return mountpoint_; }

 private:
  BlobFs(ReadCache* cache, std::string mountpoint) : cache_(cache), mountpoint_(std::move(mountpoint)) {}
  void Serve();
  // Handles one request; writes its reply (if any) to the device.
  void Handle(const char* req, size_t len, std::vector<char>& reply_buf);

  ReadCache* cache_;
  const std::string mountpoint_;
  UniqueFd dev_;
  UniqueFd wake_;  // eventfd: Shutdown wakes the threads' poll
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
  // nodeid -> hex: nodeid 1 is the root, blob ids are 2 + index. Guarded
  // by ids_mu_; ids are never reused (the kernel may still name a forgotten
  // one in a racing request).
  mutable std::mutex ids_mu_;
  std::vector<std::string> ids_;
};

}  // namespace warren::image
