#include "api/fncall_service.h"

#include <sys/stat.h>

#include <atomic>
#include <thread>

#include "api/convert.h"
#include "api/status_map.h"

namespace warren::api {

runtime::FnCallRequest FromProto(const warren::v1::FnCallRequest& r) {
  runtime::FnCallRequest q;
  q.language = r.language().empty() ? "python" : r.language();
  if (q.language == "python3") q.language = "python";
  if (q.language == "c++") q.language = "cpp";
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

FnCallFrontend::FnCallFrontend(runtime::FnCallPool* pool, node::LayerProvider* layers,
                               std::vector<std::string> default_layers)
    : pool_(pool), layers_(layers), default_layers_(std::move(default_layers)) {}

FnCallFrontend::~FnCallFrontend() { ReleaseLayers(); }

void FnCallFrontend::ReleaseLayers() {
  std::lock_guard<std::mutex> l(mu_);
  if (layers_ != nullptr) {
    for (const auto& [digest, path] : acquired_) layers_->Release(digest);
  }
  acquired_.clear();
}

StatusOr<std::vector<std::string>> FnCallFrontend::LowerDirs(const std::vector<std::string>& refs_in) {
  const std::vector<std::string>& refs = refs_in.empty() ? default_layers_ : refs_in;
  if (refs.empty()) return absl::InvalidArgumentError("fncall: no layers given and no default image");
  std::vector<std::string> dirs;
  for (const std::string& ref : refs) {
    // A plain directory (tests, --fncall-layers pointing at a rootfs dir).
    if (!ref.empty() && ref[0] == '/') {
      dirs.push_back(ref);
      continue;
    }
    if (layers_ == nullptr) return absl::FailedPreconditionError("fncall: no layer store");
    ASSIGN_OR_RETURN(image::LayerInfo info, layers_->Resolve(ref));
    std::lock_guard<std::mutex> l(mu_);
    auto it = acquired_.find(info.digest);
    if (it == acquired_.end()) {
      ASSIGN_OR_RETURN(std::string path, layers_->Acquire(info.digest));
      it = acquired_.emplace(info.digest, path).first;
    }
    dirs.push_back(it->second);
  }
  return dirs;
}

StatusOr<runtime::FnCallResult> FnCallFrontend::Run(const std::vector<std::string>& layer_refs,
                                                    const runtime::FnCallRequest& request) {
  ASSIGN_OR_RETURN(std::vector<std::string> dirs, LowerDirs(layer_refs));
  return pool_->Call(dirs, request);
}

std::vector<StatusOr<runtime::FnCallResult>> FnCallFrontend::RunBatch(
    const std::vector<std::pair<std::vector<std::string>, runtime::FnCallRequest>>& calls, uint32_t concurrency) {
  std::vector<StatusOr<runtime::FnCallResult>> out(calls.size(), absl::InternalError("not run"));
  const size_t n = std::min<size_t>(calls.size(), std::max<uint32_t>(concurrency, 1));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < calls.size(); i = next++) out[i] = Run(calls[i].first, calls[i].second);
  };
  std::vector<std::thread> ts;
  for (size_t i = 1; i < n; ++i) ts.emplace_back(work);
  work();
  for (auto& t : ts) t.join();
  return out;
}

FnCallServiceImpl::FnCallServiceImpl(FnCallFrontend* frontend, std::string token)
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
