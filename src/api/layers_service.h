// warren.v1.Layers: build (from a streamed tar, or from a host directory for
// local callers only), get, list, remove.
//
// Thread-safe: handlers run concurrently on the server's thread pool.
#pragma once

#include "api/service_deps.h"
#include "image/layer_store.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::api {

class LayersService final : public warren::v1::Layers::Service {
 public:
  explicit LayersService(ServiceDeps deps) : deps_(deps) {}

  // The tar is spooled to a file beside the layer store (never whole in
  // memory) and removed whatever happens.
  grpc::Status Build(grpc::ServerContext* ctx, grpc::ServerReader<warren::v1::BuildLayerRequest>* reader,
                     warren::v1::Layer* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const warren::v1::GetLayerRequest* req, warren::v1::Layer* resp) override;
  grpc::Status List(grpc::ServerContext* ctx, const warren::v1::ListLayersRequest* req,
                    warren::v1::ListLayersResponse* resp) override;
  grpc::Status Remove(grpc::ServerContext* ctx, const warren::v1::RemoveLayerRequest* req, warren::v1::Empty*) override;

 private:
  // The layer with the node's view of it (in use, mounted).
  void ToLayer(const image::LayerInfo& li, warren::v1::Layer* out) const;

  const ServiceDeps deps_;
};

}  // namespace warren::api
