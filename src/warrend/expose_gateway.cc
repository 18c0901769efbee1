#include "warrend/expose_gateway.h"

#include <chrono>
#include <cstdlib>

#include <grpcpp/grpcpp.h>

#include "api/forward.h"
#include "cluster/router.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::warrend {

namespace {

constexpr auto kAskTimeout = std::chrono::seconds(5);

absl::Status NoSuchPort(const std::string& id, uint16_t port) {
  return absl::NotFoundError("sandbox " + id + " has no exposed port " + std::to_string(port) + " (sb.expose(" +
                             std::to_string(port) + ") makes one)");
}

// The exposure's address from the sandbox's own node.
StatusOr<std::string> AskOwner(cluster::Cluster& cluster, const std::string& node, const std::string& token,
                               const std::string& id, uint16_t port) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> ch, cluster.NodeChannel(node));
  grpc::ClientContext cc;
  cc.set_deadline(std::chrono::system_clock::now() + kAskTimeout);
  cc.AddMetadata(api::kForwardedKey, cluster.Self());
  if (!token.empty()) cc.AddMetadata("authorization", "Bearer " + token);
  warren::v1::GetSandboxRequest req;
  req.set_id(id);
  warren::v1::Sandbox s;
  const grpc::Status st = warren::v1::Sandboxes::NewStub(ch)->Get(&cc, req, &s);
  if (st.error_code() == grpc::StatusCode::NOT_FOUND) return absl::NotFoundError("no sandbox " + id);
  if (!st.ok())
    return absl::UnavailableError("node " + node + " did not answer for sandbox " + id + ": " + st.error_message());
  for (const warren::v1::ExposedPort& x : s.exposed()) {
    if (x.port() == port) return x.address();
  }
  return NoSuchPort(id, port);
}

}  // namespace

StatusOr<std::unique_ptr<net::ExposeGateway>> StartExposeGateway(const std::string& listen, const std::string& domain,
                                                                 node::SandboxManager* manager,
                                                                 cluster::Cluster* cluster, const std::string& token) {
  const size_t colon = listen.rfind(':');
  const int port = colon == std::string::npos ? -1 : std::atoi(listen.c_str() + colon + 1);
  if (colon == std::string::npos || colon == 0 || port < 0 || port > 65535 ||
      listen.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
    return absl::InvalidArgumentError("--expose-gateway '" + listen + "': expected IPv4:PORT, e.g. 127.0.0.1:8090");
  }
  auto resolve = [manager, cluster, token](const std::string& id, uint16_t p) -> StatusOr<std::string> {
    const std::string node = cluster::Router::NodeOf(id);
    if (cluster != nullptr && !node.empty() && node != cluster->Self()) return AskOwner(*cluster, node, token, id, p);
    StatusOr<node::NetworkView> n = manager->Network(id);
    if (!n.ok())
      return n.status().code() == absl::StatusCode::kNotFound ? absl::NotFoundError("no sandbox " + id) : n.status();
    for (const runtime::ExposedPort& x : n->exposed) {
      if (x.port == p) return x.address;
    }
    return NoSuchPort(id, p);
  };
  return net::ExposeGateway::Open(listen.substr(0, colon), static_cast<uint16_t>(port), domain, std::move(resolve));
}

}  // namespace warren::warrend
