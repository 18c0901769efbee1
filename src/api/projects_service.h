// warren.v1.Projects: the cluster's projects (api/projects.h), managed on
// behalf of the caller's project (api/auth.h). FAILED_PRECONDITION on a node
// that is not in a cluster (projects live in the cluster's etcd).
//
// Thread-safe.
#pragma once

#include "api/service_deps.h"
#include "warren/v1/project.grpc.pb.h"

namespace warren::api {

class ProjectsService final : public warren::v1::Projects::Service {
 public:
  explicit ProjectsService(ServiceDeps deps) : deps_(deps) {}

  grpc::Status Create(grpc::ServerContext* ctx, const warren::v1::CreateProjectRequest* req,
                      warren::v1::CreateProjectResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const warren::v1::GetProjectRequest* req,
                   warren::v1::Project* resp) override;
  grpc::Status List(grpc::ServerContext* ctx, const warren::v1::ListProjectsRequest* req,
                    warren::v1::ListProjectsResponse* resp) override;
  grpc::Status Update(grpc::ServerContext* ctx, const warren::v1::UpdateProjectRequest* req,
                      warren::v1::Project* resp) override;
  grpc::Status Delete(grpc::ServerContext* ctx, const warren::v1::DeleteProjectRequest* req,
                      warren::v1::DeleteProjectResponse* resp) override;

 private:
  const ServiceDeps deps_;
};

}  // namespace warren::api
