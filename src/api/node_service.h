// warren.v1.Node: the node's status (identity, backends, counters, memory)
// and, in a cluster, its members and their drain flags (api/cluster_members.h).
//
// Thread-safe.
#pragma once

#include <future>
#include <string>
#include <vector>

#include "api/cluster_members.h"
#include "api/service_deps.h"
#include "runtime/microvm/microvm_backend.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::api {

// Static facts about the node, reported by Node.Status.
struct NodeFacts {
  std::string version = "0.1.0";
  int cgroup_version = 0;
  std::string cgroup_parent;
  bool idmapped_mounts = false;
  // The microvm backend's accelerator, once chosen (invalid when the backend
  // is not offered). Node.Status waits for it (bounded).
  std::shared_future<runtime::AccelChoice> microvm_accel;
};

class NodeService final : public warren::v1::Node::Service {
 public:
  // `extra_backends`: served outside the sandbox manager (e.g. "fncall");
  // listed after the manager's.
  // `members`: borrowed, outlives this; null on a single node.
  NodeService(ServiceDeps deps, NodeFacts facts, std::vector<std::string> extra_backends,
              ClusterMembers* members = nullptr)
      : deps_(deps), facts_(std::move(facts)), extra_backends_(std::move(extra_backends)), members_(members) {}

  grpc::Status Status(grpc::ServerContext* ctx, const warren::v1::NodeStatusRequest* req,
                      warren::v1::NodeStatus* resp) override;
  grpc::Status ListNodes(grpc::ServerContext* ctx, const warren::v1::ListNodesRequest* req,
                         warren::v1::ListNodesResponse* resp) override;
  grpc::Status Drain(grpc::ServerContext* ctx, const warren::v1::DrainRequest* req,
                     warren::v1::ClusterNode* resp) override;

 private:
  const ServiceDeps deps_;
  const NodeFacts facts_;
  const std::vector<std::string> extra_backends_;
  ClusterMembers* const members_;
};

}  // namespace warren::api
