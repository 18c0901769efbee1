#include "cluster/projects.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

#include "common/log.h"
#include "common/time.h"
#include "image/oci/digest.h"

namespace warren::cluster {
namespace {

namespace v1 = ::warren::v1;

constexpr char kDefPrefix[] = "/warren/projects/";
constexpr char kUsagePrefix[] = "/warren/usage/";
constexpr size_t kMaxDepth = 8;
// Reads of the definitions for unknown tokens, at most, per second.
constexpr size_t kMissLoadsPerSecond = 20;
// A create's quota transaction: tries and time before it answers Unavailable.
constexpr int kMaxTries = 64;
constexpr auto kAdmitBudget = std::chrono::seconds(5);
// A project's create-rate key, beside its usage keys: '#' is no name
// character, so it never collides with a child project or a node's key.
constexpr char kRateKey[] = "#rate";

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

bool HasQuota(const v1::ProjectQuota& q) {
  return q.sandboxes() > 0 || q.cpu_millis() > 0 || q.memory_mb() > 0 || q.creates_per_second() > 0;
}

nlohmann::json QuotaJson(const v1::ProjectQuota& q) {
  return {{"sandboxes", q.sandboxes()},
          {"cpu_millis", q.cpu_millis()},
          {"memory_mb", q.memory_mb()},
          {"creates_per_second", q.creates_per_second()},
          {"create_burst", q.create_burst()}};
}

// The GCRA's parameters of a rate quota (project.proto): the emission
// interval T (ns between creates on average) and the burst.
int64_t RateIntervalNs(const v1::ProjectQuota& q) {
  return std::max<int64_t>(1, std::llround(1e9 / q.creates_per_second()));
}
int64_t RateBurst(const v1::ProjectQuota& q) {
  if (q.create_burst() > 0) return q.create_burst();
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(q.creates_per_second())));
}

// A key under /warren/usage/ that is no node's usage (a rate key).
bool IsRateKey(const std::string& key) { return absl::EndsWith(key, std::string("/") + kRateKey); }

// A rate as people write it ("2", "0.5").
std::string RateText(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", r);
  return buf;
}

// The first limit where `q` asks for more than `cap` allows (both set, 0 =
// no limit): its name and both values as text; nullopt when q fits in cap.
struct Above {
  std::string what, want, cap;
};
std::optional<Above> FirstAbove(const v1::ProjectQuota& q, const v1::ProjectQuota& cap) {
  const std::pair<const char*, std::pair<uint64_t, uint64_t>> counts[] = {
      {"sandboxes", {q.sandboxes(), cap.sandboxes()}},
      {"cpu_millis", {q.cpu_millis(), cap.cpu_millis()}},
      {"memory_mb", {q.memory_mb(), cap.memory_mb()}}};
  for (const auto& [what, v] : counts) {
    if (v.second > 0 && v.first > v.second) return Above{what, std::to_string(v.first), std::to_string(v.second)};
  }
  if (cap.creates_per_second() > 0 && q.creates_per_second() > cap.creates_per_second()) {
    return Above{"creates_per_second", RateText(q.creates_per_second()), RateText(cap.creates_per_second())};
  }
  return std::nullopt;
}

// A creates-per-second quota that is not a finite number >= 0, or a burst
// without a rate: what is wrong with it, else "".
std::string BadRate(const v1::ProjectQuota& q) {
  if (!std::isfinite(q.creates_per_second()) || q.creates_per_second() < 0) {
    return "creates_per_second must be a finite number >= 0 (0 = no limit)";
  }
  if (q.creates_per_second() > 0 && q.creates_per_second() < 1e-3) {
    return "creates_per_second must be at least 0.001 (one create in 1000 s)";
  }
  if (q.create_burst() > 0 && q.creates_per_second() == 0) return "create_burst needs creates_per_second";
  return "";
}

