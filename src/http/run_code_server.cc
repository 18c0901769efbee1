#include "http/run_code_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/secret.h"
#include "image/layer_store.h"

namespace warren::http {
namespace {

using json = nlohmann::json;

constexpr int kWorkers = 128;         // verl's default concurrency is 64-128
constexpr int kListenBacklog = 4096;  // capped by net.core.somaxconn

// A time-out field in seconds: the default when absent, not a number or not
// positive (SandboxFusion's clients send -1 for "default"), else at most
// `max` (an error naming the field otherwise; the default itself is capped).
StatusOr<std::chrono::milliseconds> Seconds(const json& req, const char* key, double dflt, double max) {
  dflt = std::min(dflt, max);
  double s = dflt;
  if (req.contains(key) && req[key].is_number()) s = req[key].get<double>();
  if (!(s > 0) || !std::isfinite(s)) s = dflt;
  if (s > max) {
    return absl::InvalidArgumentError(absl::StrCat(key, " ", s, " s is above this node's maximum of ", max, " s"));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

// Whether `ref` is a layer reference (never a path) within `allowed`.
Status CheckLayer(const std::string& ref, size_t index, const std::vector<std::string>& allowed) {
  const std::string field = "layers[" + std::to_string(index) + "]";
  StatusOr<image::LayerName> name = image::LayerName::Parse(ref);
  if (!name.ok()) {
    return absl::InvalidArgumentError(
        field + " \"" + absl::CHexEscape(ref) +
        "\" is not a layer name kind/name[@version]: " + std::string(name.status().message()));
  }
  for (const std::string& a : allowed) {
    StatusOr<image::LayerName> ok = image::LayerName::Parse(a);
    if (!ok.ok()) continue;  // a directory among --fncall-layers: a default only
    if (ok->kind == name->kind && ok->name == name->name && (ok->version.empty() || ok->version == name->version))
      return absl::OkStatus();
  }
  std::string list;
  for (const std::string& a : allowed) {
    if (!image::LayerName::Parse(a).ok()) continue;
    absl::StrAppend(&list, list.empty() ? "" : ", ", a);
  }
  return absl::PermissionDeniedError(field + " \"" + ref + "\" is not among this node's /run_code layers (" +
                                     (list.empty() ? "none" : list) + "; warrend --run-code-layers)");
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The host part of a Host header or an Origin's authority ("name",
// "name:port", "[v6]:port"), lower-cased; "" when malformed.
std::string HostPart(const std::string& authority) {
  if (authority.empty()) return "";
  if (authority[0] == '[') {
    size_t close = authority.find(']');
    if (close == std::string::npos) return "";
    return Lower(authority.substr(0, close + 1));
  }
  size_t colon = authority.find(':');
  if (colon != authority.rfind(':')) return "";  // an unbracketed v6 literal is not a Host
  return Lower(authority.substr(0, colon));
}

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[16];
  if (inet_pton(AF_INET, host.c_str(), buf) == 1) return true;
  return host.size() > 2 && host.front() == '[' && host.back() == ']' &&
         inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) == 1;
}

// A Host a browser can only send for a page of this very server: an IP
// literal (a DNS-rebinding page has a name of its own), localhost, the
// listen host, or a configured name.
bool AllowedHost(const RunCodeOptions& o, const std::string& host) {
  if (host.empty()) return false;
  if (host == "localhost" || IsIpLiteral(host)) return true;
  if (host == HostPart(o.listen)) return true;
  for (const std::string& h : o.allowed_hosts) {
    if (host == Lower(h)) return true;
  }
  return false;
}

// Text for JSON: invalid UTF-8 replaced (JSON strings must be valid UTF-8).
json Text(const std::string& bytes) {
  return json(json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace)));
}

// One stage as SandboxFusion reports it: return_code null at the time-out,
// and -N for a process ended by signal N (SandboxFusion's is Python's
// Popen.returncode of the program bash exec'd), else its exit code.
json StageJson(const runtime::ExecOutcome& o) {
  json rc = o.timed_out ? json(nullptr) : json(o.signal != 0 ? -o.signal : o.exit_code);
  return json{{"status", o.timed_out ? "TimeLimitExceeded" : "Finished"},
              {"execution_time", std::chrono::duration<double>(o.duration).count()},
              {"return_code", rc},
              {"stdout", Text(o.stdout_data)},
              {"stderr", Text(o.stderr_data)}};
}

json Error(const std::string& msg) {
  return json{{"status", "SandboxError"},     {"message", msg},
              {"compile_result", nullptr},    {"run_result", nullptr},
              {"executor_pod_name", nullptr}, {"files", json::object()}};
}

// SandboxFusion's Language literal (sandbox_fusion.models.Language) plus
// warren's aliases ("python3", "c++", "c", "javascript", "js"). Which of
// them this node runs is the fncall backend's business (SandboxError
// otherwise: runtime::kFnCallLanguages).
constexpr const char* kLanguages[] = {
    "python",     "python2", "cpp",     "nodejs",        "go",   "go_test",    "java",       "php",  "csharp", "bash",
    "typescript", "sql",     "rust",    "cuda",          "lua",  "R",          "perl",       "D_ut", "ruby",   "scala",
    "julia",      "pytest",  "junit",   "kotlin_script", "jest", "verilog",    "python_gpu", "lean", "swift",  "racket",
    "gtest",      "react",   "python3", "c++",           "c",    "javascript", "js"};

// A FastAPI 422 body {"detail": [{loc, msg, type}]} for one field.
json Detail(const json& loc, const std::string& msg, const std::string& type) {
  json l = json::array({"body"});
  for (const auto& x : loc) l.push_back(x);
  return json{{"detail", json::array({json{{"loc", l}, {"msg", msg}, {"type", type}}})}};
}

// The fields RunCodeRequest and RunJupyterRequest share (memory_limit_MB,
// files, fetch_files); `null_files`: a file's content may be null
// (RunCodeRequest's Dict[str, Optional[str]]).
std::optional<json> SharedSchemaError(const json& req, bool null_files);

// SandboxFusion's RunCodeRequest schema (a FastAPI/pydantic model there):
// the first field that does not fit, as a 422 body {"detail": [{loc, msg,
// type}]}; nullopt when the request fits.
std::optional<json> SchemaError(const json& req) {
  auto detail = Detail;
  if (!req.is_object()) return detail(json::array(), "Input should be a valid dictionary", "model_attributes_type");
  for (const char* k : {"code", "language"}) {
    if (!req.contains(k)) return detail(json::array({k}), "Field required", "missing");
    if (!req[k].is_string()) return detail(json::array({k}), "Input should be a valid string", "string_type");
  }
  const std::string lang = req["language"].get<std::string>();
  if (std::find(std::begin(kLanguages), std::end(kLanguages), lang) == std::end(kLanguages))
    return detail(json::array({"language"}), "Input should be one of SandboxFusion's languages", "literal_error");
  for (const char* k : {"compile_timeout", "run_timeout"}) {
    if (req.contains(k) && !req[k].is_number())
      return detail(json::array({k}), "Input should be a valid number", "float_type");
  }
  if (req.contains("stdin") && !req["stdin"].is_null() && !req["stdin"].is_string())
    return detail(json::array({"stdin"}), "Input should be a valid string", "string_type");
  return SharedSchemaError(req, true);
}

// SandboxFusion's RunJupyterRequest schema (sandbox/runners/types.py):
// cells a list of strings (required), cell_timeout/total_timeout numbers,
// kernel the literal "python3", memory_limit_MB, files, fetch_files.
std::optional<json> JupyterSchemaError(const json& req) {
  auto detail = Detail;
  if (!req.is_object()) return detail(json::array(), "Input should be a valid dictionary", "model_attributes_type");
  if (!req.contains("cells")) return detail(json::array({"cells"}), "Field required", "missing");
  if (!req["cells"].is_array()) return detail(json::array({"cells"}), "Input should be a valid list", "list_type");
  for (size_t i = 0; i < req["cells"].size(); ++i) {
    if (!req["cells"][i].is_string())
      return detail(json::array({"cells", i}), "Input should be a valid string", "string_type");
  }
  for (const char* k : {"cell_timeout", "total_timeout"}) {
    if (req.contains(k) && !req[k].is_number())
      return detail(json::array({k}), "Input should be a valid number", "float_type");
  }
  if (req.contains("kernel") && req["kernel"] != "python3")
    return detail(json::array({"kernel"}), "Input should be 'python3'", "literal_error");
  return SharedSchemaError(req, false);
}

std::optional<json> SharedSchemaError(const json& req, bool null_files) {
  auto detail = Detail;
  if (req.contains("memory_limit_MB") && !req["memory_limit_MB"].is_number_integer())
    return detail(json::array({"memory_limit_MB"}), "Input should be a valid integer", "int_type");
  if (req.contains("files")) {
    if (!req["files"].is_object())
      return detail(json::array({"files"}), "Input should be a valid dictionary", "dict_type");
    for (const auto& [path, v] : req["files"].items()) {
      if (!(null_files && v.is_null()) && !v.is_string())
        return detail(json::array({"files", path}), "Input should be a valid string", "string_type");
    }
  }
  if (req.contains("fetch_files")) {
    if (!req["fetch_files"].is_array())
      return detail(json::array({"fetch_files"}), "Input should be a valid list", "list_type");
    for (size_t i = 0; i < req["fetch_files"].size(); ++i) {
      if (!req["fetch_files"][i].is_string())
        return detail(json::array({"fetch_files", i}), "Input should be a valid string", "string_type");
    }
  }
  return std::nullopt;
}

}  // namespace

