#include "node/sandbox_manager.h"

#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>

#include "common/file_util.h"
#include "common/log.h"
#include "common/rollback.h"
#include "node/admission/validate.h"

namespace warren::node {

StatusOr<std::unique_ptr<SandboxManager>> SandboxManager::New(ManagerOptions options,
                                                              std::vector<std::unique_ptr<runtime::Backend>> backends,
                                                              std::unique_ptr<LayerProvider> layers) {
  if (!ValidNodeId(options.node_id)) {
    return absl::InvalidArgumentError("node id " + Quote(options.node_id) + " must match [a-z0-9][a-z0-9-]{0,30}");
  }
  if (options.state_dir.empty() || options.state_dir[0] != '/') {
    return absl::InvalidArgumentError("state dir " + Quote(options.state_dir) + " must be an absolute path");
  }
  if (layers == nullptr) return absl::InvalidArgumentError("no layer provider");
  SandboxTable::Backends by_name;
  for (auto& b : backends) {
    std::string name = b->name();
    by_name[name] = std::move(b);
  }
  if (by_name.empty()) return absl::InvalidArgumentError("no backend");
  NodeLimits& l = options.limits;
  if (l.cpus == 0) l.cpus = static_cast<uint32_t>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  if (l.memory_mb == 0) {
    struct sysinfo si;
    if (sysinfo(&si) != 0) return ErrnoToStatus(errno, "sysinfo()");
    l.memory_mb = static_cast<uint64_t>(si.totalram) * si.mem_unit >> 20;
  }
  if (l.max_sandboxes == 0) l.max_sandboxes = 16384;
  if (l.max_creates_in_flight == 0) l.max_creates_in_flight = 4 * l.cpus;
  if (options.run_dir.empty()) options.run_dir = options.state_dir;
  if (options.run_dir[0] != '/') {
    return absl::InvalidArgumentError("run dir " + Quote(options.run_dir) + " must be an absolute path");
  }
  for (const std::string& d : {options.state_dir, options.state_dir + "/tmp", options.run_dir, options.run_dir + "/run",
                               options.run_dir + "/audit"}) {
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, "mkdir(" + d + ")");
    }
  }
  ASSIGN_OR_RETURN(RecordStore records, RecordStore::Open(options.run_dir + "/sandboxes"));
  return std::unique_ptr<SandboxManager>(
      new SandboxManager(std::move(options), std::move(by_name), std::move(layers), std::move(records)));
}

SandboxManager::SandboxManager(ManagerOptions options, SandboxTable::Backends backends,
                               std::unique_ptr<LayerProvider> layers, RecordStore records)
    : options_(std::move(options)),
      backends_(std::move(backends)),
      layers_(std::move(layers)),
      records_(std::move(records)),
      started_at_ns_(WallNowNs()),
      metrics_(options_.metrics != nullptr ? *options_.metrics : NullMetrics()) {
  admission_ = std::make_unique<Admission>(options_.limits, [this] { return table_->size(); });
  SandboxTable::Hooks hooks;
  hooks.destroyed = [this](const std::string& id) {
    processes_->DropSandbox(id);  // they died with the sandbox: stop their pumps
    calls_->Drop(id);
    audit_->Remove(id);
  };
  hooks.adopted = [this](const std::string& id, const std::string& request_id) {
    create_keys_->RememberDone(request_id, id);
  };
  table_ = std::make_unique<SandboxTable>(options_, backends_, *layers_, records_, *admission_, std::move(hooks));
  audit_ = std::make_unique<node::AuditLog>(options_.run_dir + "/audit",
                                            [this](const std::string& id) { return table_->Contains(id); });
  calls_ = std::make_unique<CallSlots>(options_.max_recorded_calls);
  CreateKeys::Ops ops;
  ops.create = [this](const CreateRequest& r) { return CreateAndStart(r); };
  ops.get = [this](const std::string& id) { return table_->Get(id); };
  ops.destroy = [this](const std::string& id, const std::string& reason) { return table_->Destroy(id, reason); };
  create_keys_ = std::make_unique<CreateKeys>(std::move(ops));
  jobs_ = std::make_unique<Jobs>(options_.state_dir, *table_);
  snapshots_ = std::make_unique<SnapshotService>(options_, *table_, *layers_, staging_used_);
  reaper_ = std::make_unique<Reaper>(*table_, *jobs_, *layers_, options_.reap_interval, options_.sweep_interval);
}

SandboxManager::~SandboxManager() { reaper_.reset(); }

