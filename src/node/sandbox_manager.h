// SandboxManager: the node (DESIGN.md §2 "node"), a facade over its rooms,
// each owning one concern and its own lock:
//   table/        the sandbox table and each sandbox's state machine; create,
//                 destroy, pause/resume/suspend, recovery after a restart
//   admission/    validation of create requests, create slots and queue
//   records/      what survives a daemon restart (one record per sandbox)
//   reaper/       TTL and idle timeout, periodic layer sweep
//   jobs/         jobs and their leases
//   audit/        the per-sandbox audit log
//   idempotency/  request ids of calls and of creates
//   snapshot/     snapshot and grade, services on top of the table
// The manager owns the backends (by name) and the layer provider, wires the
// rooms together and audits calls. Its destructor (daemon shutdown) does NOT
// destroy sandboxes: they outlive the daemon and are re-adopted by the next
// Start().
//
// Thread-safe. Errors (absl::Status): InvalidArgument naming the field and
// value; NotFound for unknown ids or layers; FailedPrecondition for a
// sandbox that is not running; ResourceExhausted (retryable) when admission
// refuses (table full, create queue full) or the state dir is full;
// DeadlineExceeded / Cancelled when a create's deadline passed or its client
// went away while it waited in the create queue.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "node/admission/admission.h"
#include "node/audit/audit_log.h"
#include "node/idempotency/call_slots.h"
#include "node/idempotency/create_keys.h"
#include "node/jobs/jobs.h"
#include "node/layer_provider.h"
#include "node/metrics.h"
#include "node/process_table.h"
#include "node/reaper/reaper.h"
#include "node/records/record_store.h"
#include "node/sandbox_types.h"
#include "node/snapshot/snapshot_service.h"
#include "node/table/sandbox_table.h"
#include "runtime/backend.h"

namespace warren::node {

class SandboxManager {
 public:
  // Takes ownership of the backends (keyed by Backend::name()) and the
  // layer provider. Creates the state dir layout. Call Start() before use.
  static StatusOr<std::unique_ptr<SandboxManager>> New(ManagerOptions options,
                                                       std::vector<std::unique_ptr<runtime::Backend>> backends,
                                                       std::unique_ptr<LayerProvider> layers);
  ~SandboxManager();  // stops the reaper's threads; sandboxes keep running

  // Recovers persisted sandboxes (see the header comment), then starts the
  // periodic sweep. Errors only if the state dir is unreadable; a record that
  // cannot be recovered is logged, cleaned up and dropped.
  Status Start();

  // With request.request_id set, a create retried with the same key returns
  // the sandbox the first one made while it exists (a concurrent duplicate
  // waits for the first, until its own deadline); a failed create is not
  // recorded (a retry runs again); an abandoned key is refused (Cancelled).
  // The last kMaxCreateKeys keys are kept, in memory only.
  StatusOr<SandboxInfo> Create(const CreateRequest& request);
  // The client of the create with `request_id` gave up: its sandbox is
  // destroyed now if it was made, or by the create itself when it finishes
  // (which then returns Cancelled); the key is refused from now on. OK when
  // nothing was made (a tombstone is kept for a create still on its way).
  Status AbandonCreate(const std::string& request_id);
  Status Destroy(const std::string& id);
  StatusOr<SandboxInfo> Get(const std::string& id) const;
  // Sandboxes carrying all `labels` and, if `job` is non-empty, of that job.
  std::vector<SandboxInfo> List(const std::map<std::string, std::string>& labels, const std::string& job) const;

  // The backend sandbox of a running entry, for Exec and files: NotFound for
  // unknown ids, FailedPrecondition while creating or destroying. The
  // returned object stays valid after a concurrent Destroy (its calls then
  // fail or return promptly).
  // Resumes a paused or suspended sandbox first and marks activity (a call
  // is about to use it): not a query, see Get for one.
  StatusOr<std::shared_ptr<runtime::Sandbox>> Running(const std::string& id);
  StatusOr<runtime::ExecOutcome> Exec(const std::string& id, const runtime::ExecSpec& spec);

