// The node's sandbox table and each sandbox's state machine:
//
//   creating ──► running ◄──► paused ──► suspended
//       │           │  ▲────────────────────┘
//       └───────────┴──────► destroying ──► (gone)
//
// Create:  validate (admission/validate.h) → admit (admission/admission.h) →
//          resolve layers → persist "creating" record → mkdir
//          <run_dir>/run/<id> → Acquire each layer → Backend::Create →
//          persist "running" record (with Sandbox::Record()). Every step is
//          undone if a later one fails: a failed create leaves no record, no
//          dir, no mount reference, no sandbox.
// Destroy: state "destroying" (persisted) → Sandbox::Destroy (makes running
//          Execs return) → Release layers → remove record and dir → hooks.
//          Concurrent Destroys of one id wait for the first; destroying an
//          unknown id is NotFound.
// Recover: every record: "running" (also paused/suspended) → Backend::Adopt
//          and re-Acquire its layers, or Cleanup + remove when it is gone;
//          "creating"/"destroying" → Backend::Cleanup + remove.
// Pause/Resume: cgroup freezer via the backend; "paused" is persisted (the
//          freezer state outlives the daemon); Use() resumes first. Suspend =
//          pause + reclaim of the sandbox's memory into swap/zram; resuming a
//          suspended sandbox prefetches its working set first.
//
// Thread-safe. One lock (mu_) guards the map and each entry's state; it is
// never held while calling a backend, the layer provider or a hook.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "node/admission/admission.h"
#include "node/layer_provider.h"
#include "node/metrics.h"
#include "node/records/record_store.h"
#include "node/sandbox_types.h"
#include "node/table/entry.h"
#include "node/table/gone.h"
#include "runtime/backend.h"

namespace warren::node {

class SandboxTable {
 public:
  using Backends = std::map<std::string, std::unique_ptr<runtime::Backend>>;
  struct Hooks {
    // After a sandbox left the table (destroyed) or a dead one's record was
    // cleaned up: drop what other rooms keep for it.
    std::function<void(const std::string& id)> destroyed;
    // A sandbox adopted after a restart whose create had a request id.
    std::function<void(const std::string& id, const std::string& request_id)> adopted;
  };
  // Borrows everything; all must outlive the table.
  SandboxTable(const ManagerOptions& options, const Backends& backends, LayerProvider& layers,
               const RecordStore& records, Admission& admission, Hooks hooks);

  // ---- create / destroy
  StatusOr<CreateRequest> Normalize(const CreateRequest& request) const;
  StatusOr<SandboxInfo> Create(const CreateRequest& request);
  Status Destroy(const std::string& id, const std::string& reason);
  // Adopts or cleans up after every persisted record (see above). A record
  // that cannot be recovered is logged, cleaned up and dropped.
  void Recover();

  // ---- queries: never change a sandbox's state
  StatusOr<SandboxInfo> Get(const std::string& id) const;
  // Sandboxes carrying all `labels` and, if `job` is non-empty, of that job.
  std::vector<SandboxInfo> List(const std::map<std::string, std::string>& labels, const std::string& job) const;
  size_t size() const;
  // What the sandboxes of each QoS class (index runtime::Qos) asked for,
  // creating ones included: what over-commit admission counts.
  std::array<ClassUsage, 2> ClassUsages() const;
  // (backend, state name) -> sandboxes in the table (metrics, at scrape time).
  std::map<std::pair<std::string, std::string>, uint32_t> StateCounts() const;
  bool Contains(const std::string& id) const;
  uint32_t LayerUsers(const std::string& digest) const;
  StatusOr<SandboxMemory> Memory(const std::string& id) const;
  // The entry of `id` (for services built on the table: snapshot, grade,
  // fork), or NotFound naming the id. FailedPrecondition unless it is
  // running, paused or suspended; `state`, if given, gets its state.
  StatusOr<std::shared_ptr<Entry>> Live(const std::string& id, SandboxState* state = nullptr) const;
  // (id, reason) of every sandbox whose TTL or idle timeout expired at
  // `now_ns` (a paused or suspended sandbox is never idle; its TTL runs).
  std::vector<std::pair<std::string, std::string>> Expired(int64_t now_ns) const;
  // NotFound for `id`, naming when and why it was destroyed if remembered.
  Status NotFound(const std::string& id) const { return gone_.NotFound(id); }

