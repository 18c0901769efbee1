// gRPC services of api/warren/v1/warren.proto (Sandboxes, Files, Layers,
// Node) over a node::SandboxManager, for the synchronous gRPC server.
//
// Auth: a call arriving over TCP must carry `authorization: Bearer <token>`
// (PERMISSION_DENIED otherwise); calls over the unix socket are authorized by
// the socket's file permissions. Layers.Build from a host directory
// (source_dir) is accepted only over the unix socket.
//
// Every handler validates its input (INVALID_ARGUMENT naming the field) and
// maps errors once, through api/status_map.h. Thread-safe: handlers run
// concurrently on the server's thread pool; an Exec blocks its thread for
// its duration.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "node/sandbox_manager.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::api {

// Static facts about the node, reported by Node.Status.
struct NodeFacts {
  std::string version = "0.1.0";
  int cgroup_version = 0;
  std::string cgroup_parent;
  bool idmapped_mounts = false;
};

struct ServiceOptions {
  std::string token;  // bearer token for TCP callers; empty = TCP callers always refused
  NodeFacts facts;
  // Backends served outside the sandbox manager (e.g. "fncall", its own
  // service); Node.Status lists them after the manager's.
  std::vector<std::string> extra_backends;
};

// Owns the four service objects; register them all with a ServerBuilder.
class WarrenServices {
 public:
  WarrenServices(node::SandboxManager* manager, ServiceOptions options);
  ~WarrenServices();
  std::vector<grpc::Service*> services();

  class Impl;

 private:
  struct Holder;
  std::unique_ptr<Impl> impl_;
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
StatusOr<std::unique_ptr<grpc::Server>> StartServer(const ServerOptions& options,
                                                    WarrenServices& services,
                                                    int* tcp_port = nullptr,
                                                    const std::vector<grpc::Service*>& extra = {});

// True when the call came over a unix socket.
bool IsUnixPeer(const grpc::ServerContext& context);

}  // namespace warren::api
