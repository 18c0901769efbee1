// SandboxManager: the node's sandbox table (DESIGN.md §2 "node"). Owns the
// backends by name, the layer provider (store + mount cache) and the
// persisted records under <state_dir>/sandboxes/<id>.json.
//
// Lifecycle of a sandbox on this node:
//   Create:  validate → admit (bounded creates in flight, bounded table) →
//            resolve layers → persist "creating" record → mkdir
//            <state_dir>/run/<id> → Acquire each layer → Backend::Create →
//            persist "running" record (with Sandbox::Record()).
//            Every step is undone if a later one fails: a failed create leaves
//            no record, no dir, no mount reference, no sandbox.
//   Destroy: state "destroying" (persisted) → Sandbox::Destroy (makes running
//            Execs return) → Release layers → remove record and dir.
//            Concurrent Destroys of one id wait for the first; destroying an
//            unknown id is NotFound.
//   Restart: Start() reads every record: "running" → Backend::Adopt and
//            re-Acquire its layers, or Cleanup + remove when it is gone;
//            "creating"/"destroying" → Backend::Cleanup + remove; then Sweep.
// The manager's destructor (daemon shutdown) does NOT destroy sandboxes: they
// outlive the daemon and are re-adopted by the next Start().
//
// Thread-safe. Errors (absl::Status): InvalidArgument naming the field and
// value; NotFound for unknown ids or layers; FailedPrecondition for a
// sandbox that is not running; ResourceExhausted (retryable) when admission
// refuses or the state dir is full.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
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
#include "node/record_store.h"
#include "runtime/backend.h"

namespace warren::node {

enum class SandboxState { kCreating, kRunning, kDestroying };
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
};

// A snapshot of one table entry.
struct SandboxInfo {
  std::string id;
  std::string backend;
  SandboxState state = SandboxState::kCreating;
  std::vector<std::string> layer_digests;  // bottom first
  std::vector<std::string> layer_names;    // as asked
  runtime::Resources resources;
  std::map<std::string, std::string> labels;
  std::string job;
  int64_t created_at_ns = 0;
  pid_t init_pid = 0;
  std::string hostname;
  uint32_t ttl_s = 0;
};

struct NodeLimits {
  uint32_t cpus = 0;           // 0 = probe (online CPUs)
  uint64_t memory_mb = 0;      // 0 = probe (MemTotal)
  uint32_t max_sandboxes = 0;  // 0 = 16384
  uint32_t max_creates_in_flight = 0;  // 0 = 4 × cpus
};

struct ManagerOptions {
  std::string node_id = "n0";  // [a-z0-9][a-z0-9-]{0,30}; prefix of every sandbox id
  std::string state_dir;       // records in <state_dir>/sandboxes, dirs in <state_dir>/run
  NodeLimits limits;
  std::chrono::milliseconds sweep_interval{10000};  // 0 = no periodic sweep thread
};

struct NodeCounters {
  uint32_t sandboxes = 0;
  uint32_t creates_in_flight = 0;
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

  StatusOr<SandboxInfo> Create(const CreateRequest& request);
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
  SandboxInfo InfoOf(const Entry& e) const;
  std::string NewId();
  std::string RunDir(const std::string& id) const;
  void RecoverOne(const std::string& id, const nlohmann::json& record);
  void CleanupRecord(const std::string& id, const nlohmann::json& record, const std::string& reason);
  void SweepLoop();

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

  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  bool stopping_ = false;
  std::thread sweep_thread_;
};

}  // namespace warren::node