std::string UsageJson(const ProjectStore::Usage& u) {
  return nlohmann::json{{"sandboxes", u.sandboxes}, {"cpu_millis", u.cpu_millis}, {"memory_mb", u.memory_mb}}.dump();
}

ProjectStore::Usage ParseUsage(const std::string& s) {
  ProjectStore::Usage u;
  nlohmann::json j = nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return u;
  u.sandboxes = j.value("sandboxes", uint64_t{0});
  u.cpu_millis = j.value("cpu_millis", uint64_t{0});
  u.memory_mb = j.value("memory_mb", uint64_t{0});
  return u;
}

// "" when `used` is within `q`, else which limit it passes.
std::string Exceeds(const v1::ProjectQuota& q, const ProjectStore::Usage& used) {
  if (q.sandboxes() > 0 && used.sandboxes > q.sandboxes()) {
    return "quota of " + std::to_string(q.sandboxes()) + " sandboxes reached";
  }
  if (q.cpu_millis() > 0 && used.cpu_millis > q.cpu_millis()) {
    return "quota of " + std::to_string(q.cpu_millis()) + " millicpus reached (" + std::to_string(used.cpu_millis) +
           " with this create)";
  }
  if (q.memory_mb() > 0 && used.memory_mb > q.memory_mb()) {
    return "quota of " + std::to_string(q.memory_mb()) + " MiB reached (" + std::to_string(used.memory_mb) +
           " with this create)";
  }
  return "";
}

StatusOr<std::string> NewToken() {
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "getrandom(project token)");
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string t = "wp_";
  for (unsigned char c : raw) {
    t += kHex[c >> 4];
    t += kHex[c & 15];
  }
  return t;
}

bool ValidName(std::string_view n) {
  if (n.empty() || n.size() > 63) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) return false;
  }
  return true;
}

}  // namespace

ProjectStore::Usage& ProjectStore::Usage::operator+=(const Usage& o) {
  sandboxes += o.sandboxes;
  cpu_millis += o.cpu_millis;
  memory_mb += o.memory_mb;
  return *this;
}

ProjectStore::Usage& ProjectStore::Usage::operator-=(const Usage& o) {
  sandboxes -= std::min(sandboxes, o.sandboxes);
  cpu_millis -= std::min(cpu_millis, o.cpu_millis);
  memory_mb -= std::min(memory_mb, o.memory_mb);
  return *this;
}

// Returns its share to the node's pending usage when the create ends (the
// sandbox it made, if any, is in the table by then).
class ProjectStore::Hold final : public api::QuotaHold {
 public:
  // `published`: the admission wrote this node's usage key (a project
  // under a quota), which Release then brings down to what is left.
  Hold(ProjectStore* store, std::string project, Usage u, bool published)
      : store_(store), project_(std::move(project)), usage_(u), published_(published) {}
  ~Hold() override { store_->Release(project_, usage_, published_); }
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;

 private:
  ProjectStore* const store_;
  const std::string project_;
  const Usage usage_;
  const bool published_;
};

ProjectStore::ProjectStore(EtcdClient* etcd, std::string node_id, node::SandboxManager* manager)
    : etcd_(etcd), node_(std::move(node_id)), manager_(manager) {}

ProjectStore::~ProjectStore() = default;

Status ProjectStore::CheckPath(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("project path is empty");
  size_t depth = 0;
  for (size_t start = 0; start <= path.size(); ++depth) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (!ValidName(std::string_view(path).substr(start, slash - start))) {
      return absl::InvalidArgumentError("project path \"" + path +
                                        "\": each name must be 1-63 characters of [a-z0-9._-], starting with a "
                                        "letter or digit, names joined by '/'");
    }
    start = slash + 1;
  }
  if (depth > kMaxDepth) {
    return absl::InvalidArgumentError("project path \"" + path + "\" is deeper than " + std::to_string(kMaxDepth) +
                                      " levels");
  }
  return absl::OkStatus();
}

std::string ProjectStore::UsageKey(const std::string& project) const { return kUsagePrefix + project + "/@" + node_; }

