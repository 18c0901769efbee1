#include "e2b/connect.h"

#include <cstdint>
#include <string>

namespace warren::e2b {

using json = nlohmann::json;

std::string Envelope(const json& message, unsigned char flags) {
  const std::string body = message.dump(-1, ' ', false, json::error_handler_t::replace);
  const auto n = static_cast<uint32_t>(body.size());
  std::string out;
  out.reserve(5 + body.size());
  out.push_back(static_cast<char>(flags));
  out.push_back(static_cast<char>((n >> 24) & 0xff));
  out.push_back(static_cast<char>((n >> 16) & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  out.push_back(static_cast<char>(n & 0xff));
  out += body;
  return out;
}

std::string EndStream(const Status& status) {
  if (status.ok()) return Envelope(json::object(), kEndStreamFlag);
  return Envelope(json{{"error", ErrorJson(status)}}, kEndStreamFlag);
}

namespace {

constexpr size_t kEnvelopeHeader = 5;

// The message length of the envelope header at body[0, 5).
StatusOr<uint32_t> MessageLength(std::string_view body) {
  if ((static_cast<unsigned char>(body[0]) & 0x01) != 0)
    return absl::InvalidArgumentError("Connect stream request: compressed messages are not accepted");
  return (static_cast<uint32_t>(static_cast<unsigned char>(body[1])) << 24) |
         (static_cast<uint32_t>(static_cast<unsigned char>(body[2])) << 16) |
         (static_cast<uint32_t>(static_cast<unsigned char>(body[3])) << 8) |
         static_cast<uint32_t>(static_cast<unsigned char>(body[4]));
}

StatusOr<json> ParseMessage(std::string_view message) {
  json j = json::parse(message, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError("Connect stream request: the message is not a JSON object");
  return j;
}

}  // namespace

StatusOr<json> FirstMessage(std::string_view body) {
  if (body.size() < kEnvelopeHeader) return absl::InvalidArgumentError("Connect stream request: no message envelope");
  ASSIGN_OR_RETURN(const uint32_t n, MessageLength(body));
  if (body.size() - 5 < n) return absl::InvalidArgumentError("Connect stream request: envelope longer than the body");
  if (body.size() - 5 > n)
    return absl::InvalidArgumentError("Connect stream request: " + std::to_string(body.size() - 5 - n) +
                                      " bytes after the request message (a server-streaming call takes one)");
  return ParseMessage(body.substr(5, n));
}

Status MessageReader::Feed(std::string_view bytes) {
  pending_.append(bytes);
  size_t at = 0;
  Status s;
  while (s.ok() && pending_.size() - at >= kEnvelopeHeader) {
    const std::string_view rest = std::string_view(pending_).substr(at);
    StatusOr<uint32_t> n = MessageLength(rest);
    if (!n.ok()) {
      s = n.status();
      break;
    }
    if (rest.size() - kEnvelopeHeader < *n) break;  // the message is not all here yet
    if ((static_cast<unsigned char>(rest[0]) & kEndStreamFlag) != 0) {
      s = absl::InvalidArgumentError("Connect stream request: an end-of-stream flag in a request message");
      break;
    }
    StatusOr<json> msg = ParseMessage(rest.substr(kEnvelopeHeader, *n));
    at += kEnvelopeHeader + *n;
    ++messages_;
    s = msg.ok() ? on_message_(*std::move(msg)) : msg.status();
  }
  pending_.erase(0, at);
  return s;
}

Status MessageReader::Finish() const {
  if (pending_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError("Connect stream request: the body ends inside a message (" +
                                    std::to_string(pending_.size()) + " bytes of it)");
}

const char* CodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kCancelled: return "canceled";
    case absl::StatusCode::kInvalidArgument: return "invalid_argument";
    case absl::StatusCode::kDeadlineExceeded: return "deadline_exceeded";
    case absl::StatusCode::kNotFound: return "not_found";
    case absl::StatusCode::kAlreadyExists: return "already_exists";
    case absl::StatusCode::kPermissionDenied: return "permission_denied";
    case absl::StatusCode::kResourceExhausted: return "resource_exhausted";
    case absl::StatusCode::kFailedPrecondition: return "failed_precondition";
    case absl::StatusCode::kAborted: return "aborted";
    case absl::StatusCode::kOutOfRange: return "out_of_range";
    case absl::StatusCode::kUnimplemented: return "unimplemented";
    case absl::StatusCode::kInternal: return "internal";
    case absl::StatusCode::kUnavailable: return "unavailable";
    case absl::StatusCode::kDataLoss: return "data_loss";
    case absl::StatusCode::kUnauthenticated: return "unauthenticated";
    default: return "unknown";
  }
}

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kCancelled: return 499;
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists: return 409;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kFailedPrecondition: return 400;
    case absl::StatusCode::kAborted: return 409;
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kUnauthenticated: return 401;
    default: return 500;
  }
}

json ErrorJson(const Status& status) {
  return json{{"code", CodeName(status.code())}, {"message", std::string(status.message())}};
}

}  // namespace warren::e2b
