#include "node/sandbox_manager.h"

#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <fstream>

#include "absl/strings/escaping.h"
#include "common/log.h"
#include "node/rollback.h"
#include "image/layer_tree.h"

namespace warren::node {

using image::CopyBudget;
using image::CopySolution;
using image::DiffCopyOptions;
using image::ListChanges;

namespace {

constexpr uint32_t kDefaultCpuMillis = 1000;
constexpr uint32_t kDefaultMemoryMb = 2048;
constexpr uint32_t kDefaultDiskMb = 1024;
constexpr uint32_t kDefaultPids = 1024;
constexpr uint32_t kDefaultOpenFiles = 1024;
constexpr uint32_t kDefaultTmpfsMb = 256;
constexpr uint64_t kMaxDiskMb = 1u << 20;  // 1 TiB
constexpr uint32_t kMaxPids = 4194304;
constexpr uint32_t kMinOpenFiles = 16;
constexpr uint32_t kMaxOpenFiles = 1048576;
constexpr size_t kMaxLabels = 64;
constexpr size_t kMaxEnvBytes = 1 << 20;
constexpr auto kCreateWaitBound = std::chrono::minutes(10);
// Longest a create waits in the admission queue when its request has no
// (earlier) deadline.
constexpr auto kMaxCreateQueueWait = std::chrono::minutes(5);

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Printable rendering of a user-supplied value for error messages.
std::string Quote(const std::string& s) {
  std::string v = s.size() > 80 ? s.substr(0, 80) + "..." : s;
  return "\"" + absl::CHexEscape(v) + "\"";
}

bool HasControl(const std::string& s) {
  return std::any_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

bool IsDigits(const std::string& s) {
  return !s.empty() && s.size() <= 10 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         std::stoull(s) <= 4294967294ull;
}

bool ValidHostname(const std::string& h) {
  if (h.empty() || h.size() > 63) return false;
  size_t start = 0;
  while (start <= h.size()) {
    size_t end = h.find('.', start);
    if (end == std::string::npos) end = h.size();
    std::string label = h.substr(start, end - start);
    if (label.empty() || label.front() == '-' || label.back() == '-') return false;
    for (char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
    start = end + 1;
  }
  return true;
}

bool ValidLabelKey(const std::string& k) {
  if (k.empty() || k.size() > 253) return false;
  return std::all_of(k.begin(), k.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
           c == '/';
  });
}

bool ValidNodeId(const std::string& n) {
  if (n.empty() || n.size() > 31) return false;
  if (!std::islower(static_cast<unsigned char>(n[0])) && !std::isdigit(static_cast<unsigned char>(n[0]))) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

bool ValidSandboxId(const std::string& id) {
  if (id.empty() || id.size() > 63 || id[0] == '-') return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

}  // namespace

bool ValidUser(const std::string& u) {
  if (u.empty() || u.size() > 32) return false;
  size_t colon = u.find(':');
  if (std::isdigit(static_cast<unsigned char>(u[0]))) {
    if (colon == std::string::npos) return IsDigits(u);
    return IsDigits(u.substr(0, colon)) && IsDigits(u.substr(colon + 1));
  }
  if (colon != std::string::npos) return false;
  if (!(std::islower(static_cast<unsigned char>(u[0])) || u[0] == '_')) return false;
  for (size_t i = 0; i < u.size(); ++i) {
    char c = u[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              (c == '$' && i + 1 == u.size());
    if (!ok) return false;
  }
  return true;
}

const char* SandboxStateName(SandboxState s) {
  switch (s) {
    case SandboxState::kCreating: return "creating";
    case SandboxState::kRunning: return "running";
    case SandboxState::kDestroying: return "destroying";
    case SandboxState::kPaused: return "paused";
    case SandboxState::kSuspended: return "suspended";
  }
  return "unknown";
}

struct SandboxManager::Entry {
  SandboxInfo info;  // info.state guarded by SandboxManager::mu_
  CreateRequest spec;
  std::string dir;
  runtime::Backend* backend = nullptr;
  std::vector<std::string> acquired;  // digests holding a mount reference
  std::shared_ptr<runtime::Sandbox> sandbox;
  nlohmann::json backend_record;
  bool destroy_running = false;  // guarded by mu_
  int inflight_execs = 0;        // guarded by mu_; an exec running is never idle
  std::mutex pause_mu;           // serializes Pause/Resume of this sandbox
  nlohmann::json transitions = nlohmann::json::array();
};

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
  std::map<std::string, std::unique_ptr<runtime::Backend>> by_name;
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

SandboxManager::SandboxManager(ManagerOptions options,
                               std::map<std::string, std::unique_ptr<runtime::Backend>> backends,
                               std::unique_ptr<LayerProvider> layers, RecordStore records)
    : options_(std::move(options)),
      backends_(std::move(backends)),
      layers_(std::move(layers)),
      records_(std::move(records)),
      started_at_ns_(NowNs()) {}

SandboxManager::~SandboxManager() {
  {
    std::lock_guard<std::mutex> l(sweep_mu_);
    stopping_ = true;
  }
  sweep_cv_.notify_all();
  if (sweep_thread_.joinable()) sweep_thread_.join();
  if (reap_thread_.joinable()) reap_thread_.join();
}

std::string SandboxManager::RunDir(const std::string& id) const {
  return options_.run_dir + "/run/" + id;
}

StatusOr<std::shared_ptr<SandboxManager::Entry>> SandboxManager::FindEntry(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = table_.find(id);
  if (it == table_.end()) return SandboxNotFound(id);
  return it->second;
}

std::string SandboxManager::NewId() {
  for (int attempt = 0; attempt < 16; ++attempt) {
    unsigned char buf[6];
    size_t got = 0;
    while (got < sizeof(buf)) {
      ssize_t n = getrandom(buf + got, sizeof(buf) - got, 0);
      if (n > 0) got += static_cast<size_t>(n);
    }
    std::string id = options_.node_id + "-" +
                     absl::BytesToHexString(std::string(reinterpret_cast<char*>(buf), sizeof(buf)));
    std::lock_guard<std::mutex> l(mu_);
    if (!table_.count(id)) return id;
  }
  return {};
}

StatusOr<CreateRequest> SandboxManager::Normalize(const CreateRequest& in) const {
  CreateRequest r = in;
  const NodeLimits& lim = options_.limits;
  if (r.backend.empty()) r.backend = "container";
  if (!backends_.count(r.backend)) {
    std::string names;
    for (const auto& [n, b] : backends_) names += (names.empty() ? "" : ", ") + n;
    return absl::InvalidArgumentError("backend " + Quote(r.backend) +
                                      " is not available on this node (available: " + names + ")");
  }
  if (r.layers.empty()) {
    return absl::InvalidArgumentError("layers: at least one layer is required");
  }
  for (size_t i = 0; i < r.layers.size(); ++i) {
    if (r.layers[i].empty() || HasControl(r.layers[i]) || r.layers[i].size() > 512) {
      return absl::InvalidArgumentError("layers[" + std::to_string(i) + "]=" + Quote(r.layers[i]) +
                                        " is not a layer reference");
    }
  }
  runtime::Resources& res = r.resources;
  if (res.cpu_millis == 0) res.cpu_millis = kDefaultCpuMillis;
  if (res.memory_mb == 0) res.memory_mb = kDefaultMemoryMb;
  if (res.disk_mb == 0) res.disk_mb = kDefaultDiskMb;
  if (res.pids == 0) res.pids = kDefaultPids;
  if (res.open_files == 0) res.open_files = kDefaultOpenFiles;
  if (res.tmpfs_mb == 0) res.tmpfs_mb = kDefaultTmpfsMb;
  // Defaults may exceed a small host; clamp defaults only, never explicit asks.
  if (in.resources.cpu_millis == 0) res.cpu_millis = std::min<uint32_t>(res.cpu_millis, 1000 * lim.cpus);
  if (in.resources.memory_mb == 0) res.memory_mb = static_cast<uint32_t>(std::min<uint64_t>(res.memory_mb, lim.memory_mb));
  if (in.resources.disk_mb == 0) res.disk_mb = static_cast<uint32_t>(std::min<uint64_t>(res.disk_mb, lim.memory_mb));
  if (in.resources.tmpfs_mb == 0) res.tmpfs_mb = static_cast<uint32_t>(std::min<uint64_t>(res.tmpfs_mb, lim.memory_mb));
  if (res.cpu_millis > 1000ull * lim.cpus) {
    return absl::InvalidArgumentError(
        "resources.cpu_millis=" + std::to_string(res.cpu_millis) + " exceeds this node's " +
        std::to_string(1000ull * lim.cpus) + " (" + std::to_string(lim.cpus) + " cpus)");
  }
  if (res.memory_mb > lim.memory_mb) {
    return absl::InvalidArgumentError("resources.memory_mb=" + std::to_string(res.memory_mb) +
                                      " exceeds this node's memory of " +
                                      std::to_string(lim.memory_mb) + " MiB");
  }
  // The upper layer lives in memory (tmpfs): bounded by RAM and by 1 TiB.
  uint64_t disk_max = std::min<uint64_t>(kMaxDiskMb, lim.memory_mb);
  if (res.disk_mb > disk_max) {
    return absl::InvalidArgumentError("resources.disk_mb=" + std::to_string(res.disk_mb) +
                                      " exceeds the maximum of " + std::to_string(disk_max) +
                                      " MiB on this node");
  }
  if (res.tmpfs_mb > lim.memory_mb) {
    return absl::InvalidArgumentError("resources.tmpfs_mb=" + std::to_string(res.tmpfs_mb) +
                                      " exceeds this node's memory of " +
                                      std::to_string(lim.memory_mb) + " MiB");
  }
  if (res.pids < 1 || res.pids > kMaxPids) {
    return absl::InvalidArgumentError("resources.pids=" + std::to_string(res.pids) +
                                      " is outside [1, " + std::to_string(kMaxPids) + "]");
  }
  if (res.open_files < kMinOpenFiles || res.open_files > kMaxOpenFiles) {
    return absl::InvalidArgumentError("resources.open_files=" + std::to_string(res.open_files) +
                                      " is outside [" + std::to_string(kMinOpenFiles) + ", " +
                                      std::to_string(kMaxOpenFiles) + "]");
  }
  size_t env_bytes = 0;
  for (const auto& [k, v] : r.env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError("env key " + Quote(k) +
                                        " must be non-empty without '=' or NUL");
    }
    if (v.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError("env[" + Quote(k) + "] value contains NUL");
    }
    env_bytes += k.size() + v.size() + 2;
  }
  if (env_bytes > kMaxEnvBytes) {
    return absl::InvalidArgumentError("env: " + std::to_string(env_bytes) +
                                      " bytes exceeds the limit of 1 MiB");
  }
  if (r.workdir.empty()) r.workdir = "/";
  if (r.workdir[0] != '/' || r.workdir.find('\0') != std::string::npos || r.workdir.size() > 4096) {
    return absl::InvalidArgumentError("workdir=" + Quote(r.workdir) + " must be an absolute path");
  }
  if (r.user.empty()) r.user = "root";
  if (!ValidUser(r.user)) {
    return absl::InvalidArgumentError("user=" + Quote(r.user) +
                                      " must be \"root\", a user name or \"uid[:gid]\"");
  }
  if (!r.hostname.empty() && !ValidHostname(r.hostname)) {
    return absl::InvalidArgumentError("hostname=" + Quote(r.hostname) +
                                      " is not a valid host name (letters, digits, '-', '.'; "
                                      "at most 63 characters)");
  }
  if (r.labels.size() > kMaxLabels) {
    return absl::InvalidArgumentError("labels: " + std::to_string(r.labels.size()) +
                                      " labels exceed the maximum of " + std::to_string(kMaxLabels));
  }
  for (const auto& [k, v] : r.labels) {
    if (!ValidLabelKey(k)) {
      return absl::InvalidArgumentError("label key " + Quote(k) +
                                        " must be 1-253 characters of [A-Za-z0-9._/-]");
    }
    if (v.size() > 1024 || HasControl(v)) {
      return absl::InvalidArgumentError("labels[" + Quote(k) + "]=" + Quote(v) +
                                        " must be at most 1024 bytes without control characters");
    }
  }
  if (r.job.size() > 253 || HasControl(r.job)) {
    return absl::InvalidArgumentError("job=" + Quote(r.job) +
                                      " must be at most 253 bytes without control characters");
  }
  return r;
}

nlohmann::json SandboxManager::MakeRecord(const Entry& e, SandboxState state) const {
  nlohmann::json env = nlohmann::json::object();
  for (const auto& [k, v] : e.spec.env) env[absl::Base64Escape(k)] = absl::Base64Escape(v);
  const runtime::Resources& r = e.info.resources;
  nlohmann::json j = {
      {"version", 1},
      {"id", e.info.id},
      // A paused (suspended) sandbox is persisted as "running" + "paused"
      // (+ "suspended"): older daemons adopt it as running / paused.
      {"state", SandboxStateName(state == SandboxState::kPaused || state == SandboxState::kSuspended
                                     ? SandboxState::kRunning
                                     : state)},
      {"paused", state == SandboxState::kPaused || state == SandboxState::kSuspended},
      {"suspended", state == SandboxState::kSuspended},
      {"expires_at_ns", e.info.expires_at_ns},
      {"idle_timeout_s", e.info.idle_timeout_s},
      {"backend", e.info.backend},
      {"dir", e.dir},
      {"layers", e.info.layer_digests},
      {"layer_names", e.info.layer_names},
      {"pristine_layers", e.info.pristine_layers},
      {"resources",
       {{"cpu_millis", r.cpu_millis}, {"memory_mb", r.memory_mb}, {"disk_mb", r.disk_mb},
        {"pids", r.pids}, {"open_files", r.open_files}, {"tmpfs_mb", r.tmpfs_mb}}},
      {"env_b64", env},
      {"workdir", e.spec.workdir},
      {"user", e.spec.user},
      {"hostname", e.info.hostname},
      {"labels", e.info.labels},
      {"job", e.info.job},
      {"ttl_s", e.info.ttl_s},
      {"created_at_ns", e.info.created_at_ns},
      {"backend_record", e.backend_record},
      {"request_id", e.spec.request_id},
      {"transitions", e.transitions},
  };
  return j;
}

SandboxInfo SandboxManager::InfoOf(const Entry& e) const {
  SandboxInfo i = e.info;
  if (e.sandbox != nullptr) i.init_pid = e.sandbox->init_pid();
  return i;
}

namespace {
void AddTransition(nlohmann::json& transitions, SandboxState s, const std::string& reason) {
  transitions.push_back({{"state", SandboxStateName(s)}, {"at_ns", NowNs()}, {"reason", reason}});
}
}  // namespace

// Admission: at most max_creates_in_flight creates run; later ones wait in a
// FIFO queue (tickets, served strictly in order) of at most max_create_queue,
// each until its deadline (bounded by kMaxCreateQueueWait) or until its client
// cancels. Refused at once only when the queue is full or the table is.
Status SandboxManager::AdmitCreate(const CreateRequest& request) {
  const NodeLimits& lim = options_.limits;
  const uint32_t max_queue = lim.max_create_queue == 0 ? 1024 : lim.max_create_queue;
  std::unique_lock<std::mutex> l(mu_);
  auto table_full = [&]() -> Status {
    return absl::ResourceExhaustedError("node full: " + std::to_string(table_.size()) + " sandboxes (max " +
                                        std::to_string(lim.max_sandboxes) + "), retry later or on another node");
  };
  if (table_.size() >= lim.max_sandboxes) return table_full();
  if (creates_in_flight_ < lim.max_creates_in_flight && create_queue_.empty()) {
    ++creates_in_flight_;
    return absl::OkStatus();
  }
  if (create_queue_.size() >= max_queue) {
    return absl::ResourceExhaustedError("node busy: " + std::to_string(creates_in_flight_) +
                                        " creates in flight (--max-creates-in-flight=" +
                                        std::to_string(lim.max_creates_in_flight) + ") and the create queue is full (" +
                                        std::to_string(create_queue_.size()) + " waiting, --max-create-queue=" +
                                        std::to_string(max_queue) + "), retry");
  }
  CreateWaiter me;
  const auto pos = create_queue_.insert(create_queue_.end(), &me);
  const auto start = std::chrono::steady_clock::now();
  const auto until = std::min(request.deadline, start + kMaxCreateQueueWait);
  Status result;
  for (;;) {
    if (create_queue_.front() == &me && creates_in_flight_ < lim.max_creates_in_flight) break;
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) {
      result = absl::DeadlineExceededError(
          "create waited " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count()) +
          " ms in the create queue (" + std::to_string(creates_in_flight_) + " creates in flight, max " +
          std::to_string(lim.max_creates_in_flight) + ") and reached its deadline");
      break;
    }
    // Woken when this waiter reaches the head with a slot free; the 100 ms
    // slice serves the deadline and `cancelled` only. `cancelled` is asked
    // once per slice, never per wake-up: gRPC's IsCancelled polls the
    // completion queue (a timed wait), costly when dozens are queued.
    if (me.cv.wait_until(l, std::min(until, now + std::chrono::milliseconds(100))) == std::cv_status::timeout &&
        request.cancelled) {
      l.unlock();
      const bool gone = request.cancelled();
      l.lock();
      if (gone) {
        result = absl::CancelledError("create cancelled by the client while queued");
        break;
      }
    }
  }
  create_queue_.erase(pos);
  if (result.ok()) {
    if (table_.size() >= lim.max_sandboxes) {
      result = table_full();
    } else {
      ++creates_in_flight_;
    }
  }
  // The next waiter may now be at the head (or may take the slot this one
  // left when it gave up).
  if (!create_queue_.empty() && creates_in_flight_ < lim.max_creates_in_flight) create_queue_.front()->cv.notify_one();
  return result;
}

void SandboxManager::ReleaseCreateSlotLocked() {
  --creates_in_flight_;
  if (!create_queue_.empty()) create_queue_.front()->cv.notify_one();
}

struct SandboxManager::CreateKey {
  bool done = false;       // the create finished (made `sandbox_id`, or failed and was forgotten)
  bool abandoned = false;  // its client gave up: destroy what it makes, refuse the key
  std::string sandbox_id;
};

void SandboxManager::RememberCreateKeyLocked(const std::string& key, std::shared_ptr<CreateKey> k) {
  if (create_keys_.emplace(key, std::move(k)).second) create_key_order_.push_back(key);
  // Oldest first; a key whose create still runs is kept (and with it the
  // ones after it: the bound is exceeded only while that many creates run).
  while (create_key_order_.size() > kMaxCreateKeys) {
    auto it = create_keys_.find(create_key_order_.front());
    if (it != create_keys_.end() && !it->second->done) break;
    if (it != create_keys_.end()) create_keys_.erase(it);
    create_key_order_.pop_front();
  }
}

StatusOr<SandboxInfo> SandboxManager::Create(const CreateRequest& request) {
  const std::string& key = request.request_id;
  if (key.empty()) return CreateOnce(request);
  if (key.size() > 256 || HasControl(key)) {
    return absl::InvalidArgumentError("request_id=" + Quote(key) +
                                      " must be at most 256 bytes without control characters");
  }
  std::shared_ptr<CreateKey> mine;
  {
    std::unique_lock<std::mutex> l(create_keys_mu_);
    for (;;) {
      auto it = create_keys_.find(key);
      if (it == create_keys_.end()) break;
      std::shared_ptr<CreateKey> k = it->second;
      if (k->abandoned) return absl::CancelledError("create request " + Quote(key) + " was abandoned by its client");
      if (k->done) {
        StatusOr<SandboxInfo> info = Get(k->sandbox_id);
        // The retry of a create that made it; destroyed (or being destroyed,
        // e.g. because that first call's client gave up) since: the key
        // makes a new one.
        if (info.ok() && info->state != SandboxState::kDestroying) return info;
        create_keys_.erase(it);
        break;
      }
      // A duplicate of a create in progress waits for it, until its own
      // deadline (bounded by the create queue's bound).
      const auto until = std::min(request.deadline, std::chrono::steady_clock::now() + kMaxCreateQueueWait);
      if (!create_keys_cv_.wait_until(l, until, [&] { return k->done || k->abandoned; })) {
        return absl::DeadlineExceededError("create request " + Quote(key) +
                                           " is still being made by an earlier call; reached this call's deadline");
      }
    }
    mine = std::make_shared<CreateKey>();
    RememberCreateKeyLocked(key, mine);
  }
  StatusOr<SandboxInfo> info = CreateOnce(request);
  bool abandoned;
  {
    std::lock_guard<std::mutex> l(create_keys_mu_);
    abandoned = mine->abandoned;
    mine->done = true;
    if (info.ok()) {
      mine->sandbox_id = info->id;
    } else if (!abandoned) {
      // Not recorded: a retry runs again.
      auto it = create_keys_.find(key);
      if (it != create_keys_.end() && it->second == mine) create_keys_.erase(it);
    }
  }
  create_keys_cv_.notify_all();
  if (abandoned && info.ok()) {
    Status ds = Destroy(info->id);
    Log(spdlog::level::info, "create abandoned by its client; sandbox destroyed",
        {{"sandbox", info->id}, {"request_id", key}, {"destroy", ds.ToString()}});
    return absl::CancelledError("create request " + Quote(key) + " was abandoned by its client");
  }
  return info;
}

Status SandboxManager::AbandonCreate(const std::string& key) {
  if (key.empty() || key.size() > 256 || HasControl(key)) {
    return absl::InvalidArgumentError("create_request_id=" + Quote(key) +
                                      " must be 1-256 bytes without control characters");
  }
  std::string made;
  {
    std::lock_guard<std::mutex> l(create_keys_mu_);
    auto it = create_keys_.find(key);
    if (it == create_keys_.end()) {
      // Nothing made (yet): a tombstone, for a create still on its way.
      auto k = std::make_shared<CreateKey>();
      k->done = true;
      k->abandoned = true;
      RememberCreateKeyLocked(key, std::move(k));
      return absl::OkStatus();
    }
    std::shared_ptr<CreateKey> k = it->second;
    if (k->abandoned) return absl::OkStatus();
    k->abandoned = true;
    if (!k->done) return absl::OkStatus();  // the create destroys it when it finishes
    made = k->sandbox_id;
  }
  create_keys_cv_.notify_all();
  if (made.empty()) return absl::OkStatus();
  Status ds = DestroyWithReason(made, "create abandoned by its client");
  if (ds.code() == absl::StatusCode::kNotFound) return absl::OkStatus();
  return ds;
}

StatusOr<SandboxInfo> SandboxManager::CreateOnce(const CreateRequest& request) {
  ASSIGN_OR_RETURN(CreateRequest spec, Normalize(request));
  Rollback rollback;
  RETURN_IF_ERROR(AdmitCreate(spec));
  rollback.Add([this] {
    std::lock_guard<std::mutex> l(mu_);
    ReleaseCreateSlotLocked();
  });
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
  e->info.labels = spec.labels;
  e->info.job = spec.job;
  e->info.created_at_ns = NowNs();
  e->info.hostname = spec.hostname.empty() ? id : spec.hostname;
  e->info.ttl_s = spec.ttl_s;
  e->info.expires_at_ns = spec.ttl_s > 0 ? e->info.created_at_ns + int64_t{spec.ttl_s} * 1000000000 : 0;
  e->info.idle_timeout_s = spec.idle_timeout_s;
  e->info.last_activity_ns = e->info.created_at_ns;
  AddTransition(e->transitions, SandboxState::kCreating, "create requested");

  {
    std::shared_lock<std::shared_mutex> layer_lock(layer_mu_);
    bool pristine_done = false;  // a layer from a sandbox ends the pristine ones
    for (size_t i = 0; i < spec.layers.size(); ++i) {
      StatusOr<image::LayerInfo> li = layers_->Resolve(spec.layers[i]);
      if (!li.ok()) {
        Status s = li.status();
        return Status(s.code(), "layers[" + std::to_string(i) + "]=" + Quote(spec.layers[i]) +
                                    ": " + std::string(s.message()));
      }
      e->info.layer_digests.push_back(li->digest);
      if (li->from_sandbox) pristine_done = true;
      if (!pristine_done) e->info.pristine_layers.push_back(li->digest);
    }
    std::lock_guard<std::mutex> l(mu_);
    table_[id] = e;
  }
  rollback.Add([this, id] {
    std::lock_guard<std::mutex> l(mu_);
    table_.erase(id);
    cv_.notify_all();
  });

  e->backend_record = {{"id", id}, {"dir", e->dir}};
  RETURN_IF_ERROR(records_.Put(id, MakeRecord(*e, SandboxState::kCreating)));
  rollback.Add([this, id] {
    Status s = records_.Remove(id);
    if (!s.ok()) Log(spdlog::level::err, "rollback: removing record failed", {{"sandbox", id}, {"error", s.ToString()}});
  });

  if (::mkdir(e->dir.c_str(), 0700) != 0) {
    Status s = ErrnoToStatus(errno, "mkdir(" + e->dir + ")");
    if (StatusErrno(s) == ENOSPC) {
      return absl::ResourceExhaustedError("run dir " + options_.run_dir + " is full: " +
                                          std::string(s.message()));
    }
    return s;
  }
  rollback.Add([this, e] {
    Status s = RemoveTree(e->dir);
    if (!s.ok()) Log(spdlog::level::err, "rollback: removing dir failed", {{"sandbox", e->info.id}, {"error", s.ToString()}});
  });

  runtime::SandboxSpec bspec;
  bspec.id = id;
  bspec.dir = e->dir;
  for (const std::string& digest : e->info.layer_digests) {
    StatusOr<std::string> path = layers_->Acquire(digest);
    if (!path.ok()) {
      return Status(path.status().code(), "mounting layer " + digest + ": " +
                                              std::string(path.status().message()));
    }
    e->acquired.push_back(digest);
    rollback.Add([this, digest] { layers_->Release(digest); });
    bspec.lower_dirs.push_back(*path);
  }
  bspec.resources = spec.resources;
  bspec.env = spec.env;
  bspec.workdir = spec.workdir;
  bspec.user = spec.user;
  bspec.hostname = e->info.hostname;

  // Cleanup is idempotent and covers a backend that broke its "nothing left
  // behind" promise; it runs before the dir removal registered above.
  rollback.Add([this, e] {
    Status s = e->backend->Cleanup(e->backend_record);
    if (!s.ok()) Log(spdlog::level::err, "rollback: backend cleanup failed", {{"sandbox", e->info.id}, {"error", s.ToString()}});
  });
  StatusOr<std::unique_ptr<runtime::Sandbox>> sb = e->backend->Create(bspec);
  if (!sb.ok()) {
    Log(spdlog::level::warn, "create failed", {{"sandbox", id}, {"step", "backend"}, {"error", sb.status().ToString()}});
    return sb.status();
  }
  e->sandbox = std::shared_ptr<runtime::Sandbox>(std::move(*sb));
  rollback.Add([this, e] {
    Status s = e->sandbox->Destroy();
    if (!s.ok()) Log(spdlog::level::err, "rollback: destroy failed", {{"sandbox", e->info.id}, {"error", s.ToString()}});
  });
  e->backend_record = e->sandbox->Record();
  if (!e->backend_record.is_object()) e->backend_record = nlohmann::json::object();
  e->backend_record["id"] = id;
  e->backend_record["dir"] = e->dir;
  AddTransition(e->transitions, SandboxState::kRunning, "created");
  Status st = records_.Put(id, MakeRecord(*e, SandboxState::kRunning));
  if (!st.ok()) {
    Log(spdlog::level::warn, "create failed", {{"sandbox", id}, {"step", "persist"}, {"error", st.ToString()}});
    return st;
  }

  rollback.Commit();
  SandboxInfo info;
  {
    std::lock_guard<std::mutex> l(mu_);
    ReleaseCreateSlotLocked();
    e->info.state = SandboxState::kRunning;
    info = InfoOf(*e);
  }
  cv_.notify_all();
  Log(spdlog::level::info, "sandbox running", {{"sandbox", id}, {"reason", "created"}, {"backend", spec.backend}});
  return info;
}

Status SandboxManager::Destroy(const std::string& id) {
  return DestroyWithReason(id, "destroy requested");
}

Status SandboxManager::DestroyWithReason(const std::string& id, const std::string& reason) {
  std::shared_ptr<Entry> e;
  {
    std::unique_lock<std::mutex> l(mu_);
    auto it = table_.find(id);
    if (it == table_.end()) return SandboxNotFound(id);
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
  AddTransition(e->transitions, SandboxState::kDestroying, reason);
  Status s = records_.Put(id, MakeRecord(*e, SandboxState::kDestroying));
  if (!s.ok()) {
    Log(spdlog::level::warn, "persisting destroying state failed", {{"sandbox", id}, {"error", s.ToString()}});
  }
  Log(spdlog::level::info, "sandbox destroying", {{"sandbox", id}, {"reason", reason}});
  s = e->sandbox->Destroy();
  if (!s.ok()) {
    Log(spdlog::level::err, "destroy failed", {{"sandbox", id}, {"error", s.ToString()}});
    {
      std::lock_guard<std::mutex> l(mu_);
      e->destroy_running = false;
    }
    cv_.notify_all();
    return s;
  }
  processes_->DropSandbox(id);  // they died with the sandbox: stop their pumps
  for (const std::string& d : e->acquired) layers_->Release(d);
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
  {
    std::lock_guard<std::mutex> l(calls_mu_);
    calls_.erase(id);
    call_order_.erase(id);
  }
  calls_cv_.notify_all();
  {
    std::lock_guard<std::mutex> l(audit_mu_);
    (void)::unlink(AuditPath(id).c_str());
  }
  RememberGone(id, reason);
  Log(spdlog::level::info, "sandbox destroyed", {{"sandbox", id}, {"reason", reason}});
  return absl::OkStatus();
}

void SandboxManager::RememberGone(const std::string& id, const std::string& reason) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::lock_guard<std::mutex> l(gone_mu_);
  if (gone_order_.size() < kGoneRemembered) {
    gone_order_.push_back(id);
  } else {
    gone_.erase(gone_order_[gone_next_]);
    gone_order_[gone_next_] = id;
    gone_next_ = (gone_next_ + 1) % kGoneRemembered;
  }
  gone_[id] = std::string("destroyed at ") + when + " (" + reason + ")";
}

Status SandboxManager::SandboxNotFound(const std::string& id) const {
  std::lock_guard<std::mutex> l(gone_mu_);
  auto it = gone_.find(id);
  if (it == gone_.end()) return absl::NotFoundError("sandbox " + Quote(id) + " not found");
  return absl::NotFoundError("sandbox " + Quote(id) + " not found: " + it->second);
}

StatusOr<SandboxInfo> SandboxManager::Get(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = table_.find(id);
  if (it == table_.end()) return SandboxNotFound(id);
  return InfoOf(*it->second);
}

std::vector<SandboxInfo> SandboxManager::List(const std::map<std::string, std::string>& labels,
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

StatusOr<std::shared_ptr<runtime::Sandbox>> SandboxManager::Running(const std::string& id) const {
  bool paused = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = table_.find(id);
    if (it == table_.end()) return SandboxNotFound(id);
    paused = it->second->info.state == SandboxState::kPaused ||
             it->second->info.state == SandboxState::kSuspended;
    if (!paused && it->second->info.state != SandboxState::kRunning) {
      return absl::FailedPreconditionError("sandbox " + id + " is " +
                                           SandboxStateName(it->second->info.state));
    }
    it->second->info.last_activity_ns = NowNs();
    if (!paused) return it->second->sandbox;
  }
  // Any call on a paused or suspended sandbox resumes it.
  RETURN_IF_ERROR(const_cast<SandboxManager*>(this)->Resume(id));
  std::lock_guard<std::mutex> l(mu_);
  auto it = table_.find(id);
  if (it == table_.end()) return SandboxNotFound(id);
  if (it->second->info.state != SandboxState::kRunning) {
    return absl::FailedPreconditionError("sandbox " + id + " is " +
                                         SandboxStateName(it->second->info.state));
  }
  return it->second->sandbox;
}

void SandboxManager::Touch(const std::string& id, int delta_inflight) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = table_.find(id);
  if (it == table_.end()) return;
  it->second->inflight_execs += delta_inflight;
  it->second->info.last_activity_ns = NowNs();
}

StatusOr<runtime::ExecOutcome> SandboxManager::Exec(const std::string& id,
                                                    const runtime::ExecSpec& spec) {
  return Exec(id, spec, "");
}

StatusOr<runtime::ExecOutcome> SandboxManager::Exec(const std::string& id, const runtime::ExecSpec& spec,
                                                    const std::string& request_id) {
  bool ran = false;
  const int64_t start = NowNs();
  StatusOr<RecordedCall> rc = Idempotent(id, request_id, [&]() -> StatusOr<RecordedCall> {
    ran = true;
    ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, Running(id));
    Touch(id, +1);
    StatusOr<runtime::ExecOutcome> out = sb->Exec(spec);
    Touch(id, -1);
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

uint32_t SandboxManager::LayerUsers(const std::string& digest) const {
  std::lock_guard<std::mutex> l(mu_);
  uint32_t n = 0;
  for (const auto& [id, e] : table_) {
    const auto& d = e->info.layer_digests;
    if (std::find(d.begin(), d.end(), digest) != d.end()) ++n;
  }
  return n;
}

Status SandboxManager::RemoveLayer(const std::string& ref) {
  std::unique_lock<std::shared_mutex> layer_lock(layer_mu_);
  ASSIGN_OR_RETURN(image::LayerInfo info, layers_->Resolve(ref));
  uint32_t users = LayerUsers(info.digest);
  if (users > 0) {
    return absl::FailedPreconditionError("layer " + ref + " (" + info.digest + ") is in use by " +
                                         std::to_string(users) + " sandbox(es)");
  }
  RETURN_IF_ERROR(layers_->Remove(ref));
  Log(spdlog::level::info, "layer removed", {{"layer", ref}, {"digest", info.digest}});
  return absl::OkStatus();
}

std::vector<std::string> SandboxManager::BackendNames() const {
  std::vector<std::string> out;
  for (const auto& [n, b] : backends_) out.push_back(n);
  return out;
}

NodeCounters SandboxManager::Counters() const {
  std::lock_guard<std::mutex> l(mu_);
  NodeCounters c;
  c.sandboxes = static_cast<uint32_t>(table_.size());
  c.creates_in_flight = creates_in_flight_;
  c.creates_queued = static_cast<uint32_t>(create_queue_.size());
  c.started_at_ns = started_at_ns_;
  c.cpus = options_.limits.cpus;
  c.memory_mb = options_.limits.memory_mb;
  return c;
}

// ---------------------------------------------------------------- restart

void SandboxManager::CleanupRecord(const std::string& id, const nlohmann::json& record,
                                   const std::string& reason) {
  nlohmann::json brec = record.contains("backend_record") && record["backend_record"].is_object()
                            ? record["backend_record"]
                            : nlohmann::json::object();
  brec["id"] = id;
  brec["dir"] = RunDir(id);
  std::vector<runtime::Backend*> targets;
  std::string bname = record.value("backend", std::string());
  if (backends_.count(bname)) {
    targets.push_back(backends_.at(bname).get());
  } else {
    for (const auto& [n, b] : backends_) targets.push_back(b.get());  // unknown: try all
  }
  for (runtime::Backend* b : targets) {
    Status s = b->Cleanup(brec);
    if (!s.ok()) {
      Log(spdlog::level::err, "cleanup failed; record kept for the next start",
          {{"sandbox", id}, {"reason", reason}, {"error", s.ToString()}});
      return;
    }
  }
  Status s = RemoveTree(RunDir(id));
  if (!s.ok()) {
    Log(spdlog::level::err, "removing sandbox dir failed; record kept",
        {{"sandbox", id}, {"error", s.ToString()}});
    return;
  }
  s = records_.Remove(id);
  if (!s.ok()) Log(spdlog::level::err, "removing record failed", {{"sandbox", id}, {"error", s.ToString()}});
  (void)::unlink(AuditPath(id).c_str());
  Log(spdlog::level::info, "sandbox cleaned up", {{"sandbox", id}, {"reason", reason}});
}

void SandboxManager::RecoverOne(const std::string& id, const nlohmann::json& rec) {
  std::string state = rec.value("state", std::string());
  if (rec.value("id", std::string()) != id) {
    CleanupRecord(id, rec, "record id does not match its file name");
    return;
  }
  if (state != "running") {
    CleanupRecord(id, rec, "found in state '" + state + "' at start: half-created or half-destroyed");
    return;
  }
  std::string bname = rec.value("backend", std::string());
  auto bit = backends_.find(bname);
  if (bit == backends_.end()) {
    Log(spdlog::level::err, "record names an unavailable backend; left in place",
        {{"sandbox", id}, {"backend", bname}});
    return;
  }
  auto e = std::make_shared<Entry>();
  try {
    e->backend = bit->second.get();
    e->dir = RunDir(id);
    e->info.id = id;
    e->info.backend = bname;
    e->info.state = SandboxState::kRunning;
    e->info.layer_digests = rec.at("layers").get<std::vector<std::string>>();
    e->info.layer_names = rec.value("layer_names", std::vector<std::string>());
    if (rec.contains("pristine_layers")) {
      e->info.pristine_layers = rec.at("pristine_layers").get<std::vector<std::string>>();
    } else {  // a record of an older daemon: the same rule as Create
      for (const std::string& d : e->info.layer_digests) {
        StatusOr<image::LayerInfo> li = layers_->Resolve(d);
        if (!li.ok() || li->from_sandbox) break;
        e->info.pristine_layers.push_back(d);
      }
    }
    const auto& r = rec.at("resources");
    e->info.resources = runtime::Resources{r.at("cpu_millis").get<uint32_t>(), r.at("memory_mb").get<uint32_t>(),
                                           r.at("disk_mb").get<uint32_t>(), r.at("pids").get<uint32_t>(),
                                           r.at("open_files").get<uint32_t>(), r.at("tmpfs_mb").get<uint32_t>()};
    e->info.labels = rec.value("labels", std::map<std::string, std::string>());
    e->info.job = rec.value("job", std::string());
    e->info.hostname = rec.value("hostname", std::string());
    e->info.ttl_s = rec.value("ttl_s", 0u);
    e->info.created_at_ns = rec.value("created_at_ns", int64_t{0});
    e->info.expires_at_ns = rec.value("expires_at_ns", int64_t{0});
    e->info.idle_timeout_s = rec.value("idle_timeout_s", 0u);
    e->info.last_activity_ns = NowNs();  // idle time restarts with the daemon
    if (rec.value("paused", false)) e->info.state = SandboxState::kPaused;
    if (rec.value("suspended", false)) e->info.state = SandboxState::kSuspended;
    e->spec.backend = bname;
    e->spec.layers = e->info.layer_names;
    e->spec.resources = e->info.resources;
    e->spec.workdir = rec.value("workdir", std::string("/"));
    e->spec.user = rec.value("user", std::string("root"));
    e->spec.hostname = e->info.hostname;
    e->spec.labels = e->info.labels;
    e->spec.job = e->info.job;
    e->spec.ttl_s = e->info.ttl_s;
    e->spec.idle_timeout_s = e->info.idle_timeout_s;
    if (rec.contains("env_b64") && rec["env_b64"].is_object()) {
      const nlohmann::json& env = rec["env_b64"];
      for (auto it = env.begin(); it != env.end(); ++it) {
        std::string key, val;
        if (absl::Base64Unescape(it.key(), &key) &&
            absl::Base64Unescape(it.value().get<std::string>(), &val)) {
          e->spec.env[key] = val;
        }
      }
    }
    e->backend_record = rec.value("backend_record", nlohmann::json::object());
    e->transitions = rec.value("transitions", nlohmann::json::array());
    e->spec.request_id = rec.value("request_id", std::string());
  } catch (const std::exception& ex) {
    CleanupRecord(id, rec, std::string("malformed record: ") + ex.what());
    return;
  }
  StatusOr<std::unique_ptr<runtime::Sandbox>> sb = e->backend->Adopt(e->backend_record);
  if (!sb.ok()) {
    CleanupRecord(id, rec, "backend could not adopt it: " + sb.status().ToString());
    return;
  }
  e->sandbox = std::shared_ptr<runtime::Sandbox>(std::move(*sb));
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
    StatusOr<std::string> p = layers_->Acquire(d);
    if (!p.ok()) {
      Log(spdlog::level::warn, "re-acquiring layer of adopted sandbox failed",
          {{"sandbox", id}, {"digest", d}, {"error", p.status().ToString()}});
      continue;
    }
    e->acquired.push_back(d);
  }
  AddTransition(e->transitions, e->info.state, "adopted after daemon restart");
  Status s = records_.Put(id, MakeRecord(*e, e->info.state));
  if (!s.ok()) Log(spdlog::level::warn, "persisting adopted record failed", {{"sandbox", id}, {"error", s.ToString()}});
  {
    std::lock_guard<std::mutex> l(mu_);
    table_[id] = e;
  }
  if (!e->spec.request_id.empty()) {
    // A create whose reply the crash may have lost: its client can still
    // retry it (or abandon it) by its key.
    auto k = std::make_shared<CreateKey>();
    k->done = true;
    k->sandbox_id = id;
    std::lock_guard<std::mutex> l(create_keys_mu_);
    RememberCreateKeyLocked(e->spec.request_id, std::move(k));
  }
  Log(spdlog::level::info, "sandbox adopted", {{"sandbox", id}, {"reason", "daemon restart"}});
}

Status SandboxManager::Start() {
  struct stat st;
  if (::stat(records_.dir().c_str(), &st) != 0) {
    return ErrnoToStatus(errno, "stat(" + records_.dir() + ")");
  }
  for (RecordStore::Loaded& l : records_.LoadAll()) {
    if (!ValidSandboxId(l.id)) {
      Log(spdlog::level::err, "ignoring record with an invalid id", {{"file", l.id}});
      continue;
    }
    if (!l.record.ok()) {
      CleanupRecord(l.id, nlohmann::json::object(), "unreadable record: " + l.record.status().ToString());
      continue;
    }
    RecoverOne(l.id, *l.record);
  }
  layers_->Sweep();
  // Snapshot/grade staging trees a previous daemon left behind.
  {
    Status ts = RemoveTree(options_.state_dir + "/tmp");
    if (!ts.ok()) Log(spdlog::level::warn, "cleaning the tmp dir failed", {{"error", ts.ToString()}});
    (void)::mkdir((options_.state_dir + "/tmp").c_str(), 0700);
  }
  LoadJobs();
  if (options_.sweep_interval.count() > 0) {
    sweep_thread_ = std::thread([this] { SweepLoop(); });
  }
  if (options_.reap_interval.count() > 0) {
    reap_thread_ = std::thread([this] { ReapLoop(); });
  }
  return absl::OkStatus();
}

void SandboxManager::SweepLoop() {
  std::unique_lock<std::mutex> l(sweep_mu_);
  while (!stopping_) {
    sweep_cv_.wait_for(l, options_.sweep_interval, [this] { return stopping_; });
    if (stopping_) break;
    l.unlock();
    layers_->Sweep();
    l.lock();
  }
}

// ---------------------------------------------------------------- lifecycle

struct SandboxManager::CallSlot {
  bool done = false;
  Status status;
  RecordedCall result;
};

StatusOr<RecordedCall> SandboxManager::Idempotent(const std::string& id, const std::string& request_id,
                                                  const std::function<StatusOr<RecordedCall>()>& run) {
  if (request_id.empty()) return run();
  if (request_id.size() > 256 || HasControl(request_id)) {
    return absl::InvalidArgumentError("request_id=" + Quote(request_id) +
                                      " must be at most 256 bytes without control characters");
  }
  std::shared_ptr<CallSlot> slot;
  {
    std::unique_lock<std::mutex> l(calls_mu_);
    auto& m = calls_[id];
    auto it = m.find(request_id);
    if (it != m.end()) {
      slot = it->second;
      // A duplicate of a call in progress waits for it (bounded: a day).
      if (!calls_cv_.wait_for(l, std::chrono::hours(24), [&] { return slot->done; })) {
        return absl::UnavailableError("request " + request_id + " is still running; retry");
      }
      if (!slot->status.ok()) return slot->status;
      return slot->result;
    }
    slot = std::make_shared<CallSlot>();
    m[request_id] = slot;
    call_order_[id].push_back(request_id);
  }
  StatusOr<RecordedCall> r = run();
  {
    std::lock_guard<std::mutex> l(calls_mu_);
    slot->done = true;
    auto cit = calls_.find(id);
    if (r.ok()) {
      slot->result = *r;
    } else {
      slot->status = r.status();
      // Not recorded: a later retry runs again.
      if (cit != calls_.end()) {
        auto sit = cit->second.find(request_id);
        if (sit != cit->second.end() && sit->second == slot) cit->second.erase(sit);
      }
    }
    auto oit = call_order_.find(id);
    if (cit != calls_.end() && oit != call_order_.end()) {
      std::vector<std::string>& order = oit->second;
      size_t drop = 0;
      while (order.size() - drop > options_.max_recorded_calls) {
        auto sit = cit->second.find(order[drop]);
        if (sit != cit->second.end() && !sit->second->done) break;  // oldest still running
        if (sit != cit->second.end()) cit->second.erase(sit);
        ++drop;
      }
      order.erase(order.begin(), order.begin() + static_cast<long>(drop));
      if (cit->second.empty()) {
        calls_.erase(cit);
        call_order_.erase(oit);
      }
    }
  }
  calls_cv_.notify_all();
  return r;
}

StatusOr<SandboxInfo> SandboxManager::ExtendTtl(const std::string& id, uint32_t ttl_s) {
  std::shared_ptr<Entry> e;
  SandboxState state;
  SandboxInfo info;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = table_.find(id);
    if (it == table_.end()) return SandboxNotFound(id);
    e = it->second;
    state = e->info.state;
    if (state != SandboxState::kRunning && state != SandboxState::kPaused && state != SandboxState::kSuspended) {
      return absl::FailedPreconditionError("sandbox " + id + " is " + SandboxStateName(state));
    }
    e->info.ttl_s = ttl_s;
    e->spec.ttl_s = ttl_s;
    e->info.expires_at_ns = ttl_s > 0 ? NowNs() + int64_t{ttl_s} * 1000000000 : 0;
    info = InfoOf(*e);
  }
  RETURN_IF_ERROR(records_.Put(id, MakeRecord(*e, state)));
  return info;
}

void SandboxManager::SetPausedState(Entry& e, const std::string& id, SandboxState to, const std::string& reason) {
  {
    std::lock_guard<std::mutex> l(mu_);
    // A destroy took over meanwhile (it waits for this call's pause_mu
    // before it touches the record): its state and record stand.
    auto it = table_.find(id);
    if (e.info.state == SandboxState::kDestroying || it == table_.end() || it->second.get() != &e) return;
    e.info.state = to;
    if (to == SandboxState::kRunning) e.info.last_activity_ns = NowNs();
  }
  AddTransition(e.transitions, to, reason);
  Status s = records_.Put(id, MakeRecord(e, to));
  if (!s.ok()) {
    Log(spdlog::level::warn, "persisting sandbox state failed",
        {{"sandbox", id}, {"state", SandboxStateName(to)}, {"error", s.ToString()}});
  }
}

Status SandboxManager::Pause(const std::string& id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, FindEntry(id));
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
  SetPausedState(*e, id, SandboxState::kPaused, "pause requested");
  Log(spdlog::level::info, "sandbox paused", {{"sandbox", id}});
  return absl::OkStatus();
}

