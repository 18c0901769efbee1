#include "api/sandboxes_service.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

#include "api/convert.h"
#include "api/image_service.h"
#include "api/projects.h"
#include "api/status_map.h"
#include "common/log.h"

namespace warren::api {
namespace {

namespace v1 = ::warren::v1;

void ExposedToProto(const runtime::ExposedPort& x, v1::ExposedPort* out) {
  out->set_port(x.port);
  out->set_address(x.address);
  out->set_token(x.token);
}

grpc::Status CheckPort(uint32_t port) {
  if (port == 0 || port > 65535)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "port " + std::to_string(port) + " (want 1..65535)");
  return grpc::Status::OK;
}

// "8080/tcp" or "8080" of an image's ExposedPorts: the port; 0 for another
// protocol ("53/udp": exposures are TCP); InvalidArgument naming it otherwise.
StatusOr<uint16_t> ImageTcpPort(const std::string& exposed) {
  const size_t slash = exposed.find('/');
  const std::string proto = slash == std::string::npos ? "tcp" : absl::AsciiStrToLower(exposed.substr(slash + 1));
  uint32_t port = 0;
  if (!absl::SimpleAtoi(exposed.substr(0, slash), &port) || port == 0 || port > 65535 ||
      (proto != "tcp" && proto != "udp" && proto != "sctp")) {
    return absl::InvalidArgumentError("the image's ExposedPorts entry " + Quote(exposed) +
                                      " is not PORT[/tcp|/udp|/sctp] with PORT in 1..65535");
  }
  return proto == "tcp" ? static_cast<uint16_t>(port) : 0;
}

// CreateSandboxRequest.start/command/expose/expose_image_ports into
// r->start_argv and r->expose, with the image's config (nullptr: no image).
grpc::Status StartAndExpose(const v1::CreateSandboxRequest& req, const image::oci::ImageConfig* image,
                            node::CreateRequest* r) {
  for (uint32_t port : req.expose()) {
    RETURN_IF_GRPC_ERROR(CheckPort(port));
    r->expose.push_back(static_cast<uint16_t>(port));
  }
  if (req.expose_image_ports()) {
    if (image == nullptr) return Invalid("expose_image_ports needs an image");
    for (const std::string& p : image->exposed_ports) {
      ASSIGN_OR_RETURN_GRPC(uint16_t port, ImageTcpPort(p));
      if (port != 0) r->expose.push_back(port);
    }
  }
  std::sort(r->expose.begin(), r->expose.end());
  r->expose.erase(std::unique(r->expose.begin(), r->expose.end()), r->expose.end());
  if (!req.start() && req.command().empty()) return grpc::Status::OK;
  // Docker's rule: the Entrypoint stays, a command replaces the Cmd.
  if (image != nullptr) r->start_argv = image->entrypoint;
  if (!req.command().empty()) {
    r->start_argv.insert(r->start_argv.end(), req.command().begin(), req.command().end());
  } else if (image != nullptr) {
    r->start_argv.insert(r->start_argv.end(), image->cmd.begin(), image->cmd.end());
  }
  if (r->start_argv.empty()) {
    return Invalid(image == nullptr
                       ? "start: nothing to run (no command, no image)"
                       : "start: nothing to run (the image has no Entrypoint or Cmd, and no command given)");
  }
  for (size_t i = 0; i < r->start_argv.size(); ++i) {
    if (r->start_argv[i].find('\0') != std::string::npos) {
      return Invalid("start: argv[" + std::to_string(i) + "]=" + Quote(r->start_argv[i]) + " contains NUL");
    }
  }
  if (r->start_argv[0].empty()) return Invalid("start: argv[0] is empty");
  return grpc::Status::OK;
}

// A create reply sent this close to the RPC's deadline is taken as too late
// (see Create).
constexpr auto kCreateReplyMargin = std::chrono::milliseconds(20);

}  // namespace

grpc::Status SandboxesService::Create(grpc::ServerContext* ctx, const v1::CreateSandboxRequest* req,
                                      v1::Sandbox* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  grpc::Status placed;
  if (deps_.forward != nullptr &&
      deps_.forward->Place(
          ctx, *req, resp, [&](v1::Sandbox* out) { return CreateLocal(ctx, req, out); }, &placed)) {
    return placed;
  }
  return CreateLocal(ctx, req, resp);
}

