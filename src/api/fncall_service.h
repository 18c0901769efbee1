// The FnCall gRPC service (api/warren/v1/fncall.proto) over the node's
// fncall front end (node/fncall_frontend.h). Auth as every service
// (api/auth.h); a layer ref naming a host directory is for local callers
// only. Errors map to gRPC codes once (status_map.h).
//
// Thread-safe.
#pragma once

#include <string>

#include <grpcpp/grpcpp.h>

#include "api/auth.h"
#include "common/status.h"
#include "node/fncall_frontend.h"
#include "runtime/fncall/fncall.h"
#include "warren/v1/fncall.grpc.pb.h"

namespace warren::api {

class FnCallServiceImpl final : public warren::v1::FnCall::Service {
 public:
  // `token`: bearer token required from TCP callers (api/auth.h; empty = TCP refused).
  FnCallServiceImpl(node::FnCallFrontend* frontend, std::string token);
  grpc::Status Call(grpc::ServerContext* ctx, const warren::v1::FnCallRequest* req,
                    warren::v1::FnCallResponse* resp) override;
  grpc::Status CallBatch(grpc::ServerContext* ctx, const warren::v1::FnCallBatchRequest* req,
                         warren::v1::FnCallBatchResponse* resp) override;

 private:
  static grpc::Status CheckLayerRefs(const grpc::ServerContext* ctx,
                                     const google::protobuf::RepeatedPtrField<std::string>& refs);
  node::FnCallFrontend* const frontend_;
  const Authorizer auth_;
};

// Converts between the proto and the runtime types.
runtime::FnCallRequest FromProto(const warren::v1::FnCallRequest& r);
void ToProto(const runtime::FnCallResult& r, warren::v1::FnCallResponse* out);

}  // namespace warren::api
