#include "e2b/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "api/projects.h"
#include "common/file_util.h"
#include "common/secret.h"
#include "e2b/connect.h"

namespace warren::e2b {
namespace {

// One thread per connection in service: a running command's stream holds
// one for as long as it runs.
constexpr int kWorkers = 128;
constexpr int kListenBacklog = 1024;
constexpr uint64_t kPruneEvery = 256;

}  // namespace

StatusOr<std::vector<std::string>> ReadApiKeys(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  std::vector<std::string> keys;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::string key(absl::StripAsciiWhitespace(line));
    if (key.empty() || key[0] == '#') continue;
    keys.push_back(key);
  }
  if (keys.empty()) return absl::InvalidArgumentError("--e2b-api-keys " + path + " holds no key");
  return keys;
}

StatusOr<std::string> E2bState::KeyProject(const std::string& key) const {
  bool every = false;
  for (const std::string& k : options_.api_keys) every |= SameSecret(key, k);  // every key compared: no early exit
  every |= !options_.node_token.empty() && SameSecret(key, options_.node_token);
  if (every) return std::string();
  if (options_.projects != nullptr && !key.empty()) {
    if (std::optional<std::string> p = options_.projects->ProjectOfToken(key)) return *p;
  }
  return absl::UnauthenticatedError("invalid API key");
}

std::string E2bState::NewAccessToken(const std::string& id) {
  std::string token = RandomHex(24);
  std::lock_guard<std::mutex> lock(mu_);
  tokens_[id] = token;
  // Sandboxes also end without this front end (TTL, warren's own API): their
  // tokens and watchers are dropped every kPruneEvery new tokens.
  if (++issued_ % kPruneEvery == 0) {
    for (auto it = tokens_.begin(); it != tokens_.end();) {
      if (manager_->Get(it->first).ok()) {
        ++it;
        continue;
      }
      watchers_.Drop(it->first);
      it = tokens_.erase(it);
    }
  }
  return token;
}

std::string E2bState::AccessToken(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tokens_.find(id);
    if (it != tokens_.end()) return it->second;
  }
  return NewAccessToken(id);
}

std::string BodyJson(int http_status, const std::string& message) {
  return nlohmann::json{{"code", http_status}, {"message", message}}.dump(-1, ' ', false,
                                                                          nlohmann::json::error_handler_t::replace);
}

std::string BodyLimitMessage(uint64_t limit) {
  return "request body is larger than this server's limit of " + std::to_string(limit) + " bytes (" +
         std::to_string(limit >> 20) + " MiB; warrend --e2b-max-upload-mb)";
}

StatusOr<std::string> ReadBody(const httplib::ContentReader& reader, const httplib::Response& res, uint64_t limit) {
  std::string body;
  bool over = false;
  const bool read = reader([&](const char* data, size_t n) {
    if (!over && body.size() + n > limit) {
      over = true;
      std::string().swap(body);
    }
    if (!over) body.append(data, n);
    return true;
  });
  if (over || res.status == 413) return absl::ResourceExhaustedError(BodyLimitMessage(limit));
  if (!read) return absl::InvalidArgumentError("the request body could not be read (malformed or cut)");
  return body;
}

bool StreamsBody(const std::string& path) {
  return path == "/files" || path == "/process.Process/Start" || path == "/process.Process/Connect" ||
         path == "/process.Process/StreamInput" || path == "/filesystem.Filesystem/WatchDir";
}

bool E2bState::AccessOk(const std::string& id, const std::string& token) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tokens_.find(id);
  return it != tokens_.end() && SameSecret(token, it->second);
}

void E2bState::Forget(const std::string& id) {
  watchers_.Drop(id);
  std::lock_guard<std::mutex> lock(mu_);
  tokens_.erase(id);
}

StatusOr<std::string> Addressed(const E2bState& st, const httplib::Request& req) {
  const std::string id = req.get_header_value("E2b-Sandbox-Id");
  if (id.empty()) return absl::InvalidArgumentError("missing E2b-Sandbox-Id header");
  if (!st.AccessOk(id, req.get_header_value("X-Access-Token")))
    return absl::UnauthenticatedError("no such sandbox or wrong X-Access-Token for sandbox \"" + id + "\"");
  return id;
}