Status SandboxManager::Resume(const std::string& id) { return Resume(id, true); }

Status SandboxManager::Resume(const std::string& id, bool prefetch) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, FindEntry(id));
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
  const int64_t t0 = NowNs();
  uint64_t prefetched = 0;
  if (suspended) {
    // Still frozen: the working set comes back before any process runs.
    runtime::Suspendable* suspendable = runtime::As<runtime::Suspendable>(*e->sandbox);
    StatusOr<uint64_t> p = suspendable != nullptr
                               ? suspendable->EndSuspend(options_.suspend_prefetch && prefetch)
                               : runtime::NotSupported(*e->sandbox, runtime::Capability::kSuspend);
    if (!p.ok()) {
      Log(spdlog::level::warn, "ending suspend failed; resuming anyway", {{"sandbox", id}, {"error", p.status().ToString()}});
    } else {
      prefetched = *p;
    }
  }
  RETURN_IF_ERROR(pausable->Resume());
  SetPausedState(*e, id, SandboxState::kRunning, "resumed");
  Log(spdlog::level::info, "sandbox resumed",
      {{"sandbox", id}, {"from", suspended ? "suspended" : "paused"},
       {"prefetched_bytes", std::to_string(prefetched)}, {"ms", std::to_string((NowNs() - t0) / 1000000)}});
  return absl::OkStatus();
}

