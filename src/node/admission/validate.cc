#include "node/admission/validate.h"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <chrono>

#include "absl/strings/escaping.h"

namespace warren::node {

namespace {

constexpr uint32_t kDefaultCpuMillis = 1000;
constexpr uint32_t kDefaultMemoryMb = 2048;
constexpr uint32_t kDefaultDiskMb = 1024;
constexpr uint32_t kDefaultPids = 1024;
constexpr uint32_t kDefaultOpenFiles = 1024;
constexpr uint32_t kDefaultTmpfsMb = 256;
constexpr uint64_t kMaxDiskMb = 1u << 20;  // 1 TiB
constexpr uint32_t kMaxPids = 4194304;     // the kernel's PID_MAX_LIMIT
constexpr uint32_t kMinOpenFiles = 16;
constexpr uint32_t kMaxOpenFiles = 1048576;
constexpr size_t kMaxLabels = 64;
constexpr size_t kMaxEnvBytes = 1 << 20;

bool IsDigits(const std::string& s) {
  return !s.empty() && s.size() <= 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
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
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '/';
  });
}

// The most open files a sandbox may get: its init inherits the limit from
// the daemon, and raising a hard limit needs CAP_SYS_RESOURCE in the initial
// user namespace, which the sandbox's setup does not hold.
uint64_t MaxOpenFiles(const NodeLimits& lim) {
  uint64_t max = kMaxOpenFiles;
  if (lim.max_open_files != 0) return std::min<uint64_t>(max, lim.max_open_files);
  struct rlimit rl;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY) {
    max = std::min<uint64_t>(max, rl.rlim_max);
  }
  return max;
}

Status TooBig(const std::string& field, uint64_t value, const std::string& max) {
  return absl::InvalidArgumentError("resources." + field + "=" + std::to_string(value) + " exceeds " + max);
}

}  // namespace

std::string Quote(const std::string& s) {
  std::string v = s.size() > 80 ? s.substr(0, 80) + "..." : s;
  return "\"" + absl::CHexEscape(v) + "\"";
}

bool HasControl(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

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
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || (c == '$' && i + 1 == u.size());
    if (!ok) return false;
  }
  return true;
}

