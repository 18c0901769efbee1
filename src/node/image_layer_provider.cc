#include "node/image_layer_provider.h"

#include "common/log.h"
#include "image/blob_fs.h"
#include "image/read_cache.h"

#include <utility>

namespace warren::node {
namespace {

class ImageLayerProvider final : public LayerProvider {
 public:
  ImageLayerProvider(std::unique_ptr<image::LayerStore> store, std::unique_ptr<image::ReadCache> read_cache,
                     std::unique_ptr<image::BlobFs> blob_fs, std::unique_ptr<image::MountCache> cache)
      : store_(std::move(store)),
        read_cache_(std::move(read_cache)),
        blob_fs_(std::move(blob_fs)),
        cache_(std::move(cache)) {}
  // A clean shutdown unmounts the layers no sandbox holds (those waiting out
  // their grace period): they would otherwise outlive the daemon for nothing.
  // Layers of live sandboxes keep their references and stay mounted for the
  // next daemon to adopt; a crash leaves everything to that daemon's sweep.
  ~ImageLayerProvider() override { Unmounted(cache_->Sweep(/*all=*/true)); }

  StatusOr<image::LayerInfo> Resolve(const std::string& ref) const override { return store_->Resolve(ref); }
  std::vector<image::LayerInfo> List() const override { return store_->List(); }
  StatusOr<image::LayerInfo> BuildFromDir(const std::string& name, const std::string& dir) override {
    return store_->BuildFromDir(name, dir);
  }
  StatusOr<image::LayerInfo> BuildFromSandboxDir(const std::string& name, const std::string& dir,
                                                 const std::string& project) override {
    return store_->BuildFromSandboxDir(name, dir, project);
  }
  StatusOr<image::LayerInfo> BuildFromTar(const std::string& name, const std::string& tar_path) override {
    return store_->BuildFromTar(name, tar_path);
  }
  StatusOr<image::LayerInfo> BuildFromTarWithProgress(const std::string& name, const std::string& tar_path,
                                                      const image::TarProgressFn& progress) override {
    return store_->BuildFromTar(name, tar_path, progress);
  }
  StatusOr<image::LayerInfo> BuildMerged(const std::string& name, const std::vector<std::string>& digests) override {
    return store_->BuildMerged(name, digests);
  }
  Status Remove(const std::string& ref) override { return store_->Remove(ref); }
  std::string TmpDir() const override { return store_->dir() + "/tmp"; }
  std::string BlobPath(const std::string& digest) const override { return store_->BlobPath(digest); }
  // With a read cache: a layer about to be mounted is read ahead from its
  // hot list; when its first sandboxes are gone, what they read becomes the
  // hot list (image::ReadCache::Prefetch/RecordHot).
  StatusOr<std::string> Acquire(const std::string& digest) override {
    if (read_cache_ != nullptr && prefetch_ && !cache_->IsMounted(digest)) read_cache_->Prefetch(Hex(digest));
    return cache_->Acquire(digest);
  }
  void Release(const std::string& digest) override {
    cache_->Release(digest);
    if (read_cache_ != nullptr && cache_->RefCount(digest) == 0) {
      Status st = read_cache_->RecordHot(Hex(digest));
      if (!st.ok())
        Log(spdlog::level::warn, "layer hot list not written", {{"layer", digest}, {"error", st.ToString()}});
    }
  }
  void Sweep() override { Unmounted(cache_->Sweep(false)); }
  bool IsMounted(const std::string& digest) const override { return cache_->IsMounted(digest); }
  size_t MountedCount() const override { return cache_->MountedCount(); }
  CacheStats Stats() const override {
    const image::MountCache::Stats m = cache_->stats();
    CacheStats s;
    s.hits = m.hits;
    s.misses = m.misses;
    s.failures = m.failures;
    s.evictions = m.evictions;
    s.mounted = m.mounted;
    s.mounted_bytes = m.mounted_bytes;
    if (read_cache_ != nullptr) {
      const image::ReadCache::Stats r = read_cache_->stats();
      s.read_cache = true;
      s.read_cache_cap_bytes = r.cap_bytes;
      s.read_cache_bytes = r.cached_bytes;
      s.read_cache_hits = r.hits;
      s.read_cache_misses = r.misses;
      s.read_cache_evictions = r.evictions;
      s.read_cache_write_errors = r.write_errors;
      s.store_read_bytes = r.store_read_bytes;
      s.prefetched_bytes = r.prefetched_bytes;
      s.read_cache_metadata_bytes = r.metadata_bytes;
      for (const auto& [hex, l] : r.layers) s.layer_store_read_bytes["sha256:" + hex] = l.store_read_bytes;
    }
    return s;
  }
  void set_prefetch(bool on) { prefetch_ = on; }
  bool FileBackedErofs() const override { return image::MountCache::FileBackedErofsSupported(); }

 private:
  // Destroyed bottom up: the mount cache (it points at the store and mounts
  // from blob_fs_), the cache's files, the cache, the store.
  std::unique_ptr<image::LayerStore> store_;
  std::unique_ptr<image::ReadCache> read_cache_;  // null: no read cache
  std::unique_ptr<image::BlobFs> blob_fs_;
  std::unique_ptr<image::MountCache> cache_;
  bool prefetch_ = true;

  static std::string Hex(const std::string& digest) { return digest.substr(digest.find(':') + 1); }
  // Unmounted layers: the kernel may forget their files (image::BlobFs
  // drops their node ids on FORGET; the read cache dropped their state on
  // the files' RELEASE).
  void Unmounted(const std::vector<std::string>& hexes) {
    if (blob_fs_ == nullptr) return;
    for (const std::string& hex : hexes) blob_fs_->Forget(hex);
  }
};

}  // namespace

StatusOr<std::unique_ptr<LayerProvider>> NewImageLayerProvider(const std::string& store_dir,
                                                               const std::string& mount_root, int64_t grace_ms,
                                                               const ReadCacheOptions& rc) {
  ASSIGN_OR_RETURN(std::unique_ptr<image::LayerStore> store, image::LayerStore::Open(store_dir));
  store->set_chunked_layers(rc.chunked_layers);
  std::unique_ptr<image::ReadCache> read_cache;
  std::unique_ptr<image::BlobFs> blob_fs;
  std::string source_root;
  if (rc.cap_bytes > 0) {
    StatusOr<std::unique_ptr<image::ReadCache>> opened =
        image::ReadCache::Open(store.get(), {rc.dir, rc.cap_bytes, rc.chunk_bytes, rc.keep_metadata});
    if (!opened.ok()) {
      return Status(opened.status().code(),
                    "--layer-cache-dir/--layer-cache-bytes: " + std::string(opened.status().message()));
    }
    read_cache = *std::move(opened);
    ASSIGN_OR_RETURN(blob_fs, image::BlobFs::Mount(read_cache.get(), rc.fs_mountpoint, 4, rc.fs_holder_path));
    source_root = blob_fs->mountpoint();
  } else if (!rc.fs_mountpoint.empty()) {
    image::BlobFs::Abandon(rc.fs_mountpoint);  // a previous daemon ran with the cache
  }
  ASSIGN_OR_RETURN(std::unique_ptr<image::MountCache> cache,
                   image::MountCache::Open(store.get(), mount_root, grace_ms, source_root));
  auto p = std::make_unique<ImageLayerProvider>(std::move(store), std::move(read_cache), std::move(blob_fs),
                                                std::move(cache));
  p->set_prefetch(rc.prefetch);
  return std::unique_ptr<LayerProvider>(std::move(p));
}

}  // namespace warren::node
