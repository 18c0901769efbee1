#include "node/fncall_frontend.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <thread>

namespace warren::node {

FnCallFrontend::FnCallFrontend(runtime::FnCallPool* pool, LayerProvider* layers,
                               std::vector<std::string> default_layers, Metrics* metrics)
    : pool_(pool),
      layers_(layers),
      default_layers_(std::move(default_layers)),
      metrics_(metrics != nullptr ? *metrics : NullMetrics()) {}

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
  for (const std::string& given : refs) {
    // Only the defaults may be optional (a caller's layers are what it asked for).
    const bool optional = refs_in.empty() && !given.empty() && given.back() == '?';
    const std::string ref = optional ? given.substr(0, given.size() - 1) : given;
    // A plain directory (tests, --fncall-layers pointing at a rootfs dir).
    if (!ref.empty() && ref[0] == '/') {
      struct stat st {};
      if (optional && !(::stat(ref.c_str(), &st) == 0 && S_ISDIR(st.st_mode))) continue;
      dirs.push_back(ref);
      continue;
    }
    if (layers_ == nullptr) {
      if (optional) continue;
      return absl::FailedPreconditionError("fncall: no layer store");
    }
    StatusOr<image::LayerInfo> resolved = layers_->Resolve(ref);
    if (optional && absl::IsNotFound(resolved.status())) continue;
    ASSIGN_OR_RETURN(image::LayerInfo info, std::move(resolved));
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
  const auto start = std::chrono::steady_clock::now();
  StatusOr<std::vector<std::string>> dirs = LowerDirs(layer_refs);
  StatusOr<runtime::FnCallResult> r = dirs.ok() ? pool_->Call(*dirs, request) : dirs.status();
  const std::string outcome = r.ok() && !r->sandbox_error.empty() ? "sandbox_error" : OutcomeLabel(r.status());
  metrics_.OnFnCall(outcome, std::chrono::steady_clock::now() - start);
  return r;
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

}  // namespace warren::node
