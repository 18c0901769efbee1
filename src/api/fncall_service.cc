#include "api/fncall_service.h"

#include "api/convert.h"
#include "api/status_map.h"

namespace warren::api {

runtime::FnCallRequest FromProto(const warren::v1::FnCallRequest& r) {
  runtime::FnCallRequest q;
  q.language = runtime::CanonicalFnCallLanguage(r.language().empty() ? "python" : r.language());
  q.code = r.code();
  q.stdin_data = r.stdin();
  for (const auto& [k, v] : r.files()) q.files[k] = v;
  q.fetch_files.assign(r.fetch_files().begin(), r.fetch_files().end());
  for (const auto& [k, v] : r.env()) q.env[k] = v;
  q.run_timeout = std::chrono::milliseconds(r.run_timeout_ms() ? r.run_timeout_ms() : 10000);
  q.compile_timeout = std::chrono::milliseconds(r.compile_timeout_ms() ? r.compile_timeout_ms() : 10000);
  q.memory_mb = r.memory_mb();
  q.output_cap_bytes = r.output_cap_bytes() ? r.output_cap_bytes() : 16u << 20;
  return q;
}

void ToProto(const runtime::FnCallResult& r, warren::v1::FnCallResponse* out) {
  if (r.compile) ToProto(*r.compile, out->mutable_compile());
  if (r.run) ToProto(*r.run, out->mutable_run());
  for (const auto& [k, v] : r.files) (*out->mutable_files())[k] = v;
  for (const auto& m : r.missing_files) out->add_missing_files(m);
  out->set_sandbox_error(r.sandbox_error);
  out->set_duration_ns(r.duration.count());
}

FnCallServiceImpl::FnCallServiceImpl(node::FnCallFrontend* frontend, std::string token)
    : frontend_(frontend), auth_(std::move(token)) {}

// A layer ref that is a host directory ("/...") lends the call a host tree
// as root: only local callers (the unix socket, root's) may name one; a TCP
// caller's bearer token grants the API, not the host's file system.
grpc::Status FnCallServiceImpl::CheckLayerRefs(const grpc::ServerContext* ctx,
                                               const google::protobuf::RepeatedPtrField<std::string>& refs) {
  for (int i = 0; i < refs.size(); ++i) {
    if (!refs[i].empty() && refs[i][0] == '/') {
      RETURN_IF_GRPC_ERROR(Authorizer::RequireLocal(
          *ctx, "fncall layers[" + std::to_string(i) + "] \"" + refs[i] +
                    "\": host directories are for local (unix socket) callers only; name a layer"));
    }
  }
  return grpc::Status::OK;
}

grpc::Status FnCallServiceImpl::Call(grpc::ServerContext* ctx, const warren::v1::FnCallRequest* req,
                                     warren::v1::FnCallResponse* resp) {
  RETURN_IF_GRPC_ERROR(auth_.Check(*ctx));
  if (grpc::Status a = CheckLayerRefs(ctx, req->layers()); !a.ok()) return a;
  std::vector<std::string> layers(req->layers().begin(), req->layers().end());
  StatusOr<runtime::FnCallResult> r = frontend_->Run(layers, FromProto(*req));
  if (!r.ok()) return ToGrpcStatus(r.status());
  ToProto(*r, resp);
  return grpc::Status::OK;
}

grpc::Status FnCallServiceImpl::CallBatch(grpc::ServerContext* ctx, const warren::v1::FnCallBatchRequest* req,
                                          warren::v1::FnCallBatchResponse* resp) {
  RETURN_IF_GRPC_ERROR(auth_.Check(*ctx));
  for (const auto& q : req->requests()) {
    if (grpc::Status a = CheckLayerRefs(ctx, q.layers()); !a.ok()) return a;
  }
  std::vector<std::pair<std::vector<std::string>, runtime::FnCallRequest>> calls;
  calls.reserve(req->requests_size());
  for (const auto& q : req->requests()) {
    calls.emplace_back(std::vector<std::string>(q.layers().begin(), q.layers().end()), FromProto(q));
  }
  uint32_t conc = req->concurrency() ? req->concurrency() : 64;
  auto results = frontend_->RunBatch(calls, conc);
  for (auto& r : results) {
    warren::v1::FnCallResponse* out = resp->add_responses();
    if (r.ok()) {
      ToProto(*r, out);
    } else {
      out->set_sandbox_error(r.status().ToString());
    }
  }
  return grpc::Status::OK;
}

}  // namespace warren::api
