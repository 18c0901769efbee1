// E2B-compatible front end of warrend (--e2b-listen): the unmodified `e2b`
// Python SDK talks to it with E2B_API_URL and E2B_SANDBOX_URL both set to
// this listener (plain HTTP/1.1). It serves
//   * E2B's REST API (lifecycle.cc): sandboxes are warren sandboxes (TTL =
//     E2B timeout, metadata = labels "e2b.meta.<key>", template = layers);
//   * envd's process service (process_service.cc: commands and PTYs) and
//     filesystem service (filesystem_service.cc, dir_watch.h: directory
//     watches) over the Connect protocol (connect.h), and its /files
//     transfer (file_transfer.cc), addressed per sandbox by the SDK's
//     `E2b-Sandbox-Id` header.
// Nothing here runs sandbox logic of its own: every call maps onto the node's
// SandboxManager (create, exec/processes, TTL, pause/resume, destroy).
//
// Who may call: REST calls need an `X-API-KEY` (E2B_API_KEY) that is one of
// --e2b-api-keys or the node's token (--token-file), both acting for every
// project, or, in a cluster, a project's token (api/projects.h), acting for
// that project: its creates carry the project's label and pass its quotas
// (api::AdmitCreate, as warren.v1's), and it sees and touches only its own
// sandboxes and those below it (another project's are "not found"). Any
// other key is a 401, as E2B answers. Sandbox (envd) calls need
// the `X-Access-Token` handed out in that sandbox's create answer
// (envdAccessToken); tokens live in memory: after a daemon restart a
// sandbox's envd calls need a new one, which Sandbox.connect hands out.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "e2b/dir_watch.h"
#include "e2b/templates.h"
#include "node/sandbox_manager.h"

namespace httplib {
class ContentReader;
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace warren::api {
class Projects;
}  // namespace warren::api

namespace warren::e2b {

// Default for E2bOptions::max_body_bytes (--e2b-max-upload-mb).
constexpr uint64_t kDefaultMaxBodyBytes = uint64_t{512} << 20;

struct E2bOptions {
  std::string listen;                 // "HOST:PORT" (PORT 0 = any; see E2bServer::port())
  std::vector<std::string> api_keys;  // X-API-KEY values acting for every project
  std::string node_token;             // the node's token (--token-file), also such a key; "" = none
  api::Projects* projects = nullptr;  // the cluster's projects (borrowed, outlive the server); null = none
  // Largest request body accepted (uploads to /files, any envd or REST
  // call): a larger one is answered 413 naming this limit, and nothing it
  // carried is kept.
  uint64_t max_body_bytes = kDefaultMaxBodyBytes;
  // The templates (templates.h): the mapping read at start from
  // `templates_path` (--e2b-templates; "" = none), read again when the file
  // changes; `base_layers` (--fncall-layers) are template "base" unless the
  // file names one.
  TemplateMap templates;
  std::string templates_path;
  std::vector<std::string> base_layers;
};

// --e2b-api-keys: one key a line; blank lines and lines starting with '#'
// are skipped. An empty list is an error naming the file.
StatusOr<std::vector<std::string>> ReadApiKeys(const std::string& path);

// What the handlers share. Thread-safe.
class E2bState {
 public:
  E2bState(node::SandboxManager* manager, E2bOptions options)
      : manager_(manager),
        options_(std::move(options)),
        templates_(options_.templates_path, options_.base_layers, options_.templates) {}
  node::SandboxManager& manager() { return *manager_; }
  const E2bOptions& options() const { return options_; }
  // The templates as the mapping file is now.
  TemplateSource& templates() { return templates_; }
  // The project an X-API-KEY acts for ("" = every project); Unauthenticated
  // for a key that is none of the above.
  StatusOr<std::string> KeyProject(const std::string& key) const;
  // A fresh envd access token for sandbox `id`.
  std::string NewAccessToken(const std::string& id);
  // Sandbox `id`'s token; a fresh one when it has none (created before a
  // daemon restart).
  std::string AccessToken(const std::string& id);
  // Whether `token` is sandbox `id`'s (constant-time compare).
  bool AccessOk(const std::string& id, const std::string& token) const;
  // The sandbox ended: its token and watchers go.
  void Forget(const std::string& id);
  // Directory watchers of CreateWatcher (filesystem_service.cc).
  WatcherTable& watchers() { return watchers_; }

 private:
  node::SandboxManager* const manager_;
  const E2bOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> tokens_;  // sandbox id -> envd access token
  uint64_t issued_ = 0;
  WatcherTable watchers_;
  TemplateSource templates_;
};

// The sandbox an envd request addresses (header E2b-Sandbox-Id), checked
// against its access token (X-Access-Token): Unauthenticated otherwise.
StatusOr<std::string> Addressed(const E2bState& st, const httplib::Request& req);
// The keepalive interval a stream's client asks for (envd's
// Keepalive-Ping-Interval header, whole seconds; 0 or absent = none):
// InvalidArgument naming the header for anything but [0, 3600].
StatusOr<std::chrono::seconds> KeepaliveInterval(const httplib::Request& req);
// A unary Connect call: the JSON request handed to `f` with the addressed
// sandbox; its answer, or its error as Connect's {code, message} with the
// matching HTTP status.
using UnaryFn = StatusOr<nlohmann::json> (*)(E2bState&, const std::string& sandbox_id, const nlohmann::json& request);
void ConnectUnary(E2bState& st, const httplib::Request& req, httplib::Response& res, UnaryFn f);

// The body of a request served by a ContentReader handler (those that take
// bodies of unknown length: chunked, as the SDK sends streaming calls),
// read whole up to `limit` bytes: past it the rest is read and dropped and
// the answer is ResourceExhausted naming the limit (BodyLimitMessage);
// InvalidArgument when the body is malformed or cut.
StatusOr<std::string> ReadBody(const httplib::ContentReader& reader, const httplib::Response& res, uint64_t limit);
// POST paths whose handlers read their body through a ContentReader; every
// other request must announce its body's length (411 otherwise).
bool StreamsBody(const std::string& path);

// {"code": <HTTP status>, "message"}: the error body of E2B's REST API and of
// envd's HTTP routes.
std::string BodyJson(int http_status, const std::string& message);
// Why a request body over `limit` bytes was refused (names the limit and
// the flag that sets it).
std::string BodyLimitMessage(uint64_t limit);

// Route registration, one file each.
void AddLifecycleRoutes(httplib::Server& server, const std::shared_ptr<E2bState>& state);
void AddProcessRoutes(httplib::Server& server, const std::shared_ptr<E2bState>& state);
void AddFilesystemRoutes(httplib::Server& server, const std::shared_ptr<E2bState>& state);
void AddFileTransferRoutes(httplib::Server& server, const std::shared_ptr<E2bState>& state);

class E2bServer {
 public:
  ~E2bServer();
  static StatusOr<std::unique_ptr<E2bServer>> Start(node::SandboxManager* manager, E2bOptions options);
  int port() const { return port_; }
  void Stop();

 private:
  E2bServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace warren::e2b
