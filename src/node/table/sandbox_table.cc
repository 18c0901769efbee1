#include "node/table/sandbox_table.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/log.h"
#include "node/admission/validate.h"
#include "node/records/sandbox_record.h"

namespace warren::node {

SandboxTable::SandboxTable(const ManagerOptions& options, const Backends& backends, LayerProvider& layers,
                           const RecordStore& records, Admission& admission, Hooks hooks)
    : options_(options),
      backends_(backends),
      layers_(layers),
      records_(records),
      admission_(admission),
      hooks_(std::move(hooks)),
      metrics_(options.metrics != nullptr ? *options.metrics : NullMetrics()) {}

StatusOr<CreateRequest> SandboxTable::Normalize(const CreateRequest& request) const {
  std::vector<std::string> names;
  for (const auto& [n, b] : backends_) names.push_back(n);
  ASSIGN_OR_RETURN(CreateRequest r, NormalizeCreate(request, options_.limits, names));
  // A network asked of a backend without one fails the create (a sandbox
  // without the network it asked for would look like one with it).
  if (r.network.enabled && !backends_.at(r.backend)->capabilities().has(runtime::Capability::kNetwork)) {
    return absl::FailedPreconditionError(
        "backend " + r.backend + " offers no network on this node" +
        (r.backend == "container" || r.backend == "microvm" ? " (warrend --sandbox-net)" : ""));
  }
  return r;
}

SandboxInfo SandboxTable::InfoOf(const Entry& e) const {
  SandboxInfo i = e.info;
  if (e.sandbox != nullptr) i.init_pid = e.sandbox->init_pid();
  return i;
}

StatusOr<std::shared_ptr<Entry>> SandboxTable::Find(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = table_.find(id);
  if (it == table_.end()) return NotFound(id);
  return it->second;
}

void SandboxTable::Persist(const Entry& e, SandboxState state, const char* what) const {
  Status s = records_.Put(e.info.id, MakeRecord(e, state));
  if (!s.ok()) Log(spdlog::level::warn, what, {{"sandbox", e.info.id}, {"error", s.ToString()}});
}

StatusOr<SandboxInfo> SandboxTable::Get(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = table_.find(id);
  if (it == table_.end()) return NotFound(id);
  return InfoOf(*it->second);
}

std::vector<SandboxInfo> SandboxTable::List(const std::map<std::string, std::string>& labels,
                                            const std::string& job) const {
  std::vector<SandboxInfo> out;
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [id, e] : table_) {
    if (!job.empty() && e->info.job != job) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = e->info.labels.find(k);
      if (it == e->info.labels.end() || it->second != v) {
        match = false;
        break;
      }
    }
    if (match) out.push_back(InfoOf(*e));
  }
  return out;
}

size_t SandboxTable::size() const {
  std::lock_guard<std::mutex> l(mu_);
  return table_.size();
}

ClassUsage SandboxTable::UsageLocked(runtime::Qos qos) const {
  ClassUsage u;
  for (const auto& [id, e] : table_) {
    if (e->info.qos != qos) continue;
    u.cpu_millis += e->info.resources.cpu_millis;
    u.memory_mb += e->info.resources.memory_mb;
    ++u.sandboxes;
  }
  return u;
}

std::array<ClassUsage, 2> SandboxTable::ClassUsages() const {
  std::lock_guard<std::mutex> l(mu_);
  return {UsageLocked(runtime::Qos::kLatency), UsageLocked(runtime::Qos::kBestEffort)};
}

std::map<std::pair<std::string, std::string>, uint32_t> SandboxTable::StateCounts() const {
  std::map<std::pair<std::string, std::string>, uint32_t> out;
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [id, e] : table_) ++out[{e->info.backend, SandboxStateName(e->info.state)}];
  return out;
}

bool SandboxTable::Contains(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  return table_.count(id) > 0;
}

uint32_t SandboxTable::LayerUsers(const std::string& digest) const {
  std::lock_guard<std::mutex> l(mu_);
  uint32_t n = 0;
  for (const auto& [id, e] : table_) {
    const auto& d = e->info.layer_digests;
    if (std::find(d.begin(), d.end(), digest) != d.end()) ++n;
  }
  return n;
}

StatusOr<std::shared_ptr<Entry>> SandboxTable::Live(const std::string& id, SandboxState* state) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = table_.find(id);
  if (it == table_.end()) return NotFound(id);
  const SandboxState s = it->second->info.state;
  if (s != SandboxState::kRunning && s != SandboxState::kPaused && s != SandboxState::kSuspended) {
    return absl::FailedPreconditionError("sandbox " + id + " is " + SandboxStateName(s));
  }
  if (state != nullptr) *state = s;
  return it->second;
}