Status ProjectStore::Load() {
  std::unique_lock<std::mutex> one(load_mu_);
  {
    std::lock_guard<std::mutex> l(cache_mu_);
    load_tried_ = std::chrono::steady_clock::now();
  }
  ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, etcd_->RangePrefix(kDefPrefix));
  std::map<std::string, Def> defs;
  std::map<std::string, std::string> by_token;
  for (const EtcdKv& kv : kvs) {
    nlohmann::json j = nlohmann::json::parse(kv.value, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("path") || !j["path"].is_string()) {
      Log(spdlog::level::warn, "projects: ignoring a malformed definition", {{"key", kv.key}});
      continue;
    }
    Def d;
    d.path = j["path"].get<std::string>();
    d.token_sha256 = j.value("token_sha256", "");
    d.created_ns = j.value("created_ns", int64_t{0});
    const nlohmann::json q = j.value("quota", nlohmann::json::object());
    d.quota.set_sandboxes(q.value("sandboxes", 0u));
    d.quota.set_cpu_millis(q.value("cpu_millis", uint64_t{0}));
    d.quota.set_memory_mb(q.value("memory_mb", uint64_t{0}));
    d.quota.set_creates_per_second(q.value("creates_per_second", 0.0));
    d.quota.set_create_burst(q.value("create_burst", 0u));
    if (!d.token_sha256.empty()) by_token[d.token_sha256] = d.path;
    defs[d.path] = std::move(d);
  }
  std::lock_guard<std::mutex> l(cache_mu_);
  defs_ = std::move(defs);
  by_token_ = std::move(by_token);
  return absl::OkStatus();
}

void ProjectStore::LoadIfStale(std::chrono::milliseconds age) {
  {
    std::lock_guard<std::mutex> l(cache_mu_);
    if (std::chrono::steady_clock::now() - load_tried_ < age) return;
  }
  if (Status s = Load(); !s.ok()) {
    Log(spdlog::level::warn, "projects: could not read the definitions; using the last ones",
        {{"error", s.ToString()}});
  }
}

