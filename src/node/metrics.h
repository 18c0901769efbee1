// The node's metrics hooks: the node calls one method at the one place each
// event happens (a create finished, a sandbox left the table, an exec ran,
// ...); an implementation counts them (src/metrics: Prometheus, served by
// warrend --metrics-listen). This class is the null implementation: every
// hook does nothing, so a node without metrics pays one virtual call per
// event and the node never includes a metrics library's headers.
//
// Contract for implementations: hooks are called concurrently from any
// thread, never with a node lock held, and must not block (no I/O). Every
// label value they receive has a small bound: backend names of this node's
// backends (or "unknown" for a create naming none of them), status code
// names, DestroyCause names; never a sandbox id, a layer or a job.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace warren::node {

// What the node reports at scrape time, read from its rooms then (not kept
// by hand beside them).
struct NodeGauges {
  // (backend, state name) -> sandboxes in the table now.
  std::map<std::pair<std::string, std::string>, uint32_t> sandboxes;
  uint32_t creates_in_flight = 0;    // holding a create slot
  uint32_t creates_queued = 0;       // waiting for one
  uint64_t layer_mounts = 0;         // layers mounted on this node
  uint64_t layer_mounted_bytes = 0;  // their EROFS images' size
  // The layer mount cache since the node started (counters read at scrape
  // time): Acquires served by a mount that was there, Acquires that mounted,
  // mounts that failed, unused mounts removed.
  uint64_t layer_cache_hits = 0, layer_cache_misses = 0, layer_cache_failures = 0, layer_cache_evictions = 0;
  // The node-local read cache of layer blobs (LayerProvider::CacheStats's
  // read_cache_* fields; absent when the node has none). The per-layer map
  // has one entry per layer the cache read since start (the node's layers:
  // bounded by its store, not by requests).
  bool read_cache = false;
  uint64_t read_cache_cap_bytes = 0, read_cache_bytes = 0;
  uint64_t read_cache_hits = 0, read_cache_misses = 0, read_cache_evictions = 0, read_cache_write_errors = 0;
  std::map<std::string, uint64_t> layer_store_read_bytes;  // "sha256:<hex>" -> bytes read from the store
  uint64_t read_cache_prefetched_bytes = 0;                // of them, read ahead from hot lists
  uint64_t read_cache_metadata_bytes = 0;                  // of read_cache_bytes, open layers' metadata (kept)
  // The fncall pool (warrend's): workers by occupancy.
  bool fncall = false;
  uint32_t fncall_workers_busy = 0, fncall_workers_idle = 0;
};

class Metrics {
 public:
  virtual ~Metrics() = default;
  // A create finished (SandboxTable::Create, also a fork's): `result` OK or
  // its error; `took` from the call to its end, admission queue included.
  virtual void OnCreate(std::string_view /*backend*/, const Status& /*result*/, std::chrono::nanoseconds /*took*/) {}
  // A sandbox left the table; `reason` is the destroy's reason text
  // (DestroyCause maps it to a label).
  virtual void OnDestroy(std::string_view /*backend*/, std::string_view /*reason*/) {}
  // A unary exec reached the sandbox and returned: `outcome` is ExecOutcomeLabel's.
  virtual void OnExec(std::string_view /*backend*/, std::string_view /*outcome*/, std::chrono::nanoseconds /*took*/) {}
  virtual void OnPause(std::string_view /*backend*/) {}
  // `swap_bytes`: the sandbox's memory in swap (or written out) after it.
  virtual void OnSuspend(std::string_view /*backend*/, uint64_t /*swap_bytes*/) {}
  // `prefetched_bytes`: read back from swap before it ran (suspended only).
  virtual void OnResume(std::string_view /*backend*/, bool /*from_suspended*/, uint64_t /*prefetched_bytes*/) {}
  // An fncall call finished: `outcome` "ok", "sandbox_error" or a status code name.
  virtual void OnFnCall(std::string_view /*outcome*/, std::chrono::nanoseconds /*took*/) {}
};

// The process-wide null implementation.
Metrics& NullMetrics();

// The label of a call's result: "ok" or the status code's name in
// snake_case ("invalid_argument", "resource_exhausted", ...).
std::string OutcomeLabel(const Status& s);
// The label of an exec that returned: "ok" (whatever the exit code),
// "timed_out", "oom_killed", or OutcomeLabel of its error.
std::string ExecOutcomeLabel(const Status& s, bool timed_out, bool oom_killed);
// The label of a destroy's reason text: "client" (destroy requested),
// "ttl", "idle", "job" (job destroy or lapsed lease), "abandoned" (a create
// its client gave up on), "fork" (a failed fork's rollback), "grade" (a
// grade's own sandbox), "other".
std::string_view DestroyCause(std::string_view reason);

}  // namespace warren::node