std::vector<std::pair<std::string, std::string>> SandboxTable::Expired(int64_t now) const {
  std::vector<std::pair<std::string, std::string>> victims;
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [id, e] : table_) {
    const SandboxInfo& i = e->info;
    if (i.state != SandboxState::kRunning && i.state != SandboxState::kPaused && i.state != SandboxState::kSuspended) {
      continue;
    }
    if (i.expires_at_ns > 0 && now >= i.expires_at_ns) {
      victims.emplace_back(id, "ttl expired");
    } else if (i.idle_timeout_s > 0 && e->inflight_execs == 0 && i.state == SandboxState::kRunning &&
               now - i.last_activity_ns >= int64_t{i.idle_timeout_s} * 1000000000) {
      victims.emplace_back(id, "idle timeout");
    }
  }
  return victims;
}

StatusOr<SandboxMemory> SandboxTable::Memory(const std::string& id) const {
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = table_.find(id);
    if (it == table_.end()) return NotFound(id);
    e = it->second;
    if (e->sandbox == nullptr) {
      return absl::FailedPreconditionError("sandbox " + id + " is " + SandboxStateName(e->info.state));
    }
  }
  ASSIGN_OR_RETURN(runtime::Suspendable * suspendable, runtime::Require<runtime::Suspendable>(*e->sandbox));
  SandboxMemory m;
  ASSIGN_OR_RETURN(m.memory_bytes, suspendable->MemoryUsage());
  m.swap_bytes = suspendable->SwapUsage();
  return m;
}

StatusOr<std::shared_ptr<runtime::Sandbox>> SandboxTable::Use(const std::string& id) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = table_.find(id);
    if (it == table_.end()) return NotFound(id);
    const SandboxState s = it->second->info.state;
    const bool paused = s == SandboxState::kPaused || s == SandboxState::kSuspended;
    if (!paused && s != SandboxState::kRunning) {
      return absl::FailedPreconditionError("sandbox " + id + " is " + SandboxStateName(s));
    }
    it->second->info.last_activity_ns = WallNowNs();
    if (!paused) return it->second->sandbox;
  }
  // Any call on a paused or suspended sandbox resumes it.
  RETURN_IF_ERROR(Resume(id, true));
  std::lock_guard<std::mutex> l(mu_);
  auto it = table_.find(id);
  if (it == table_.end()) return NotFound(id);
  if (it->second->info.state != SandboxState::kRunning) {
    return absl::FailedPreconditionError("sandbox " + id + " is " + SandboxStateName(it->second->info.state));
  }
  return it->second->sandbox;
}

void SandboxTable::Touch(const std::string& id, int delta_inflight) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = table_.find(id);
  if (it == table_.end()) return;
  it->second->inflight_execs += delta_inflight;
  it->second->info.last_activity_ns = WallNowNs();
}

StatusOr<SandboxInfo> SandboxTable::ExtendTtl(const std::string& id, uint32_t ttl_s) {
  std::shared_ptr<Entry> e;
  SandboxState state;
  SandboxInfo info;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = table_.find(id);
    if (it == table_.end()) return NotFound(id);
    e = it->second;
    state = e->info.state;
    if (state != SandboxState::kRunning && state != SandboxState::kPaused && state != SandboxState::kSuspended) {
      return absl::FailedPreconditionError("sandbox " + id + " is " + SandboxStateName(state));
    }
    e->info.ttl_s = ttl_s;
    e->spec.ttl_s = ttl_s;
    e->info.expires_at_ns = ttl_s > 0 ? WallNowNs() + int64_t{ttl_s} * 1000000000 : 0;
    info = InfoOf(*e);
  }
  RETURN_IF_ERROR(records_.Put(id, MakeRecord(*e, state)));
  return info;
}

StatusOr<runtime::NetworkSpec> SandboxTable::SetNetwork(const std::string& id, const runtime::NetworkSpec& network) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Live(id));
  ASSIGN_OR_RETURN(runtime::NetworkConfigurable * n, runtime::Require<runtime::NetworkConfigurable>(*e->sandbox));
  RETURN_IF_ERROR(n->SetNetwork(network));
  RETURN_IF_ERROR(Rerecord(*e, id));
  return n->Network();
}