bool ValidNodeId(const std::string& n) {
  if (n.empty() || n.size() > 31) return false;
  if (!std::islower(static_cast<unsigned char>(n[0])) && !std::isdigit(static_cast<unsigned char>(n[0]))) return false;
  return std::all_of(n.begin(), n.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

bool ValidSandboxId(const std::string& id) {
  if (id.empty() || id.size() > 63 || id[0] == '-') return false;
  return std::all_of(id.begin(), id.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
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

StatusOr<CreateRequest> NormalizeCreate(const CreateRequest& in, const NodeLimits& lim,
                                        const std::vector<std::string>& backends) {
  CreateRequest r = in;
  if (r.backend.empty()) r.backend = "container";
  if (std::find(backends.begin(), backends.end(), r.backend) == backends.end()) {
    std::string names;
    for (const std::string& n : backends) names += (names.empty() ? "" : ", ") + n;
    return absl::InvalidArgumentError("backend " + Quote(r.backend) +
                                      " is not available on this node (available: " + names + ")");
  }
  if (r.qos.empty()) r.qos = "latency";
  runtime::Qos qos;
  if (!runtime::ParseQos(r.qos, &qos)) {
    return absl::InvalidArgumentError("qos=" + Quote(r.qos) + " must be \"latency\" or \"best-effort\"");
  }
  // SCHED_IDLE and the cgroup weights are applied by the container backend
  // only (a VM's vCPU threads and the fncall workers are not classed).
  if (qos == runtime::Qos::kBestEffort && r.backend != "container") {
    return absl::InvalidArgumentError("qos=\"best-effort\" is not available with backend " + Quote(r.backend) +
                                      " (container only)");
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
  const uint64_t max_open_files = MaxOpenFiles(lim);
  // Defaults may exceed a small host; clamp defaults only, never explicit asks.
  if (in.resources.cpu_millis == 0) res.cpu_millis = std::min<uint32_t>(res.cpu_millis, 1000 * lim.cpus);
  if (in.resources.memory_mb == 0)
    res.memory_mb = static_cast<uint32_t>(std::min<uint64_t>(res.memory_mb, lim.memory_mb));
  if (in.resources.disk_mb == 0) res.disk_mb = static_cast<uint32_t>(std::min<uint64_t>(res.disk_mb, lim.memory_mb));
  if (in.resources.tmpfs_mb == 0) res.tmpfs_mb = static_cast<uint32_t>(std::min<uint64_t>(res.tmpfs_mb, lim.memory_mb));
  if (in.resources.open_files == 0) {
    res.open_files = static_cast<uint32_t>(std::min<uint64_t>(res.open_files, max_open_files));
  }
  if (res.cpu_millis > 1000ull * lim.cpus) {
    return TooBig(
        "cpu_millis", res.cpu_millis,
        "this node's maximum of " + std::to_string(1000ull * lim.cpus) + " (" + std::to_string(lim.cpus) + " cpus)");
  }
  if (res.memory_mb > lim.memory_mb) {
    return TooBig("memory_mb", res.memory_mb, "this node's memory of " + std::to_string(lim.memory_mb) + " MiB");
  }
  // The upper layer lives in memory (tmpfs): bounded by RAM and by 1 TiB.
  uint64_t disk_max = std::min<uint64_t>(kMaxDiskMb, lim.memory_mb);
  if (res.disk_mb > disk_max) {
    return TooBig("disk_mb", res.disk_mb, "the maximum of " + std::to_string(disk_max) + " MiB on this node");
  }
  if (res.tmpfs_mb > lim.memory_mb) {
    return TooBig("tmpfs_mb", res.tmpfs_mb, "this node's memory of " + std::to_string(lim.memory_mb) + " MiB");
  }
  if (res.pids < 1 || res.pids > kMaxPids) {
    return absl::InvalidArgumentError("resources.pids=" + std::to_string(res.pids) + " is outside [1, " +
                                      std::to_string(kMaxPids) + "]");
  }
  if (res.open_files < kMinOpenFiles) {
    return absl::InvalidArgumentError("resources.open_files=" + std::to_string(res.open_files) +
                                      " is below the minimum of " + std::to_string(kMinOpenFiles));
  }
  if (res.open_files > max_open_files) {
    return TooBig("open_files", res.open_files,
                  "this node's maximum of " + std::to_string(max_open_files) +
                      (max_open_files < kMaxOpenFiles ? " (the daemon's hard RLIMIT_NOFILE)" : ""));
  }
  size_t env_bytes = 0;
  for (const auto& [k, v] : r.env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError("env key " + Quote(k) + " must be non-empty without '=' or NUL");
    }
    if (v.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError("env[" + Quote(k) + "] value contains NUL");
    }
    env_bytes += k.size() + v.size() + 2;
  }
  if (env_bytes > kMaxEnvBytes) {
    return absl::InvalidArgumentError("env: " + std::to_string(env_bytes) + " bytes exceeds the limit of 1 MiB");
  }
  // A UTF-8 locale unless the request chose one: programs that print or
  // decode non-ASCII text (Python's stdio, sort, grep) behave as on a
  // developer's machine instead of falling back to ASCII.
  if (!r.env.count("LANG") && !r.env.count("LC_ALL")) r.env["LANG"] = kDefaultLang;
  if (r.workdir.empty()) r.workdir = "/";
  if (r.workdir[0] != '/' || r.workdir.find('\0') != std::string::npos || r.workdir.size() > 4096) {
    return absl::InvalidArgumentError("workdir=" + Quote(r.workdir) + " must be an absolute path");
  }
  if (r.user.empty()) r.user = "root";
  if (!ValidUser(r.user)) {
    return absl::InvalidArgumentError("user=" + Quote(r.user) + " must be \"root\", a user name or \"uid[:gid]\"");
  }
  if (!r.hostname.empty() && !ValidHostname(r.hostname)) {
    return absl::InvalidArgumentError("hostname=" + Quote(r.hostname) +
                                      " is not a valid host name (letters, digits, '-', '.'; "
                                      "at most 63 characters)");
  }
  if (r.labels.size() > kMaxLabels) {
    return absl::InvalidArgumentError("labels: " + std::to_string(r.labels.size()) + " labels exceed the maximum of " +
                                      std::to_string(kMaxLabels));
  }
  for (const auto& [k, v] : r.labels) {
    if (!ValidLabelKey(k)) {
      return absl::InvalidArgumentError("label key " + Quote(k) + " must be 1-253 characters of [A-Za-z0-9._/-]");
    }
    if (v.size() > 1024 || HasControl(v)) {
      return absl::InvalidArgumentError("labels[" + Quote(k) + "]=" + Quote(v) +
                                        " must be at most 1024 bytes without control characters");
    }
  }
  if (r.job.size() > 253 || HasControl(r.job)) {
    return absl::InvalidArgumentError("job=" + Quote(r.job) + " must be at most 253 bytes without control characters");
  }
  return r;
}

}  // namespace warren::node
