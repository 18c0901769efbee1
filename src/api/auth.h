// Who may call the API: the one check every RPC of every gRPC service
// (Sandboxes, Files, Layers, Node, Lifecycle, Processes, FnCall) runs first.
//
// * A call over the unix socket is authorized by the socket's file
//   permissions (0660, root's group): no token needed.
// * A call over TCP must carry `authorization: Bearer <token>`; without it,
//   with a wrong one, or when the daemon has no token, PERMISSION_DENIED.
// * In a cluster, a project's token (api/projects.h) is accepted too: the
//   call then acts for that project (Project()), whatever the transport.
// * A few requests lend the caller the host's file system (a layer built
//   from a host directory, an fncall rooted at a host directory): those are
//   for local callers only (RequireLocal), whatever token a TCP caller has.
//
// tests/unit/api/auth_test.cc calls every method of every service without
// the token and fails on any that does not refuse: a new RPC must call
// Check() before it reads its request.
//
// Thread-safe (immutable after construction).
#pragma once

#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

namespace warren::api {

// True when the call came over a unix socket.
bool IsUnixPeer(const grpc::ServerContext& context);

class Projects;  // api/projects.h

class Authorizer {
 public:
  // `token`: the bearer token TCP callers must send; empty = TCP callers
  // are always refused (but for project tokens). `projects`: the cluster's
  // projects, borrowed; null on a single node (no project tokens).
  explicit Authorizer(std::string token, Projects* projects = nullptr)
      : token_(std::move(token)), projects_(projects) {}

  // OK for a unix-socket caller or a TCP caller with the node's token or a
  // project's.
  grpc::Status Check(const grpc::ServerContext& context) const;

  // The project the call acts for; "" = every project (api/projects.h).
  std::string Project(const grpc::ServerContext& context) const;

  // The cluster's projects; null on a single node.
  Projects* projects() const { return projects_; }

  // OK for a unix-socket caller only; otherwise PERMISSION_DENIED with
  // `refusal` (which names the request refused) as its message.
  static grpc::Status RequireLocal(const grpc::ServerContext& context, const std::string& refusal);

 private:
  const std::string token_;
  Projects* const projects_;
};

}  // namespace warren::api