  // ---- lifecycle (DESIGN.md §5)
  // Exec with a request id: the first call with (id, request_id) runs, later
  // ones return its recorded outcome (a concurrent duplicate waits for the
  // first). Recorded in memory, at most max_recorded_calls per sandbox
  // (oldest dropped), dropped with the sandbox and on daemon restart.
  // An empty request_id runs unconditionally. Calls that fail with an error
  // are not recorded (duplicates waiting on them get the same error).
  StatusOr<runtime::ExecOutcome> Exec(const std::string& id, const runtime::ExecSpec& spec,
                                      const std::string& request_id);
  // Same for any call (file writes): `run` executes at most once per key.
  StatusOr<RecordedCall> Idempotent(const std::string& id, const std::string& request_id,
                                    const std::function<StatusOr<RecordedCall>()>& run);
  // Sets the TTL to `ttl_s` seconds from now (0 = no TTL). Persisted.
  StatusOr<SandboxInfo> ExtendTtl(const std::string& id, uint32_t ttl_s);
  // Replaces the sandbox's egress policy (see SandboxTable::SetNetwork).
  StatusOr<runtime::NetworkSpec> SetNetwork(const std::string& id, const runtime::NetworkSpec& network);
  // Exposed ports and what Get shows of the network (see SandboxTable).
  StatusOr<runtime::ExposedPort> Expose(const std::string& id, uint16_t port);
  Status Unexpose(const std::string& id, uint16_t port);
  StatusOr<NetworkView> Network(const std::string& id) const;
  // Freezes every process (state kPaused, persisted). Any exec or file call
  // (Running()) resumes it first. Idempotent.
  Status Pause(const std::string& id);
  // Resumes a paused or suspended sandbox (a suspended one gets its working
  // set prefetched first, see ManagerOptions::suspend_prefetch). Idempotent.
  Status Resume(const std::string& id);
  // Same; `prefetch` false skips the working-set prefetch of a suspended
  // sandbox even when ManagerOptions::suspend_prefetch is set.
  Status Resume(const std::string& id, bool prefetch);
  // Pauses (if running) then reclaims the sandbox's memory into swap
  // (kSuspended, persisted). Idempotent. If the reclaim fails, a sandbox that
  // was running is resumed and the error returned.
  Status Suspend(const std::string& id);
  StatusOr<SandboxMemory> Memory(const std::string& id) const;
  // Every job with a lease or with sandboxes, by name.
  std::vector<JobInfo> ListJobs() const;
  // Snapshot, fork and grade: see node/snapshot/snapshot_service.h.
  StatusOr<image::LayerInfo> Snapshot(const SnapshotRequest& request);
  StatusOr<ForkResult> Fork(const ForkRequest& request);
  StatusOr<GradeResult> Grade(const GradeRequest& request);
  // Audit log of a sandbox: one JSON object per exec / file call, oldest first
  // (<state_dir>/audit/<id>.jsonl, outside every sandbox; removed on destroy).
  StatusOr<std::vector<nlohmann::json>> AuditLog(const std::string& id) const;
  // Appends one record (the API calls this for file operations).
  void Audit(const std::string& id, const nlohmann::json& entry) const;
  // Jobs. Heartbeat renews (or starts) the lease: lease_s/grace_s 0 keep the
  // previous values (defaults 60 s / 300 s). Persisted in <state_dir>/jobs.json.
  StatusOr<JobInfo> JobHeartbeat(const std::string& job, uint32_t lease_s, uint32_t grace_s);
  StatusOr<JobInfo> GetJob(const std::string& job) const;
  // Suspend / resume / destroy every sandbox of a job; returns how many were
  // affected. Errors of single sandboxes are logged and skipped.
  uint32_t SuspendJob(const std::string& job, const std::string& reason);
  uint32_t ResumeJob(const std::string& job);
  uint32_t DestroyJob(const std::string& job, const std::string& reason);
  // Destroys sandboxes whose TTL or idle timeout expired (the reaper thread
  // calls this; a paused or suspended sandbox is never idle, its TTL still runs), suspends
  // the sandboxes of jobs whose lease lapsed and destroys them after the
  // grace period; returns the ids destroyed for TTL/idle.
  std::vector<std::string> ReapExpired();

