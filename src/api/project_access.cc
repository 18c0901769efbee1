#include <string_view>

#include "api/auth.h"
#include "api/projects.h"
#include "api/service_deps.h"
#include "common/secret.h"

namespace warren::api {
std::string ProjectOf(const node::SandboxInfo& info) {
  auto it = info.labels.find(kProjectLabel);
  return it == info.labels.end() ? std::string() : it->second;
}

bool LayerVisible(const std::string& project, const std::vector<std::string>& owners) {
  if (project.empty() || owners.empty()) return true;
  for (const std::string& o : owners) {
    if (InProject(project, o)) return true;
  }
  return false;
}

StatusOr<std::unique_ptr<QuotaHold>> AdmitCreate(Projects* projects, node::SandboxManager& manager,
                                                 const std::string& project, node::CreateRequest* r) {
  if (project.empty()) return std::unique_ptr<QuotaHold>();
  if (projects == nullptr)
    return absl::FailedPreconditionError("project " + project + ": this node is not in a cluster");
  for (const std::string& ref : r->layers) {
    // A layer it may not see is answered as one that does not exist (the
    // node's own resolve reports other errors, e.g. a malformed name).
    StatusOr<image::LayerInfo> li = manager.layers().Resolve(ref);
    if (li.ok() && !LayerVisible(project, li->projects)) return absl::NotFoundError("layer " + ref + " not found");
  }
  r->labels[kProjectLabel] = project;
  // As the node fills them in (validate.cc) when the request leaves them 0.
  const uint32_t cpu = r->resources.cpu_millis != 0 ? r->resources.cpu_millis : 1000;
  const uint32_t memory = r->resources.memory_mb != 0 ? r->resources.memory_mb : 2048;
  return projects->Admit(project, cpu, memory);
}

bool InProject(const std::string& scope, const std::string& project) {
  if (scope.empty()) return true;
  return project == scope || (project.size() > scope.size() && project.compare(0, scope.size(), scope) == 0 &&
                              project[scope.size()] == '/');
}

std::string CallerProject(const grpc::ServerContext& ctx, const std::string& node_token, Projects* projects) {
  const auto& md = ctx.client_metadata();
  auto auth = md.find("authorization");
  if (auth != md.end()) {
    const std::string_view got(auth->second.data(), auth->second.size());
    const bool node = !node_token.empty() && SameSecret(got, "Bearer " + node_token);
    if (!node && projects != nullptr && got.substr(0, 7) == "Bearer ") {
      if (std::optional<std::string> p = projects->ProjectOfToken(got.substr(7))) return *p;
    }
    // Neither the node's token nor a project's: trusted only over the unix
    // socket (a TCP caller is refused by Authorizer::Check).
    if (!node && !IsUnixPeer(ctx)) return "";
  }
  auto named = md.find(kProjectKey);
  return named == md.end() ? std::string() : std::string(named->second.data(), named->second.size());
}

grpc::Status CheckSandboxAccess(const ServiceDeps& deps, const grpc::ServerContext& ctx, const std::string& id) {
  const std::string project = deps.auth->Project(ctx);
  if (project.empty()) return grpc::Status::OK;
  StatusOr<node::SandboxInfo> info = deps.manager->Get(id);
  if (info.ok() && InProject(project, ProjectOf(*info))) return grpc::Status::OK;
  // The same answer for another project's sandbox and for none at all.
  return {grpc::StatusCode::PERMISSION_DENIED, "sandbox " + id + " is not in project " + project};
}

grpc::Status CheckJobAccess(const ServiceDeps& deps, const grpc::ServerContext& ctx, const std::string& job) {
  const std::string project = deps.auth->Project(ctx);
  if (project.empty()) return grpc::Status::OK;
  for (const node::SandboxInfo& s : deps.manager->List({}, job)) {
    if (!InProject(project, ProjectOf(s))) {
      return {grpc::StatusCode::PERMISSION_DENIED, "job " + job + " is not in project " + project};
    }
  }
  return grpc::Status::OK;
}

grpc::Status RequireEveryProject(const ServiceDeps& deps, const grpc::ServerContext& ctx, const std::string& what) {
  const std::string project = deps.auth->Project(ctx);
  if (project.empty()) return grpc::Status::OK;
  return {grpc::StatusCode::PERMISSION_DENIED,
          what + " is for the cluster's operators (the node token or the unix socket), not project " + project};
}

}  // namespace warren::api
