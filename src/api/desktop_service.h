// warren.v1.Desktop: screenshots and input of sandboxes with a virtual
// display (runtime/desktop.h). A sandbox whose backend has none answers
// UNIMPLEMENTED naming the backend.
//
// Thread-safe: handlers run concurrently; calls on one sandbox are
// serialized by its QMP monitor.
#pragma once

#include "api/service_deps.h"
#include "warren/v1/desktop.grpc.pb.h"

namespace warren::api {

class DesktopService final : public warren::v1::Desktop::Service {
 public:
  explicit DesktopService(ServiceDeps deps) : deps_(deps) {}

  grpc::Status Screenshot(grpc::ServerContext* ctx, const warren::v1::ScreenshotRequest* req,
                          warren::v1::ScreenImage* resp) override;
  grpc::Status Input(grpc::ServerContext* ctx, const warren::v1::InputRequest* req, warren::v1::Empty* resp) override;

 private:
  ServiceDeps deps_;
};

}  // namespace warren::api
