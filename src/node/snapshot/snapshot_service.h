// Snapshot, fork and grade: services on top of the sandbox table. They read
// a sandbox's changes through the backend's ChangeExporter capability (a
// backend-neutral layer tree, see runtime/backend.h), build layers from them
// and make new sandboxes through the table's own create/destroy (never the
// manager's public API: no request ids, no audit of the helper sandboxes).
//
// Copy bounds: a snapshot or grade copies at most disk_mb MiB + 1/4
// (metadata) from a sandbox, holes at 1/16 of their size, and at most
// ManagerOptions::max_staging_bytes node-wide: ResourceExhausted naming the
// sandbox, the size and the limit. Thread-safe (no state but the staging
// counter, shared with the manager).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "node/layer_provider.h"
#include "node/sandbox_types.h"
#include "node/table/sandbox_table.h"

namespace warren::node {

struct ForkRequest {
  std::string id;
  uint32_t count = 0;                         // 1..kMaxForks
  std::map<std::string, std::string> labels;  // merged over the source's
  uint32_t ttl_s = 0;                         // 0 = the source's ttl_s
  std::vector<std::string> exclude;           // as SnapshotRequest::exclude
  bool pause = true;                          // as SnapshotRequest::pause
  std::string project;                        // as SnapshotRequest::project
};
struct ForkResult {
  image::LayerInfo layer;              // the snapshot layer (the forks' top layer)
  std::vector<SandboxInfo> sandboxes;  // `count` running sandboxes
};

class SnapshotService {
 public:
  static constexpr uint32_t kMaxForks = 256;

  // Borrows everything.
  SnapshotService(const ManagerOptions& options, SandboxTable& table, LayerProvider& layers,
                  std::atomic<uint64_t>& staging_used)
      : options_(options), table_(table), layers_(layers), staging_used_(staging_used) {}

  // Packs the sandbox's changes (minus `exclude`) into a new layer: ids as
  // inside, whiteouts/opaque dirs/xattrs/hardlinks kept. A sandbox from the
  // same layers + this one shows the snapshotted state.
  StatusOr<image::LayerInfo> Snapshot(const SnapshotRequest& request);

  // Snapshot, then `count` sandboxes made from the source's layers plus the
  // snapshot layer, each keeping the source's backend, env (byte-exact),
  // workdir, user, hostname rule (an explicit hostname is kept, else each
  // fork is named after its id), resources, labels (merged with the
  // request's), job, TTL (the request's or the source's) and idle timeout.
  // All or nothing: if a fork cannot be made, those made are destroyed and
  // the snapshot layer is removed unless a sandbox uses it; the error names
  // how many were made. InvalidArgument for count 0 or above kMaxForks.
  StatusOr<ForkResult> Fork(const ForkRequest& request);

  // Tamper-proof grading by construction: the grader runs in a FRESH
  // sandbox from the sandbox's pristine layers (those its creator gave,
  // never one a sandbox made: see SandboxInfo::pristine_layers) plus, for
  // each of the agent's diffs (the layers above the pristine ones, then its
  // own changes), a layer holding only what the diff has under
  // `request.solution`. Nothing else of the agent's reaches the grader: not
  // its interpreter, site-packages, test config, PATH, loader preload.
  // `touched` lists every agent change outside the solution paths.
  StatusOr<GradeResult> Grade(const GradeRequest& request);

 private:
  const ManagerOptions& options_;
  SandboxTable& table_;
  LayerProvider& layers_;
  std::atomic<uint64_t>& staging_used_;
};

}  // namespace warren::node
