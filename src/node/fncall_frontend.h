// The node's fncall front end, shared by the FnCall gRPC service
// (api/fncall_service.h) and the /run_code HTTP server (http/): resolves a
// call's layer refs to mounted lowerdirs (acquiring each layer's mount once)
// and runs calls on the runtime's warm worker pool, one at a time or batched.
//
// Thread-safe. Layer mounts taken for fncall pools are held (one reference
// per distinct layer) until ReleaseLayers or destruction.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "node/layer_provider.h"
#include "node/metrics.h"
#include "runtime/fncall/fncall.h"

namespace warren::node {

class FnCallFrontend {
 public:
  // `default_layers` serve requests that name none; one ending in '?' is
  // optional: a layer ref the store does not hold (NotFound) or a directory
  // that does not exist is left out of the call, at each call (so a toolset
  // built later joins the defaults without a restart; the pool is keyed by
  // the layer set). `metrics` (borrowed; nullptr = none) counts every call.
  FnCallFrontend(runtime::FnCallPool* pool, LayerProvider* layers, std::vector<std::string> default_layers,
                 Metrics* metrics = nullptr);
  ~FnCallFrontend();
  // Resolves `layer_refs` (or the defaults), acquires their mounts once, runs
  // the call. NotFound / InvalidArgument for bad refs.
  StatusOr<runtime::FnCallResult> Run(const std::vector<std::string>& layer_refs,
                                      const runtime::FnCallRequest& request);
  // Runs many calls concurrently (at most `concurrency` at once); results in order.
  std::vector<StatusOr<runtime::FnCallResult>> RunBatch(
      const std::vector<std::pair<std::vector<std::string>, runtime::FnCallRequest>>& calls, uint32_t concurrency);
  runtime::FnCallPool* pool() { return pool_; }
  // Releases the layer mounts taken so far (shutdown: after the pool's
  // workers are gone, before the layer provider is). Idempotent.
  void ReleaseLayers();

 private:
  StatusOr<std::vector<std::string>> LowerDirs(const std::vector<std::string>& refs);

  runtime::FnCallPool* const pool_;
  LayerProvider* const layers_;
  const std::vector<std::string> default_layers_;
  Metrics& metrics_;
  std::mutex mu_;
  std::map<std::string, std::string> acquired_;  // digest -> mount path
};

}  // namespace warren::node