grpc::Status SandboxesService::CreateLocal(grpc::ServerContext* ctx, const v1::CreateSandboxRequest* req,
                                           v1::Sandbox* resp) {
  node::CreateRequest r;
  r.backend = req->backend();
  r.layers.assign(req->layers().begin(), req->layers().end());
  const v1::Resources& res = req->resources();
  r.resources = runtime::Resources{res.cpu_millis(), res.memory_mb(),  res.disk_mb(),
                                   res.pids(),       res.open_files(), res.tmpfs_mb()};
  r.env.insert(req->env().begin(), req->env().end());
  r.workdir = req->workdir();
  r.user = req->user();
  r.hostname = req->hostname();
  r.labels.insert(req->labels().begin(), req->labels().end());
  r.ttl_s = req->ttl_s();
  r.job = req->job();
  r.idle_timeout_s = req->idle_timeout_s();
  r.qos = req->qos();
  // Holds the image's layers until the sandbox holds them (an image rm
  // meanwhile leaves them to the layer GC).
  std::unique_ptr<image::oci::ImageUse> image_use;
  if (!req->image().empty()) {
    if (deps_.images == nullptr) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this node serves no images");
    ASSIGN_OR_RETURN_GRPC(image_use, deps_.images->ApplyToCreate(req->image(), &r));
  }
  RETURN_IF_GRPC_ERROR(StartAndExpose(*req, image_use != nullptr ? &image_use->record().config : nullptr, &r));
  // A create that waits in the node's admission queue gives up at the
  // RPC's deadline or when the client goes away.
  if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    r.deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                        ctx->deadline() - std::chrono::system_clock::now());
  }
  r.cancelled = [ctx] { return ctx->IsCancelled(); };
  r.request_id = req->request_id();
  if (req->has_network()) {
    r.network.enabled = true;
    r.network.allow.assign(req->network().allow().begin(), req->network().allow().end());
    r.network.deny.assign(req->network().deny().begin(), req->network().deny().end());
  }
  // A project's create carries its label and holds its share of the
  // project's quotas (cluster-wide) while it runs.
  StatusOr<std::unique_ptr<QuotaHold>> quota =
      AdmitCreate(deps_.auth->projects(), *deps_.manager, deps_.auth->Project(*ctx), &r);
  if (!quota.ok()) {
    grpc::Status g = ToGrpcStatus(quota.status());
    if (g.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return g;
    return {g.error_code(), g.error_message(), kQuotaRefusalDetails};  // no other node will take it either
  }
  StatusOr<node::SandboxInfo> info = deps_.manager->Create(r);
  if (!info.ok()) return ToGrpcStatus(info.status());
  // Nobody will ever learn this id if the client gave up: do not leak the
  // sandbox. The client's deadline is earlier than ours by the request's
  // transit time, and our reply needs time to reach it: a reply sent in
  // the last kCreateReplyMargin (20 ms) before our deadline is taken as too late.
  // (One lost in flight anyway is abandoned by the client: see
  // CreateSandboxRequest.request_id.)
  const bool late = ctx->deadline() != std::chrono::system_clock::time_point::max() &&
                    std::chrono::system_clock::now() + kCreateReplyMargin >= ctx->deadline();
  if (late || ctx->IsCancelled()) {
    // A retry with the same request id makes a new one (this call, not
    // the request, was given up: no tombstone as AbandonCreate leaves).
    Status s = deps_.manager->Destroy(info->id);
    warren::Log(spdlog::level::info, "create given up by the client; sandbox destroyed",
                {{"sandbox", info->id}, {"destroy", s.ToString()}, {"late", late ? "true" : "false"}});
    return late ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                               "create finished too close to its deadline; nothing was kept")
                : grpc::Status(grpc::StatusCode::CANCELLED, "create cancelled by the client");
  }
  ToProto(*info, resp);
  if (!r.expose.empty()) {
    if (StatusOr<node::NetworkView> n = deps_.manager->Network(info->id); n.ok()) {
      for (const runtime::ExposedPort& x : n->exposed) ExposedToProto(x, resp->add_exposed());
    }
  }
  return grpc::Status::OK;
}

grpc::Status SandboxesService::Get(grpc::ServerContext* ctx, const v1::GetSandboxRequest* req, v1::Sandbox* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Sandboxes, Get, *req, resp);
  ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, deps_.manager->Get(req->id()));
  ToProto(info, resp);
  if (StatusOr<node::SandboxMemory> m = deps_.manager->Memory(req->id()); m.ok()) {
    resp->set_memory_bytes(m->memory_bytes);
    resp->set_swap_bytes(m->swap_bytes);
  }
  if (StatusOr<node::NetworkView> n = deps_.manager->Network(req->id()); n.ok()) {
    if (n->policy.enabled) {
      for (const std::string& a : n->policy.allow) resp->mutable_network()->add_allow(a);
      for (const std::string& d : n->policy.deny) resp->mutable_network()->add_deny(d);
      resp->mutable_network();  // set even when empty: a link that reaches nothing
    }
    for (const runtime::ExposedPort& x : n->exposed) ExposedToProto(x, resp->add_exposed());
    if (n->traffic) {
      v1::NetworkTraffic* t = resp->mutable_traffic();
      t->set_egress_bytes(n->traffic->egress_bytes);
      t->set_ingress_bytes(n->traffic->ingress_bytes);
      t->set_connections(n->traffic->connections);
      t->set_denied(n->traffic->denied);
    }
  }
  return grpc::Status::OK;
}

