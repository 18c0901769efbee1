// The cluster's projects (api/projects.h), kept in etcd:
//
//   /warren/projects/<path>          the definition: JSON {path, token_sha256, quota, created_ns}
//   /warren/usage/<path>/@<node id>  what that node runs for exactly that project: JSON
//                                    {sandboxes, cpu_millis, memory_mb}, under the node's
//                                    membership lease (a node that dies takes it along)
//   /warren/usage/<path>/#rate       a creates-per-second quota's state: the GCRA's
//                                    theoretical arrival time of the next create (unix ns)
//
// A project's usage is the sum of the keys under /warren/usage/<path>/: its
// own and its descendants' ('@' is no name character, so <path>/@n and
// <path>/child/@n never collide).
//
// Admission (Admit): read the usage under the highest project with a quota
// at or above the creating one, check every quota on the way, and write
// this node's new usage (and each rate key on the way, moved one interval
// on) in one transaction that holds only when no usage key under that
// project changed since the read. Creates on any nodes therefore
// serialize on etcd and the sums never pass a quota; a conflict is read
// again and retried (bounded). Only creates of projects under a quota touch
// etcd. This node's usage keys are recomputed from its sandbox table after
// every membership refresh (Reconcile), so a destroy by any path (client,
// TTL, job, idle) frees its share within a refresh; when a create's hold
// ends (it failed, or it is in the table now) the key is lowered at once
// to what the node still holds, so a failed create (placed again on
// another node) never leaves its share counted twice.
//
// Definitions are cached: read again on every refresh, and on an unknown
// token at most every 250 ms. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/projects.h"
#include "cluster/etcd_client.h"
#include "node/sandbox_manager.h"

namespace warren::cluster {

class ProjectStore final : public api::Projects {
 public:
  // `etcd` and `manager` are borrowed and must outlive this.
  ProjectStore(EtcdClient* etcd, std::string node_id, node::SandboxManager* manager);
  ~ProjectStore() override;

  // The node's membership lease, which this node's usage keys live under
  // (Admit answers Unavailable until it is set).
  void SetLease(int64_t lease) { lease_.store(lease); }

  // Reads the definitions again and republishes this node's usage from its
  // table (and under `lease`). Called after every membership refresh.
  void Reconcile(int64_t lease);

  // api::Projects
  std::optional<std::string> ProjectOfToken(std::string_view token) override;
  StatusOr<std::unique_ptr<api::QuotaHold>> Admit(const std::string& project, uint32_t cpu_millis,
                                                  uint32_t memory_mb) override;
  StatusOr<warren::v1::CreateProjectResponse> Create(const std::string& caller,
                                                     const warren::v1::CreateProjectRequest& req) override;
  StatusOr<warren::v1::Project> Get(const std::string& caller, const std::string& path) override;
  StatusOr<std::vector<warren::v1::Project>> List(const std::string& caller) override;
  StatusOr<warren::v1::Project> Update(const std::string& caller, const warren::v1::UpdateProjectRequest& req) override;
  Status Delete(const std::string& caller, const std::string& path) override;

  // InvalidArgument naming what is wrong with a project path.
  static Status CheckPath(const std::string& path);

  struct Usage {
    uint64_t sandboxes = 0, cpu_millis = 0, memory_mb = 0;
    Usage& operator+=(const Usage& o);
    Usage& operator-=(const Usage& o);
    bool operator==(const Usage& o) const = default;
  };

 private:
  class Hold;
  struct Def {
    std::string path;
    std::string token_sha256;
    warren::v1::ProjectQuota quota;
    int64_t created_ns = 0;
  };

  Status Load();  // the definitions from etcd into the cache
  void LoadIfStale(std::chrono::milliseconds age);
  std::optional<Def> Find(const std::string& path);
  // InvalidArgument when `q` is above an ancestor's limits of `path`.
  Status CheckAncestors(const std::string& path, const warren::v1::ProjectQuota& q);
  std::map<std::string, Usage> TableUsage();  // this node's sandboxes by project
  std::string UsageKey(const std::string& project) const;
  // Usage of every project (itself and below) from one read of etcd.
  StatusOr<std::map<std::string, Usage>> AllUsage(const std::vector<Def>& defs);
  // What this node holds for exactly `project`: its table's sandboxes and
  // the creates admitted and still running. Needs usage_mu_.
  Usage ShareLocked(const std::string& project);
  // A create's hold ends (`published`: its admission wrote the usage key).
  void Release(const std::string& project, const Usage& u, bool published);

  EtcdClient* const etcd_;
  const std::string node_;
  node::SandboxManager* const manager_;
  std::atomic<int64_t> lease_{0};

  std::mutex cache_mu_;
  std::map<std::string, Def> defs_;              // by path
  std::map<std::string, std::string> by_token_;  // token sha256 (hex) -> path
  std::chrono::steady_clock::time_point load_tried_{};
  std::deque<std::chrono::steady_clock::time_point> miss_loads_;  // reads for unknown tokens, last second
  std::mutex load_mu_;                                            // one Load at a time

  std::mutex usage_mu_;                     // this node's usage keys: Admit, Release, Reconcile
  std::map<std::string, Usage> pending_;    // admitted creates still running, by project
  std::map<std::string, Usage> published_;  // this node's usage keys as last written
  int64_t published_lease_ = 0;
};

}  // namespace warren::cluster
