// SandboxFusion-compatible HTTP front door of the fncall backend: `POST
// /run_code`, `POST /run_jupyter` (and `GET /v1/ping`), so code-RL pipelines that call
// SandboxFusion (verl, ...) run on warren by changing a URL.
//
// Request JSON: code, language, stdin, compile_timeout, run_timeout (seconds,
// float), memory_limit_MB, files {path: base64}, fetch_files [path], and
// warren's own layers [layer name] (the layers of this call). A request that
// does not fit SandboxFusion's schema (code and language required strings,
// language one of SandboxFusion's, the other fields of their types) is a 422
// with FastAPI's body {"detail": [{"loc": ["body", field...], "msg", "type"}]};
// a body that is not JSON at all is a 400. memory_limit_MB absent or <= 0
// (SandboxFusion's -1) sets no limit of the call's own: the node's maximum.
// compile_result.execution_time is the compile stage's own time, run_result's
// the run's.
// Response JSON: status Success | Failed | SandboxError, message,
// compile_result / run_result (null or {status Finished | Error |
// TimeLimitExceeded, execution_time (s), return_code, stdout, stderr}),
// files {path: base64}. Success = the run finished with return code 0.
// Served with cpp-httplib (Debian libcpp-httplib-dev), plain HTTP: one
// thread per connection in service (128, verl's highest default
// concurrency), more connections wait accepted in the pool's queue, and the
// listen backlog is 4096, so bursts of connects are never dropped or reset.
//
// Who may call (RunCodeOptions): a POST must be `Content-Type:
// application/json` (415 otherwise: a web page can send a cross-origin
// text/plain or form post without the browser asking us first, but not a
// JSON one), carry an expected Host (421 otherwise: a DNS-rebinding page
// names its own domain there) and no foreign Origin (403), and, when a token
// is configured, `Authorization: Bearer <token>` (401 missing, 403 wrong).
// What it may ask (400 with a message naming the field, the value and the
// bound): layers only by name (`kind/name[@version]`, never a path) and only
// from the allowed set; memory_limit_MB and the time-outs at most the node's
// maxima.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "node/fncall_frontend.h"

namespace httplib {
class Server;
}

namespace warren::http {

struct RunCodeOptions {
  // "HOST:PORT" (PORT 0 = any; see RunCodeServer::port()).
  std::string listen;
  // Bearer token required in `Authorization`; "" = none.
  std::string token;
  // Host header names accepted besides localhost, IP literals and the
  // listen host (case-insensitive, without the port).
  std::vector<std::string> allowed_hosts;
  // Layers a request's "layers" may name: an entry "kind/name" allows every
  // version of that name, "kind/name@version" that version only. Requests
  // that name none run on the fncall default layers.
  std::vector<std::string> allowed_layers;
  uint32_t max_memory_mb = 4096;
  double max_timeout_s = 300;  // run_timeout and compile_timeout
};

struct RunCodeReply {
  int http_status = 200;
  nlohmann::json body;
};

// The reply to one request JSON (exposed for tests): 400 with a
// SandboxError body for a request outside `options`' bounds.
RunCodeReply RunCode(node::FnCallFrontend& frontend, const nlohmann::json& request, const RunCodeOptions& options);

// `POST /run_jupyter` as SandboxFusion defines it (RunJupyterRequest:
// cells [str] (required), cell_timeout (s, <= 0: none; default 0),
// total_timeout (s, default 45), kernel "python3", memory_limit_MB, files,
// fetch_files; warren's layers as in /run_code). The cells run in order in
// one python process kept for the request (jupyter_runner.py, an fncall
// python call on the request's layers; why no ipykernel: there), sharing
// their namespace. Answer (RunJupyterResponse): status Success | Failed |
// SandboxError, message, driver (the runner's stage, as a run_result),
// cells [{stdout, stderr, display [mime bundle], error [{ename, evalue,
// traceback}]}], executor_pod_name null, files. A cell's exception is in its
// `error` and later cells still run (Success); a cell over cell_timeout is
// interrupted (TimeoutError in its error) and the rest run; at
// total_timeout the driver is killed: Failed, driver TimeLimitExceeded,
// no cells and no files (SandboxFusion's rule for a driver that did not
// finish). 422 / 400 / 403 as RunCode.
RunCodeReply RunJupyter(node::FnCallFrontend& frontend, const nlohmann::json& request, const RunCodeOptions& options);

// The jupyter runner's python source (jupyter_runner.py, embedded at build time).
const std::string& JupyterRunnerSource();

// The HTTP-level checks (content type, Host, Origin, token) of one POST;
// 0 when it may proceed, else the status to answer with and `why`.
int CheckCaller(const RunCodeOptions& options, const std::string& content_type, const std::string& host,
                const std::string& origin, const std::string& authorization, std::string* why);

class RunCodeServer {
 public:
  ~RunCodeServer();
  static StatusOr<std::unique_ptr<RunCodeServer>> Start(node::FnCallFrontend* frontend, RunCodeOptions options);
  int port() const { return port_; }
  void Stop();

 private:
  RunCodeServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace warren::http
