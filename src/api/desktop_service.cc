#include "api/desktop_service.h"

#include "api/convert.h"
#include "api/status_map.h"
#include "runtime/desktop.h"

namespace warren::api {

namespace v1 = ::warren::v1;

namespace {

// The desktop of a running sandbox (resumed first), or UNIMPLEMENTED.
StatusOr<runtime::Desktop*> DesktopOf(node::SandboxManager& m, const std::string& id,
                                      std::shared_ptr<runtime::Sandbox>* hold) {
  ASSIGN_OR_RETURN(*hold, m.Running(id));
  auto* d = dynamic_cast<runtime::Desktop*>(hold->get());
  if (d == nullptr) return runtime::DesktopUnsupported(**hold);
  return d;
}

runtime::MouseButton Button(v1::MouseButton b) {
  switch (b) {
    case v1::MOUSE_BUTTON_LEFT: return runtime::MouseButton::kLeft;
    case v1::MOUSE_BUTTON_MIDDLE: return runtime::MouseButton::kMiddle;
    case v1::MOUSE_BUTTON_RIGHT: return runtime::MouseButton::kRight;
    default: return runtime::MouseButton::kNone;
  }
}

runtime::MouseAction Action(v1::MouseAction a) {
  switch (a) {
    case v1::MOUSE_ACTION_CLICK: return runtime::MouseAction::kClick;
    case v1::MOUSE_ACTION_DOWN: return runtime::MouseAction::kDown;
    case v1::MOUSE_ACTION_UP: return runtime::MouseAction::kUp;
    default: return runtime::MouseAction::kMove;
  }
}

}  // namespace

grpc::Status DesktopService::Screenshot(grpc::ServerContext* ctx, const v1::ScreenshotRequest* req,
                                        v1::ScreenImage* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Desktop, Screenshot, *req, resp);
  std::shared_ptr<runtime::Sandbox> hold;
  ASSIGN_OR_RETURN_GRPC(runtime::Desktop * d, DesktopOf(*deps_.manager, req->id(), &hold));
  ASSIGN_OR_RETURN_GRPC(runtime::Screenshot shot, d->TakeScreenshot());
  resp->set_png(std::move(shot.png));
  resp->set_width(shot.width);
  resp->set_height(shot.height);
  return grpc::Status::OK;
}

grpc::Status DesktopService::Input(grpc::ServerContext* ctx, const v1::InputRequest* req, v1::Empty* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Desktop, Input, *req, resp);
  if (req->event_case() == v1::InputRequest::EVENT_NOT_SET) {
    return Invalid("input: one of key, type, mouse or scroll is required");
  }
  if (req->has_key() && req->key().keys().empty()) return Invalid("input: key.keys is empty");
  std::shared_ptr<runtime::Sandbox> hold;
  ASSIGN_OR_RETURN_GRPC(runtime::Desktop * d, DesktopOf(*deps_.manager, req->id(), &hold));
  Status s;
  switch (req->event_case()) {
    case v1::InputRequest::kKey: s = d->Key(req->key().keys()); break;
    case v1::InputRequest::kType: s = d->Type(req->type().text()); break;
    case v1::InputRequest::kMouse:
      s = d->Mouse(req->mouse().x(), req->mouse().y(), Button(req->mouse().button()), Action(req->mouse().action()));
      break;
    case v1::InputRequest::kScroll: s = d->Scroll(req->scroll().dx(), req->scroll().dy()); break;
    default: break;
  }
  return ToGrpcStatus(s);
}

}  // namespace warren::api