Status SandboxManager::Start() {
  struct stat st;
  if (::stat(records_.dir().c_str(), &st) != 0) {
    return ErrnoToStatus(errno, "stat(" + records_.dir() + ")");
  }
  table_->Recover();
  layers_->Sweep();
  // Snapshot/grade staging trees a previous daemon left behind.
  {
    Status ts = RemoveTree(options_.state_dir + "/tmp");
    if (!ts.ok()) Log(spdlog::level::warn, "cleaning the tmp dir failed", {{"error", ts.ToString()}});
    (void)::mkdir((options_.state_dir + "/tmp").c_str(), 0700);
  }
  jobs_->Load();
  reaper_->Start();
  return absl::OkStatus();
}

StatusOr<CreateRequest> SandboxManager::Normalize(const CreateRequest& request) const {
  return table_->Normalize(request);
}
StatusOr<SandboxInfo> SandboxManager::Create(const CreateRequest& request) { return create_keys_->Create(request); }

StatusOr<SandboxInfo> SandboxManager::CreateAndStart(const CreateRequest& r) {
  ASSIGN_OR_RETURN(SandboxInfo info, table_->Create(r));
  if (r.expose.empty() && r.start_argv.empty()) return info;
  auto fail = [&](const Status& s) {
    Status ds = table_->Destroy(info.id, "create failed: " + s.ToString());
    Log(spdlog::level::info, "create failed after the sandbox was up; sandbox destroyed",
        {{"sandbox", info.id}, {"error", s.ToString()}, {"destroy", ds.ToString()}});
    return s;
  };
  for (uint16_t port : r.expose) {
    if (StatusOr<runtime::ExposedPort> x = table_->Expose(info.id, port); !x.ok()) {
      return fail(Status(x.status().code(),
                         "create: expose port " + std::to_string(port) + ": " + std::string(x.status().message())));
    }
  }
  if (!r.start_argv.empty()) {
    runtime::ExecSpec spec;
    spec.argv = r.start_argv;
    ProcessOptions opts;
    opts.kill_grace = spec.kill_grace;
    StatusOr<std::shared_ptr<ManagedProcess>> mp = Spawn(info.id, spec, opts);
    if (!mp.ok()) {
      return fail(Status(mp.status().code(), "create: starting the main process " + Quote(r.start_argv[0]) + ": " +
                                                 std::string(mp.status().message())));
    }
    info.main_process = (*mp)->id();
  }
  return info;
}
Status SandboxManager::AbandonCreate(const std::string& request_id) { return create_keys_->Abandon(request_id); }
Status SandboxManager::Destroy(const std::string& id) { return table_->Destroy(id, "destroy requested"); }
StatusOr<SandboxInfo> SandboxManager::Get(const std::string& id) const { return table_->Get(id); }
std::vector<SandboxInfo> SandboxManager::List(const std::map<std::string, std::string>& labels,
                                              const std::string& job) const {
  return table_->List(labels, job);
}
StatusOr<std::shared_ptr<runtime::Sandbox>> SandboxManager::Running(const std::string& id) { return table_->Use(id); }
StatusOr<runtime::NetworkSpec> SandboxManager::SetNetwork(const std::string& id, const runtime::NetworkSpec& network) {
  return table_->SetNetwork(id, network);
}
StatusOr<runtime::ExposedPort> SandboxManager::Expose(const std::string& id, uint16_t port) {
  return table_->Expose(id, port);
}
Status SandboxManager::Unexpose(const std::string& id, uint16_t port) { return table_->Unexpose(id, port); }
StatusOr<NetworkView> SandboxManager::Network(const std::string& id) const { return table_->Network(id); }

StatusOr<SandboxInfo> SandboxManager::ExtendTtl(const std::string& id, uint32_t ttl_s) {
  return table_->ExtendTtl(id, ttl_s);
}
Status SandboxManager::Pause(const std::string& id) { return table_->Pause(id); }
Status SandboxManager::Resume(const std::string& id) { return table_->Resume(id, true); }
Status SandboxManager::Resume(const std::string& id, bool prefetch) { return table_->Resume(id, prefetch); }
Status SandboxManager::Suspend(const std::string& id) { return table_->Suspend(id); }
StatusOr<SandboxMemory> SandboxManager::Memory(const std::string& id) const { return table_->Memory(id); }
uint32_t SandboxManager::LayerUsers(const std::string& digest) const { return table_->LayerUsers(digest); }
Status SandboxManager::RemoveLayer(const std::string& ref) { return table_->RemoveLayer(ref); }

