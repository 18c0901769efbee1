// The cluster's membership as the warren.v1.Node service sees it: the nodes
// registered now and this node's drain flag. The services know only this
// interface; src/cluster implements it. Null on a single node.
//
// Thread-safe: called concurrently from the server's handler threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "warren/v1/warren.pb.h"

namespace warren::api {

class ClusterMembers {
 public:
  virtual ~ClusterMembers() = default;

  // This node's id.
  virtual std::string Self() const = 0;

  // The nodes in this node's last view of the cluster, by id; `self` set on
  // this node's entry.
  virtual std::vector<warren::v1::ClusterNode> Nodes() = 0;

  // Sets this node's drain flag and publishes it now. Returns this node as
  // it now publishes itself. UNAVAILABLE when etcd cannot be reached (the
  // flag stays set and is published on the next refresh that reaches it).
  virtual StatusOr<warren::v1::ClusterNode> SetDrain(bool drain) = 0;

  // The channel to node `id` (for forwarding). NotFound naming the id when
  // it is not in the cluster.
  virtual StatusOr<std::shared_ptr<grpc::Channel>> NodeChannel(const std::string& id) = 0;
};

}  // namespace warren::api
