// What every warren.v1 service over the sandbox manager borrows. Each
// handler's first statement is `RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));`
// (api/auth.h), before it reads its request.
#pragma once

#include "api/auth.h"
#include "api/forward.h"
#include "node/sandbox_manager.h"

namespace warren::api {

class NodeImages;  // api/image_service.h

struct ServiceDeps {
  node::SandboxManager* manager;  // borrowed; outlives the services
  const Authorizer* auth;         // borrowed; outlives the services
  // Borrowed; outlives the services. Null where images are not served.
  const NodeImages* images = nullptr;
  // Borrowed; outlives the services. Null on a single node (api/forward.h).
  Forwarder* forward = nullptr;
};

}  // namespace warren::api
