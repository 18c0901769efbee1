#include "node/sandbox_manager.h"

#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"
#include "node/admission/validate.h"
#include "node/rollback.h"
#include "node/upper_copy.h"

namespace warren::node {

StatusOr<std::unique_ptr<SandboxManager>> SandboxManager::New(
    ManagerOptions options, std::vector<std::unique_ptr<runtime::Backend>> backends,
    std::unique_ptr<LayerProvider> layers) {
  if (!ValidNodeId(options.node_id)) {
    return absl::InvalidArgumentError("node id " + Quote(options.node_id) +
                                      " must match [a-z0-9][a-z0-9-]{0,30}");
  }
  if (options.state_dir.empty() || options.state_dir[0] != '/') {
    return absl::InvalidArgumentError("state dir " + Quote(options.state_dir) +
                                      " must be an absolute path");
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
  for (const std::string& d : {options.state_dir, options.state_dir + "/tmp", options.run_dir,
                               options.run_dir + "/run", options.run_dir + "/audit"}) {
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, "mkdir(" + d + ")");
    }
  }
  ASSIGN_OR_RETURN(RecordStore records, RecordStore::Open(options.run_dir + "/sandboxes"));
  return std::unique_ptr<SandboxManager>(new SandboxManager(
      std::move(options), std::move(by_name), std::move(layers), std::move(records)));
}

SandboxManager::SandboxManager(ManagerOptions options, SandboxTable::Backends backends,
                               std::unique_ptr<LayerProvider> layers, RecordStore records)
    : options_(std::move(options)),
      backends_(std::move(backends)),
      layers_(std::move(layers)),
      records_(std::move(records)),
      started_at_ns_(NowNs()) {
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
  ops.create = [this](const CreateRequest& r) { return table_->Create(r); };
  ops.get = [this](const std::string& id) { return table_->Get(id); };
  ops.destroy = [this](const std::string& id, const std::string& reason) { return table_->Destroy(id, reason); };
  create_keys_ = std::make_unique<CreateKeys>(std::move(ops));
  jobs_ = std::make_unique<Jobs>(options_.state_dir, *table_);
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
Status SandboxManager::AbandonCreate(const std::string& request_id) { return create_keys_->Abandon(request_id); }
Status SandboxManager::Destroy(const std::string& id) { return table_->Destroy(id, "destroy requested"); }
StatusOr<SandboxInfo> SandboxManager::Get(const std::string& id) const { return table_->Get(id); }
std::vector<SandboxInfo> SandboxManager::List(const std::map<std::string, std::string>& labels,
                                              const std::string& job) const {
  return table_->List(labels, job);
}
StatusOr<std::shared_ptr<runtime::Sandbox>> SandboxManager::Running(const std::string& id) { return table_->Use(id); }
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
  const int64_t start = NowNs();
  StatusOr<RecordedCall> rc = calls_->Run(id, request_id, [&]() -> StatusOr<RecordedCall> {
    ran = true;
    ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, table_->Use(id));
    table_->Touch(id, +1);
    StatusOr<runtime::ExecOutcome> out = sb->Exec(spec);
    table_->Touch(id, -1);
    if (!out.ok()) return out.status();
    RecordedCall r;
    r.outcome = std::move(*out);
    return r;
  });
  nlohmann::json a = {{"op", "exec"}, {"start_ns", start}, {"end_ns", NowNs()}};
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
  if (rc.ok() || rc.status().code() != absl::StatusCode::kNotFound) Audit(id, std::move(a));
  if (!rc.ok()) return rc.status();
  return std::move(rc->outcome);
}

void SandboxManager::Audit(const std::string& id, nlohmann::json entry) const { audit_->Append(id, entry); }

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
    a["end_ns"] = NowNs();
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

// ---------------------------------------------------------------- snapshot, grade

namespace {
// Pauses a running sandbox for a consistent read of its upper; resumes on
// destruction unless it was already paused (by the node or a snapshot).
class FreezeGuard {
 public:
  FreezeGuard(runtime::Sandbox* sb, bool want) : sb_(sb) {
    if (want) frozen_ = sb_->Pause().ok();
  }
  ~FreezeGuard() { Release(); }
  void Release() {
    if (frozen_) (void)sb_->Resume();
    frozen_ = false;
  }

