// LayerProvider over the real image::LayerStore + image::MountCache.
// Built into library `warren_node_image` only when `warren_image` exists.
#pragma once

#include <memory>
#include <string>

#include "node/layer_provider.h"

namespace warren::node {

// Opens the store at store_dir and a mount cache under mount_root (mounts left
// there by a previous daemon are adopted with refcount 0).
StatusOr<std::unique_ptr<LayerProvider>> NewImageLayerProvider(const std::string& store_dir,
                                                               const std::string& mount_root, int64_t grace_ms);

}  // namespace warren::node