namespace {

RunCodeReply Bad(const Status& s) {
  return RunCodeReply{s.code() == absl::StatusCode::kPermissionDenied ? 403 : 400, Error(std::string(s.message()))};
}

// The fields /run_code and /run_jupyter share (memory_limit_MB, files,
// fetch_files, layers) into `q` and `layers`; a 400/403 reply when one is
// outside `options`' bounds.
std::optional<RunCodeReply> SharedFields(const json& req, const RunCodeOptions& options, runtime::FnCallRequest& q,
                                         std::vector<std::string>& layers) {
  auto bad = Bad;
  // SandboxFusion: memory_limit_MB > 0 limits the call; absent, -1 (its
  // default) or any other value <= 0 sets no limit of the call's own: here
  // the node's maximum for /run_code.
  q.memory_mb = options.max_memory_mb;
  if (req.contains("memory_limit_MB") && req["memory_limit_MB"].is_number_unsigned() &&
      req["memory_limit_MB"].get<uint64_t>() > 0) {
    const uint64_t mb = req["memory_limit_MB"].get<uint64_t>();
    if (mb > options.max_memory_mb) {
      return bad(absl::InvalidArgumentError(
          absl::StrCat("memory_limit_MB ", mb, " is above this node's maximum of ", options.max_memory_mb, " MB")));
    }
    q.memory_mb = static_cast<uint32_t>(mb);
  }
  if (req.contains("files")) {
    for (const auto& [path, b64] : req["files"].items()) {
      if (b64.is_null()) continue;
      std::string data;
      if (!absl::Base64Unescape(b64.get<std::string>(), &data))
        return bad(absl::InvalidArgumentError("files['" + path + "'] is not base64"));
      q.files[path] = data;
    }
  }
  if (req.contains("fetch_files")) {
    for (const auto& f : req["fetch_files"]) q.fetch_files.push_back(f.get<std::string>());
  }
  if (req.contains("layers") && !req["layers"].is_null()) {
    if (!req["layers"].is_array()) return bad(absl::InvalidArgumentError("layers must be an array of layer names"));
    for (const auto& l : req["layers"]) {
      if (!l.is_string()) return bad(absl::InvalidArgumentError("layers must be an array of layer names"));
      const std::string ref = l.get<std::string>();
      if (Status s = CheckLayer(ref, layers.size(), options.allowed_layers); !s.ok()) return bad(s);
      layers.push_back(ref);
    }
  }
  return std::nullopt;
}

}  // namespace

