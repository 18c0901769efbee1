// What the node needs from the image component (DESIGN.md §4): name
// resolution, builds, and the per-node mount cache. An interface so the node
// and API logic are testable without mounting EROFS images; the production
// implementation (node/image_layer_provider.h) wraps image::LayerStore and
// image::MountCache.
//
// Thread-safe. Errors as absl::Status (common/status.h): InvalidArgument for a
// malformed ref (naming it), NotFound for an unknown one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "image/layer_store.h"

namespace warren::node {

class LayerProvider {
 public:
  virtual ~LayerProvider() = default;

  // ref: "kind/name", "kind/name@version" or "sha256:<hex>".
  virtual StatusOr<image::LayerInfo> Resolve(const std::string& ref) const = 0;
  virtual std::vector<image::LayerInfo> List() const = 0;
  virtual StatusOr<image::LayerInfo> BuildFromDir(const std::string& name, const std::string& dir) = 0;
  // A tree copied from a sandbox (snapshot, grade): marked from_sandbox
  // (never pristine), holes kept; `project` (the sandbox's, or empty) owns
  // it (image::LayerInfo::projects).
  virtual StatusOr<image::LayerInfo> BuildFromSandboxDir(const std::string& name, const std::string& dir,
                                                         const std::string& project) = 0;
  virtual StatusOr<image::LayerInfo> BuildFromTar(const std::string& name, const std::string& tar_path) = 0;
  // BuildFromTar reporting the bytes of the tar read during the extraction
  // (image::TarProgressFn; false cancels). By default without reports.
  virtual StatusOr<image::LayerInfo> BuildFromTarWithProgress(const std::string& name, const std::string& tar_path,
                                                              const image::TarProgressFn& progress) {
    (void)progress;
    return BuildFromTar(name, tar_path);
  }
  // One layer equal to a stack of layers (image::LayerStore::BuildMerged).
  virtual StatusOr<image::LayerInfo> BuildMerged(const std::string& name, const std::vector<std::string>& digests) {
    (void)name;
    (void)digests;
    return absl::UnimplementedError("this layer provider cannot merge layers");
  }
  // Removes a name (the caller has checked the layer is not in use).
  virtual Status Remove(const std::string& ref) = 0;
  // A directory on the store's file system for spooling uploads.
  virtual std::string TmpDir() const = 0;
  // The EROFS image file of a digest (backends that attach layers as disks);
  // "" where layers are not files (test fakes).
  virtual std::string BlobPath(const std::string& digest) const {
    (void)digest;
    return "";
  }

  // Mount cache: Acquire mounts (if needed) and takes one reference, returning
  // the mount path (a lowerdir); every successful Acquire is paired with one
  // Release. Sweep unmounts unreferenced mounts whose grace expired.
  virtual StatusOr<std::string> Acquire(const std::string& digest) = 0;
  virtual void Release(const std::string& digest) = 0;
  virtual void Sweep() = 0;
  virtual bool IsMounted(const std::string& digest) const = 0;
  virtual size_t MountedCount() const = 0;
  virtual bool FileBackedErofs() const = 0;
  // The mount cache's counters (image::MountCache::Stats: hits, misses,
  // failures, evictions since the node started; mounted layers and their
  // image bytes now). Providers without a cache report their mounts only.
  struct CacheStats {
    uint64_t hits = 0, misses = 0, failures = 0, evictions = 0;
    uint64_t mounted = 0, mounted_bytes = 0;
    // The node-local read cache (image::ReadCache::Stats), when there is one:
    // its cap and the chunk bytes held now; chunks found / fetched; chunks
    // evicted; chunks not kept for a local write error; bytes read from the
    // store in all and per layer ("sha256:<hex>" -> bytes) since start.
    bool read_cache = false;
    uint64_t read_cache_cap_bytes = 0, read_cache_bytes = 0;
    uint64_t read_cache_hits = 0, read_cache_misses = 0, read_cache_evictions = 0, read_cache_write_errors = 0;
    uint64_t store_read_bytes = 0, prefetched_bytes = 0;
    uint64_t read_cache_metadata_bytes = 0;  // of read_cache_bytes, open layers' metadata kept local
    std::map<std::string, uint64_t> layer_store_read_bytes;
  };
  virtual CacheStats Stats() const {
    CacheStats s;
    s.mounted = MountedCount();
    return s;
  }
};

}  // namespace warren::node