StatusOr<std::chrono::seconds> KeepaliveInterval(const httplib::Request& req) {
  constexpr int64_t kMaxKeepaliveS = 3600;
  if (!req.has_header("Keepalive-Ping-Interval")) return std::chrono::seconds(0);
  const std::string v = req.get_header_value("Keepalive-Ping-Interval");
  int64_t s = 0;
  if (!absl::SimpleAtoi(v, &s) || s < 0 || s > kMaxKeepaliveS)
    return absl::InvalidArgumentError("Keepalive-Ping-Interval must be an integer number of seconds in [0, " +
                                      std::to_string(kMaxKeepaliveS) + "], got \"" + v + "\"");
  return std::chrono::seconds(s);
}

void ConnectUnary(E2bState& st, const httplib::Request& req, httplib::Response& res, UnaryFn f) {
  using json = nlohmann::json;
  StatusOr<json> out = [&]() -> StatusOr<json> {
    ASSIGN_OR_RETURN(std::string id, Addressed(st, req));
    json msg = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
    if (msg.is_discarded() || !msg.is_object()) return absl::InvalidArgumentError("request is not a JSON object");
    return f(st, id, msg);
  }();
  if (!out.ok()) {
    res.status = HttpStatus(out.status().code());
    res.set_content(ErrorJson(out.status()).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    return;
  }
  res.set_content(out->dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

E2bServer::~E2bServer() { Stop(); }

void E2bServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

StatusOr<std::unique_ptr<E2bServer>> E2bServer::Start(node::SandboxManager* manager, E2bOptions options) {
  const std::string listen = options.listen;
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError("--e2b-listen wants HOST:PORT, got " + listen);
  const std::string host = listen.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535)
    return absl::InvalidArgumentError("--e2b-listen: bad port in " + listen);
  if (options.api_keys.empty() && options.node_token.empty() && options.projects == nullptr)
    return absl::InvalidArgumentError(
        "--e2b-listen needs API keys: --e2b-api-keys, --token-file or --cluster (project tokens)");
  std::unique_ptr<E2bServer> s(new E2bServer());
  s->server_ = std::make_unique<httplib::Server>();
  s->server_->new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  // Answers go out as several writes (headers, body, stream chunks): without
  // TCP_NODELAY each small one after the first waits for the client's
  // delayed ACK (~40 ms on Linux).
  s->server_->set_tcp_nodelay(true);
  auto listen_fd = std::make_shared<int>(-1);
  s->server_->set_socket_options([listen_fd](int sock) {
    int yes = 1;
    (void)::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    *listen_fd = sock;
  });
  // Bodies are bounded: one with a Content-Length over the limit is read
  // and dropped, then answered 413 (the error handler names the limit).
  // Bodies of unknown length (chunked, as the SDK sends streaming calls, or
  // read to the connection's end) are counted as they stream by the
  // handlers that read through a ContentReader (StreamsBody); anywhere
  // else cpp-httplib would hold them whole, so they are refused.
  const uint64_t limit = options.max_body_bytes;
  s->server_->set_payload_max_length(limit);
  s->server_->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "POST" && StreamsBody(req.path)) return httplib::Server::HandlerResponse::Unhandled;
    const bool chunked = absl::AsciiStrToLower(req.get_header_value("Transfer-Encoding")) == "chunked";
    const bool has_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" || req.method == "PRI";
    if (!chunked && !(has_body && !req.has_header("Content-Length")))
      return httplib::Server::HandlerResponse::Unhandled;
    res.status = 411;
    res.set_header("Connection", "close");
    res.set_content(BodyJson(411, req.method + " " + req.path + ": the request body needs a Content-Length"),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
  s->server_->set_error_handler(
      httplib::Server::HandlerWithResponse([limit](const httplib::Request&, httplib::Response& res) {
        if (res.status != 413 || !res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        res.set_content(BodyJson(413, BodyLimitMessage(limit)), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  auto state = std::make_shared<E2bState>(manager, std::move(options));
  AddLifecycleRoutes(*s->server_, state);
  AddProcessRoutes(*s->server_, state);
  AddFilesystemRoutes(*s->server_, state);
  AddFileTransferRoutes(*s->server_, state);
  if (port == 0) {
    port = s->server_->bind_to_any_port(host);
    if (port < 0) return absl::UnavailableError("cannot bind --e2b-listen " + listen);
  } else if (!s->server_->bind_to_port(host, port)) {
    return absl::UnavailableError("cannot bind --e2b-listen " + listen);
  }
  if (*listen_fd < 0 || ::listen(*listen_fd, kListenBacklog) != 0)
    return ErrnoToStatus(*listen_fd < 0 ? EBADF : errno, "listen(--e2b-listen " + listen + ", backlog)");
  s->port_ = port;
  httplib::Server* raw = s->server_.get();
  s->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return s;
}

}  // namespace warren::e2b