std::optional<ProjectStore::Def> ProjectStore::Find(const std::string& path) {
  std::lock_guard<std::mutex> l(cache_mu_);
  auto it = defs_.find(path);
  if (it == defs_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> ProjectStore::ProjectOfToken(std::string_view token) {
  const std::string sha = image::oci::Sha256Hex(token);
  for (int pass = 0; pass < 2; ++pass) {
    {
      std::lock_guard<std::mutex> l(cache_mu_);
      auto it = by_token_.find(sha);
      if (it != by_token_.end()) return it->second;
    }
    // Unknown here: maybe made since the last read (on another node). Read
    // again, at most kMissLoadsPerSecond times a second (a stream of bad
    // tokens costs etcd no more).
    if (pass == 0) {
      const auto now = std::chrono::steady_clock::now();
      {
        std::lock_guard<std::mutex> l(cache_mu_);
        while (!miss_loads_.empty() && now - miss_loads_.front() > std::chrono::seconds(1)) miss_loads_.pop_front();
        if (miss_loads_.size() >= kMissLoadsPerSecond) return std::nullopt;
        miss_loads_.push_back(now);
      }
      if (Status s = Load(); !s.ok()) return std::nullopt;
    }
  }
  return std::nullopt;
}

std::map<std::string, ProjectStore::Usage> ProjectStore::TableUsage() {
  std::map<std::string, Usage> out;
  for (const node::SandboxInfo& s : manager_->List({}, "")) {
    auto it = s.labels.find(api::kProjectLabel);
    if (it == s.labels.end()) continue;
    out[it->second] += Usage{1, s.resources.cpu_millis, s.resources.memory_mb};
  }
  return out;
}

StatusOr<std::unique_ptr<api::QuotaHold>> ProjectStore::Admit(const std::string& project, uint32_t cpu_millis,
                                                              uint32_t memory_mb) {
  if (!Find(project)) LoadIfStale(std::chrono::milliseconds(0));
  if (!Find(project)) return absl::PermissionDeniedError("project " + project + " does not exist (deleted?)");
  // The project and the ones above it that have a quota, nearest first.
  std::vector<Def> limits;
  for (std::string p = project; !p.empty(); p = Parent(p)) {
    std::optional<Def> d = Find(p);
    if (d && HasQuota(d->quota)) limits.push_back(*std::move(d));
  }
  const Usage want{1, cpu_millis, memory_mb};
  std::unique_lock<std::mutex> l(usage_mu_);
  if (limits.empty()) {
    pending_[project] += want;
    return std::make_unique<Hold>(this, project, want, false);
  }
  const int64_t lease = lease_.load();
  if (lease == 0) return absl::UnavailableError("projects: this node is not registered in the cluster yet");
  const std::string guard = kUsagePrefix + limits.back().path + "/";
  const std::string mine = UsageKey(project);
  const auto deadline = std::chrono::steady_clock::now() + kAdmitBudget;
  std::minstd_rand rng(std::random_device{}());
  for (int attempt = 1;; ++attempt) {
    // This node's share: what its table holds for the project, the creates
    // admitted and still running, and this one.
    Usage next = ShareLocked(project);
    next += want;
    int64_t revision = 0;
    ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, etcd_->RangePrefix(guard, &revision));
    std::vector<EtcdKv> puts = {{mine, UsageJson(next), 0, lease}};
    const int64_t now = WallNowNs();
    for (const Def& d : limits) {
      const std::string under = kUsagePrefix + d.path + "/";
      Usage used = next;
      for (const EtcdKv& kv : kvs) {
        if (kv.key != mine && kv.key.rfind(under, 0) == 0 && !IsRateKey(kv.key)) used += ParseUsage(kv.value);
      }
      if (std::string why = Exceeds(d.quota, used); !why.empty()) {
        return absl::ResourceExhaustedError("project " + d.path + ": " + why +
                                            "; retry after one of its sandboxes is destroyed");
      }
      if (d.quota.creates_per_second() <= 0) continue;
      // GCRA: the theoretical arrival time (TAT) of the next create; this
      // one conforms when it is at most (burst - 1) intervals ahead of now.
      const std::string rate_key = under + kRateKey;
      int64_t tat = 0;
      for (const EtcdKv& kv : kvs) {
        if (kv.key == rate_key) (void)absl::SimpleAtoi(kv.value, &tat);
      }
      const int64_t interval = RateIntervalNs(d.quota);
      const int64_t from = std::max(tat, now);
      const int64_t ahead = from - now - (RateBurst(d.quota) - 1) * interval;
      if (ahead > 0) {
        return absl::ResourceExhaustedError("project " + d.path + ": quota of " +
                                            RateText(d.quota.creates_per_second()) + " creates per second (burst " +
                                            std::to_string(RateBurst(d.quota)) + ") reached; retry in " +
                                            std::to_string((ahead + 999999) / 1000000) + " ms");
      }
      puts.push_back({rate_key, std::to_string(from + interval), 0, 0});
    }
    ASSIGN_OR_RETURN(bool written, etcd_->PutIfUnchanged({{guard, true}}, revision, puts));
    if (written) {
      published_[project] = next;
      pending_[project] += want;
      return std::make_unique<Hold>(this, project, want, true);
    }
    if (attempt >= kMaxTries || std::chrono::steady_clock::now() > deadline) {
      return absl::UnavailableError("project " + project + ": quota busy (" + std::to_string(attempt) +
                                    " concurrent-create conflicts); retry");
    }
    // Another node's create won the race: back off a little and read again.
    l.unlock();
    std::uniform_int_distribution<int> wait(1, 1 << std::min(attempt, 5));
    std::this_thread::sleep_for(std::chrono::milliseconds(wait(rng)));
    l.lock();
  }
}

ProjectStore::Usage ProjectStore::ShareLocked(const std::string& project) {
  Usage u;
  for (const node::SandboxInfo& s : manager_->List({{api::kProjectLabel, project}}, "")) {
    u += Usage{1, s.resources.cpu_millis, s.resources.memory_mb};
  }
  if (auto it = pending_.find(project); it != pending_.end()) u += it->second;
  return u;
}

void ProjectStore::Release(const std::string& project, const Usage& u, bool published) {
  std::lock_guard<std::mutex> l(usage_mu_);
  auto it = pending_.find(project);
  if (it == pending_.end()) return;
  it->second -= u;
  if (it->second == Usage{}) pending_.erase(it);
  if (!published) return;
  // The usage key may now say more than this node holds: the create failed
  // (the router places it on another node, whose admission reads this key),
  // or a Reconcile or another Admit ran while the new sandbox was both in
  // the table and still held here. Brought down at once, not at the next
  // refresh, so a quota is never refused for a share nobody holds. Only
  // ever lowered here (raising is for admissions, under their guard).
  auto pub = published_.find(project);
  const int64_t lease = lease_.load();
  if (pub == published_.end() || lease == 0) return;
  const Usage now = ShareLocked(project);
  if (now == pub->second || now.sandboxes > pub->second.sandboxes || now.cpu_millis > pub->second.cpu_millis ||
      now.memory_mb > pub->second.memory_mb) {
    return;
  }
  Status s = now == Usage{} ? etcd_->Delete(UsageKey(project)) : etcd_->Put(UsageKey(project), UsageJson(now), lease);
  if (!s.ok()) {
    Log(spdlog::level::warn, "projects: lowering this node's usage after a create failed (the next refresh retries)",
        {{"project", project}, {"error", s.ToString()}});
    return;
  }
  if (now == Usage{}) {
    published_.erase(pub);
  } else {
    pub->second = now;
  }
}

void ProjectStore::Reconcile(int64_t lease) {
  lease_.store(lease);
  LoadIfStale(std::chrono::milliseconds(0));
  std::lock_guard<std::mutex> l(usage_mu_);
  std::map<std::string, Usage> now = TableUsage();
  for (const auto& [p, u] : pending_) now[p] += u;
  for (const auto& [p, u] : published_) now.try_emplace(p);
  bool all = true;
  for (const auto& [p, u] : now) {
    auto it = published_.find(p);
    if (it != published_.end() && it->second == u && lease == published_lease_) continue;
    Status s = u == Usage{} ? etcd_->Delete(UsageKey(p)) : etcd_->Put(UsageKey(p), UsageJson(u), lease);
    if (!s.ok()) {
      all = false;
      continue;
    }
    if (u == Usage{}) {
      published_.erase(p);
    } else {
      published_[p] = u;
    }
  }
  if (all) published_lease_ = lease;
}

StatusOr<std::map<std::string, ProjectStore::Usage>> ProjectStore::AllUsage(const std::vector<Def>& defs) {
  ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, etcd_->RangePrefix(kUsagePrefix));
  std::map<std::string, Usage> out;
  for (const Def& d : defs) {
    const std::string under = kUsagePrefix + d.path + "/";
    Usage& u = out[d.path];
    for (auto it = std::lower_bound(kvs.begin(), kvs.end(), under,
                                    [](const EtcdKv& kv, const std::string& k) { return kv.key < k; });
         it != kvs.end() && it->key.rfind(under, 0) == 0; ++it) {
      if (!IsRateKey(it->key)) u += ParseUsage(it->value);
    }
  }
  return out;
}