std::vector<JobInfo> SandboxManager::ListJobs() const { return jobs_->List(); }
StatusOr<JobInfo> SandboxManager::JobHeartbeat(const std::string& job, uint32_t lease_s, uint32_t grace_s) {
  return jobs_->Heartbeat(job, lease_s, grace_s);
}
StatusOr<JobInfo> SandboxManager::GetJob(const std::string& job) const { return jobs_->Get(job); }
uint32_t SandboxManager::SuspendJob(const std::string& job, const std::string& reason) {
  return jobs_->Suspend(job, reason);
}
uint32_t SandboxManager::ResumeJob(const std::string& job) { return jobs_->Resume(job); }
uint32_t SandboxManager::DestroyJob(const std::string& job, const std::string& reason) {
  return jobs_->Destroy(job, reason);
}
std::vector<std::string> SandboxManager::ReapExpired() { return reaper_->ReapOnce(); }

std::vector<std::string> SandboxManager::BackendNames() const {
  std::vector<std::string> out;
  for (const auto& [n, b] : backends_) out.push_back(n);
  return out;
}

NodeCounters SandboxManager::Counters() const {
  NodeCounters c;
  c.sandboxes = static_cast<uint32_t>(table_->size());
  c.creates_in_flight = admission_->in_flight();
  c.creates_queued = admission_->queued();
  c.started_at_ns = started_at_ns_;
  c.cpus = options_.limits.cpus;
  c.memory_mb = options_.limits.memory_mb;
  return c;
}

std::array<ClassUsage, 2> SandboxManager::ClassUsages() const { return table_->ClassUsages(); }

NodeGauges SandboxManager::Gauges() const {
  NodeGauges g;
  // Every (backend, state) pair, zeros included: a state empty now is a
  // series at 0, not a gap.
  for (const auto& [name, b] : backends_) {
    for (SandboxState st : {SandboxState::kCreating, SandboxState::kRunning, SandboxState::kPaused,
                            SandboxState::kSuspended, SandboxState::kDestroying}) {
      g.sandboxes[{name, SandboxStateName(st)}] = 0;
    }
  }
  for (const auto& [key, n] : table_->StateCounts()) g.sandboxes[key] = n;
  g.creates_in_flight = admission_->in_flight();
  g.creates_queued = admission_->queued();
  const LayerProvider::CacheStats lc = layers_->Stats();
  g.layer_mounts = lc.mounted;
  g.layer_mounted_bytes = lc.mounted_bytes;
  g.layer_cache_hits = lc.hits;
  g.layer_cache_misses = lc.misses;
  g.layer_cache_failures = lc.failures;
  g.layer_cache_evictions = lc.evictions;
  g.read_cache = lc.read_cache;
  g.read_cache_cap_bytes = lc.read_cache_cap_bytes;
  g.read_cache_bytes = lc.read_cache_bytes;
  g.read_cache_hits = lc.read_cache_hits;
  g.read_cache_misses = lc.read_cache_misses;
  g.read_cache_evictions = lc.read_cache_evictions;
  g.read_cache_write_errors = lc.read_cache_write_errors;
  g.layer_store_read_bytes = lc.layer_store_read_bytes;
  g.read_cache_prefetched_bytes = lc.prefetched_bytes;
  g.read_cache_metadata_bytes = lc.read_cache_metadata_bytes;
  return g;
}

// ---------------------------------------------------------------- calls

StatusOr<RecordedCall> SandboxManager::Idempotent(const std::string& id, const std::string& request_id,
                                                  const std::function<StatusOr<RecordedCall>()>& run) {
  return calls_->Run(id, request_id, run);
}

StatusOr<runtime::ExecOutcome> SandboxManager::Exec(const std::string& id, const runtime::ExecSpec& spec) {
  return Exec(id, spec, "");
}

StatusOr<runtime::ExecOutcome> SandboxManager::Exec(const std::string& id, const runtime::ExecSpec& spec,
                                                    const std::string& request_id) {
  bool ran = false;
  const int64_t start = WallNowNs();
  StatusOr<RecordedCall> rc = calls_->Run(id, request_id, [&]() -> StatusOr<RecordedCall> {
    ran = true;
    ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, table_->Use(id));
    RETURN_IF_ERROR(CheckMergeStderr(*sb, spec));
    table_->Touch(id, +1);
    const auto exec_start = std::chrono::steady_clock::now();
    StatusOr<runtime::ExecOutcome> out = sb->Exec(spec);
    metrics_.OnExec(sb->backend_name(),
                    ExecOutcomeLabel(out.status(), out.ok() && out->timed_out, out.ok() && out->oom_killed),
                    std::chrono::steady_clock::now() - exec_start);
    table_->Touch(id, -1);
    if (!out.ok()) return out.status();
    RecordedCall r;
    r.outcome = std::move(*out);
    return r;
  });
  nlohmann::json a = {{"op", "exec"}, {"start_ns", start}, {"end_ns", WallNowNs()}};
  if (spec.shell) {
    a["shell"] = *spec.shell;
  } else {
    a["argv"] = spec.argv;
  }
  a["stdin_bytes"] = spec.stdin_data.size();
  if (!request_id.empty()) {
    a["request_id"] = request_id;
    a["replayed"] = !ran;
  }
  if (rc.ok()) {
    const runtime::ExecOutcome& o = rc->outcome;
    a["exit_code"] = o.exit_code;
    a["signal"] = o.signal;
    a["timed_out"] = o.timed_out;
    a["oom_killed"] = o.oom_killed;
    a["stdout_bytes"] = o.stdout_total;
    a["stderr_bytes"] = o.stderr_total;
  } else {
    a["error"] = rc.status().ToString();
  }
  if (rc.ok() || rc.status().code() != absl::StatusCode::kNotFound) Audit(id, a);
  if (!rc.ok()) return rc.status();
  return std::move(rc->outcome);
}