grpc::Status SandboxesService::List(grpc::ServerContext* ctx, const v1::ListSandboxesRequest* req,
                                    v1::ListSandboxesResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  std::map<std::string, std::string> labels(req->labels().begin(), req->labels().end());
  // A project sees its own sandboxes and those of the projects below it.
  const std::string project = deps_.auth->Project(*ctx);
  auto visible = [&](const auto& sandbox_labels) {
    if (project.empty()) return true;
    auto it = sandbox_labels.find(kProjectLabel);
    return it != sandbox_labels.end() && InProject(project, it->second);
  };
  for (const node::SandboxInfo& i : deps_.manager->List(labels, req->job())) {
    if (visible(i.labels)) ToProto(i, resp->add_sandboxes());
  }
  // In a cluster, the other nodes' sandboxes too.
  std::vector<v1::ListSandboxesResponse> parts;
  RETURN_IF_GRPC_ERROR(FanOut<v1::Sandboxes>(deps_.forward, *ctx, &parts,
                                             [&](auto& s, auto* c, auto* r) { return s.List(c, *req, r); }));
  for (v1::ListSandboxesResponse& p : parts) {
    for (v1::Sandbox& s : *p.mutable_sandboxes()) {
      if (visible(s.labels())) *resp->add_sandboxes() = std::move(s);
    }
  }
  return grpc::Status::OK;
}

grpc::Status SandboxesService::Destroy(grpc::ServerContext* ctx, const v1::DestroySandboxRequest* req,
                                       v1::DestroySandboxResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  if (!req->create_request_id().empty()) {
    if (!req->id().empty()) return Invalid("give either id or create_request_id, not both");
    RETURN_IF_GRPC_ERROR(ToGrpcStatus(deps_.manager->AbandonCreate(req->create_request_id())));
    // In a cluster the create may have been placed on any node: every node
    // abandons it (one that never saw it refuses the id from then on).
    std::vector<v1::DestroySandboxResponse> peers;
    return FanOut<v1::Sandboxes>(deps_.forward, *ctx, &peers,
                                 [&](auto& s, auto* c, auto* r) { return s.Destroy(c, *req, r); });
  }
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Sandboxes, Destroy, *req, resp);
  return ToGrpcStatus(deps_.manager->Destroy(req->id()));
}

grpc::Status SandboxesService::Exec(grpc::ServerContext* ctx, const v1::ExecRequest* req, v1::ExecResult* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->sandbox_id(), v1::Sandboxes, Exec, *req, resp);
  runtime::ExecSpec spec;
  RETURN_IF_GRPC_ERROR(ToExecSpec(*req, &spec));
  // A client that went away (disconnect, its deadline) takes its command with it.
  spec.cancelled = [ctx] { return ctx->IsCancelled(); };
  ASSIGN_OR_RETURN_GRPC(runtime::ExecOutcome out, deps_.manager->Exec(req->sandbox_id(), spec, req->request_id()));
  ToProto(std::move(out), resp);
  return grpc::Status::OK;
}

grpc::Status SandboxesService::SetNetwork(grpc::ServerContext* ctx, const v1::SetNetworkRequest* req,
                                          v1::NetworkPolicy* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Sandboxes, SetNetwork, *req, resp);
  runtime::NetworkSpec n;
  n.enabled = true;
  n.allow.assign(req->network().allow().begin(), req->network().allow().end());
  n.deny.assign(req->network().deny().begin(), req->network().deny().end());
  ASSIGN_OR_RETURN_GRPC(runtime::NetworkSpec got, deps_.manager->SetNetwork(req->id(), n));
  for (const std::string& a : got.allow) resp->add_allow(a);
  for (const std::string& d : got.deny) resp->add_deny(d);
  return grpc::Status::OK;
}

grpc::Status SandboxesService::Expose(grpc::ServerContext* ctx, const v1::ExposeRequest* req, v1::ExposedPort* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  RETURN_IF_GRPC_ERROR(CheckPort(req->port()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Sandboxes, Expose, *req, resp);
  ASSIGN_OR_RETURN_GRPC(runtime::ExposedPort x, deps_.manager->Expose(req->id(), static_cast<uint16_t>(req->port())));
  ExposedToProto(x, resp);
  return grpc::Status::OK;
}

grpc::Status SandboxesService::Unexpose(grpc::ServerContext* ctx, const v1::UnexposeRequest* req, v1::Empty* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  RETURN_IF_GRPC_ERROR(CheckPort(req->port()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Sandboxes, Unexpose, *req, resp);
  return ToGrpcStatus(deps_.manager->Unexpose(req->id(), static_cast<uint16_t>(req->port())));
}

}  // namespace warren::api
