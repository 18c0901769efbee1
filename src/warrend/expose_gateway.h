// warrend's exposure gateway (--expose-gateway, net/gateway.h): a request for
// Host PORT-SANDBOX_ID.DOMAIN goes to that sandbox's exposure of PORT, found
// on this node or, in a cluster, asked of the node the id names.
#pragma once

#include <memory>
#include <string>

#include "cluster/cluster.h"
#include "common/status.h"
#include "net/gateway.h"
#include "node/sandbox_manager.h"

namespace warren::warrend {

// Listens on `listen` ("IPv4:PORT") for names under `domain`. `cluster`
// (nullptr: single node) and `manager` are borrowed and must outlive the
// gateway; `token`: the node token the other nodes accept (cluster).
// InvalidArgument naming a bad flag value; the errno of bind/listen.
StatusOr<std::unique_ptr<net::ExposeGateway>> StartExposeGateway(const std::string& listen, const std::string& domain,
                                                                 node::SandboxManager* manager,
                                                                 cluster::Cluster* cluster, const std::string& token);

}  // namespace warren::warrend
