// The vm backend's QMP (QEMU Machine Protocol) client: microvm::Qmp (the
// protocol, runtime/microvm/qemu.h) shared between threads: calls are
// serialized, each bounded by its own timeout, and a broken connection fails
// every later call with the status that broke it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "runtime/microvm/qemu.h"

namespace warren::runtime::vm {

class QmpClient {
 public:
  using Clock = microvm::Qmp::Clock;

  // Connects (retrying while QEMU has not accepted yet), reads the
  // greeting and negotiates capabilities, until `deadline`.
  static StatusOr<std::unique_ptr<QmpClient>> Connect(const std::string& path, Clock::time_point deadline);

  // Runs `execute` with `arguments_json` ("" for none) and returns the
  // "return" member as JSON text; an "error" answer is InternalError naming
  // the command and QEMU's description. DeadlineExceeded past `timeout`.
  // `pass_fd` (>= 0) goes with the command as SCM_RIGHTS (add-fd, getfd).
  StatusOr<std::string> Execute(const std::string& execute, const std::string& arguments_json,
                                std::chrono::milliseconds timeout, int pass_fd = -1);

  // Runs `f` on the protocol itself with the calls serialized (the
  // migrations of microvm/qemu.h: MigrateToFd, MigrateFromFd); an error of
  // `f` other than InternalError breaks the client as Execute's do. The
  // commands `f` sends without a deadline of their own are bounded by
  // Connect's `deadline`.
  Status With(const std::function<Status(microvm::Qmp&)>& f);

 private:
  explicit QmpClient(microvm::Qmp qmp) : qmp_(std::move(qmp)) {}

  std::mutex mu_;
  microvm::Qmp qmp_;
  Status broken_;
};

}  // namespace warren::runtime::vm
