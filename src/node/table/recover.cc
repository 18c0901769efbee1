// SandboxTable: recovery of the sandboxes a previous daemon left (see
// sandbox_table.h).
#include "common/file_util.h"
#include "common/log.h"
#include "node/admission/validate.h"
#include "node/records/sandbox_record.h"
#include "node/table/sandbox_table.h"

namespace warren::node {

void SandboxTable::CleanupRecord(const std::string& id, const record::Sandbox& record, const std::string& reason) {
  runtime::SandboxSpec spec = SpecOf(record);
  spec.id = id;
  spec.dir = RunDir(id);
  std::vector<runtime::Backend*> targets;
  if (backends_.count(record.backend())) {
    targets.push_back(backends_.at(record.backend()).get());
  } else {
    for (const auto& [n, b] : backends_) targets.push_back(b.get());  // unknown: try all
  }
  for (runtime::Backend* b : targets) {
    Status s = b->Cleanup(spec, record.backend_record());
    if (!s.ok()) {
      Log(spdlog::level::err, "cleanup failed; record kept for the next start",
          {{"sandbox", id}, {"reason", reason}, {"error", s.ToString()}});
      return;
    }
  }
  Status s = RemoveTree(RunDir(id));
  if (!s.ok()) {
    Log(spdlog::level::err, "removing sandbox dir failed; record kept", {{"sandbox", id}, {"error", s.ToString()}});
    return;
  }
  s = records_.Remove(id);
  if (!s.ok()) Log(spdlog::level::err, "removing record failed", {{"sandbox", id}, {"error", s.ToString()}});
  if (hooks_.destroyed) hooks_.destroyed(id);
  Log(spdlog::level::info, "sandbox cleaned up", {{"sandbox", id}, {"reason", reason}});
}

void SandboxTable::RecoverOne(const std::string& id, const record::Sandbox& rec) {
  const std::string& state = rec.state();
  if (rec.id() != id) {
    CleanupRecord(id, rec, "record id does not match its file name");
    return;
  }
  if (state != "running") {
    CleanupRecord(id, rec, "found in state '" + state + "' at start: half-created or half-destroyed");
    return;
  }
  const std::string& bname = rec.backend();
  auto bit = backends_.find(bname);
  if (bit == backends_.end()) {
    Log(spdlog::level::err, "record names an unavailable backend; left in place",
        {{"sandbox", id}, {"backend", bname}});
    return;
  }
  auto e = std::make_shared<Entry>();
  e->backend = bit->second.get();
  e->dir = RunDir(id);
  ParseRecord(rec, e.get(), [this](const std::vector<std::string>& digests) {
    std::vector<std::string> pristine;
    for (const std::string& d : digests) {
      StatusOr<image::LayerInfo> li = layers_.Resolve(d);
      if (!li.ok() || li->from_sandbox) break;
      pristine.push_back(d);
    }
    return pristine;
  });
  runtime::SandboxSpec spec = SpecOf(rec);
  spec.dir = e->dir;
  StatusOr<std::unique_ptr<runtime::Sandbox>> sb = e->backend->Adopt(spec, e->backend_record);
  if (!sb.ok()) {
    CleanupRecord(id, rec, "backend could not adopt it: " + sb.status().ToString());
    return;
  }
  e->sandbox = std::shared_ptr<runtime::Sandbox>(std::move(*sb));
  e->backend_record = e->sandbox->Record();  // in the backend's current format
  // The freezer is reconciled with the record: a daemon killed between a
  // freeze and the record write (pause, suspend) or between a thaw and the
  // record write (resume) left the cgroup in the other state. The record is
  // what the client was told (it is written before the reply), so the
  // cgroup follows it.
  const bool paused = e->info.state != SandboxState::kRunning;
  runtime::Pausable* pausable = runtime::As<runtime::Pausable>(*e->sandbox);
  Status fs = pausable == nullptr ? runtime::NotSupported(*e->sandbox, runtime::Capability::kPause)
              : paused            ? pausable->Pause()
                                  : pausable->Resume();
  if (!fs.ok() && (paused || pausable != nullptr)) {
    Log(spdlog::level::warn, "reconciling the freezer of an adopted sandbox failed",
        {{"sandbox", id}, {"want", paused ? "frozen" : "thawed"}, {"error", fs.ToString()}});
    if (paused && pausable != nullptr && pausable->Resume().ok()) {
      e->info.state = SandboxState::kRunning;  // never left half-frozen: running, recorded as such below
    }
  }
  for (const std::string& d : e->info.layer_digests) {
    StatusOr<std::string> p = layers_.Acquire(d);
    if (!p.ok()) {
      Log(spdlog::level::warn, "re-acquiring layer of adopted sandbox failed",
          {{"sandbox", id}, {"digest", d}, {"error", p.status().ToString()}});
      continue;
    }
    e->acquired.push_back(d);
  }
  AddTransition(*e, e->info.state, "adopted after daemon restart");
  Persist(*e, e->info.state, "persisting adopted record failed");
  {
    std::lock_guard<std::mutex> l(mu_);
    table_[id] = e;
  }
  if (!e->spec.request_id.empty() && hooks_.adopted) hooks_.adopted(id, e->spec.request_id);
  Log(spdlog::level::info, "sandbox adopted", {{"sandbox", id}, {"reason", "daemon restart"}});
}

void SandboxTable::Recover() {
  for (RecordStore::Loaded& l : records_.LoadAll()) {
    if (!ValidSandboxId(l.id)) {
      Log(spdlog::level::err, "ignoring record with an invalid id", {{"file", l.id}});
      continue;
    }
    if (!l.record.ok()) {
      CleanupRecord(l.id, record::Sandbox(), "unreadable record: " + l.record.status().ToString());
      continue;
    }
    RecoverOne(l.id, *l.record);
  }
}

}  // namespace warren::node
