#include "common/status.h"

#include <cstring>

#include "absl/strings/cord.h"

namespace warren {
namespace {
constexpr char kErrnoPayload[] = "warren.errno";

absl::StatusCode CodeFor(int err) {
  switch (err) {
    case ENOENT:
    case ESRCH: return absl::StatusCode::kNotFound;
    case EEXIST: return absl::StatusCode::kAlreadyExists;
    case EACCES:
    case EPERM:
    case EROFS: return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case EAGAIN:
    case EFBIG: return absl::StatusCode::kResourceExhausted;
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
    case EXDEV:
    case ENOTDIR:
    case EISDIR: return absl::StatusCode::kInvalidArgument;
    case ENOTEMPTY:
    case EBUSY: return absl::StatusCode::kFailedPrecondition;
    case ETIMEDOUT: return absl::StatusCode::kDeadlineExceeded;
    default: return absl::StatusCode::kInternal;
  }
}
}  // namespace

Status ErrnoToStatus(int err, std::string_view what) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  msg += " [errno " + std::to_string(err) + "]";
  Status s(CodeFor(err), msg);
  s.SetPayload(kErrnoPayload, absl::Cord(std::to_string(err)));
  return s;
}

int StatusErrno(const Status& s) {
  auto p = s.GetPayload(kErrnoPayload);
  if (!p) return 0;
  return std::atoi(std::string(*p).c_str());
}

}  // namespace warren