RunCodeReply RunCode(node::FnCallFrontend& frontend, const json& req, const RunCodeOptions& options) {
  if (std::optional<json> e = SchemaError(req)) return RunCodeReply{422, std::move(*e)};
  runtime::FnCallRequest q;
  q.language = runtime::CanonicalFnCallLanguage(req["language"].get<std::string>());
  q.code = req["code"].get<std::string>();
  if (req.contains("stdin") && req["stdin"].is_string()) q.stdin_data = req["stdin"].get<std::string>();
  StatusOr<std::chrono::milliseconds> run = Seconds(req, "run_timeout", 10, options.max_timeout_s);
  if (!run.ok()) return Bad(run.status());
  StatusOr<std::chrono::milliseconds> compile = Seconds(req, "compile_timeout", 10, options.max_timeout_s);
  if (!compile.ok()) return Bad(compile.status());
  q.run_timeout = *run;
  q.compile_timeout = *compile;
  std::vector<std::string> layers;
  if (std::optional<RunCodeReply> refused = SharedFields(req, options, q, layers)) return std::move(*refused);
  StatusOr<runtime::FnCallResult> called = frontend.Run(layers, q);
  if (!called.ok()) return {200, Error(called.status().ToString())};
  const runtime::FnCallResult& r = *called;
  json out = {{"status", "Failed"},           {"message", ""},
              {"compile_result", nullptr},    {"run_result", nullptr},
              {"executor_pod_name", nullptr}, {"files", json::object()}};
  if (r.compile) out["compile_result"] = StageJson(*r.compile);
  if (r.run) out["run_result"] = StageJson(*r.run);
  for (const auto& [path, data] : r.files) out["files"][path] = absl::Base64Escape(data);
  if (!r.sandbox_error.empty()) {
    out["status"] = "SandboxError";
    out["message"] = r.sandbox_error;
  } else if (r.run && !r.run->timed_out && r.run->exit_code == 0) {
    out["status"] = "Success";
  }  // else Failed with message "", as SandboxFusion's parse_run_status answers
  return {200, out};
}

