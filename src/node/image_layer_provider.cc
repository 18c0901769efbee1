#include "node/image_layer_provider.h"

#include <utility>

namespace warren::node {
namespace {

class ImageLayerProvider final : public LayerProvider {
 public:
  ImageLayerProvider(std::unique_ptr<image::LayerStore> store, std::unique_ptr<image::MountCache> cache)
      : store_(std::move(store)), cache_(std::move(cache)) {}
  // A clean shutdown unmounts the layers no sandbox holds (those waiting out
  // their grace period): they would otherwise outlive the daemon for nothing.
  // Layers of live sandboxes keep their references and stay mounted for the
  // next daemon to adopt; a crash leaves everything to that daemon's sweep.
  ~ImageLayerProvider() override { cache_->Sweep(/*all=*/true); }

  StatusOr<image::LayerInfo> Resolve(const std::string& ref) const override { return store_->Resolve(ref); }
  std::vector<image::LayerInfo> List() const override { return store_->List(); }
  StatusOr<image::LayerInfo> BuildFromDir(const std::string& name, const std::string& dir) override {
    return store_->BuildFromDir(name, dir);
  }
  StatusOr<image::LayerInfo> BuildFromSandboxDir(const std::string& name, const std::string& dir) override {
    return store_->BuildFromSandboxDir(name, dir);
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
  StatusOr<std::string> Acquire(const std::string& digest) override { return cache_->Acquire(digest); }
  void Release(const std::string& digest) override { cache_->Release(digest); }
  void Sweep() override { cache_->Sweep(false); }
  bool IsMounted(const std::string& digest) const override { return cache_->IsMounted(digest); }
  size_t MountedCount() const override { return cache_->MountedCount(); }
  CacheStats Stats() const override {
    const image::MountCache::Stats m = cache_->stats();
    return CacheStats{m.hits, m.misses, m.failures, m.evictions, m.mounted, m.mounted_bytes};
  }
  bool FileBackedErofs() const override { return image::MountCache::FileBackedErofsSupported(); }

 private:
  std::unique_ptr<image::LayerStore> store_;
  std::unique_ptr<image::MountCache> cache_;  // destroyed first: it points at store_
};

}  // namespace

StatusOr<std::unique_ptr<LayerProvider>> NewImageLayerProvider(const std::string& store_dir,
                                                               const std::string& mount_root, int64_t grace_ms) {
  ASSIGN_OR_RETURN(std::unique_ptr<image::LayerStore> store, image::LayerStore::Open(store_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<image::MountCache> cache,
                   image::MountCache::Open(store.get(), mount_root, grace_ms));
  return std::unique_ptr<LayerProvider>(std::make_unique<ImageLayerProvider>(std::move(store), std::move(cache)));
}

}  // namespace warren::node
