// Errors as values: absl::Status / absl::StatusOr<T> across module
// boundaries, errno kept in the message and in the code. Map to gRPC codes
// only at the service edge (src/api/status_map.h).
#pragma once

#include <cerrno>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace warren {

using absl::Status;
using absl::StatusOr;

// "open(/x): No such file or directory [errno 2]" with a code chosen from
// errno (ENOENT→NotFound, EEXIST→AlreadyExists, EACCES/EPERM→PermissionDenied,
// ENOSPC/EDQUOT/EMFILE/ENFILE/ENOMEM/EAGAIN→ResourceExhausted,
// EINVAL/ENAMETOOLONG/ELOOP/EXDEV/ENOTDIR/EISDIR→InvalidArgument or
// FailedPrecondition, ENOTEMPTY/EBUSY→FailedPrecondition, else Internal).
Status ErrnoToStatus(int err, std::string_view what);

// The errno an ErrnoToStatus() status was made from, 0 if none.
int StatusErrno(const Status& s);

}  // namespace warren

#define WARREN_CONCAT_INNER_(a, b) a##b
#define WARREN_CONCAT_(a, b) WARREN_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)    \
  do {                           \
    ::absl::Status _st = (expr); \
    if (!_st.ok()) return _st;   \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) ASSIGN_OR_RETURN_IMPL_(WARREN_CONCAT_(_sor_, __LINE__), lhs, expr)
// tmp is a name and lhs may be a declaration (`auto x`): neither can be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
