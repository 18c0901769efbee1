#include "api/status_map.h"

namespace warren::api {

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  int code = static_cast<int>(status.code());
  // absl::StatusCode values 1..16 are the gRPC codes; anything else (never
  // produced by absl today) is a bug.
  if (code < 1 || code > 16) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
  return grpc::Status(static_cast<grpc::StatusCode>(code), std::string(status.message()));
}

}  // namespace warren::api