Status SandboxManager::Suspend(const std::string& id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, FindEntry(id));
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
  const int64_t t0 = NowNs();
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
        SetPausedState(*e, id, SandboxState::kPaused, "suspend failed");
      }
    }
    return Status(rs.code(), "suspend of " + id + ": " + std::string(rs.message()));
  }
  const uint64_t after = suspendable->MemoryUsage().value_or(0);
  SetPausedState(*e, id, SandboxState::kSuspended, "suspend requested");
  Log(spdlog::level::info, "sandbox suspended",
      {{"sandbox", id}, {"memory_before_bytes", std::to_string(before)}, {"memory_after_bytes", std::to_string(after)},
       {"swap_bytes", std::to_string(suspendable->SwapUsage())}, {"ms", std::to_string((NowNs() - t0) / 1000000)}});
  return absl::OkStatus();
}

StatusOr<SandboxMemory> SandboxManager::Memory(const std::string& id) const {
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = table_.find(id);
    if (it == table_.end()) return SandboxNotFound(id);
    e = it->second;
    if (e->sandbox == nullptr) return absl::FailedPreconditionError("sandbox " + id + " is " + SandboxStateName(e->info.state));
  }
  ASSIGN_OR_RETURN(runtime::Suspendable * suspendable, runtime::Require<runtime::Suspendable>(*e->sandbox));
  SandboxMemory m;
  ASSIGN_OR_RETURN(m.memory_bytes, suspendable->MemoryUsage());
  m.swap_bytes = suspendable->SwapUsage();
  return m;
}

