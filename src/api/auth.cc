#include "api/auth.h"

#include "common/secret.h"

namespace warren::api {

bool IsUnixPeer(const grpc::ServerContext& context) { return context.peer().rfind("unix:", 0) == 0; }

grpc::Status Authorizer::Check(const grpc::ServerContext& context) const {
  if (IsUnixPeer(context)) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (token_.empty() || it == md.end()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "TCP calls need 'authorization: Bearer <token>'");
  }
  if (!SameSecret(std::string_view(it->second.data(), it->second.size()), "Bearer " + token_)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "bad bearer token");
  }
  return grpc::Status::OK;
}

grpc::Status Authorizer::RequireLocal(const grpc::ServerContext& context, const std::string& refusal) {
  if (IsUnixPeer(context)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, refusal);
}

}  // namespace warren::api
