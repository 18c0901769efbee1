#include "node/jobs/jobs.h"

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/log.h"

namespace warren::node {

namespace {
constexpr uint32_t kDefaultLeaseS = 60;
constexpr uint32_t kDefaultGraceS = 300;
}  // namespace

Jobs::Jobs(const std::string& state_dir, SandboxTable& table) : path_(state_dir + "/jobs.json"), table_(table) {}

void Jobs::SaveLocked() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, job] : jobs_) {
    j[name] = {{"lease_s", job.lease_s},
               {"grace_s", job.grace_s},
               {"lease_expires_at_ns", job.lease_expires_at_ns},
               {"lapsed", job.lapsed},
               {"lapsed_at_ns", job.lapsed_at_ns}};
  }
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (!f.good()) {
      Log(spdlog::level::warn, "persisting jobs failed", {{"file", tmp}});
      return;
    }
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    Log(spdlog::level::warn, "persisting jobs failed",
        {{"error", ErrnoToStatus(errno, "rename(" + tmp + ")").ToString()}});
  }
}

void Jobs::Load() {
  std::ifstream f(path_);
  if (!f.good()) return;
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_object()) continue;
    JobInfo job;
    job.name = it.key();
    job.lease_s = it.value().value("lease_s", 0u);
    job.grace_s = it.value().value("grace_s", 0u);
    job.lease_expires_at_ns = it.value().value("lease_expires_at_ns", int64_t{0});
    job.lapsed = it.value().value("lapsed", false);
    job.lapsed_at_ns = it.value().value("lapsed_at_ns", int64_t{0});
    jobs_[job.name] = job;
  }
}

StatusOr<JobInfo> Jobs::Heartbeat(const std::string& job, uint32_t lease_s, uint32_t grace_s) {
  if (job.empty() || job.size() > 253 || HasControl(job)) {
    return absl::InvalidArgumentError("job=" + Quote(job) + " must be 1-253 bytes without control characters");
  }
  bool revive = false;
  JobInfo out;
  {
    std::lock_guard<std::mutex> l(mu_);
    JobInfo& j = jobs_[job];
    j.name = job;
    if (lease_s > 0) j.lease_s = lease_s;
    if (grace_s > 0) j.grace_s = grace_s;
    if (j.lease_s == 0) j.lease_s = kDefaultLeaseS;
    if (j.grace_s == 0) j.grace_s = kDefaultGraceS;
    j.lease_expires_at_ns = WallNowNs() + int64_t{j.lease_s} * 1000000000;
    revive = j.lapsed;
    j.lapsed = false;
    j.lapsed_at_ns = 0;
    SaveLocked();
    out = j;
  }
  if (revive) {
    uint32_t n = Resume(job);
    Log(spdlog::level::info, "job lease renewed after lapse; sandboxes resumed",
        {{"job", job}, {"sandboxes", std::to_string(n)}});
  }
  out.sandboxes = static_cast<uint32_t>(table_.List({}, job).size());
  return out;
}

StatusOr<JobInfo> Jobs::Get(const std::string& job) const {
  JobInfo out;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = jobs_.find(job);
    if (it != jobs_.end()) out = it->second;
  }
  out.name = job;
  out.sandboxes = static_cast<uint32_t>(table_.List({}, job).size());
  if (out.lease_s == 0 && out.sandboxes == 0) return absl::NotFoundError("job " + Quote(job) + " not found");
  return out;
}

std::vector<JobInfo> Jobs::List() const {
  std::map<std::string, JobInfo> out;
  {
    std::lock_guard<std::mutex> l(mu_);
    out = jobs_;
  }
  for (const SandboxInfo& i : table_.List({}, "")) {
    if (i.job.empty()) continue;
    JobInfo& j = out[i.job];
    j.name = i.job;
    ++j.sandboxes;
  }
  std::vector<JobInfo> v;
  for (auto& [name, j] : out) {
    if (j.lease_s == 0 && j.sandboxes == 0) continue;
    v.push_back(j);
  }
  return v;
}

uint32_t Jobs::Suspend(const std::string& job, const std::string& reason) {
  uint32_t n = 0;
  for (const SandboxInfo& i : table_.List({}, job)) {
    if (i.state != SandboxState::kRunning && i.state != SandboxState::kPaused) continue;
    Status s = table_.Suspend(i.id);
    if (s.ok()) {
      ++n;
    } else {
      Log(spdlog::level::warn, "suspending sandbox of job failed",
          {{"job", job}, {"sandbox", i.id}, {"reason", reason}, {"error", s.ToString()}});
    }
  }
  return n;
}

uint32_t Jobs::Resume(const std::string& job) {
  uint32_t n = 0;
  for (const SandboxInfo& i : table_.List({}, job)) {
    if (i.state != SandboxState::kPaused && i.state != SandboxState::kSuspended) continue;
    Status s = table_.Resume(i.id, true);
    if (s.ok()) {
      ++n;
    } else {
      Log(spdlog::level::warn, "resuming sandbox of job failed",
          {{"job", job}, {"sandbox", i.id}, {"error", s.ToString()}});
    }
  }
  return n;
}

uint32_t Jobs::Destroy(const std::string& job, const std::string& reason) {
  uint32_t n = 0;
  for (const SandboxInfo& i : table_.List({}, job)) {
    if (table_.Destroy(i.id, reason).ok()) ++n;
  }
  std::lock_guard<std::mutex> l(mu_);
  jobs_.erase(job);
  SaveLocked();
  return n;
}

void Jobs::Reap() {
  std::vector<std::string> lapse, expire;
  {
    std::lock_guard<std::mutex> l(mu_);
    const int64_t now = WallNowNs();
    bool changed = false;
    for (auto& [name, j] : jobs_) {
      if (j.lease_s == 0 || j.lease_expires_at_ns == 0) continue;
      if (!j.lapsed && now >= j.lease_expires_at_ns) {
        j.lapsed = true;
        j.lapsed_at_ns = now;
        changed = true;
        lapse.push_back(name);
      } else if (j.lapsed && now >= j.lapsed_at_ns + int64_t{j.grace_s} * 1000000000) {
        expire.push_back(name);
      }
    }
    if (changed) SaveLocked();
  }
  for (const std::string& job : lapse) {
    uint32_t n = Suspend(job, "job lease lapsed");
    Log(spdlog::level::info, "job lease lapsed; sandboxes suspended", {{"job", job}, {"sandboxes", std::to_string(n)}});
  }
  for (const std::string& job : expire) {
    uint32_t n = Destroy(job, "job lease lapsed beyond its grace period");
    Log(spdlog::level::info, "job grace expired; sandboxes destroyed",
        {{"job", job}, {"sandboxes", std::to_string(n)}});
  }
}

}  // namespace warren::node
