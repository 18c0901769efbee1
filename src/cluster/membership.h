// Cluster membership in etcd: this node's record (node_record.h) under a
// lease, rewritten every refresh with fresh facts, and the view of every
// node's record, read at the same pace. A node that stops refreshing (killed,
// cut off) leaves every view when its lease expires; a clean Leave() revokes
// the lease, so it leaves at once.
//
// Thread-safe. One background thread does all etcd traffic; Nodes() reads
// the last view and never waits for etcd.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/etcd_client.h"
#include "cluster/node_record.h"
#include "common/status.h"

namespace warren::cluster {

struct MembershipOptions {
  std::string prefix = "/warren/nodes/";
  int64_t lease_s = 10;
  std::chrono::milliseconds refresh{2000};
  // Run on the membership thread after every refresh that reached etcd,
  // with this node's lease (projects.h republishes its usage under it).
  std::function<void(int64_t lease)> after_refresh;
};

class Membership {
 public:
  // This node's current record; called on the membership thread.
  using Facts = std::function<NodeRecord()>;

  // Registers this node (a lease, its record) and reads the view once:
  // an error (etcd unreachable, UNAVAILABLE) leaves nothing registered.
  // `etcd` is borrowed and must outlive this.
  static StatusOr<std::unique_ptr<Membership>> Join(EtcdClient* etcd, MembershipOptions options, Facts facts);
  ~Membership();  // Leave()

  // Stops refreshing and withdraws the record (revokes the lease). Idempotent.
  void Leave();

  // Runs a refresh (this node's record, then the view) on the membership
  // thread now and waits for it, at most `timeout`. Its status;
  // DeadlineExceeded when it did not finish in time, Unavailable after Leave.
  Status RefreshNow(std::chrono::milliseconds timeout);

  // The last view of every registered node, this one included (shared,
  // immutable: a new view replaces it).
  std::shared_ptr<const std::vector<NodeRecord>> Nodes() const;
  const std::string& self() const { return self_; }
  // This node's lease (it changes when the node registers again).
  int64_t lease() const { return lease_.load(); }

 private:
  Membership(EtcdClient* etcd, MembershipOptions options, Facts facts);
  Status Register();  // a new lease and the record under it
  Status Refresh();   // keepalive (re-register when the lease is gone), record, view
  Status ReadView();
  void Loop();

  EtcdClient* const etcd_;
  const MembershipOptions options_;
  const Facts facts_;
  std::string self_;
  std::atomic<int64_t> lease_{0};  // written by the membership thread only (and Join/Leave, before/after it)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool poked_ = false;     // RefreshNow wants a refresh before the period ends
  uint64_t started_ = 0;   // refreshes begun
  uint64_t finished_ = 0;  // refreshes ended; last_ is the latest one's status
  Status last_;
  std::condition_variable done_cv_;
  std::shared_ptr<const std::vector<NodeRecord>> view_ = std::make_shared<std::vector<NodeRecord>>();
  std::thread thread_;
};

}  // namespace warren::cluster
