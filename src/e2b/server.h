// E2B-compatible front end of warrend (--e2b-listen): the unmodified `e2b`
// Python SDK talks to it with E2B_API_URL and E2B_SANDBOX_URL both set to
// this listener (plain HTTP/1.1). It serves
//   * E2B's REST API (lifecycle.cc): sandboxes are warren sandboxes (TTL =
//     E2B timeout, metadata = labels "e2b.meta.<key>", template = layers);
//   * envd's process service (process_service.cc) over the Connect protocol
//     (connect.h), addressed per sandbox by the SDK's `E2b-Sandbox-Id` header.
// Nothing here runs sandbox logic of its own: every call maps onto the node's
// SandboxManager (create, exec/processes, TTL, pause/resume, destroy).
//
// Who may call: REST calls need `X-API-KEY` equal (constant-time) to one of
// --e2b-api-keys (401 otherwise, as E2B answers). Sandbox (envd) calls need
// the `X-Access-Token` handed out in that sandbox's create answer
// (envdAccessToken); tokens live in memory: after a daemon restart a
// sandbox's envd calls need a new one, which Sandbox.connect hands out.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "node/sandbox_manager.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace warren::e2b {

struct E2bOptions {
  std::string listen;                 // "HOST:PORT" (PORT 0 = any; see E2bServer::port())
  std::vector<std::string> api_keys;  // accepted X-API-KEY values; none = every call refused
  // template id -> layers (bottom first); "base" present unless configured
  std::map<std::string, std::vector<std::string>> templates;
};

// --e2b-api-keys: one key a line; blank lines and lines starting with '#'
// are skipped. An empty list is an error naming the file.
StatusOr<std::vector<std::string>> ReadApiKeys(const std::string& path);
// --e2b-templates: a JSON object {template id: [layer, ...]}; errors name
// the file and the entry. `base_layers` become template "base" unless the
// file names one.
StatusOr<std::map<std::string, std::vector<std::string>>> ReadTemplates(const std::string& path,
                                                                        const std::vector<std::string>& base_layers);

// What the handlers share. Thread-safe.
class E2bState {
 public:
  E2bState(node::SandboxManager* manager, E2bOptions options) : manager_(manager), options_(std::move(options)) {}
  node::SandboxManager& manager() { return *manager_; }
  const E2bOptions& options() const { return options_; }
  bool ApiKeyOk(const std::string& key) const;
  // A fresh envd access token for sandbox `id`.
  std::string NewAccessToken(const std::string& id);
  // Sandbox `id`'s token; a fresh one when it has none (created before a
  // daemon restart).
  std::string AccessToken(const std::string& id);
  // Whether `token` is sandbox `id`'s (constant-time compare).
  bool AccessOk(const std::string& id, const std::string& token) const;
  void Forget(const std::string& id);

 private:
  node::SandboxManager* const manager_;
  const E2bOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> tokens_;  // sandbox id -> envd access token
  uint64_t issued_ = 0;
};

// The sandbox an envd request addresses (header E2b-Sandbox-Id), checked
// against its access token (X-Access-Token): Unauthenticated otherwise.
StatusOr<std::string> Addressed(const E2bState& st, const httplib::Request& req);
// A unary Connect call: the JSON request handed to `f` with the addressed
// sandbox; its answer, or its error as Connect's {code, message} with the
// matching HTTP status.
using UnaryFn = StatusOr<nlohmann::json> (*)(E2bState&, const std::string& sandbox_id, const nlohmann::json& request);
void ConnectUnary(E2bState& st, const httplib::Request& req, httplib::Response& res, UnaryFn f);

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
