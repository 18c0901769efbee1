// The warren.v1 gRPC server: the services over a node::SandboxManager
// (Sandboxes, Files, Layers, Node, Lifecycle, Processes; one file each,
// api/*_service.h) and StartServer, which serves them with any extra ones
// (FnCall, api/fncall_service.h) on the unix socket and optionally TCP.
//
// Auth: every RPC of every service checks its caller first, through one
// Authorizer (api/auth.h): unix-socket callers by the socket's permissions,
// TCP callers by their bearer token (PERMISSION_DENIED otherwise).
//
// Every handler validates its input (INVALID_ARGUMENT naming the field,
// api/convert.h) and maps errors once, through api/status_map.h.
// Thread-safe: handlers run concurrently on the server's thread pool; an
// Exec blocks its thread for its duration.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "api/auth.h"
#include "api/node_service.h"
#include "common/status.h"
#include "node/sandbox_manager.h"

namespace warren::api {

struct ServiceOptions {
  std::string token;  // bearer token for TCP callers; empty = TCP callers always refused
  NodeFacts facts;
  // Backends served outside the sandbox manager (e.g. "fncall", its own
  // service); Node.Status lists them after the manager's.
  std::vector<std::string> extra_backends;
  // Cluster routing (api/forward.h), borrowed; null = a single node.
  Forwarder* forward = nullptr;
  // Cluster membership (api/cluster_members.h), borrowed; null = a single node.
  ClusterMembers* members = nullptr;
  // The cluster's projects (api/projects.h), borrowed; null = a single node.
  Projects* projects = nullptr;
};

// Owns the service objects (and their Authorizer); register them all with a
// ServerBuilder. `manager` is borrowed and must outlive this.
class WarrenServices {
 public:
  WarrenServices(node::SandboxManager* manager, ServiceOptions options);
  ~WarrenServices();
  std::vector<grpc::Service*> services();

 private:
  struct Holder;
  std::unique_ptr<Holder> holder_;
};

struct ServerOptions {
  std::string unix_socket;  // path; empty = no unix listener
  std::string tcp_listen;   // "host:port"; empty = none
  int max_threads = 1024;   // bounds concurrently running handlers
  int max_message_bytes = 600 << 20;
};

// Builds and starts the server with `services` and any `extra` services
// (e.g. FnCall), all borrowed. The unix socket is chmod'ed 0660. When
// tcp_listen ends in ":0", *tcp_port receives the port chosen.
StatusOr<std::unique_ptr<grpc::Server>> StartServer(const ServerOptions& options, WarrenServices& services,
                                                    int* tcp_port = nullptr,
                                                    const std::vector<grpc::Service*>& extra = {});

}  // namespace warren::api
