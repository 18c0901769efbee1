#include "http/run_code_server.h"

#include <httplib.h>

#include <cmath>

#include "absl/strings/escaping.h"

namespace warren::http {
namespace {

using json = nlohmann::json;

std::chrono::milliseconds Seconds(const json& req, const char* key, double dflt) {
  double s = dflt;
  if (req.contains(key) && req[key].is_number()) s = req[key].get<double>();
  if (!(s > 0) || !std::isfinite(s)) s = dflt;
  return std::chrono::milliseconds(static_cast<int64_t>(std::min(s, 3600.0) * 1000));
}

// Text for JSON: invalid UTF-8 replaced (JSON strings must be valid UTF-8).
json Text(const std::string& bytes) {
  return json(json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace)));
}

json StageJson(const runtime::ExecOutcome& o) {
  return json{{"status", o.timed_out ? "TimeLimitExceeded" : "Finished"},
              {"execution_time", std::chrono::duration<double>(o.duration).count()},
              {"return_code", o.timed_out ? json(nullptr) : json(o.exit_code)},
              {"stdout", Text(o.stdout_data)},
              {"stderr", Text(o.stderr_data)}};
}

json Error(const std::string& msg) {
  return json{{"status", "SandboxError"}, {"message", msg}, {"compile_result", nullptr},
              {"run_result", nullptr}, {"executor_pod_name", nullptr}, {"files", json::object()}};
}

}  // namespace

json RunCode(api::FnCallFrontend& frontend, const json& req) {
  if (!req.is_object() || !req.contains("code") || !req["code"].is_string())
    return Error("request must be a JSON object with a string 'code'");
  runtime::FnCallRequest q;
  q.language = req.value("language", std::string("python"));
  if (q.language == "python3") q.language = "python";
  if (q.language == "c++") q.language = "cpp";
  q.code = req["code"].get<std::string>();
  if (req.contains("stdin") && req["stdin"].is_string()) q.stdin_data = req["stdin"].get<std::string>();
  q.run_timeout = Seconds(req, "run_timeout", 10);
  q.compile_timeout = Seconds(req, "compile_timeout", 10);
  if (req.contains("memory_limit_MB") && req["memory_limit_MB"].is_number_unsigned())
    q.memory_mb = req["memory_limit_MB"].get<uint32_t>();
  if (req.contains("files") && req["files"].is_object()) {
    for (const auto& [path, b64] : req["files"].items()) {
      std::string data;
      if (!b64.is_string() || !absl::Base64Unescape(b64.get<std::string>(), &data))
        return Error("files['" + path + "'] is not base64");
      q.files[path] = data;
    }
  }
  if (req.contains("fetch_files") && req["fetch_files"].is_array()) {
    for (const auto& f : req["fetch_files"]) {
      if (f.is_string()) q.fetch_files.push_back(f.get<std::string>());
    }
  }
  std::vector<std::string> layers;
  if (req.contains("layers") && req["layers"].is_array()) {
    for (const auto& l : req["layers"]) {
      if (l.is_string()) layers.push_back(l.get<std::string>());
    }
  }
  StatusOr<runtime::FnCallResult> r = frontend.Run(layers, q);
  if (!r.ok()) return Error(r.status().ToString());
  json out = {{"status", "Failed"}, {"message", ""}, {"compile_result", nullptr},
              {"run_result", nullptr}, {"executor_pod_name", nullptr}, {"files", json::object()}};
  if (r->compile) out["compile_result"] = StageJson(*r->compile);
  if (r->run) out["run_result"] = StageJson(*r->run);
  for (const auto& [path, data] : r->files) out["files"][path] = absl::Base64Escape(data);
  if (!r->sandbox_error.empty()) {
    out["status"] = "SandboxError";
    out["message"] = r->sandbox_error;
  } else if (r->run && !r->run->timed_out && r->run->exit_code == 0) {
    out["status"] = "Success";
  } else if (r->compile && (r->compile->timed_out || r->compile->exit_code != 0)) {
    out["message"] = "compilation failed";
  }
  return out;
}

RunCodeServer::~RunCodeServer() { Stop(); }

void RunCodeServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

StatusOr<std::unique_ptr<RunCodeServer>> RunCodeServer::Start(api::FnCallFrontend* frontend,
                                                               const std::string& listen) {
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError("--http-listen wants HOST:PORT, got " + listen);
  std::string host = listen.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(listen.substr(colon + 1));
  } catch (const std::exception&) {
    return absl::InvalidArgumentError("--http-listen: bad port in " + listen);
  }
  std::unique_ptr<RunCodeServer> s(new RunCodeServer());
  s->server_ = std::make_unique<httplib::Server>();
  s->server_->new_task_queue = [] { return new httplib::ThreadPool(64); };
  s->server_->Get("/v1/ping", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("\"pong\"", "application/json");
  });
  auto handler = [frontend](const httplib::Request& req, httplib::Response& res) {
    json in = json::parse(req.body, nullptr, false);
    json out = in.is_discarded() ? Error("request body is not JSON") : RunCode(*frontend, in);
    res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  };
  s->server_->Post("/run_code", handler);
  s->server_->Post("/v1/run_code", handler);
  if (port == 0) {
    port = s->server_->bind_to_any_port(host);
    if (port < 0) return absl::UnavailableError("cannot bind HTTP " + listen);
  } else if (!s->server_->bind_to_port(host, port)) {
    return absl::UnavailableError("cannot bind HTTP " + listen);
  }
  s->port_ = port;
  httplib::Server* raw = s->server_.get();
  s->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return s;
}

}  // namespace warren::http
