#include "api/projects_service.h"

#include "api/projects.h"
#include "api/status_map.h"

namespace warren::api {
namespace {

namespace v1 = ::warren::v1;

// The cluster's projects, or why there are none here.
grpc::Status Store(const ServiceDeps& deps, Projects** out) {
  *out = deps.auth->projects();
  if (*out == nullptr) {
    return {grpc::StatusCode::FAILED_PRECONDITION,
            "this node is not in a cluster (projects live in the cluster's etcd: start warrend with --cluster "
            "etcd=URL, README \"Projects and quotas\")"};
  }
  return grpc::Status::OK;
}

}  // namespace

grpc::Status ProjectsService::Create(grpc::ServerContext* ctx, const v1::CreateProjectRequest* req,
                                     v1::CreateProjectResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  Projects* projects = nullptr;
  RETURN_IF_GRPC_ERROR(Store(deps_, &projects));
  ASSIGN_OR_RETURN_GRPC(*resp, projects->Create(deps_.auth->Project(*ctx), *req));
  return grpc::Status::OK;
}

grpc::Status ProjectsService::Get(grpc::ServerContext* ctx, const v1::GetProjectRequest* req, v1::Project* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  Projects* projects = nullptr;
  RETURN_IF_GRPC_ERROR(Store(deps_, &projects));
  ASSIGN_OR_RETURN_GRPC(*resp, projects->Get(deps_.auth->Project(*ctx), req->path()));
  return grpc::Status::OK;
}

grpc::Status ProjectsService::List(grpc::ServerContext* ctx, const v1::ListProjectsRequest*,
                                   v1::ListProjectsResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  Projects* projects = nullptr;
  RETURN_IF_GRPC_ERROR(Store(deps_, &projects));
  ASSIGN_OR_RETURN_GRPC(std::vector<v1::Project> all, projects->List(deps_.auth->Project(*ctx)));
  for (v1::Project& p : all) *resp->add_projects() = std::move(p);
  return grpc::Status::OK;
}

grpc::Status ProjectsService::Update(grpc::ServerContext* ctx, const v1::UpdateProjectRequest* req, v1::Project* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  Projects* projects = nullptr;
  RETURN_IF_GRPC_ERROR(Store(deps_, &projects));
  ASSIGN_OR_RETURN_GRPC(*resp, projects->Update(deps_.auth->Project(*ctx), *req));
  return grpc::Status::OK;
}

grpc::Status ProjectsService::Delete(grpc::ServerContext* ctx, const v1::DeleteProjectRequest* req,
                                     v1::DeleteProjectResponse*) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  Projects* projects = nullptr;
  RETURN_IF_GRPC_ERROR(Store(deps_, &projects));
  return ToGrpcStatus(projects->Delete(deps_.auth->Project(*ctx), req->path()));
}

}  // namespace warren::api
