// SandboxManager: the node's sandbox table (DESIGN.md §2 "node"). Owns the
// backends by name, the layer provider (store + mount cache) and the
// persisted records under <state_dir>/sandboxes/<id>.json.
//
// Lifecycle of a sandbox on this node:
//   Create:  validate → admit (bounded creates in flight, the rest wait in a
//            bounded FIFO queue; bounded table) →
//            resolve layers → persist "creating" record → mkdir
//            <state_dir>/run/<id> → Acquire each layer → Backend::Create →
//            persist "running" record (with Sandbox::Record()).
//            Every step is undone if a later one fails: a failed create leaves
//            no record, no dir, no mount reference, no sandbox.
//   Destroy: state "destroying" (persisted) → Sandbox::Destroy (makes running
//            Execs return) → Release layers → remove record and dir.
//            Concurrent Destroys of one id wait for the first; destroying an
//            unknown id is NotFound.
//   Restart: Start() reads every record: "running" (also paused/suspended)
//            → Backend::Adopt and re-Acquire its layers, or Cleanup + remove
//            when it is gone;
//            "creating"/"destroying" → Backend::Cleanup + remove; then Sweep.
// The manager's destructor (daemon shutdown) does NOT destroy sandboxes: they
// outlive the daemon and are re-adopted by the next Start().
//
// Lifecycle for RL (issue 4), enforced here, not by clients:
//   TTL: expires_at_ns (persisted in the record) = create/ExtendTtl time + ttl;
//   idle: no exec/file call for idle_timeout_s (a running exec is never idle,
//   a paused sandbox neither; idle time restarts with the daemon). A reaper
//   thread (reap_interval) destroys expired sandboxes with the reason recorded.
//   Pause/Resume: cgroup freezer via the backend; "paused" is persisted (the
//   freezer state outlives the daemon); any exec/file call (Running()) resumes
//   first. Jobs: a lease per job renewed by JobHeartbeat; on lapse the job's
//   sandboxes are suspended, destroyed after grace_s unless a heartbeat comes first
//   (which resumes them). Suspend = pause + reclaim of the sandbox's memory
//   into swap/zram (Sandbox::ReclaimMemory); resuming a suspended sandbox
//   prefetches its working set (Sandbox::EndSuspend) before thawing it;
//   "suspended" is persisted like "paused". Snapshot/Grade: see image/layer_tree.h. Audit log: one
//   JSON line per exec/file call in <state_dir>/audit/<id>.jsonl, removed
//   with the sandbox. Request ids: in memory only (lost on daemon restart).
//
// Thread-safe. Errors (absl::Status): InvalidArgument naming the field and
// value; NotFound for unknown ids or layers; FailedPrecondition for a
// sandbox that is not running; ResourceExhausted (retryable) when admission
// refuses (table full, create queue full) or the state dir is full;
// DeadlineExceeded / Cancelled when a create's deadline passed or its client
// went away while it waited in the create queue.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "node/layer_provider.h"
#include "node/process_table.h"
#include "node/record_store.h"
#include "runtime/backend.h"