 private:
  runtime::Sandbox* sb_;
  bool frozen_ = false;
};

bool ValidInsidePath(const std::string& p) {
  if (p.empty() || p[0] != '/' || p.size() > 4096 || p.find('\0') != std::string::npos) return false;
  size_t i = 0;
  while (i < p.size()) {
    size_t j = p.find('/', i);
    if (j == std::string::npos) j = p.size();
    std::string c = p.substr(i, j - i);
    if (c == "..") return false;
    i = j + 1;
  }
  return true;
}
}  // namespace

namespace {
// What a snapshot or grade may copy from a sandbox: its disk limit (the
// size of its upper) plus a quarter for metadata and chunk indexes.
uint64_t CopyLimitBytes(const runtime::Resources& r) {
  const uint64_t disk = uint64_t{r.disk_mb} << 20;
  return disk + disk / 4;
}
}  // namespace

StatusOr<image::LayerInfo> SandboxManager::Snapshot(const SnapshotRequest& req) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, table_->Live(req.id));
  const bool paused = table_->Get(req.id).value_or(SandboxInfo{}).state != SandboxState::kRunning;
  const int64_t t0 = NowNs();
  const std::string name =
      req.name.empty() ? "workspace/snap-" + req.id + "@" + std::to_string(t0) : req.name;
  if (name.find('@') == std::string::npos) {
    return absl::InvalidArgumentError("snapshot name " + Quote(name) + " must be kind/name@version");
  }
  ASSIGN_OR_RETURN(UniqueFd upper, e->sandbox->OpenUpper());
  CopyBudget budget("sandbox " + req.id, CopyLimitBytes(e->info.resources), &staging_used_,
                    options_.max_staging_bytes);
  UpperCopyOptions co;
  co.host_root_id = e->sandbox->upper_host_root_id();
  co.id_range = e->sandbox->upper_id_range();
  co.exclude = req.exclude;
  co.budget = &budget;
  const std::string staging = options_.state_dir + "/tmp/snap-" + req.id + "-" + std::to_string(t0);
  {
    FreezeGuard freeze(e->sandbox.get(), req.pause && !paused);
    Status cs = CopyUpperTree(upper.get(), staging, co);
    if (!cs.ok()) {
      return Status(cs.code(), cs.code() == absl::StatusCode::kResourceExhausted  // names the sandbox
                                   ? "snapshot: " + std::string(cs.message())
                                   : "snapshot of sandbox " + req.id + ": " + std::string(cs.message()));
    }
  }
  StatusOr<image::LayerInfo> li = layers_->BuildFromSandboxDir(name, staging);
  Status rm = RemoveTree(staging);
  if (!rm.ok()) Log(spdlog::level::warn, "removing snapshot staging failed", {{"dir", staging}, {"error", rm.ToString()}});
  if (!li.ok()) return li.status();
  Log(spdlog::level::info, "snapshot", {{"sandbox", req.id}, {"layer", name}, {"digest", li->digest},
                                        {"bytes", std::to_string(budget.used())},
                                        {"ms", std::to_string((NowNs() - t0) / 1000000)}});
  return li;
}

