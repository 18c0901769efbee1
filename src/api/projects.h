// Projects as the warren.v1 services see them: which project a call acts
// for, what it may touch, and the cluster-wide quota a create must pass.
// src/cluster implements Projects (its definitions live in etcd); null on a
// single node, where every caller acts for every project.
//
// A call acts for a project when it carries that project's bearer token,
// or when a caller trusted with every project (the unix socket, the node
// token; so also a call another node forwards) names one in kProjectKey.
// Such a call sees and touches only sandboxes labelled kProjectLabel with
// its project or one below it, and jobs holding only those.
//
// Thread-safe: called concurrently from the server's handler threads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "node/sandbox_types.h"
#include "warren/v1/project.pb.h"

namespace warren::node {
class SandboxManager;
}

namespace warren::api {

struct ServiceDeps;

// Metadata key naming the project a trusted caller acts for.
inline constexpr char kProjectKey[] = "x-warren-project";
// The label every sandbox a project creates carries: the project's path.
inline constexpr char kProjectLabel[] = "warren.project";
// error_details of a create refused by a project quota: a google.rpc.Status
// (code 8, RESOURCE_EXHAUSTED; message "quota"). Placement does not try
// another node for it: the quota holds on every node.
inline constexpr char kQuotaRefusalDetails[] = "\x08\x08\x12\x05quota";

// A quota share held by a create while it runs; released on destruction
// (the sandbox, once made, is counted from the node's table).
class QuotaHold {
 public:
  virtual ~QuotaHold() = default;
};

class Projects {
 public:
  virtual ~Projects() = default;

  // The project whose token `token` is; nullopt when it is none.
  virtual std::optional<std::string> ProjectOfToken(std::string_view token) = 0;

  // Takes a create's share of `project`'s quotas (and of every project
  // above it) cluster-wide. ResourceExhausted naming the project and the
  // quota reached; PermissionDenied when the project no longer exists;
  // Unavailable (retryable) when etcd cannot be reached.
  virtual StatusOr<std::unique_ptr<QuotaHold>> Admit(const std::string& project, uint32_t cpu_millis,
                                                     uint32_t memory_mb) = 0;

  // Management on behalf of `caller` ("" = every project); see project.proto.
  virtual StatusOr<warren::v1::CreateProjectResponse> Create(const std::string& caller,
                                                             const warren::v1::CreateProjectRequest& req) = 0;
  virtual StatusOr<warren::v1::Project> Get(const std::string& caller, const std::string& path) = 0;
  virtual StatusOr<std::vector<warren::v1::Project>> List(const std::string& caller) = 0;
  virtual StatusOr<warren::v1::Project> Update(const std::string& caller,
                                               const warren::v1::UpdateProjectRequest& req) = 0;
  virtual Status Delete(const std::string& caller, const std::string& path) = 0;
};

// Whether `project` is `scope` or below it; every project is in scope "".
bool InProject(const std::string& scope, const std::string& project);

// The project sandbox `info` belongs to (its kProjectLabel; "" = none).
std::string ProjectOf(const node::SandboxInfo& info);

// Whether a caller acting for `project` ("" = every project) sees a layer
// owned by `owners` (image::LayerInfo::projects): a layer of no project is
// every project's; one of projects (snapshots, forks and grades of their
// sandboxes) is theirs and the projects' above them.
bool LayerVisible(const std::string& project, const std::vector<std::string>& owners);

// A create on behalf of `project` ("" = a caller trusted with every
// project: nothing to do, a null hold): checks that the project sees every
// layer `r` names (NotFound naming the first it does not, as for a layer
// that does not exist), labels `r` with kProjectLabel and takes its share
// of the project's quotas (Projects::Admit, with the node's defaults for
// resources `r` leaves 0). The hold is kept until the create finished.
// FailedPrecondition when `projects` is null (a single node has no
// projects); Admit's errors otherwise. Every front end that creates
// sandboxes (warren.v1 Sandboxes, the E2B API) calls this.
StatusOr<std::unique_ptr<QuotaHold>> AdmitCreate(Projects* projects, node::SandboxManager& manager,
                                                 const std::string& project, node::CreateRequest* r);

// The project `ctx`'s call acts for ("" = every project): a project token's
// project, else the kProjectKey a trusted caller (the unix socket, the node
// token `node_token`) names. `projects` may be null (no project tokens).
std::string CallerProject(const grpc::ServerContext& ctx, const std::string& node_token, Projects* projects);

// OK when the caller may touch sandbox `id`, served on this node. Otherwise
// PERMISSION_DENIED, the same whether the sandbox exists or not.
grpc::Status CheckSandboxAccess(const ServiceDeps& deps, const grpc::ServerContext& ctx, const std::string& id);

// OK when every sandbox of job `job` on this node is in the caller's
// project; PERMISSION_DENIED naming the job otherwise.
grpc::Status CheckJobAccess(const ServiceDeps& deps, const grpc::ServerContext& ctx, const std::string& job);

// PERMISSION_DENIED naming `what` for a caller acting for one project:
// node-wide operations (layers, images, nodes) are the operators'.
grpc::Status RequireEveryProject(const ServiceDeps& deps, const grpc::ServerContext& ctx, const std::string& what);

}  // namespace warren::api