namespace warren::node {

// kSuspended: paused with its memory reclaimed into swap (issue 4).
enum class SandboxState { kCreating, kRunning, kDestroying, kPaused, kSuspended };
const char* SandboxStateName(SandboxState s);

// A user spec as accepted by create and exec: "root", a user name
// ([a-z_][a-z0-9_-]*$?, at most 32) or "uid[:gid]".
bool ValidUser(const std::string& user);

// A create request as the API received it. Zero resources take node defaults.
struct CreateRequest {
  std::string backend;              // empty = "container"
  std::vector<std::string> layers;  // refs, bottom first
  runtime::Resources resources{0, 0, 0, 0, 0, 0};
  std::map<std::string, std::string> env;
  std::string workdir;              // empty = "/"
  std::string user;                 // empty = "root"
  std::string hostname;             // empty = the sandbox id
  std::map<std::string, std::string> labels;
  uint32_t ttl_s = 0;
  std::string job;
  uint32_t idle_timeout_s = 0;      // 0 = none
  // Admission queue (issue 3 "fast"): how long this create may wait for a
  // create slot (the RPC's deadline); default: no deadline of its own (the
  // queue's bound, kMaxCreateQueueWait, still applies). `cancelled`, if set,
  // is polled while waiting (the RPC's client went away).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::function<bool()> cancelled;
  // Idempotency key (see AbandonCreate); empty = none.
  std::string request_id;
};

// A snapshot of one table entry.
struct SandboxInfo {
  std::string id;
  std::string backend;
  SandboxState state = SandboxState::kCreating;
  std::vector<std::string> layer_digests;  // bottom first
  std::vector<std::string> layer_names;    // as asked
  // The bottom layers up to (not including) the first one built from a
  // sandbox's contents (LayerInfo::from_sandbox: a snapshot): the layers the
  // creator chose, which grading trusts. A sandbox created from a snapshot's
  // layer list keeps the snapshotted sandbox's pristine layers (its lineage).
  // Persisted in the record.
  std::vector<std::string> pristine_layers;
  runtime::Resources resources;
  std::map<std::string, std::string> labels;
  std::string job;
  int64_t created_at_ns = 0;
  pid_t init_pid = 0;
  std::string hostname;
  uint32_t ttl_s = 0;
  int64_t expires_at_ns = 0;     // unix ns; 0 = no TTL
  uint32_t idle_timeout_s = 0;   // 0 = none
  int64_t last_activity_ns = 0;  // unix ns of the end of the last exec/file call
};

// Result of a call recorded for idempotent retries (request ids).
struct RecordedCall {
  runtime::ExecOutcome outcome;  // exec
  uint64_t bytes = 0;            // file write
};

// A job's lease (DESIGN.md §5): renewed by the trainer's heartbeats. When it
// lapses, the job's sandboxes are paused ("suspended"); when it stays lapsed
// for grace_s, they are destroyed. A heartbeat within the grace resumes them.
struct JobInfo {
  std::string name;
  uint32_t lease_s = 0;            // 0 = no lease (never lapses)
  uint32_t grace_s = 0;
  int64_t lease_expires_at_ns = 0;
  bool lapsed = false;
  int64_t lapsed_at_ns = 0;
  uint32_t sandboxes = 0;          // filled by GetJob
};

struct SnapshotRequest {
  std::string id;
  std::string name;                  // "kind/name@version"; empty = "workspace/snap-<id>@<unix ns>"
  std::vector<std::string> exclude;  // see runtime::ExportOptions::exclude
  bool pause = true;                 // freeze the sandbox for a consistent cut
};

struct GradeRequest {
  std::string id;
  runtime::ExecSpec grader;              // run in a fresh sandbox
  // Absolute inside paths where the task's solution lives: the only place
  // the agent's changes enter the grader. Required (non-empty).
  std::vector<std::string> solution;
  // Deprecated: everything outside `solution` is pristine anyway; a
  // protected path inside a solution path stays pristine too.
  std::vector<std::string> protected_paths;
};
struct GradeResult {
  runtime::ExecOutcome outcome;
  // Every agent change outside the solution paths (sorted, at most
  // kMaxTouched), plus the protected paths the agent changed.
  std::vector<std::string> touched;
  bool touched_truncated = false;
  std::string grade_sandbox_id;
  // Non-empty: the solution could not be packed (over the sandbox's disk
  // limit, a path longer than a layer holds); the grader did not run and
  // outcome is a failure (exit_code 1, this text on stderr).
  std::string rejected;
  static constexpr size_t kMaxTouched = 4096;
};

struct NodeLimits {
  uint32_t cpus = 0;           // 0 = probe (online CPUs)
  uint64_t memory_mb = 0;      // 0 = probe (MemTotal)
  uint32_t max_sandboxes = 0;  // 0 = 16384
  uint32_t max_creates_in_flight = 0;  // 0 = 4 × cpus
  // Creates beyond max_creates_in_flight wait in a FIFO queue of at most
  // this many (0 = 1024) instead of being refused; a create that finds the
  // queue full gets ResourceExhausted ("create queue is full").
  uint32_t max_create_queue = 0;
};

struct ManagerOptions {
  std::string node_id = "n0";  // [a-z0-9][a-z0-9-]{0,30}; prefix of every sandbox id
  std::string state_dir;       // snapshot staging (<state_dir>/tmp), jobs.json
  // Per-sandbox runtime state: records in <run_dir>/sandboxes, runtime dirs
  // in <run_dir>/run, audit logs in <run_dir>/audit. Empty = state_dir.
  // warrend puts it on a tmpfs (/run/warren/...; see ResolveRunDir): these
  // files live as long as their sandbox, which never outlives a reboot, and
  // creating/renaming short-lived files on a busy ext4 costs more CPU than
  // the rest of a create (inode bitmap scans).
  std::string run_dir;
  NodeLimits limits;
  std::chrono::milliseconds sweep_interval{10000};  // 0 = no periodic sweep thread
  std::chrono::milliseconds reap_interval{500};     // TTL/idle reaper period; 0 = no reaper thread
  size_t max_recorded_calls = 1024;                 // per sandbox, for request ids
  bool suspend_prefetch = true;  // resuming a suspended sandbox prefetches its working set
  // Node-wide cap on the bytes that snapshot and grade staging trees (and so
  // the layers built from them) hold at once; 0 = none. Each sandbox is
  // bounded by its own disk limit as well (see Snapshot).
  uint64_t max_staging_bytes = 0;
};

// Memory of one sandbox, read from its memory cgroup now.
struct SandboxMemory {
  uint64_t memory_bytes = 0;  // charged (RSS + page cache + tmpfs)
  uint64_t swap_bytes = 0;    // of it in swap
};

struct NodeCounters {
  uint32_t sandboxes = 0;
  uint32_t creates_in_flight = 0;
  uint32_t creates_queued = 0;  // waiting for a create slot
  int64_t started_at_ns = 0;
  uint32_t cpus = 0;
  uint64_t memory_mb = 0;
};

class SandboxManager {
 public:
  // Takes ownership of the backends (keyed by Backend::name()) and the
  // layer provider. Creates the state dir layout. Call Start() before use.
  static StatusOr<std::unique_ptr<SandboxManager>> New(
      ManagerOptions options, std::vector<std::unique_ptr<runtime::Backend>> backends,
      std::unique_ptr<LayerProvider> layers);
  ~SandboxManager();  // stops the sweep thread; sandboxes keep running

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
  std::vector<SandboxInfo> List(const std::map<std::string, std::string>& labels,
                                const std::string& job) const;

