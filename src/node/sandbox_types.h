// Value types of the node's sandbox table, shared by its rooms (table,
// admission, records, reaper, jobs, snapshot) and by the API layer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/time.h"
#include "runtime/backend.h"

namespace warren::node {

class Metrics;  // node/metrics.h

// kSuspended: paused with its memory reclaimed into swap.
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
  std::string qos;                         // "latency" (empty = it) or "best-effort"
  std::map<std::string, std::string> env;  // values are bytes (any but NUL)
  std::string workdir;                     // empty = "/"
  std::string user;                        // empty = "root"
  std::string hostname;                    // empty = the sandbox id
  std::map<std::string, std::string> labels;
  uint32_t ttl_s = 0;
  std::string job;
  uint32_t idle_timeout_s = 0;  // 0 = none
  // Admission queue: how long this create may wait for a create slot (the
  // RPC's deadline); default: no deadline of its own (the queue's bound,
  // kMaxCreateQueueWait, still applies). `cancelled`, if set, is polled
  // while waiting (the RPC's client went away).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::function<bool()> cancelled;
  // Idempotency key (see SandboxManager::AbandonCreate); empty = none.
  std::string request_id;
  runtime::NetworkSpec network;  // not enabled: loopback only
  // Once the sandbox is up (SandboxManager::Create; a failure destroys it):
  // ports exposed (SandboxTable::Expose), then, if non-empty, this argv
  // spawned as a background process (SandboxManager::Spawn: the sandbox's
  // env, workdir and user). The API fills them from the request and the
  // image's Entrypoint/Cmd/ExposedPorts (CreateSandboxRequest.start).
  std::vector<uint16_t> expose;
  std::vector<std::string> start_argv;
};

// A sandbox's network as Get shows it.
struct NetworkView {
  runtime::NetworkSpec policy;  // not enabled: no link
  std::vector<runtime::ExposedPort> exposed;
  std::optional<runtime::NetworkTraffic> traffic;  // with a link
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
  runtime::Qos qos = runtime::Qos::kLatency;
  std::map<std::string, std::string> labels;
  std::string job;
  int64_t created_at_ns = 0;
  pid_t init_pid = 0;
  std::string hostname;
  uint32_t ttl_s = 0;
  int64_t expires_at_ns = 0;     // unix ns; 0 = no TTL
  uint32_t idle_timeout_s = 0;   // 0 = none
  int64_t last_activity_ns = 0;  // unix ns of the end of the last exec/file call
  // Create only: the process CreateRequest::start_argv started ("" = none).
  std::string main_process;
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
  uint32_t lease_s = 0;  // 0 = no lease (never lapses)
  uint32_t grace_s = 0;
  int64_t lease_expires_at_ns = 0;
  bool lapsed = false;
  int64_t lapsed_at_ns = 0;
  uint32_t sandboxes = 0;  // filled by GetJob
};

struct SnapshotRequest {
  std::string id;
  std::string name;                  // "kind/name@version"; empty = "workspace/snap-<id>@<unix ns>"
  std::vector<std::string> exclude;  // see runtime::ExportOptions::exclude
  bool pause = true;                 // freeze the sandbox for a consistent cut
  // The project owning the layer (the sandbox's; image::LayerInfo::projects);
  // empty: every project's.
  std::string project{};
};

struct GradeRequest {
  std::string id;
  runtime::ExecSpec grader;  // run in a fresh sandbox
  // Absolute inside paths where the task's solution lives: the only place
  // the agent's changes enter the grader. Required (non-empty).
  std::vector<std::string> solution;
  // Deprecated: everything outside `solution` is pristine anyway; a
  // protected path inside a solution path stays pristine too.
  std::vector<std::string> protected_paths;
  std::string project;  // owns the grade layers (as SnapshotRequest::project)
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
  uint32_t cpus = 0;                   // 0 = probe (online CPUs)
  uint64_t memory_mb = 0;              // 0 = probe (MemTotal)
  uint32_t max_sandboxes = 0;          // 0 = 16384
  uint32_t max_creates_in_flight = 0;  // 0 = 4 × cpus
  // Creates beyond max_creates_in_flight wait in a FIFO queue of at most
  // this many (0 = 1024) instead of being refused; a create that finds the
  // queue full gets ResourceExhausted ("create queue is full").
  uint32_t max_create_queue = 0;
  // Highest open_files a sandbox may ask for: the daemon's hard
  // RLIMIT_NOFILE (a sandbox's limit cannot exceed what its creator holds).
  // 0 = probe (getrlimit).
  uint64_t max_open_files = 0;
  // Over-commit per QoS class (index runtime::Qos): the node admits a
  // create while the cpu_millis (memory_mb) its running sandboxes of the
  // class asked for, plus the request, stay within cpus x 1000 (memory_mb)
  // x this ratio. 0 = the class is not counted (no bound: the node takes
  // what fits its slots). warrend --overcommit sets them.
  double overcommit[2] = {0, 0};
};

// What the sandboxes of one QoS class asked for, summed.
struct ClassUsage {
  uint64_t cpu_millis = 0;
  uint64_t memory_mb = 0;
  uint32_t sandboxes = 0;
};

struct ManagerOptions {
  std::string node_id = "n0";  // [a-z0-9][a-z0-9-]{0,30}; prefix of every sandbox id
  std::string state_dir;       // snapshot staging (<state_dir>/tmp), jobs
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
  bool suspend_prefetch = true;                     // resuming a suspended sandbox prefetches its working set
  // Node-wide cap on the bytes that snapshot and grade staging trees (and so
  // the layers built from them) hold at once; 0 = none. Each sandbox is
  // bounded by its own disk limit as well (see Snapshot).
  uint64_t max_staging_bytes = 0;
  // Hooks counting the node's events (node/metrics.h); borrowed, must
  // outlive the manager. nullptr = none.
  Metrics* metrics = nullptr;
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

// Printable, escaped rendering of a user-supplied value for error messages.
std::string Quote(const std::string& s);
// Whether `s` has an ASCII control character.
bool HasControl(const std::string& s);

}  // namespace warren::node