Status SandboxTable::Rerecord(Entry& e, const std::string& id) {
  SandboxState state;
  {
    std::lock_guard<std::mutex> l(mu_);
    e.backend_record = e.sandbox->Record();
    state = e.info.state;
  }
  return records_.Put(id, MakeRecord(e, state));
}

StatusOr<runtime::ExposedPort> SandboxTable::Expose(const std::string& id, uint16_t port) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Live(id));
  ASSIGN_OR_RETURN(runtime::NetworkConfigurable * n, runtime::Require<runtime::NetworkConfigurable>(*e->sandbox));
  ASSIGN_OR_RETURN(runtime::ExposedPort x, n->Expose(port));
  RETURN_IF_ERROR(Rerecord(*e, id));
  return x;
}

Status SandboxTable::Unexpose(const std::string& id, uint16_t port) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Live(id));
  ASSIGN_OR_RETURN(runtime::NetworkConfigurable * n, runtime::Require<runtime::NetworkConfigurable>(*e->sandbox));
  RETURN_IF_ERROR(n->Unexpose(port));
  return Rerecord(*e, id);
}

StatusOr<NetworkView> SandboxTable::Network(const std::string& id) const {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Live(id));
  NetworkView v;
  runtime::NetworkConfigurable* n = runtime::As<runtime::NetworkConfigurable>(*e->sandbox);
  if (n == nullptr) return v;
  v.policy = n->Network();
  v.exposed = n->Exposed();
  if (StatusOr<runtime::NetworkTraffic> t = n->Traffic(); t.ok()) v.traffic = *t;
  return v;
}

void SandboxTable::SetPausedState(Entry& e, SandboxState to, const std::string& reason) {
  {
    std::lock_guard<std::mutex> l(mu_);
    // A destroy took over meanwhile (it waits for this call's pause_mu
    // before it touches the record): its state and record stand.
    auto it = table_.find(e.info.id);
    if (e.info.state == SandboxState::kDestroying || it == table_.end() || it->second.get() != &e) return;
    e.info.state = to;
    if (to == SandboxState::kRunning) e.info.last_activity_ns = WallNowNs();
  }
  AddTransition(e, to, reason);
  Status s = records_.Put(e.info.id, MakeRecord(e, to));
  if (!s.ok()) {
    Log(spdlog::level::warn, "persisting sandbox state failed",
        {{"sandbox", e.info.id}, {"state", SandboxStateName(to)}, {"error", s.ToString()}});
  }
}

Status SandboxTable::Pause(const std::string& id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Find(id));
  std::lock_guard<std::mutex> pl(e->pause_mu);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (e->info.state == SandboxState::kPaused || e->info.state == SandboxState::kSuspended) return absl::OkStatus();
    if (e->info.state != SandboxState::kRunning) {
      return absl::FailedPreconditionError("sandbox " + id + " is " + SandboxStateName(e->info.state));
    }
  }
  ASSIGN_OR_RETURN(runtime::Pausable * pausable, runtime::Require<runtime::Pausable>(*e->sandbox));
  RETURN_IF_ERROR(pausable->Pause());
  SetPausedState(*e, SandboxState::kPaused, "pause requested");
  metrics_.OnPause(e->info.backend);
  Log(spdlog::level::info, "sandbox paused", {{"sandbox", id}});
  return absl::OkStatus();
}

Status SandboxTable::Resume(const std::string& id, bool prefetch) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Find(id));
  std::lock_guard<std::mutex> pl(e->pause_mu);
  bool suspended;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (e->info.state == SandboxState::kRunning) return absl::OkStatus();
    if (e->info.state != SandboxState::kPaused && e->info.state != SandboxState::kSuspended) {
      return absl::FailedPreconditionError("sandbox " + id + " is " + SandboxStateName(e->info.state));
    }
    suspended = e->info.state == SandboxState::kSuspended;
  }
  ASSIGN_OR_RETURN(runtime::Pausable * pausable, runtime::Require<runtime::Pausable>(*e->sandbox));
  const int64_t t0 = WallNowNs();
  uint64_t prefetched = 0;
  if (suspended) {
    // Still frozen: the working set comes back before any process runs.
    runtime::Suspendable* suspendable = runtime::As<runtime::Suspendable>(*e->sandbox);
    StatusOr<uint64_t> p = suspendable != nullptr ? suspendable->EndSuspend(options_.suspend_prefetch && prefetch)
                                                  : runtime::NotSupported(*e->sandbox, runtime::Capability::kSuspend);
    if (!p.ok()) {
      Log(spdlog::level::warn, "ending suspend failed; resuming anyway",
          {{"sandbox", id}, {"error", p.status().ToString()}});
    } else {
      prefetched = *p;
    }
  }
  RETURN_IF_ERROR(pausable->Resume());
  SetPausedState(*e, SandboxState::kRunning, "resumed");
  metrics_.OnResume(e->info.backend, suspended, prefetched);
  Log(spdlog::level::info, "sandbox resumed",
      {{"sandbox", id},
       {"from", suspended ? "suspended" : "paused"},
       {"prefetched_bytes", std::to_string(prefetched)},
       {"ms", std::to_string((WallNowNs() - t0) / 1000000)}});
  return absl::OkStatus();
}

