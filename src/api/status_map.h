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

// In a handler returning grpc::Status: `lhs = value` of a StatusOr, or return
// its error mapped by ToGrpcStatus.
// NOLINTBEGIN(bugprone-macro-parentheses): the arguments are a name and a declaration
#define ASSIGN_OR_RETURN_GRPC(lhs, expr) ASSIGN_OR_RETURN_GRPC_IMPL_(WARREN_CONCAT_(_gsor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_GRPC_IMPL_(tmp, lhs, expr)                \
  auto tmp = (expr);                                               \
  if (!tmp.ok()) return ::warren::api::ToGrpcStatus(tmp.status()); \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
// In a handler returning grpc::Status: return `expr` (a grpc::Status) if not OK.
#define RETURN_IF_GRPC_ERROR(expr) \
  do {                             \
    grpc::Status _g = (expr);      \
    if (!_g.ok()) return _g;       \
  } while (0)
