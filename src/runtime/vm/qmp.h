// A QMP (QEMU Machine Protocol) client on a unix socket: one command at a
// time, answers matched by their "return"/"error" member, events between
// them skipped. Every wait is bounded by the caller's timeout; a broken
// connection fails every later call with Unavailable. Thread-safe (calls
// are serialized).
#pragma once

#include <chrono>
#include <mutex>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::runtime::vm {

class QmpClient {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects (retrying while QEMU has not accepted yet), reads the
  // greeting and negotiates capabilities, until `deadline`.
  static StatusOr<std::unique_ptr<QmpClient>> Connect(const std::string& path, Clock::time_point deadline);

  // Runs `execute` with `arguments_json` ("" for none) and returns the
  // "return" member as JSON text; an "error" answer is InternalError naming
  // the command and QEMU's description. DeadlineExceeded past `timeout`.
  // `pass_fd` (>= 0) goes with the command as SCM_RIGHTS (add-fd, getfd).
  StatusOr<std::string> Execute(const std::string& execute, const std::string& arguments_json,
                                std::chrono::milliseconds timeout, int pass_fd = -1);

 private:
  explicit QmpClient(UniqueFd fd) : fd_(std::move(fd)) {}
  StatusOr<std::string> ReadLine(Clock::time_point deadline);
  StatusOr<std::string> Roundtrip(const std::string& line, const std::string& what, Clock::time_point deadline,
                                  int pass_fd = -1);

  std::mutex mu_;
  UniqueFd fd_;
  std::string buf_;
  Status broken_;
};

}  // namespace warren::runtime::vm
