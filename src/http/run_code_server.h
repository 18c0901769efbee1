// SandboxFusion-compatible HTTP front door of the fncall backend: `POST
// /run_code` (and `GET /v1/ping`), so code-RL pipelines that call
// SandboxFusion (verl, ...) run on warren by changing a URL.
//
// Request JSON: code, language, stdin, compile_timeout, run_timeout (seconds,
// float), memory_limit_MB, files {path: base64}, fetch_files [path].
// Response JSON: status Success | Failed | SandboxError, message,
// compile_result / run_result (null or {status Finished | Error |
// TimeLimitExceeded, execution_time (s), return_code, stdout, stderr}),
// files {path: base64}. Success = the run finished with return code 0.
// Served with cpp-httplib (Debian libcpp-httplib-dev). Listens on plain HTTP:
// bind it to loopback or a trusted network.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "api/fncall_service.h"
#include "common/status.h"

namespace httplib {
class Server;
}

namespace warren::http {

// The response JSON for one request JSON (exposed for tests).
nlohmann::json RunCode(api::FnCallFrontend& frontend, const nlohmann::json& request);

class RunCodeServer {
 public:
  ~RunCodeServer();
  // listen: "HOST:PORT" (PORT 0 = any; see port()).
  static StatusOr<std::unique_ptr<RunCodeServer>> Start(api::FnCallFrontend* frontend, const std::string& listen);
  int port() const { return port_; }
  void Stop();

 private:
  RunCodeServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace warren::http