namespace {
// Pauses a running sandbox for a consistent read of its changes; resumes on
// destruction unless it was already paused (by the node or a snapshot). A
// backend that cannot pause exports unfrozen.
class FreezeGuard {
 public:
  FreezeGuard(runtime::Sandbox* sb, bool want) : sb_(runtime::As<runtime::Pausable>(*sb)) {
    if (want && sb_ != nullptr) frozen_ = sb_->Pause().ok();
  }
  ~FreezeGuard() { Release(); }
  void Release() {
    if (frozen_) (void)sb_->Resume();
    frozen_ = false;
  }

 private:
  runtime::Pausable* sb_;
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
  std::shared_ptr<Entry> e;
  bool paused;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = table_.find(req.id);
    if (it == table_.end()) return SandboxNotFound(req.id);
    e = it->second;
    paused = e->info.state == SandboxState::kPaused || e->info.state == SandboxState::kSuspended;
    if (!paused && e->info.state != SandboxState::kRunning) {
      return absl::FailedPreconditionError("sandbox " + req.id + " is " + SandboxStateName(e->info.state));
    }
  }
  const int64_t t0 = NowNs();
  const std::string name =
      req.name.empty() ? "workspace/snap-" + req.id + "@" + std::to_string(t0) : req.name;
  if (name.find('@') == std::string::npos) {
    return absl::InvalidArgumentError("snapshot name " + Quote(name) + " must be kind/name@version");
  }
  ASSIGN_OR_RETURN(runtime::ChangeExporter * exporter, runtime::Require<runtime::ChangeExporter>(*e->sandbox));
  CopyBudget budget("sandbox " + req.id, CopyLimitBytes(e->info.resources), &staging_used_,
                    options_.max_staging_bytes);
  runtime::ExportOptions eo;
  eo.exclude = req.exclude;
  eo.budget = &budget;
  const std::string staging = options_.state_dir + "/tmp/snap-" + req.id + "-" + std::to_string(t0);
  {
    FreezeGuard freeze(e->sandbox.get(), req.pause && !paused);
    Status cs = exporter->ExportChanges(staging, eo);
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
// when its image has none (SeedEtcHosts in runtime/container/rootfs.cc, same text):
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
  std::shared_ptr<Entry> e;
  bool paused;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = table_.find(req.id);
    if (it == table_.end()) return SandboxNotFound(req.id);
    e = it->second;
    paused = e->info.state == SandboxState::kPaused || e->info.state == SandboxState::kSuspended;
    if (!paused && e->info.state != SandboxState::kRunning) {
      return absl::FailedPreconditionError("sandbox " + req.id + " is " + SandboxStateName(e->info.state));
    }
  }
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
  CopyBudget changes_budget("sandbox " + req.id, CopyLimitBytes(e->info.resources), &staging_used_,
                            options_.max_staging_bytes);  // the exported changes; outlives `rollback`
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
  ASSIGN_OR_RETURN(runtime::ChangeExporter * exporter, runtime::Require<runtime::ChangeExporter>(*e->sandbox));
  // The sandbox's own changes, exported in the layer format (frozen
  // meanwhile): then they read like the layers a sandbox made (ids as inside).
  const std::string changes_dir = options_.state_dir + "/tmp/grade-" + req.id + "-" + std::to_string(t0) + "-changes";
  UniqueFd changes;
  {
    FreezeGuard freeze(e->sandbox.get(), !paused);
    runtime::ExportOptions eo;
    eo.budget = &changes_budget;
    Status es = exporter->ExportChanges(changes_dir, eo);
    if (!es.ok()) {
      const bool content = (es.code() == absl::StatusCode::kResourceExhausted && !changes_budget.node_cap_hit()) ||
                           es.code() == absl::StatusCode::kFailedPrecondition;
      if (!content) return Status(es.code(), "grade of sandbox " + req.id + ": " + std::string(es.message()));
      res.rejected = std::string(es.message());
    } else {
      rollback.Add([changes_dir] { (void)RemoveTree(changes_dir); });
      changes.reset(::open(changes_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!changes.valid()) return ErrnoToStatus(errno, "open(" + changes_dir + ")");
    }
  }
  // The agent's diffs, bottom first: the layers a sandbox made, then its
  // exported changes.
  struct Diff {
    int fd;
    DiffCopyOptions options;
    std::string staging;
  };
  std::vector<Diff> diffs;
  for (size_t i = pristine.size(); i <= all.size(); ++i) {
    if (i == all.size() && !changes.valid()) break;  // rejected: nothing exported
    Diff d;
    d.fd = i < all.size() ? layer_fds[i].get() : changes.get();
    budget_store.push_back(std::make_unique<CopyBudget>("sandbox " + req.id, CopyLimitBytes(e->info.resources),
                                                        &staging_used_, options_.max_staging_bytes));
    d.options.budget = budget_store.back().get();
    d.staging = options_.state_dir + "/tmp/grade-" + req.id + "-" + std::to_string(t0) + "-" + std::to_string(diffs.size());
    diffs.push_back(std::move(d));
  }
  std::vector<std::string> touched;
  for (Diff& d : diffs) {
    std::vector<std::string> t;
    const size_t room = GradeResult::kMaxTouched > touched.size() ? GradeResult::kMaxTouched - touched.size() : 0;
    Status ls = ListChanges(d.fd, solution, pristine_fds, d.options, room, &t, &res.touched_truncated);
    if (!ls.ok()) return Status(ls.code(), "grade of sandbox " + req.id + ": " + std::string(ls.message()));
    if (d.fd == changes.get() && IsSeededEtcHosts(d.fd, e->info.hostname)) {
      t.erase(std::remove(t.begin(), t.end(), "/etc/hosts"), t.end());
    }
    touched.insert(touched.end(), t.begin(), t.end());
    for (const std::string& p : prot) {
      if (image::DiffTouches(d.fd, p)) touched.push_back(p);
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
  if (changes.valid()) {
    changes.reset();
    (void)RemoveTree(changes_dir);
    changes_budget.ReleaseNode();
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
      Status s = RemoveLayer(name);
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
  ASSIGN_OR_RETURN(SandboxInfo g, Create(cr));
  res.grade_sandbox_id = g.id;
  StatusOr<runtime::ExecOutcome> out = Exec(g.id, req.grader);
  Status ds = Destroy(g.id);
  if (!ds.ok()) Log(spdlog::level::warn, "destroying grade sandbox failed", {{"sandbox", g.id}, {"error", ds.ToString()}});
  if (!out.ok()) return out.status();
  res.outcome = std::move(*out);
  Log(spdlog::level::info, "graded", {{"sandbox", req.id}, {"exit", std::to_string(res.outcome.exit_code)},
                                      {"touched", std::to_string(res.touched.size())},
                                      {"ms", std::to_string((NowNs() - t0) / 1000000)}});
  return res;
}

std::string SandboxManager::AuditPath(const std::string& id) const {
  return options_.run_dir + "/audit/" + id + ".jsonl";
}

void SandboxManager::Audit(const std::string& id, nlohmann::json entry) const {
  if (!ValidSandboxId(id)) return;
  std::string line = entry.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> l(audit_mu_);
  {
    std::lock_guard<std::mutex> tl(mu_);
    if (!table_.count(id)) return;  // gone: no log to resurrect
  }
  const std::string path = AuditPath(id);
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid() || ::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    Log(spdlog::level::warn, "audit write failed", {{"sandbox", id}, {"error", ErrnoToStatus(errno, "write(" + path + ")").ToString()}});
  }
}

StatusOr<std::vector<nlohmann::json>> SandboxManager::AuditLog(const std::string& id) const {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!table_.count(id)) return SandboxNotFound(id);
  }
  std::vector<nlohmann::json> out;
  std::lock_guard<std::mutex> l(audit_mu_);
  std::ifstream f(AuditPath(id));
  std::string line;
  size_t bytes = 0;
  while (std::getline(f, line) && bytes < (64u << 20)) {
    bytes += line.size();
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

// ---------------------------------------------------------------- jobs

namespace {
constexpr uint32_t kDefaultLeaseS = 60;
constexpr uint32_t kDefaultGraceS = 300;
}  // namespace

void SandboxManager::SaveJobsLocked() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, job] : jobs_) {
    j[name] = {{"lease_s", job.lease_s}, {"grace_s", job.grace_s},
               {"lease_expires_at_ns", job.lease_expires_at_ns}, {"lapsed", job.lapsed},
               {"lapsed_at_ns", job.lapsed_at_ns}};
  }
  const std::string path = options_.state_dir + "/jobs.json", tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (!f.good()) {
      Log(spdlog::level::warn, "persisting jobs failed", {{"file", tmp}});
      return;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Log(spdlog::level::warn, "persisting jobs failed", {{"error", ErrnoToStatus(errno, "rename(" + tmp + ")").ToString()}});
  }
}