RunCodeReply RunJupyter(node::FnCallFrontend& frontend, const json& req, const RunCodeOptions& options) {
  if (std::optional<json> e = JupyterSchemaError(req)) return RunCodeReply{422, std::move(*e)};
  // The runner's answer, in the call's /tmp; fetched with the caller's files.
  static constexpr const char* kOut = ".warren-jupyter-out.json";
  runtime::FnCallRequest q;
  q.language = "python";
  q.code = JupyterRunnerSource();
  StatusOr<std::chrono::milliseconds> total = Seconds(req, "total_timeout", 45, options.max_timeout_s);
  if (!total.ok()) return Bad(total.status());
  double cell_s = 0;
  if (req.contains("cell_timeout") && req["cell_timeout"].is_number()) cell_s = req["cell_timeout"].get<double>();
  if (!(cell_s > 0) || !std::isfinite(cell_s)) cell_s = 0;  // SandboxFusion's 0: no limit per cell
  q.run_timeout = *total;
  q.stdin_data = json{{"cells", req["cells"]}, {"cell_timeout", cell_s}, {"out", kOut}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
  std::vector<std::string> layers;
  if (std::optional<RunCodeReply> refused = SharedFields(req, options, q, layers)) return std::move(*refused);
  if (std::find(q.fetch_files.begin(), q.fetch_files.end(), kOut) != q.fetch_files.end())
    return Bad(absl::InvalidArgumentError(absl::StrCat("fetch_files may not name ", kOut, " (warren's own)")));
  if (q.files.count(kOut) != 0)
    return Bad(absl::InvalidArgumentError(absl::StrCat("files may not name ", kOut, " (warren's own)")));
  q.fetch_files.push_back(kOut);
  StatusOr<runtime::FnCallResult> called = frontend.Run(layers, q);
  json out = {{"status", "Failed"},           {"message", ""},          {"driver", nullptr}, {"cells", json::array()},
              {"executor_pod_name", nullptr}, {"files", json::object()}};
  if (!called.ok()) {
    out["status"] = "SandboxError";
    out["message"] = called.status().ToString();
    return {200, out};
  }
  runtime::FnCallResult& r = *called;
  if (!r.sandbox_error.empty()) {
    out["status"] = "SandboxError";
    out["message"] = r.sandbox_error;
    return {200, out};
  }
  if (r.run) out["driver"] = StageJson(*r.run);
  // As SandboxFusion: a driver that did not finish (total_timeout) or left
  // no answer is Failed, with no cells and no files.
  auto answer = r.files.find(kOut);
  if (!r.run || r.run->timed_out || answer == r.files.end()) return {200, out};
  const json cells = json::parse(answer->second, nullptr, false);
  if (cells.is_discarded() || !cells.contains("cells") || !cells["cells"].is_array()) return {200, out};
  r.files.erase(answer);
  out["status"] = "Success";
  out["cells"] = cells["cells"];
  for (const auto& [path, data] : r.files) out["files"][path] = absl::Base64Escape(data);
  return {200, out};
}

int CheckCaller(const RunCodeOptions& options, const std::string& content_type, const std::string& host,
                const std::string& origin, const std::string& authorization, std::string* why) {
  // Without a Host (HTTP/1.0) the caller is no browser.
  if (!host.empty() && !AllowedHost(options, HostPart(host))) {
    *why = "Host \"" + host + "\" is not this server's (warrend --http-allowed-hosts)";
    return 421;
  }
  // Browsers send Origin on every cross-origin POST; other clients need none.
  if (!origin.empty()) {
    const size_t scheme = origin.find("://");
    const std::string oh = scheme == std::string::npos ? "" : HostPart(origin.substr(scheme + 3));
    if (!AllowedHost(options, oh)) {
      *why = "Origin \"" + origin + "\" may not call /run_code";
      return 403;
    }
  }
  if (!options.token.empty()) {
    if (authorization.empty()) {
      *why = "/run_code needs 'Authorization: Bearer <token>'";
      return 401;
    }
    if (!SameSecret(authorization, "Bearer " + options.token)) {
      *why = "bad bearer token";
      return 403;
    }
  }
  std::string media = content_type.substr(0, content_type.find(';'));
  media = Lower(std::string(absl::StripAsciiWhitespace(media)));
  if (media != "application/json") {
    *why = "Content-Type must be application/json, got \"" + content_type + "\"";
    return 415;
  }
  return 0;
}

RunCodeServer::~RunCodeServer() { Stop(); }

void RunCodeServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

StatusOr<std::unique_ptr<RunCodeServer>> RunCodeServer::Start(node::FnCallFrontend* frontend, RunCodeOptions options) {
  const std::string listen = options.listen;
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError("--http-listen wants HOST:PORT, got " + listen);
  std::string host = listen.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(listen.substr(colon + 1));
  } catch (const std::exception&) {
    return absl::InvalidArgumentError("--http-listen: bad port in " + listen);
  }
  if (!(options.max_timeout_s > 0) || !std::isfinite(options.max_timeout_s) || options.max_timeout_s > 86400)
    return absl::InvalidArgumentError("--run-code-max-timeout-s must be in (0, 86400]");
  if (options.max_memory_mb == 0) return absl::InvalidArgumentError("--run-code-max-memory-mb must be > 0");
  for (size_t i = 0; i < options.allowed_layers.size(); ++i) {
    const std::string& a = options.allowed_layers[i];
    if (!a.empty() && a[0] == '/') continue;  // a directory default of --fncall-layers
    if (StatusOr<image::LayerName> n = image::LayerName::Parse(a); !n.ok())
      return absl::InvalidArgumentError("--run-code-layers: " + std::string(n.status().message()));
  }
  std::unique_ptr<RunCodeServer> s(new RunCodeServer());
  s->server_ = std::make_unique<httplib::Server>();
  // One thread per connection being served (blocked in the call); accepted
  // connections beyond that wait in the pool's queue, never refused.
  s->server_->new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  // An answer goes out in several small writes (status line and headers,
  // body): with Nagle on, each after the first waits for the client's
  // delayed ACK (~40 ms on Linux) on a keep-alive connection.
  s->server_->set_tcp_nodelay(true);
  // cpp-httplib listens with a backlog of 5 (compiled into Debian's
  // library): a burst of verl's 64-128 concurrent connects overflows it and
  // the kernel drops or resets the excess. The socket is taken here (the
  // option hook runs before bind) and re-listened with kListenBacklog below
  // (listen(2) on a listening socket only changes its backlog).
  auto listen_fd = std::make_shared<int>(-1);
  s->server_->set_socket_options([listen_fd](int sock) {
    int yes = 1;
    (void)::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    *listen_fd = sock;
  });
  s->server_->Get("/v1/ping", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("\"pong\"", "application/json");
  });
  auto opts = std::make_shared<const RunCodeOptions>(std::move(options));
  auto handler = [frontend, opts](const httplib::Request& req, httplib::Response& res) {
    std::string why;
    const int refused = CheckCaller(*opts, req.get_header_value("Content-Type"), req.get_header_value("Host"),
                                    req.get_header_value("Origin"), req.get_header_value("Authorization"), &why);
    if (refused == 401) res.set_header("WWW-Authenticate", "Bearer");
    const RunCodeReply reply = [&] {
      if (refused != 0) return RunCodeReply{refused, Error(why)};
      const json in = json::parse(req.body, nullptr, false);
      if (in.is_discarded()) return RunCodeReply{400, Error("request body is not JSON")};
      return RunCode(*frontend, in, *opts);
    }();
    res.status = reply.http_status;
    res.set_content(reply.body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  };
  s->server_->Post("/run_code", handler);
  s->server_->Post("/v1/run_code", handler);
  auto jupyter = [frontend, opts](const httplib::Request& req, httplib::Response& res) {
    std::string why;
    const int refused = CheckCaller(*opts, req.get_header_value("Content-Type"), req.get_header_value("Host"),
                                    req.get_header_value("Origin"), req.get_header_value("Authorization"), &why);
    if (refused == 401) res.set_header("WWW-Authenticate", "Bearer");
    const RunCodeReply reply = [&] {
      if (refused != 0) return RunCodeReply{refused, Error(why)};
      const json in = json::parse(req.body, nullptr, false);
      if (in.is_discarded()) return RunCodeReply{400, Error("request body is not JSON")};
      return RunJupyter(*frontend, in, *opts);
    }();
    res.status = reply.http_status;
    res.set_content(reply.body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  };
  s->server_->Post("/run_jupyter", jupyter);
  s->server_->Post("/v1/run_jupyter", jupyter);
  if (port == 0) {
    port = s->server_->bind_to_any_port(host);
    if (port < 0) return absl::UnavailableError("cannot bind HTTP " + listen);
  } else if (!s->server_->bind_to_port(host, port)) {
    return absl::UnavailableError("cannot bind HTTP " + listen);
  }
  if (*listen_fd < 0 || ::listen(*listen_fd, kListenBacklog) != 0)
    return ErrnoToStatus(*listen_fd < 0 ? EBADF : errno, "listen(HTTP " + listen + ", backlog)");
  s->port_ = port;
  httplib::Server* raw = s->server_.get();
  s->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return s;
}

}  // namespace warren::http