namespace {

v1::Project ToProto(const std::string& path, const v1::ProjectQuota& quota, int64_t created_ns,
                    const ProjectStore::Usage& u) {
  v1::Project p;
  p.set_path(path);
  *p.mutable_quota() = quota;
  p.set_created_ns(created_ns);
  p.mutable_usage()->set_sandboxes(static_cast<uint32_t>(u.sandboxes));
  p.mutable_usage()->set_cpu_millis(u.cpu_millis);
  p.mutable_usage()->set_memory_mb(u.memory_mb);
  return p;
}

}  // namespace

StatusOr<v1::CreateProjectResponse> ProjectStore::Create(const std::string& caller,
                                                         const v1::CreateProjectRequest& req) {
  const std::string& path = req.path();
  RETURN_IF_ERROR(CheckPath(path));
  const std::string parent = Parent(path);
  if (!caller.empty() && (parent.empty() || !api::InProject(caller, parent))) {
    return absl::PermissionDeniedError("project " + caller + " may create projects only below itself");
  }
  RETURN_IF_ERROR(Load());
  if (!parent.empty() && !Find(parent)) {
    return absl::NotFoundError("parent project " + parent + " does not exist");
  }
  // A project delegates part of its quota: no limit above an ancestor's.
  const v1::ProjectQuota& q = req.quota();
  if (std::string why = BadRate(q); !why.empty()) return absl::InvalidArgumentError("project " + path + ": " + why);
  RETURN_IF_ERROR(CheckAncestors(path, q));
  ASSIGN_OR_RETURN(std::string token, NewToken());
  const int64_t created = WallNowNs();
  nlohmann::json j = {
      {"path", path}, {"token_sha256", image::oci::Sha256Hex(token)}, {"quota", QuotaJson(q)}, {"created_ns", created}};
  ASSIGN_OR_RETURN(bool made,
                   etcd_->PutIfAbsent(kDefPrefix + path, j.dump(), parent.empty() ? "" : kDefPrefix + parent));
  if (!made) {
    RETURN_IF_ERROR(Load());
    if (Find(path)) return absl::AlreadyExistsError("project " + path + " already exists");
    return absl::NotFoundError("parent project " + parent + " does not exist");
  }
  (void)Load();
  Log(spdlog::level::info, "projects: created", {{"project", path}, {"by", caller.empty() ? "operator" : caller}});
  v1::CreateProjectResponse resp;
  *resp.mutable_project() = ToProto(path, q, created, Usage{});
  resp.set_token(token);
  return resp;
}

