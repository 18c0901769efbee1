// warren.v1.Sandboxes: create, get, list, destroy, exec.
//
// Thread-safe: handlers run concurrently on the server's thread pool; an Exec
// blocks its thread for its duration.
#pragma once

#include "api/service_deps.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::api {

class SandboxesService final : public warren::v1::Sandboxes::Service {
 public:
  explicit SandboxesService(ServiceDeps deps) : deps_(deps) {}

  // A create that waits in the node's admission queue gives up at the RPC's
  // deadline or when the client goes away; one finished too late for its
  // reply to reach the client is destroyed (DEADLINE_EXCEEDED / CANCELLED).
  grpc::Status Create(grpc::ServerContext* ctx, const warren::v1::CreateSandboxRequest* req,
                      warren::v1::Sandbox* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const warren::v1::GetSandboxRequest* req,
                   warren::v1::Sandbox* resp) override;
  grpc::Status List(grpc::ServerContext* ctx, const warren::v1::ListSandboxesRequest* req,
                    warren::v1::ListSandboxesResponse* resp) override;
  grpc::Status Destroy(grpc::ServerContext* ctx, const warren::v1::DestroySandboxRequest* req,
                       warren::v1::DestroySandboxResponse* resp) override;
  grpc::Status Exec(grpc::ServerContext* ctx, const warren::v1::ExecRequest* req,
                    warren::v1::ExecResult* resp) override;
  grpc::Status SetNetwork(grpc::ServerContext* ctx, const warren::v1::SetNetworkRequest* req,
                          warren::v1::NetworkPolicy* resp) override;
  grpc::Status Expose(grpc::ServerContext* ctx, const warren::v1::ExposeRequest* req,
                      warren::v1::ExposedPort* resp) override;
  grpc::Status Unexpose(grpc::ServerContext* ctx, const warren::v1::UnexposeRequest* req,
                        warren::v1::Empty* resp) override;

 private:
  // Create on this node, without placement.
  grpc::Status CreateLocal(grpc::ServerContext* ctx, const warren::v1::CreateSandboxRequest* req,
                           warren::v1::Sandbox* resp);

  const ServiceDeps deps_;
};

}  // namespace warren::api