namespace {
// The /etc/hosts the container backend writes into a new sandbox's upper
// when its image has none (SeedEtcHosts in container_backend.cc, same text):
// not a change of the agent's, so not reported as touched. Read through fds
// without following symlinks, regular files of at most 4 KiB only.
bool IsSeededEtcHosts(int upper_fd, const std::string& hostname) {
  UniqueFd etc(::openat(upper_fd, "etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!etc.valid()) return false;
  UniqueFd f(::openat(etc.get(), "hosts", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st;
  if (!f.valid() || ::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 4096) return false;
  std::string want = "# warren: generated for this sandbox\n127.0.0.1\tlocalhost\n";
  if (!hostname.empty()) want += "127.0.1.1\t" + hostname + "\n";
  want += "::1\tlocalhost ip6-localhost ip6-loopback\n";
  std::string got(static_cast<size_t>(st.st_size), '\0');
  return ::pread(f.get(), got.data(), got.size(), 0) == static_cast<ssize_t>(got.size()) && got == want;
}

StatusOr<std::vector<std::string>> NormalizePaths(const std::vector<std::string>& in, const char* field) {
  std::vector<std::string> out;
  for (const std::string& p : in) {
    if (!ValidInsidePath(p) || p == "/") {
      return absl::InvalidArgumentError(std::string(field) + " path " + Quote(p) +
                                        " must be absolute, not \"/\", without \"..\"");
    }
    std::string q;  // collapse "//" and "/./", drop a trailing "/"
    size_t i = 0;
    while (i < p.size()) {
      size_t j = p.find('/', i);
      if (j == std::string::npos) j = p.size();
      std::string c = p.substr(i, j - i);
      if (!c.empty() && c != ".") q += "/" + c;
      i = j + 1;
    }
    if (q.empty()) {
      return absl::InvalidArgumentError(std::string(field) + " path " + Quote(p) + " names \"/\"");
    }
    out.push_back(q);
  }
  return out;
}
}  // namespace

// Grading (see the header): the grader's sandbox is built from pristine
// layers plus, per agent diff, a layer of only the solution paths; the
// agent's sandbox is only read (frozen meanwhile). The grade layers and the
// grader's sandbox are removed afterwards. A solution that cannot be packed
// because of what the agent put there (over its disk limit, a path longer
// than a layer holds) is a graded failure, not an error.
StatusOr<GradeResult> SandboxManager::Grade(const GradeRequest& req) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, table_->Live(req.id));
  const bool paused = table_->Get(req.id).value_or(SandboxInfo{}).state != SandboxState::kRunning;
  if (req.solution.empty()) {
    return absl::InvalidArgumentError(
        "grade of sandbox " + req.id +
        ": solution is empty; name the paths where the task's solution lives (e.g. /w/repo/pkg): the "
        "agent's changes enter the grader only there");
  }
  ASSIGN_OR_RETURN(std::vector<std::string> solution, NormalizePaths(req.solution, "solution"));
  ASSIGN_OR_RETURN(std::vector<std::string> prot, NormalizePaths(req.protected_paths, "protected"));
  if (e->info.pristine_layers.empty()) {
    return absl::FailedPreconditionError(
        "grade of sandbox " + req.id + ": it has no pristine layers (its bottom layer was made by a sandbox, "
        "e.g. a snapshot), so there is no toolchain to grade with; create it on the layers the snapshotted "
        "sandbox was created from plus the snapshot layer (snapshot().layers)");
  }

  GradeResult res;
  const int64_t t0 = NowNs();
  const std::vector<std::string>& all = e->info.layer_digests;
  const std::vector<std::string>& pristine = e->info.pristine_layers;  // a prefix of `all`, never changes
  std::vector<std::unique_ptr<CopyBudget>> budget_store;  // outlives `rollback` (staging removed first)
  Rollback rollback;
  std::vector<UniqueFd> layer_fds;  // every layer of the sandbox, bottom first
  for (const std::string& d : all) {
    ASSIGN_OR_RETURN(std::string path, layers_->Acquire(d));
    rollback.Add([this, d] { layers_->Release(d); });
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
    layer_fds.push_back(std::move(fd));
  }
  std::vector<int> pristine_fds;
  for (size_t i = 0; i < pristine.size(); ++i) pristine_fds.push_back(layer_fds[i].get());
  ASSIGN_OR_RETURN(UniqueFd upper, e->sandbox->OpenUpper());
  // The agent's diffs, bottom first: the layers a sandbox made, then the upper.
  struct Diff {
    int fd;
    UpperCopyOptions options;
    std::string staging;
  };
  std::vector<Diff> diffs;
  for (size_t i = pristine.size(); i <= all.size(); ++i) {
    Diff d;
    d.fd = i < all.size() ? layer_fds[i].get() : upper.get();
    if (i == all.size()) {
      d.options.host_root_id = e->sandbox->upper_host_root_id();
      d.options.id_range = e->sandbox->upper_id_range();
    }
    budget_store.push_back(std::make_unique<CopyBudget>("sandbox " + req.id, CopyLimitBytes(e->info.resources),
                                                        &staging_used_, options_.max_staging_bytes));
    d.options.budget = budget_store.back().get();
    d.staging = options_.state_dir + "/tmp/grade-" + req.id + "-" + std::to_string(t0) + "-" + std::to_string(diffs.size());
    diffs.push_back(std::move(d));
  }
  std::vector<std::string> touched;
  {
    FreezeGuard freeze(e->sandbox.get(), !paused);
    for (Diff& d : diffs) {
      std::vector<std::string> t;
      const size_t room = GradeResult::kMaxTouched > touched.size() ? GradeResult::kMaxTouched - touched.size() : 0;
      Status ls = ListChanges(d.fd, solution, pristine_fds, d.options, room, &t, &res.touched_truncated);
      if (!ls.ok()) return Status(ls.code(), "grade of sandbox " + req.id + ": " + std::string(ls.message()));
      if (d.fd == upper.get() && IsSeededEtcHosts(d.fd, e->info.hostname)) {
        t.erase(std::remove(t.begin(), t.end(), "/etc/hosts"), t.end());
      }
      touched.insert(touched.end(), t.begin(), t.end());
      for (const std::string& p : prot) {
        if (UpperTouches(d.fd, p)) touched.push_back(p);
      }
      if (!res.rejected.empty()) continue;
      Status cs = CopySolution(d.fd, d.staging, solution, prot, pristine_fds, d.options);
      if (!cs.ok()) {
        const bool content = (cs.code() == absl::StatusCode::kResourceExhausted && !d.options.budget->node_cap_hit()) ||
                             cs.code() == absl::StatusCode::kFailedPrecondition;
        if (!content) return Status(cs.code(), "grade of sandbox " + req.id + ": " + std::string(cs.message()));
        res.rejected = std::string(cs.message());
        continue;
      }
      rollback.Add([staging = d.staging] { (void)RemoveTree(staging); });
    }
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  if (touched.size() > GradeResult::kMaxTouched) {
    touched.resize(GradeResult::kMaxTouched);
    res.touched_truncated = true;
  }
  res.touched = std::move(touched);
  if (!res.rejected.empty()) {
    res.outcome.exit_code = 1;
    res.outcome.stderr_data = "warren: grade: the solution was not graded: " + res.rejected + "\n";
    res.outcome.stderr_total = res.outcome.stderr_data.size();
    Log(spdlog::level::info, "grade rejected", {{"sandbox", req.id}, {"reason", res.rejected}});
    return res;
  }
  CreateRequest cr = e->spec;
  cr.request_id.clear();  // the agent sandbox's create key: this is another create
  cr.layers = pristine;
  for (size_t i = 0; i < diffs.size(); ++i) {
    if (diffs[i].options.budget->used() == 0) {  // nothing under the solution paths
      (void)RemoveTree(diffs[i].staging);
      continue;
    }
    const std::string name = "workspace/grade-" + req.id + "@" + std::to_string(t0) + "." + std::to_string(i);
    StatusOr<image::LayerInfo> li = layers_->BuildFromSandboxDir(name, diffs[i].staging);
    (void)RemoveTree(diffs[i].staging);
    diffs[i].options.budget->ReleaseNode();
    if (!li.ok()) return li.status();
    rollback.Add([this, name] {
      Status s = table_->RemoveLayer(name);
      if (!s.ok()) Log(spdlog::level::warn, "removing grade layer failed", {{"layer", name}, {"error", s.ToString()}});
    });
    cr.layers.push_back(li->digest);
  }
  cr.labels["warren.grade-of"] = req.id;
  // The agent sandbox's create RPC is long gone: not its deadline, not its
  // cancellation probe (which refers to that call).
  cr.deadline = std::chrono::steady_clock::time_point::max();
  cr.cancelled = nullptr;
  cr.ttl_s = 0;
  cr.idle_timeout_s = 0;
  cr.job.clear();
  ASSIGN_OR_RETURN(SandboxInfo g, table_->Create(cr));
  res.grade_sandbox_id = g.id;
  StatusOr<runtime::ExecOutcome> out = [&]() -> StatusOr<runtime::ExecOutcome> {
    ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, table_->Use(g.id));
    return sb->Exec(req.grader);
  }();
  Status ds = table_->Destroy(g.id, "grade finished");
  if (!ds.ok()) Log(spdlog::level::warn, "destroying grade sandbox failed", {{"sandbox", g.id}, {"error", ds.ToString()}});
  if (!out.ok()) return out.status();
  res.outcome = std::move(*out);
  Log(spdlog::level::info, "graded", {{"sandbox", req.id}, {"exit", std::to_string(res.outcome.exit_code)},
                                      {"touched", std::to_string(res.touched.size())},
                                      {"ms", std::to_string((NowNs() - t0) / 1000000)}});
  return res;
}

}  // namespace warren::node