Status ProjectStore::CheckAncestors(const std::string& path, const v1::ProjectQuota& q) {
  for (std::string p = Parent(path); !p.empty(); p = Parent(p)) {
    std::optional<Def> d = Find(p);
    if (!d) continue;
    if (std::optional<Above> a = FirstAbove(q, d->quota)) {
      return absl::InvalidArgumentError("quota " + a->what + "=" + a->want + " is above project " + p + "'s " + a->cap);
    }
  }
  return absl::OkStatus();
}

StatusOr<v1::Project> ProjectStore::Update(const std::string& caller, const v1::UpdateProjectRequest& req) {
  const std::string& path = req.path();
  RETURN_IF_ERROR(CheckPath(path));
  // A project's limits are its parent's to set: a token never raises its own.
  if (!caller.empty() && (caller == path || !api::InProject(caller, path))) {
    return absl::PermissionDeniedError("project " + caller + " may update only projects below itself");
  }
  const v1::ProjectQuota& q = req.quota();
  if (std::string why = BadRate(q); !why.empty()) return absl::InvalidArgumentError("project " + path + ": " + why);
  RETURN_IF_ERROR(Load());
  if (!Find(path)) return absl::NotFoundError("project " + path + " does not exist");
  RETURN_IF_ERROR(CheckAncestors(path, q));
  // The projects below keep their own limits: the new ones must not fall
  // under them (lower those first).
  {
    std::lock_guard<std::mutex> l(cache_mu_);
    for (const auto& [p, d] : defs_) {
      if (p == path || !api::InProject(path, p)) continue;
      if (std::optional<Above> a = FirstAbove(d.quota, q)) {
        return absl::InvalidArgumentError("quota " + a->what + "=" + a->cap + " is below project " + p + "'s " +
                                          a->want + "; lower that first");
      }
    }
  }
  // Read-modify-write of the definition, guarded by its revision (and its
  // children's: a child made meanwhile was checked against the old quota;
  // not a sibling's whose name starts with this one's: team, team2).
  const std::string key = kDefPrefix + path;
  int64_t revision = 0;
  ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, etcd_->RangePrefix(key, &revision));
  auto it = std::find_if(kvs.begin(), kvs.end(), [&](const EtcdKv& kv) { return kv.key == key; });
  if (it == kvs.end()) return absl::NotFoundError("project " + path + " does not exist");
  nlohmann::json j = nlohmann::json::parse(it->value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::DataLossError("project " + path + ": its definition in etcd is not JSON");
  j["quota"] = QuotaJson(q);
  ASSIGN_OR_RETURN(bool written,
                   etcd_->PutIfUnchanged({{key, false}, {key + "/", true}}, revision, {{key, j.dump(), 0, 0}}));
  if (!written) return absl::AbortedError("project " + path + " changed while it was updated; retry");
  (void)Load();
  Log(spdlog::level::info, "projects: quota updated",
      {{"project", path}, {"by", caller.empty() ? "operator" : caller}});
  std::optional<Def> d = Find(path);
  if (!d) return absl::NotFoundError("project " + path + " does not exist");
  ASSIGN_OR_RETURN(auto usage, AllUsage({*d}));
  return ToProto(d->path, d->quota, d->created_ns, usage[d->path]);
}

