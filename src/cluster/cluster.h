// A warrend node's part in a cluster: its etcd client, its membership and
// its router, from warrend's --cluster flags. Owns all three.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "api/cluster_members.h"
#include "api/forward.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/projects.h"
#include "cluster/router.h"
#include "node/sandbox_manager.h"

namespace warren::cluster {

struct ClusterFlags {
  std::string spec;       // "etcd=URL[,URL...]"
  std::string advertise;  // HOST:PORT the other nodes reach this one at
  std::string token;      // the bearer token every node serves TCP with
  int64_t lease_s = 10;
  uint32_t refresh_ms = 2000;
  bool drain = false;
  std::string etcd_ca, etcd_cert, etcd_key, etcd_user, etcd_password_file;
  std::vector<std::string> extra_backends;
};

class Cluster final : public api::ClusterMembers {
 public:
  // Registers this node. Errors: InvalidArgument naming a bad flag;
  // AlreadyExists when another live node (another address) has this node
  // id; UNAVAILABLE when etcd cannot be reached (nothing left registered).
  // `manager` is borrowed and must outlive this.
  static StatusOr<std::unique_ptr<Cluster>> Join(const ClusterFlags& flags, node::SandboxManager* manager);
  ~Cluster() override;

  // Withdraws this node (idempotent); routing keeps working on the last view.
  void Leave();
  api::Forwarder* forwarder() { return router_.get(); }
  api::Projects* projects() { return projects_.get(); }

  // api::ClusterMembers
  std::string Self() const override { return self_; }
  std::vector<warren::v1::ClusterNode> Nodes() override;
  StatusOr<warren::v1::ClusterNode> SetDrain(bool drain) override;
  StatusOr<std::shared_ptr<grpc::Channel>> NodeChannel(const std::string& id) override;

 private:
  Cluster() = default;
  std::string self_;
  // This node's drain flag, read by its record's facts on every refresh.
  std::shared_ptr<std::atomic<bool>> drain_ = std::make_shared<std::atomic<bool>>(false);
  std::chrono::milliseconds refresh_{2000};
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<ProjectStore> projects_;  // before membership_, which calls it until it is gone
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<Router> router_;
};

// "etcd=URL[,URL...]" as endpoints; InvalidArgument naming what is wrong.
StatusOr<std::vector<std::string>> ParseClusterSpec(const std::string& spec);

}  // namespace warren::cluster