  // ---- use
  // The backend sandbox of `id` for a call (exec, files, processes):
  // resumes it first if paused or suspended, and marks activity. NotFound
  // for unknown ids, FailedPrecondition while creating or destroying. The
  // returned object stays valid after a concurrent Destroy (its calls then
  // fail or return promptly).
  StatusOr<std::shared_ptr<runtime::Sandbox>> Use(const std::string& id);
  // Marks activity (an exec/file call starting: +1, ending: -1).
  void Touch(const std::string& id, int delta_inflight);
  StatusOr<SandboxInfo> ExtendTtl(const std::string& id, uint32_t ttl_s);
  // Replaces the egress policy (runtime::NetworkConfigurable); persisted
  // with the backend's record. Returns the policy in force.
  StatusOr<runtime::NetworkSpec> SetNetwork(const std::string& id, const runtime::NetworkSpec& network);
  // Exposed ports (runtime::NetworkConfigurable), persisted like SetNetwork.
  StatusOr<runtime::ExposedPort> Expose(const std::string& id, uint16_t port);
  Status Unexpose(const std::string& id, uint16_t port);
  // Policy, exposed ports and traffic of a live sandbox.
  StatusOr<NetworkView> Network(const std::string& id) const;
  Status Pause(const std::string& id);
  Status Resume(const std::string& id, bool prefetch);
  Status Suspend(const std::string& id);

  // ---- layers: a layer cannot vanish under a create (shared by creates from
  // layer resolution until the entry is in the table, exclusive here).
  // FailedPrecondition while a sandbox of this node uses the layer, or while
  // its blob is held (LayerStore::HoldBlob) by any process of a node sharing
  // the store for longer than kHoldWait: a hold that short is transient, e.g.
  // a process the daemon cloned in that moment (a warm shell) that has not
  // yet closed the fds it inherited; measured here under load, 4 of 12
  // failed forks met one, 21-51 ms long.
  Status RemoveLayer(const std::string& ref);
  static constexpr std::chrono::milliseconds kHoldWait{2000};

 private:
  std::string RunDir(const std::string& id) const { return options_.run_dir + "/run/" + id; }
  std::string NewId();
  StatusOr<SandboxInfo> CreateSteps(const CreateRequest& request);  // Create without its metrics
  SandboxInfo InfoOf(const Entry& e) const;                         // mu_ held
  ClassUsage UsageLocked(runtime::Qos qos) const;                   // mu_ held
  StatusOr<std::shared_ptr<Entry>> Find(const std::string& id) const;
  // Pause/resume/suspend bookkeeping after the backend call succeeded: sets
  // the state, records the transition and persists the record; a failed
  // write is logged (the sandbox is in that state either way).
  void SetPausedState(Entry& e, SandboxState to, const std::string& reason);
  void Persist(const Entry& e, SandboxState state, const char* what) const;
  // Writes the record again with the backend's record as it is now.
  Status Rerecord(Entry& e, const std::string& id);
  void RecoverOne(const std::string& id, const record::Sandbox& record);
  void CleanupRecord(const std::string& id, const record::Sandbox& record, const std::string& reason);

  const ManagerOptions& options_;
  const Backends& backends_;
  LayerProvider& layers_;
  const RecordStore& records_;
  Admission& admission_;
  const Hooks hooks_;
  Metrics& metrics_;
  GoneMemory gone_;

  mutable std::shared_mutex layer_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;                           // an entry left kCreating or finished destroying
  std::map<std::string, std::shared_ptr<Entry>> table_;  // guarded by mu_
};

}  // namespace warren::node
