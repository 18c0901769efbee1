// The FnCall gRPC service (api/warren/v1/fncall.proto) and the layer
// resolution shared with the SandboxFusion-compatible HTTP front door
// (src/http). Errors map to gRPC codes here, once (status_map.h).
//
// Thread-safe. Layer mounts taken for fncall pools are held (one reference
// per distinct layer) until the FnCallFrontend is destroyed.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "api/auth.h"
#include "common/status.h"
#include "node/layer_provider.h"
#include "runtime/fncall/fncall.h"
#include "warren/v1/fncall.grpc.pb.h"

namespace warren::api {

class FnCallFrontend {
 public:
  // `default_layers` serve requests that name none.
  FnCallFrontend(runtime::FnCallPool* pool, node::LayerProvider* layers, std::vector<std::string> default_layers);
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
  node::LayerProvider* const layers_;
  const std::vector<std::string> default_layers_;
  std::mutex mu_;
  std::map<std::string, std::string> acquired_;  // digest -> mount path
};

class FnCallServiceImpl final : public warren::v1::FnCall::Service {
 public:
  // `token`: bearer token required from TCP callers (api/auth.h; empty = TCP refused).
  FnCallServiceImpl(FnCallFrontend* frontend, std::string token);
  grpc::Status Call(grpc::ServerContext* ctx, const warren::v1::FnCallRequest* req,
                    warren::v1::FnCallResponse* resp) override;
  grpc::Status CallBatch(grpc::ServerContext* ctx, const warren::v1::FnCallBatchRequest* req,
                         warren::v1::FnCallBatchResponse* resp) override;

 private:
  static grpc::Status CheckLayerRefs(const grpc::ServerContext* ctx,
                                     const google::protobuf::RepeatedPtrField<std::string>& refs);
  FnCallFrontend* const frontend_;
  const Authorizer auth_;
};

// Converts between the proto and the runtime types.
runtime::FnCallRequest FromProto(const warren::v1::FnCallRequest& r);
void ToProto(const runtime::FnCallResult& r, warren::v1::FnCallResponse* out);

}  // namespace warren::api
