// The cluster's api::Forwarder (api/forward.h): calls about another node's
// sandbox go to that node (the sandbox id's prefix names it), creates are
// placed (placement.h) over the membership view, lists fan out. Nothing is
// written to etcd on these paths: placement reads the last view and counts
// its own placements until each node's next record.
//
// Nodes call each other over their TCP listeners with the shared bearer
// token. Thread-safe.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "api/forward.h"
#include "cluster/membership.h"
#include "cluster/placement.h"

namespace warren::cluster {

struct RouterOptions {
  std::string self;   // this node's id
  std::string token;  // bearer token for the other nodes
  // The cluster's projects: a forwarded call names the project its caller
  // acts for (api/projects.h). Borrowed; may be null.
  api::Projects* projects = nullptr;
  PlacementOptions placement;
};

class Router final : public api::Forwarder {
 public:
  // `membership` is borrowed and must outlive this.
  Router(const Membership* membership, RouterOptions options);

  StatusOr<std::shared_ptr<grpc::Channel>> Owner(const grpc::ServerContext& ctx,
                                                 const std::string& sandbox_id) override;
  std::unique_ptr<grpc::ClientContext> Context(const grpc::ServerContext& ctx) override;
  bool Place(grpc::ServerContext* ctx, const warren::v1::CreateSandboxRequest& req, warren::v1::Sandbox* resp,
             const std::function<grpc::Status(warren::v1::Sandbox*)>& local, grpc::Status* status) override;
  std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>> Peers(const grpc::ServerContext& ctx) override;

  // The node id a sandbox id names ("" when it names none).
  static std::string NodeOf(const std::string& sandbox_id);

  // The (cached) channel to a node's HOST:PORT.
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address) { return Channel(address); }

 private:
  struct Peer {
    std::shared_ptr<grpc::Channel> channel;
    // Made once per channel: a stub registers each of its methods with the
    // channel, too much to do per create.
    std::shared_ptr<warren::v1::Sandboxes::Stub> sandboxes;
  };
  Peer& PeerLocked(const std::string& address);  // mu_ held
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  std::shared_ptr<warren::v1::Sandboxes::Stub> SandboxesStub(const std::string& address);
  // The creates this entry sent `node` since its record (0 for an older record).
  uint32_t RecentOf(const NodeRecord& node);
  // Counts a create sent to `node`; a count belongs to the record revision
  // it was made against and is dropped with it.
  void Count(const NodeRecord& node, uint32_t n);
  void Remember(const std::string& request_id, const std::string& node);
  // Recent counts for `view` (stale revisions dropped).
  std::map<std::string, uint32_t> RecentFor(const std::vector<NodeRecord>& view);

  const Membership* const membership_;
  const RouterOptions options_;
  std::mutex mu_;
  std::map<std::string, Peer> channels_;  // by address
  struct Placed {
    int64_t revision = 0;
    uint32_t count = 0;
  };
  std::map<std::string, Placed> recent_;  // by node id
  // Where creates with a request id went (the last kRememberedRequests):
  // a retry with the same id goes to the same node, which answers it with
  // the same sandbox.
  std::map<std::string, std::string> request_node_;
  std::deque<std::string> request_order_;
};

}  // namespace warren::cluster
