// LayerProvider over the real image::LayerStore + image::MountCache.
// Built into library `warren_node_image` only when `warren_image` exists.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "node/layer_provider.h"

namespace warren::node {

// The node-local read cache (image/read_cache.h): off when cap_bytes is 0
// (layers mounted straight from the store).
struct ReadCacheOptions {
  std::string dir;         // local dir of the cached chunks
  uint64_t cap_bytes = 0;  // bytes; 0 = no read cache
  uint32_t chunk_bytes = 65536;
  std::string fs_mountpoint;  // where the cache's files are mounted (BlobFs)
  // The warren-fuse-fd program: holds the files' FUSE connection across a
  // daemon restart ("": none, the connection dies with the daemon).
  std::string fs_holder_path;
  bool prefetch = true;         // read a layer's hot list ahead when it is mounted
  bool keep_metadata = true;    // keep mounted layers' metadata local (image::ReadCache::Options)
  bool chunked_layers = false;  // the store builds every layer chunk-based (LayerStore::set_chunked_layers)
};

// Opens the store at store_dir and a mount cache under mount_root (mounts left
// there by a previous daemon are adopted with refcount 0); with a read cache,
// layers are mounted from its files. A bad cache dir or chunk size fails
// (FailedPrecondition / InvalidArgument naming it) with nothing left.
StatusOr<std::unique_ptr<LayerProvider>> NewImageLayerProvider(const std::string& store_dir,
                                                               const std::string& mount_root, int64_t grace_ms,
                                                               const ReadCacheOptions& read_cache = {});

}  // namespace warren::node