StatusOr<v1::Project> ProjectStore::Get(const std::string& caller, const std::string& path) {
  RETURN_IF_ERROR(CheckPath(path));
  if (!api::InProject(caller, path)) {
    return absl::PermissionDeniedError("project " + path + " is not project " + caller + " or below it");
  }
  RETURN_IF_ERROR(Load());
  std::optional<Def> d = Find(path);
  if (!d) return absl::NotFoundError("project " + path + " does not exist");
  ASSIGN_OR_RETURN(auto usage, AllUsage({*d}));
  return ToProto(d->path, d->quota, d->created_ns, usage[d->path]);
}

StatusOr<std::vector<v1::Project>> ProjectStore::List(const std::string& caller) {
  RETURN_IF_ERROR(Load());
  std::vector<Def> defs;
  {
    std::lock_guard<std::mutex> l(cache_mu_);
    for (const auto& [path, d] : defs_) {
      if (api::InProject(caller, path)) defs.push_back(d);
    }
  }
  ASSIGN_OR_RETURN(auto usage, AllUsage(defs));
  std::vector<v1::Project> out;
  out.reserve(defs.size());
  for (const Def& d : defs) out.push_back(ToProto(d.path, d.quota, d.created_ns, usage[d.path]));
  return out;
}

Status ProjectStore::Delete(const std::string& caller, const std::string& path) {
  RETURN_IF_ERROR(CheckPath(path));
  if (!caller.empty() && (caller == path || !api::InProject(caller, path))) {
    return absl::PermissionDeniedError("project " + caller + " may delete only projects below itself");
  }
  RETURN_IF_ERROR(Load());
  if (!Find(path)) return absl::NotFoundError("project " + path + " does not exist");
  std::string below;
  {
    std::lock_guard<std::mutex> l(cache_mu_);
    for (const auto& [p, d] : defs_) {
      if (p != path && api::InProject(path, p)) below += (below.empty() ? "" : ", ") + p;
    }
  }
  if (!below.empty()) {
    return absl::FailedPreconditionError("project " + path + " has projects below it (" + below +
                                         "); delete those first");
  }
  RETURN_IF_ERROR(etcd_->Delete(kDefPrefix + path));
  (void)Load();
  Log(spdlog::level::info, "projects: deleted", {{"project", path}, {"by", caller.empty() ? "operator" : caller}});
  return absl::OkStatus();
}

}  // namespace warren::cluster
