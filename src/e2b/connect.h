// Connect protocol (connectrpc.com/docs/protocol) over HTTP/1.1 with the JSON
// codec, as E2B's SDK speaks it to envd: unary calls are `application/json`
// bodies; server-streaming calls send one enveloped request message
// (`application/connect+json`) and get enveloped messages back, the last one
// flagged end-of-stream and carrying the error, if any.
//
// Envelope: 1 flag byte (0x02 = end of stream), 4 bytes big-endian length,
// then the message.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace warren::e2b {

constexpr unsigned char kEndStreamFlag = 0x02;

// One framed message.
std::string Envelope(const nlohmann::json& message, unsigned char flags = 0);
// The end-of-stream message: `{}` when `status` is OK, else its error.
std::string EndStream(const Status& status);
// The one enveloped message of a server-streaming request body, parsed as
// JSON: InvalidArgument naming what is wrong with the envelope otherwise.
StatusOr<nlohmann::json> FirstMessage(std::string_view body);

// The messages of a client-streaming request body (process.StreamInput) as
// its bytes arrive: Feed() hands each complete message, parsed as a JSON
// object, to `on_message` in order, and stops at the first error (its own:
// InvalidArgument naming what is wrong with an envelope, or the callback's).
// Bytes of a message not yet complete are held (at most one message).
class MessageReader {
 public:
  using OnMessage = std::function<Status(nlohmann::json)>;
  explicit MessageReader(OnMessage on_message) : on_message_(std::move(on_message)) {}
  Status Feed(std::string_view bytes);
  // At the body's end: InvalidArgument when it ends inside a message.
  Status Finish() const;
  uint64_t messages() const { return messages_; }

 private:
  OnMessage on_message_;
  std::string pending_;
  uint64_t messages_ = 0;
};

// Connect's error code name for a status ("not_found", ...).
const char* CodeName(absl::StatusCode code);
// The HTTP status a unary Connect error is sent with.
int HttpStatus(absl::StatusCode code);
// The unary error body {"code", "message"}.
nlohmann::json ErrorJson(const Status& status);

}  // namespace warren::e2b