  // ---- processes (node/process_table.h, api/warren/v1/process.proto)
  // Background process: kept in the table (survives the caller), audited
  // ("spawn" at start, "process_exit" at exit), stopped when the sandbox is
  // destroyed. A running background process does not count as activity for
  // the idle timeout (only calls do).
  StatusOr<std::shared_ptr<ManagedProcess>> Spawn(const std::string& id, const runtime::ExecSpec& spec,
                                                  const ProcessOptions& options);
  // Attached process (streaming exec): not in the table, the caller owns it
  // (and Stop()s it when its client goes away). Counts as a running exec for
  // the idle timeout; audited as "exec_stream" at exit.
  StatusOr<std::shared_ptr<ManagedProcess>> StartAttached(const std::string& id, const runtime::ExecSpec& spec,
                                                          const ProcessOptions& options);
  // NotFound for an unknown sandbox or process.
  StatusOr<std::shared_ptr<ManagedProcess>> FindProcess(const std::string& id, const std::string& process_id) const;
  StatusOr<std::vector<ProcessStatus>> Processes(const std::string& id) const;

  // Layers: number of sandboxes in the table using `digest`, and removal that
  // refuses (FailedPrecondition) a layer in use.
  uint32_t LayerUsers(const std::string& digest) const;
  Status RemoveLayer(const std::string& ref);
  LayerProvider& layers() { return *layers_; }

  std::vector<std::string> BackendNames() const;
  NodeCounters Counters() const;
  // What the sandboxes of each QoS class (index runtime::Qos) asked for.
  std::array<ClassUsage, 2> ClassUsages() const;
  // The node's scrape-time gauges: sandboxes by (backend, state) for every
  // backend and state (0 included), admission, layer mounts; not fncall,
  // which the manager does not own.
  NodeGauges Gauges() const;
  const ManagerOptions& options() const { return options_; }

  // Validates and fills defaults (exposed for tests and the API's dry checks).
  StatusOr<CreateRequest> Normalize(const CreateRequest& request) const;

 private:
  SandboxManager(ManagerOptions options, SandboxTable::Backends backends, std::unique_ptr<LayerProvider> layers,
                 RecordStore records);
  // The table's create, then what the request asks of the running sandbox
  // (CreateRequest::expose, start_argv); a failure there destroys it.
  StatusOr<SandboxInfo> CreateAndStart(const CreateRequest& r);
  // What a process's audit record says (at spawn and at exit).
  static nlohmann::json ProcessAudit(const ProcessStatus& st, const char* op);

  const ManagerOptions options_;
  const SandboxTable::Backends backends_;
  const std::unique_ptr<LayerProvider> layers_;
  const RecordStore records_;
  const int64_t started_at_ns_;
  Metrics& metrics_;
  std::atomic<uint64_t> staging_used_{0};  // bytes in snapshot/grade staging now

  // The rooms, in dependency order (each borrows those declared before it).
  std::unique_ptr<SandboxTable> table_;
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<node::AuditLog> audit_;
  std::unique_ptr<CallSlots> calls_;
  std::unique_ptr<CreateKeys> create_keys_;
  std::unique_ptr<Jobs> jobs_;
  std::unique_ptr<SnapshotService> snapshots_;
  // Declared last: destroyed first (stops the threads and the process
  // pumps before anything they use).
  std::unique_ptr<ProcessTable> processes_ = std::make_unique<ProcessTable>();
  std::unique_ptr<Reaper> reaper_;
};

}  // namespace warren::node
