#include "api/forward.h"

namespace warren::api {

bool IsForwarded(const grpc::ServerContext& ctx) {
  return ctx.client_metadata().find(kForwardedKey) != ctx.client_metadata().end();
}

}  // namespace warren::api