void SandboxManager::LoadJobs() {
  std::ifstream f(options_.state_dir + "/jobs.json");
  if (!f.good()) return;
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  std::lock_guard<std::mutex> l(jobs_mu_);
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

StatusOr<JobInfo> SandboxManager::JobHeartbeat(const std::string& job, uint32_t lease_s, uint32_t grace_s) {
  if (job.empty() || job.size() > 253 || HasControl(job)) {
    return absl::InvalidArgumentError("job=" + Quote(job) + " must be 1-253 bytes without control characters");
  }
  bool revive = false;
  JobInfo out;
  {
    std::lock_guard<std::mutex> l(jobs_mu_);
    JobInfo& j = jobs_[job];
    j.name = job;
    if (lease_s > 0) j.lease_s = lease_s;
    if (grace_s > 0) j.grace_s = grace_s;
    if (j.lease_s == 0) j.lease_s = kDefaultLeaseS;
    if (j.grace_s == 0) j.grace_s = kDefaultGraceS;
    j.lease_expires_at_ns = NowNs() + int64_t{j.lease_s} * 1000000000;
    revive = j.lapsed;
    j.lapsed = false;
    j.lapsed_at_ns = 0;
    SaveJobsLocked();
    out = j;
  }
  if (revive) {
    uint32_t n = ResumeJob(job);
    Log(spdlog::level::info, "job lease renewed after lapse; sandboxes resumed", {{"job", job}, {"sandboxes", std::to_string(n)}});
  }
  out.sandboxes = static_cast<uint32_t>(List({}, job).size());
  return out;
}

StatusOr<JobInfo> SandboxManager::GetJob(const std::string& job) const {
  JobInfo out;
  {
    std::lock_guard<std::mutex> l(jobs_mu_);
    auto it = jobs_.find(job);
    if (it != jobs_.end()) out = it->second;
  }
  out.name = job;
  out.sandboxes = static_cast<uint32_t>(List({}, job).size());
  if (out.lease_s == 0 && out.sandboxes == 0) return absl::NotFoundError("job " + Quote(job) + " not found");
  return out;
}

std::vector<JobInfo> SandboxManager::ListJobs() const {
  std::map<std::string, JobInfo> out;
  {
    std::lock_guard<std::mutex> l(jobs_mu_);
    out = jobs_;
  }
  for (const SandboxInfo& i : List({}, "")) {
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

uint32_t SandboxManager::SuspendJob(const std::string& job, const std::string& reason) {
  uint32_t n = 0;
  for (const SandboxInfo& i : List({}, job)) {
    if (i.state != SandboxState::kRunning && i.state != SandboxState::kPaused) continue;
    Status s = Suspend(i.id);
    if (s.ok()) {
      ++n;
    } else {
      Log(spdlog::level::warn, "suspending sandbox of job failed", {{"job", job}, {"sandbox", i.id}, {"reason", reason}, {"error", s.ToString()}});
    }
  }
  return n;
}

uint32_t SandboxManager::ResumeJob(const std::string& job) {
  uint32_t n = 0;
  for (const SandboxInfo& i : List({}, job)) {
    if (i.state != SandboxState::kPaused && i.state != SandboxState::kSuspended) continue;
    Status s = Resume(i.id);
    if (s.ok()) {
      ++n;
    } else {
      Log(spdlog::level::warn, "resuming sandbox of job failed", {{"job", job}, {"sandbox", i.id}, {"error", s.ToString()}});
    }
  }
  return n;
}

uint32_t SandboxManager::DestroyJob(const std::string& job, const std::string& reason) {
  uint32_t n = 0;
  for (const SandboxInfo& i : List({}, job)) {
    Status s = DestroyWithReason(i.id, reason);
    if (s.ok()) ++n;
  }
  std::lock_guard<std::mutex> l(jobs_mu_);
  jobs_.erase(job);
  SaveJobsLocked();
  return n;
}

void SandboxManager::ReapJobs() {
  std::vector<std::string> lapse, expire;
  {
    std::lock_guard<std::mutex> l(jobs_mu_);
    const int64_t now = NowNs();
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
    if (changed) SaveJobsLocked();
  }
  for (const std::string& job : lapse) {
    uint32_t n = SuspendJob(job, "job lease lapsed");
    Log(spdlog::level::info, "job lease lapsed; sandboxes suspended", {{"job", job}, {"sandboxes", std::to_string(n)}});
  }
  for (const std::string& job : expire) {
    uint32_t n = DestroyJob(job, "job lease lapsed beyond its grace period");
    Log(spdlog::level::info, "job grace expired; sandboxes destroyed", {{"job", job}, {"sandboxes", std::to_string(n)}});
  }
}

std::vector<std::string> SandboxManager::ReapExpired() {
  ReapJobs();
  std::vector<std::pair<std::string, std::string>> victims;
  {
    std::lock_guard<std::mutex> l(mu_);
    const int64_t now = NowNs();
    for (const auto& [id, e] : table_) {
      const SandboxInfo& i = e->info;
      if (i.state != SandboxState::kRunning && i.state != SandboxState::kPaused &&
          i.state != SandboxState::kSuspended) {
        continue;
      }
      if (i.expires_at_ns > 0 && now >= i.expires_at_ns) {
        victims.emplace_back(id, "ttl expired");
      } else if (i.idle_timeout_s > 0 && e->inflight_execs == 0 && i.state == SandboxState::kRunning &&
                 now - i.last_activity_ns >= int64_t{i.idle_timeout_s} * 1000000000) {
        victims.emplace_back(id, "idle timeout");
      }
    }
  }
  std::vector<std::string> done;
  for (const auto& [id, reason] : victims) {
    Status s = DestroyWithReason(id, reason);
    if (s.ok()) {
      done.push_back(id);
    } else if (s.code() != absl::StatusCode::kNotFound) {
      Log(spdlog::level::warn, "reaping failed", {{"sandbox", id}, {"reason", reason}, {"error", s.ToString()}});
    }
  }
  return done;
}

void SandboxManager::ReapLoop() {
  std::unique_lock<std::mutex> l(sweep_mu_);
  while (!stopping_) {
    sweep_cv_.wait_for(l, options_.reap_interval, [this] { return stopping_; });
    if (stopping_) break;
    l.unlock();
    ReapExpired();
    l.lock();
  }
}

}  // namespace warren::node

// ---------------------------------------------------------------- processes (issue 3)
namespace warren::node {

nlohmann::json SandboxManager::ProcessAudit(const ProcessStatus& st, const char* op) const {
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
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, Running(id));
  const std::string pid = processes_->NewId();
  auto on_exit = [this, id](const ProcessStatus& st) { Audit(id, ProcessAudit(st, "process_exit")); };
  ASSIGN_OR_RETURN(std::shared_ptr<ManagedProcess> mp, ManagedProcess::Start(sb, id, pid, spec, options, on_exit));
  Status s = processes_->Insert(id, mp);
  if (!s.ok()) {
    mp->Stop();
    return s;
  }
  if (!Get(id).ok()) {  // destroyed meanwhile: its DropSandbox may have run before our Insert
    processes_->DropSandbox(id);
    return absl::FailedPreconditionError("sandbox " + id + " was destroyed during spawn");
  }
  Audit(id, ProcessAudit(mp->Info(), "spawn"));
  return mp;
}

StatusOr<std::shared_ptr<ManagedProcess>> SandboxManager::StartAttached(const std::string& id,
                                                                        const runtime::ExecSpec& spec,
                                                                        const ProcessOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, Running(id));
  Touch(id, +1);
  auto on_exit = [this, id](const ProcessStatus& st) {
    Touch(id, -1);
    Audit(id, ProcessAudit(st, "exec_stream"));
  };
  StatusOr<std::shared_ptr<ManagedProcess>> mp =
      ManagedProcess::Start(sb, id, processes_->NewId(), spec, options, on_exit);
  if (!mp.ok()) Touch(id, -1);
  return mp;
}

StatusOr<std::shared_ptr<ManagedProcess>> SandboxManager::FindProcess(const std::string& id,
                                                                      const std::string& process_id) const {
  RETURN_IF_ERROR(Get(id).status());
  return processes_->Find(id, process_id);
}

StatusOr<std::vector<ProcessStatus>> SandboxManager::Processes(const std::string& id) const {
  RETURN_IF_ERROR(Get(id).status());
  std::vector<ProcessStatus> out;
  for (const auto& p : processes_->List(id)) out.push_back(p->Info());
  return out;
}

}  // namespace warren::node