  // The backend sandbox of a running entry, for Exec and files: NotFound for
  // unknown ids, FailedPrecondition while creating or destroying. The
  // returned object stays valid after a concurrent Destroy (its calls then
  // fail or return promptly).
  StatusOr<std::shared_ptr<runtime::Sandbox>> Running(const std::string& id) const;
  StatusOr<runtime::ExecOutcome> Exec(const std::string& id, const runtime::ExecSpec& spec);

  // ---- lifecycle (issue 4; DESIGN.md §5)
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
  // Packs the sandbox's changes (runtime::ChangeExporter, minus `exclude`) into a new layer: ids mapped
  // back to those inside, whiteouts/opaque dirs/xattrs/hardlinks kept. A
  // sandbox from the same layers + this one shows the snapshotted state.
  StatusOr<image::LayerInfo> Snapshot(const SnapshotRequest& request);
  // Snapshot and grade copy at most disk_mb MiB + 1/4 (metadata) from a
  // sandbox, holes at 1/16 of their size (sparse files stay sparse; see
  // CopyBudget), and
  // at most ManagerOptions::max_staging_bytes node-wide: ResourceExhausted
  // naming the sandbox, the size and the limit.
  //
  // Tamper-proof grading by construction: the grader runs in a FRESH
  // sandbox from the sandbox's pristine layers (those its creator gave,
  // never one a sandbox made: see SandboxInfo::pristine_layers) plus, for
  // each of the agent's diffs (the layers above the pristine ones, then its
  // upper), a layer holding only what the diff has under
  // `request.solution`. Nothing else of the agent's reaches the grader: not
  // its interpreter, site-packages, test config, PATH, loader preload.
  // `touched` lists every agent change outside the solution paths.
  StatusOr<GradeResult> Grade(const GradeRequest& request);
  // Audit log of a sandbox: one JSON object per exec / file call, oldest first
  // (<state_dir>/audit/<id>.jsonl, outside every sandbox; removed on destroy).
  StatusOr<std::vector<nlohmann::json>> AuditLog(const std::string& id) const;
  // Appends one record (the API calls this for file operations).
  void Audit(const std::string& id, nlohmann::json entry) const;
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

  // ---- processes (issue 3; node/process_table.h, api/warren/v1/process.proto)
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
  const ManagerOptions& options() const { return options_; }

  // Validates and fills defaults (exposed for tests and the API's dry checks).
  StatusOr<CreateRequest> Normalize(const CreateRequest& request) const;

 private:
  struct Entry;
  SandboxManager(ManagerOptions options, std::map<std::string, std::unique_ptr<runtime::Backend>> backends,
                 std::unique_ptr<LayerProvider> layers, RecordStore records);

