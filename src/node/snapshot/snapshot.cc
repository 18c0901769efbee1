#include "node/snapshot/snapshot_service.h"

#include "common/file_util.h"
#include "common/log.h"
#include "image/layer_tree.h"
#include "node/snapshot/freeze.h"

namespace warren::node {

using image::CopyBudget;

StatusOr<image::LayerInfo> SnapshotService::Snapshot(const SnapshotRequest& req) {
  SandboxState state;
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, table_.Live(req.id, &state));
  const bool paused = state != SandboxState::kRunning;
  const int64_t t0 = WallNowNs();
  const std::string name = req.name.empty() ? "workspace/snap-" + req.id + "@" + std::to_string(t0) : req.name;
  if (name.find('@') == std::string::npos) {
    return absl::InvalidArgumentError("snapshot name " + Quote(name) + " must be kind/name@version");
  }
  ASSIGN_OR_RETURN(runtime::ChangeExporter * exporter, runtime::Require<runtime::ChangeExporter>(*e->sandbox));
  CopyBudget budget("sandbox " + req.id, CopyLimitBytes(e->info.resources), &staging_used_, options_.max_staging_bytes);
  runtime::ExportOptions eo;
  eo.exclude = req.exclude;
  eo.budget = &budget;
  const std::string staging = options_.state_dir + "/tmp/snap-" + req.id + "-" + std::to_string(t0);
  {
    FreezeGuard freeze(e->sandbox.get(), req.pause && !paused);
    Status cs = exporter->ExportChanges(staging, eo);
    if (!cs.ok()) {
      return Status(cs.code(), cs.code() == absl::StatusCode::kResourceExhausted  // names the sandbox
                                   ? "snapshot: " + std::string(cs.message())
                                   : "snapshot of sandbox " + req.id + ": " + std::string(cs.message()));
    }
  }
  StatusOr<image::LayerInfo> li = layers_.BuildFromSandboxDir(name, staging, req.project);
  Status rm = RemoveTree(staging);
  if (!rm.ok())
    Log(spdlog::level::warn, "removing snapshot staging failed", {{"dir", staging}, {"error", rm.ToString()}});
  if (!li.ok()) return li.status();
  Log(spdlog::level::info, "snapshot",
      {{"sandbox", req.id},
       {"layer", name},
       {"digest", li->digest},
       {"bytes", std::to_string(budget.used())},
       {"ms", std::to_string((WallNowNs() - t0) / 1000000)}});
  return li;
}

StatusOr<ForkResult> SnapshotService::Fork(const ForkRequest& req) {
  if (req.count == 0 || req.count > kMaxForks) {
    return absl::InvalidArgumentError("fork of sandbox " + req.id + ": count=" + std::to_string(req.count) +
                                      " must be in [1, " + std::to_string(kMaxForks) + "]");
  }
  for (const auto& [k, v] : req.labels) {
    if (k.empty() || k.size() > 253 || HasControl(k) || v.size() > 1024 || HasControl(v)) {
      return absl::InvalidArgumentError("fork of sandbox " + req.id + ": label " + Quote(k) + "=" + Quote(v) +
                                        " is not a valid label");
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, table_.Live(req.id));
  // The source's spec as created (its backend, env, workdir, user, hostname
  // rule, resources, labels, job, TTL, idle timeout) and layers by digest.
  CreateRequest cr = e->spec;
  const std::vector<std::string> source_layers = e->info.layer_digests;
  const uint32_t source_ttl_s = e->info.ttl_s;
  SnapshotRequest sr;
  sr.id = req.id;
  sr.name = "workspace/fork-" + req.id + "@" + std::to_string(WallNowNs());
  sr.exclude = req.exclude;
  sr.pause = req.pause;
  sr.project = req.project;
  ASSIGN_OR_RETURN(image::LayerInfo layer, Snapshot(sr));
  ForkResult out;
  out.layer = layer;
  cr.layers = source_layers;
  cr.layers.push_back(layer.digest);
  for (const auto& [k, v] : req.labels) cr.labels[k] = v;
  cr.ttl_s = req.ttl_s != 0 ? req.ttl_s : source_ttl_s;
  cr.request_id.clear();  // the source's create key: these are other creates
  cr.deadline = std::chrono::steady_clock::time_point::max();
  cr.cancelled = nullptr;
  Status failed;
  for (uint32_t i = 0; i < req.count; ++i) {
    StatusOr<SandboxInfo> f = table_.Create(cr);
    if (!f.ok()) {
      failed = Status(f.status().code(), "fork of sandbox " + req.id + ": fork " + std::to_string(i + 1) + " of " +
                                             std::to_string(req.count) + ": " + std::string(f.status().message()));
      break;
    }
    out.sandboxes.push_back(std::move(*f));
  }
  if (failed.ok()) {
    Log(spdlog::level::info, "forked",
        {{"sandbox", req.id}, {"count", std::to_string(req.count)}, {"layer", layer.digest}});
    return out;
  }
  // All or nothing: the forks made go, and the layer unless another sandbox
  // uses it (RemoveLayer refuses a layer in use).
  for (const SandboxInfo& f : out.sandboxes) {
    Status ds = table_.Destroy(f.id, "fork failed");
    if (!ds.ok()) Log(spdlog::level::warn, "destroying a fork failed", {{"sandbox", f.id}, {"error", ds.ToString()}});
  }
  Status rs = table_.RemoveLayer(sr.name);
  if (!rs.ok()) {
    Log(spdlog::level::warn, "removing the fork layer failed", {{"layer", sr.name}, {"error", rs.ToString()}});
  }
  Log(spdlog::level::warn, "fork failed", {{"sandbox", req.id}, {"error", failed.ToString()}});
  return failed;
}

}  // namespace warren::node
