#include "api/auth.h"

#include "api/projects.h"
#include "common/secret.h"

namespace warren::api {

bool IsUnixPeer(const grpc::ServerContext& context) { return context.peer().rfind("unix:", 0) == 0; }

grpc::Status Authorizer::Check(const grpc::ServerContext& context) const {
  if (IsUnixPeer(context)) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if ((token_.empty() && projects_ == nullptr) || it == md.end()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "TCP calls need 'authorization: Bearer <token>'");
  }
  const std::string_view got(it->second.data(), it->second.size());
  if (!token_.empty() && SameSecret(got, "Bearer " + token_)) return grpc::Status::OK;
  if (projects_ != nullptr && got.substr(0, 7) == "Bearer " && projects_->ProjectOfToken(got.substr(7))) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "bad bearer token");
}

std::string Authorizer::Project(const grpc::ServerContext& context) const {
  return CallerProject(context, token_, projects_);
}

grpc::Status Authorizer::RequireLocal(const grpc::ServerContext& context, const std::string& refusal) {
  if (IsUnixPeer(context)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, refusal);
}

}  // namespace warren::api
