// The one place where absl::Status becomes grpc::Status (DESIGN.md §2: "the
// only place errors map to gRPC codes"). Codes map one-to-one (absl and gRPC
// share the numbering); the message is kept, with bytes that are not valid
// UTF-8 (gRPC requires UTF-8 messages) escaped as \xNN.
#pragma once

#include <grpcpp/support/status.h>

#include "common/status.h"

namespace warren::api {

grpc::Status ToGrpcStatus(const Status& status);

}  // namespace warren::api
