// SandboxTable: create and destroy orchestration (see sandbox_table.h).
#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>

#include "absl/strings/escaping.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/rollback.h"
#include "node/records/sandbox_record.h"
#include "node/table/sandbox_table.h"

namespace warren::node {

namespace {
// How long a destroy waits for a create or another destroy of its id.
constexpr auto kCreateWaitBound = std::chrono::minutes(10);
}  // namespace

std::string SandboxTable::NewId() {
  for (int attempt = 0; attempt < 16; ++attempt) {
    unsigned char buf[6];
    size_t got = 0;
    while (got < sizeof(buf)) {
      ssize_t n = getrandom(buf + got, sizeof(buf) - got, 0);
      if (n > 0) got += static_cast<size_t>(n);
    }
    std::string id =
        options_.node_id + "-" + absl::BytesToHexString(std::string(reinterpret_cast<char*>(buf), sizeof(buf)));
    std::lock_guard<std::mutex> l(mu_);
    if (!table_.count(id)) return id;
  }
  return {};
}

StatusOr<SandboxInfo> SandboxTable::Create(const CreateRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  StatusOr<SandboxInfo> info = CreateSteps(request);
  // The label is one of this node's backends (never a client's free text).
  const std::string asked = request.backend.empty() ? "container" : request.backend;
  metrics_.OnCreate(backends_.count(asked) ? asked : "unknown", info.status(),
                    std::chrono::steady_clock::now() - start);
  return info;
}

StatusOr<SandboxInfo> SandboxTable::CreateSteps(const CreateRequest& request) {
  ASSIGN_OR_RETURN(CreateRequest spec, Normalize(request));
  Rollback rollback;
  RETURN_IF_ERROR(admission_.Admit(spec));
  rollback.Add([this] { admission_.Release(); });
  std::string id = NewId();
  if (id.empty()) return absl::InternalError("could not draw a unique sandbox id");

  auto e = std::make_shared<Entry>();
  e->spec = spec;
  // What the entry keeps is the sandbox's spec, not this call's: the
  // caller's deadline and its cancellation probe (which points into the
  // RPC) end with the call.
  e->spec.deadline = std::chrono::steady_clock::time_point::max();
  e->spec.cancelled = nullptr;
  e->dir = RunDir(id);
  e->backend = backends_.at(spec.backend).get();
  e->info.id = id;
  e->info.backend = spec.backend;
  e->info.state = SandboxState::kCreating;
  e->info.layer_names = spec.layers;
  e->info.resources = spec.resources;
  (void)runtime::ParseQos(spec.qos, &e->info.qos);  // normalized: one of the two
  e->info.labels = spec.labels;
  e->info.job = spec.job;
  e->info.created_at_ns = WallNowNs();
  e->info.hostname = spec.hostname.empty() ? id : spec.hostname;
  e->info.ttl_s = spec.ttl_s;
  e->info.expires_at_ns = spec.ttl_s > 0 ? e->info.created_at_ns + int64_t{spec.ttl_s} * 1000000000 : 0;
  e->info.idle_timeout_s = spec.idle_timeout_s;
  e->info.last_activity_ns = e->info.created_at_ns;
  AddTransition(*e, SandboxState::kCreating, "create requested");

  {
    std::shared_lock<std::shared_mutex> layer_lock(layer_mu_);
    bool pristine_done = false;  // a layer from a sandbox ends the pristine ones
    for (size_t i = 0; i < spec.layers.size(); ++i) {
      StatusOr<image::LayerInfo> li = layers_.Resolve(spec.layers[i]);
      if (!li.ok()) {
        const Status& s = li.status();
        return Status(s.code(),
                      "layers[" + std::to_string(i) + "]=" + Quote(spec.layers[i]) + ": " + std::string(s.message()));
      }
      e->info.layer_digests.push_back(li->digest);
      if (li->from_sandbox) pristine_done = true;
      if (!pristine_done) e->info.pristine_layers.push_back(li->digest);
    }
    std::lock_guard<std::mutex> l(mu_);
    // Counted and inserted under one lock: two creates cannot both take the
    // last share of a class.
    RETURN_IF_ERROR(AdmitClass(options_.limits, spec, UsageLocked(e->info.qos)));
    table_[id] = e;
  }
  rollback.Add([this, id] {
    {
      std::lock_guard<std::mutex> l(mu_);
      table_.erase(id);
    }
    cv_.notify_all();
  });

  RETURN_IF_ERROR(records_.Put(id, MakeRecord(*e, SandboxState::kCreating)));
  rollback.Add([this, id] {
    Status s = records_.Remove(id);
    if (!s.ok())
      Log(spdlog::level::err, "rollback: removing record failed", {{"sandbox", id}, {"error", s.ToString()}});
  });

  if (::mkdir(e->dir.c_str(), 0700) != 0) {
    Status s = ErrnoToStatus(errno, "mkdir(" + e->dir + ")");
    if (StatusErrno(s) == ENOSPC) {
      return absl::ResourceExhaustedError("run dir " + options_.run_dir + " is full: " + std::string(s.message()));
    }
    return s;
  }
  rollback.Add([e] {
    Status s = RemoveTree(e->dir);
    if (!s.ok())
      Log(spdlog::level::err, "rollback: removing dir failed", {{"sandbox", e->info.id}, {"error", s.ToString()}});
  });

  runtime::SandboxSpec bspec;
  bspec.id = id;
  bspec.dir = e->dir;
  for (const std::string& digest : e->info.layer_digests) {
    StatusOr<std::string> path = layers_.Acquire(digest);
    if (!path.ok()) {
      return Status(path.status().code(), "mounting layer " + digest + ": " + std::string(path.status().message()));
    }
    e->acquired.push_back(digest);
    rollback.Add([this, digest] { layers_.Release(digest); });
    bspec.lower_dirs.push_back(*path);
    if (std::string file = layers_.BlobPath(digest); !file.empty()) bspec.layer_files.push_back(file);
  }
  bspec.resources = spec.resources;
  bspec.qos = e->info.qos;
  bspec.env = spec.env;
  bspec.workdir = spec.workdir;
  bspec.user = spec.user;
  bspec.hostname = e->info.hostname;
  bspec.network = spec.network;

  // Cleanup is idempotent and covers a backend that broke its "nothing left
  // behind" promise; it runs before the dir removal registered above.
  rollback.Add([e, bspec] {
    Status s = e->backend->Cleanup(bspec, e->backend_record);
    if (!s.ok())
      Log(spdlog::level::err, "rollback: backend cleanup failed", {{"sandbox", e->info.id}, {"error", s.ToString()}});
  });
  StatusOr<std::unique_ptr<runtime::Sandbox>> sb = e->backend->Create(bspec);
  if (!sb.ok()) {
    Log(spdlog::level::warn, "create failed",
        {{"sandbox", id}, {"step", "backend"}, {"error", sb.status().ToString()}});
    return sb.status();
  }
  e->sandbox = std::shared_ptr<runtime::Sandbox>(std::move(*sb));
  rollback.Add([e] {
    Status s = e->sandbox->Destroy();
    if (!s.ok())
      Log(spdlog::level::err, "rollback: destroy failed", {{"sandbox", e->info.id}, {"error", s.ToString()}});
  });
  e->backend_record = e->sandbox->Record();
  AddTransition(*e, SandboxState::kRunning, "created");
  Status st = records_.Put(id, MakeRecord(*e, SandboxState::kRunning));
  if (!st.ok()) {
    Log(spdlog::level::warn, "create failed", {{"sandbox", id}, {"step", "persist"}, {"error", st.ToString()}});
    return st;
  }

  rollback.Commit();
  admission_.Release();
  SandboxInfo info;
  {
    std::lock_guard<std::mutex> l(mu_);
    e->info.state = SandboxState::kRunning;
    info = InfoOf(*e);
  }
  cv_.notify_all();
  Log(spdlog::level::info, "sandbox running", {{"sandbox", id}, {"reason", "created"}, {"backend", spec.backend}});
  return info;
}

Status SandboxTable::Destroy(const std::string& id, const std::string& reason) {
  std::shared_ptr<Entry> e;
  {
    std::unique_lock<std::mutex> l(mu_);
    auto it = table_.find(id);
    if (it == table_.end()) return NotFound(id);
    e = it->second;
    // Wait for a create in progress or another destroy of this id.
    bool settled = cv_.wait_for(l, kCreateWaitBound, [&] {
      auto cur = table_.find(id);
      return cur == table_.end() || cur->second != e ||
             (e->info.state != SandboxState::kCreating && !e->destroy_running);
    });
    if (!settled) {
      return absl::UnavailableError("sandbox " + id + " is still being created or destroyed; retry");
    }
    auto cur = table_.find(id);
    if (cur == table_.end() || cur->second != e) return absl::OkStatus();  // already gone
    e->info.state = SandboxState::kDestroying;
    e->destroy_running = true;
  }
  // A pause/resume/suspend of this sandbox in flight finishes first (it sees
  // kDestroying and leaves state and record alone); later ones refuse.
  { std::lock_guard<std::mutex> pl(e->pause_mu); }
  AddTransition(*e, SandboxState::kDestroying, reason);
  Persist(*e, SandboxState::kDestroying, "persisting destroying state failed");
  Log(spdlog::level::info, "sandbox destroying", {{"sandbox", id}, {"reason", reason}});
  Status s = e->sandbox->Destroy();
  if (!s.ok()) {
    Log(spdlog::level::err, "destroy failed", {{"sandbox", id}, {"error", s.ToString()}});
    {
      std::lock_guard<std::mutex> l(mu_);
      e->destroy_running = false;
    }
    cv_.notify_all();
    return s;
  }
  for (const std::string& d : e->acquired) layers_.Release(d);
  e->acquired.clear();
  Status rm = RemoveTree(e->dir);
  if (!rm.ok()) Log(spdlog::level::err, "removing sandbox dir failed", {{"sandbox", id}, {"error", rm.ToString()}});
  rm = records_.Remove(id);
  if (!rm.ok()) Log(spdlog::level::err, "removing sandbox record failed", {{"sandbox", id}, {"error", rm.ToString()}});
  {
    std::lock_guard<std::mutex> l(mu_);
    table_.erase(id);
    e->destroy_running = false;
  }
  cv_.notify_all();
  if (hooks_.destroyed) hooks_.destroyed(id);
  gone_.Remember(id, reason);
  metrics_.OnDestroy(e->info.backend, reason);
  Log(spdlog::level::info, "sandbox destroyed", {{"sandbox", id}, {"reason", reason}});
  return absl::OkStatus();
}

}  // namespace warren::node
