#include "api/sandboxes_service.h"

#include <chrono>

#include "api/convert.h"
#include "api/image_service.h"
#include "api/status_map.h"
#include "common/log.h"

namespace warren::api {
namespace {

namespace v1 = ::warren::v1;

// A create reply sent this close to the RPC's deadline is taken as too late
// (see Create).
constexpr auto kCreateReplyMargin = std::chrono::milliseconds(20);

}  // namespace

grpc::Status SandboxesService::Create(grpc::ServerContext* ctx, const v1::CreateSandboxRequest* req,
                                      v1::Sandbox* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
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
  if (!req->image().empty()) {
    if (deps_.images == nullptr) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this node serves no images");
    RETURN_IF_GRPC_ERROR(ToGrpcStatus(deps_.images->ApplyToCreate(req->image(), &r)));
  }
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
  return grpc::Status::OK;
}

grpc::Status SandboxesService::Get(grpc::ServerContext* ctx, const v1::GetSandboxRequest* req, v1::Sandbox* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, deps_.manager->Get(req->id()));
  ToProto(info, resp);
  if (StatusOr<node::SandboxMemory> m = deps_.manager->Memory(req->id()); m.ok()) {
    resp->set_memory_bytes(m->memory_bytes);
    resp->set_swap_bytes(m->swap_bytes);
  }
  return grpc::Status::OK;
}

grpc::Status SandboxesService::List(grpc::ServerContext* ctx, const v1::ListSandboxesRequest* req,
                                    v1::ListSandboxesResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  std::map<std::string, std::string> labels(req->labels().begin(), req->labels().end());
  for (const node::SandboxInfo& i : deps_.manager->List(labels, req->job())) ToProto(i, resp->add_sandboxes());
  return grpc::Status::OK;
}

grpc::Status SandboxesService::Destroy(grpc::ServerContext* ctx, const v1::DestroySandboxRequest* req,
                                       v1::DestroySandboxResponse*) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  if (!req->create_request_id().empty()) {
    if (!req->id().empty()) return Invalid("give either id or create_request_id, not both");
    return ToGrpcStatus(deps_.manager->AbandonCreate(req->create_request_id()));
  }
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  return ToGrpcStatus(deps_.manager->Destroy(req->id()));
}

grpc::Status SandboxesService::Exec(grpc::ServerContext* ctx, const v1::ExecRequest* req, v1::ExecResult* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
  runtime::ExecSpec spec;
  RETURN_IF_GRPC_ERROR(ToExecSpec(*req, &spec));
  ASSIGN_OR_RETURN_GRPC(runtime::ExecOutcome out, deps_.manager->Exec(req->sandbox_id(), spec, req->request_id()));
  ToProto(std::move(out), resp);
  return grpc::Status::OK;
}

grpc::Status SandboxesService::SetNetwork(grpc::ServerContext* ctx, const v1::SetNetworkRequest* req,
                                          v1::NetworkPolicy* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  runtime::NetworkSpec n;
  n.enabled = true;
  n.allow.assign(req->network().allow().begin(), req->network().allow().end());
  n.deny.assign(req->network().deny().begin(), req->network().deny().end());
  ASSIGN_OR_RETURN_GRPC(runtime::NetworkSpec got, deps_.manager->SetNetwork(req->id(), n));
  for (const std::string& a : got.allow) resp->add_allow(a);
  for (const std::string& d : got.deny) resp->add_deny(d);
  return grpc::Status::OK;
}

}  // namespace warren::api