Status SandboxTable::Suspend(const std::string& id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Find(id));
  std::lock_guard<std::mutex> pl(e->pause_mu);
  bool was_running;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (e->info.state == SandboxState::kSuspended) return absl::OkStatus();
    if (e->info.state != SandboxState::kRunning && e->info.state != SandboxState::kPaused) {
      return absl::FailedPreconditionError("sandbox " + id + " is " + SandboxStateName(e->info.state));
    }
    was_running = e->info.state == SandboxState::kRunning;
  }
  ASSIGN_OR_RETURN(runtime::Suspendable * suspendable, runtime::Require<runtime::Suspendable>(*e->sandbox));
  ASSIGN_OR_RETURN(runtime::Pausable * pausable, runtime::Require<runtime::Pausable>(*e->sandbox));
  const int64_t t0 = WallNowNs();
  if (was_running) RETURN_IF_ERROR(pausable->Pause());
  const uint64_t before = suspendable->MemoryUsage().value_or(0);
  Status rs = suspendable->ReclaimMemory();
  if (!rs.ok()) {
    // Undo: the sandbox goes back to the state it was in.
    (void)suspendable->EndSuspend(false);
    if (was_running) {
      Status us = pausable->Resume();
      if (!us.ok()) {
        Log(spdlog::level::err, "resuming after a failed suspend failed; sandbox left paused",
            {{"sandbox", id}, {"error", us.ToString()}});
        SetPausedState(*e, SandboxState::kPaused, "suspend failed");
      }
    }
    return Status(rs.code(), "suspend of " + id + ": " + std::string(rs.message()));
  }
  const uint64_t after = suspendable->MemoryUsage().value_or(0);
  const uint64_t swapped = suspendable->SwapUsage();
  SetPausedState(*e, SandboxState::kSuspended, "suspend requested");
  metrics_.OnSuspend(e->info.backend, swapped);
  Log(spdlog::level::info, "sandbox suspended",
      {{"sandbox", id},
       {"memory_before_bytes", std::to_string(before)},
       {"memory_after_bytes", std::to_string(after)},
       {"swap_bytes", std::to_string(swapped)},
       {"ms", std::to_string((WallNowNs() - t0) / 1000000)}});
  return absl::OkStatus();
}

Status SandboxTable::RemoveLayer(const std::string& ref) {
  const auto start = std::chrono::steady_clock::now();
  for (int attempt = 1;; ++attempt) {
    bool in_use = false;
    Status s = [&]() -> Status {
      std::unique_lock<std::shared_mutex> layer_lock(layer_mu_);
      ASSIGN_OR_RETURN(image::LayerInfo info, layers_.Resolve(ref));
      uint32_t users = LayerUsers(info.digest);
      if (users > 0) {
        in_use = true;
        return absl::FailedPreconditionError("layer " + ref + " (" + info.digest + ") is in use by " +
                                             std::to_string(users) + " sandbox(es)");
      }
      RETURN_IF_ERROR(layers_.Remove(ref));
      Log(spdlog::level::info, "layer removed", {{"layer", ref}, {"digest", info.digest}});
      return absl::OkStatus();
    }();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    // Only the store's refusal (a hold on the blob) is waited out; a sandbox
    // of this node using the layer is not transient.
    const bool held = s.code() == absl::StatusCode::kFailedPrecondition && !in_use;
    if (!held || waited >= kHoldWait) {
      if (held && attempt > 1) {
        Log(spdlog::level::warn, "layer still held after waiting",
            {{"layer", ref}, {"ms", std::to_string(waited.count())}, {"attempts", std::to_string(attempt)}});
      } else if (s.ok() && attempt > 1) {
        Log(spdlog::level::info, "layer removed after a transient hold",
            {{"layer", ref}, {"ms", std::to_string(waited.count())}, {"attempts", std::to_string(attempt)}});
      }
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace warren::node