  nlohmann::json MakeRecord(const Entry& e, SandboxState state) const;
  // Pause/resume/suspend bookkeeping after the backend call succeeded: sets
  // the state (under mu_), records the transition and persists the record; a
  // failed write is logged (the sandbox is in that state either way).
  void SetPausedState(Entry& e, const std::string& id, SandboxState to, const std::string& reason);
  SandboxInfo InfoOf(const Entry& e) const;
  std::string NewId();
  std::string RunDir(const std::string& id) const;
  // The table entry of `id` (taken under mu_, used after it is released:
  // entries are shared_ptr), or NotFound naming the id.
  StatusOr<std::shared_ptr<Entry>> FindEntry(const std::string& id) const;
  void RecoverOne(const std::string& id, const nlohmann::json& record);
  void CleanupRecord(const std::string& id, const nlohmann::json& record, const std::string& reason);
  void SweepLoop();
  void ReapLoop();
  Status DestroyWithReason(const std::string& id, const std::string& reason);
  // Marks activity (an exec/file call starting: +1, ending: -1).
  void Touch(const std::string& id, int delta_inflight) const;
  std::string AuditPath(const std::string& id) const;

  const ManagerOptions options_;
  const std::map<std::string, std::unique_ptr<runtime::Backend>> backends_;
  const std::unique_ptr<LayerProvider> layers_;
  const RecordStore records_;
  const int64_t started_at_ns_;

  // Held shared by creates from layer resolution until the entry is in the
  // table, exclusively by RemoveLayer: a layer cannot vanish under a create.
  mutable std::shared_mutex layer_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // an entry left kCreating or finished destroying
  std::map<std::string, std::shared_ptr<Entry>> table_;
  uint32_t creates_in_flight_ = 0;
  // Queued creates (FIFO, guarded by mu_; see AdmitCreate): each waits on its own condition variable and only
  // the head is woken when a slot frees (no herd of timed waits).
  struct CreateWaiter {
    std::condition_variable cv;
  };
  std::list<CreateWaiter*> create_queue_;
  // Create idempotency keys (CreateRequest::request_id), bounded FIFO.
  struct CreateKey;
  static constexpr size_t kMaxCreateKeys = 4096;
  std::mutex create_keys_mu_;
  std::condition_variable create_keys_cv_;
  std::map<std::string, std::shared_ptr<CreateKey>> create_keys_;  // guarded by create_keys_mu_
  std::deque<std::string> create_key_order_;                      // guarded by create_keys_mu_, oldest first
  void RememberCreateKeyLocked(const std::string& key, std::shared_ptr<CreateKey> k);
  StatusOr<SandboxInfo> CreateOnce(const CreateRequest& request);
  Status AdmitCreate(const CreateRequest& request);  // takes a create slot (mu_ not held)
  void ReleaseCreateSlotLocked();                     // mu_ held

  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  bool stopping_ = false;
  std::thread sweep_thread_;
  std::thread reap_thread_;

  struct CallSlot;
  std::mutex calls_mu_;
  std::condition_variable calls_cv_;
  std::map<std::string, std::map<std::string, std::shared_ptr<CallSlot>>> calls_;  // id -> request id -> slot
  std::map<std::string, std::vector<std::string>> call_order_;                       // id -> request ids, oldest first
  mutable std::mutex audit_mu_;

  // Recently destroyed ids (bounded, oldest forgotten first) with why and
  // when, so that a call on a sandbox the node destroyed (TTL, idle timeout,
  // lease, job) says so instead of looking like a mistyped id. In memory
  // only: a restarted daemon answers a plain NotFound.
  static constexpr size_t kGoneRemembered = 4096;
  mutable std::mutex gone_mu_;
  std::map<std::string, std::string> gone_;  // id -> "destroyed at <UTC> (<reason>)"
  std::vector<std::string> gone_order_;      // ring of kGoneRemembered ids
  size_t gone_next_ = 0;
  void RememberGone(const std::string& id, const std::string& reason);
  // NotFound for `id`, naming when and why it was destroyed if remembered.
  Status SandboxNotFound(const std::string& id) const;

  std::atomic<uint64_t> staging_used_{0};  // bytes in snapshot/grade staging now

  mutable std::mutex jobs_mu_;
  std::map<std::string, JobInfo> jobs_;
  void SaveJobsLocked() const;
  void LoadJobs();
  void ReapJobs();

  // Declared last: destroyed first (stops the pumps before anything they use).
  std::unique_ptr<ProcessTable> processes_ = std::make_unique<ProcessTable>();
  nlohmann::json ProcessAudit(const ProcessStatus& st, const char* op) const;
};

}  // namespace warren::node