void SandboxManager::Audit(const std::string& id, const nlohmann::json& entry) const { audit_->Append(id, entry); }

StatusOr<std::vector<nlohmann::json>> SandboxManager::AuditLog(const std::string& id) const {
  if (!table_->Contains(id)) return table_->NotFound(id);
  return audit_->Read(id);
}

// ---------------------------------------------------------------- processes

nlohmann::json SandboxManager::ProcessAudit(const ProcessStatus& st, const char* op) {
  nlohmann::json a = {{"op", op}, {"process_id", st.process_id}, {"start_ns", st.started_at_ns}};
  if (st.shell) {
    a["shell"] = *st.shell;
  } else {
    a["argv"] = st.argv;
  }
  if (st.pty) a["pty"] = true;
  if (!st.running) {
    a["end_ns"] = WallNowNs();
    a["exit_code"] = st.outcome.exit_code;
    a["signal"] = st.outcome.signal;
    a["timed_out"] = st.outcome.timed_out;
    a["oom_killed"] = st.outcome.oom_killed;
    a["stdout_bytes"] = st.outcome.stdout_total;
    a["stderr_bytes"] = st.outcome.stderr_total;
  }
  return a;
}

StatusOr<std::shared_ptr<ManagedProcess>> SandboxManager::Spawn(const std::string& id, const runtime::ExecSpec& spec,
                                                                const ProcessOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, table_->Use(id));
  const std::string pid = processes_->NewId();
  auto on_exit = [this, id](const ProcessStatus& st) { Audit(id, ProcessAudit(st, "process_exit")); };
  ASSIGN_OR_RETURN(std::shared_ptr<ManagedProcess> mp, ManagedProcess::Start(sb, id, pid, spec, options, on_exit));
  Status s = processes_->Insert(id, mp);
  if (!s.ok()) {
    mp->Stop();
    return s;
  }
  if (!table_->Contains(id)) {  // destroyed meanwhile: its DropSandbox may have run before our Insert
    processes_->DropSandbox(id);
    return absl::FailedPreconditionError("sandbox " + id + " was destroyed during spawn");
  }
  Audit(id, ProcessAudit(mp->Info(), "spawn"));
  return mp;
}

StatusOr<std::shared_ptr<ManagedProcess>> SandboxManager::StartAttached(const std::string& id,
                                                                        const runtime::ExecSpec& spec,
                                                                        const ProcessOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, table_->Use(id));
  table_->Touch(id, +1);
  auto on_exit = [this, id](const ProcessStatus& st) {
    table_->Touch(id, -1);
    Audit(id, ProcessAudit(st, "exec_stream"));
  };
  StatusOr<std::shared_ptr<ManagedProcess>> mp =
      ManagedProcess::Start(sb, id, processes_->NewId(), spec, options, on_exit);
  if (!mp.ok()) table_->Touch(id, -1);
  return mp;
}

StatusOr<std::shared_ptr<ManagedProcess>> SandboxManager::FindProcess(const std::string& id,
                                                                      const std::string& process_id) const {
  RETURN_IF_ERROR(table_->Get(id).status());
  return processes_->Find(id, process_id);
}

StatusOr<std::vector<ProcessStatus>> SandboxManager::Processes(const std::string& id) const {
  RETURN_IF_ERROR(table_->Get(id).status());
  std::vector<ProcessStatus> out;
  for (const auto& p : processes_->List(id)) out.push_back(p->Info());
  return out;
}

// ---------------------------------------------------------------- snapshot, fork, grade

StatusOr<image::LayerInfo> SandboxManager::Snapshot(const SnapshotRequest& request) {
  return snapshots_->Snapshot(request);
}
StatusOr<ForkResult> SandboxManager::Fork(const ForkRequest& request) { return snapshots_->Fork(request); }
StatusOr<GradeResult> SandboxManager::Grade(const GradeRequest& request) { return snapshots_->Grade(request); }

}  // namespace warren::node
