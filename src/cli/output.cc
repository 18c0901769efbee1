#include "cli/output.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace warren::cli {

std::string StateName(v1::SandboxState state) {
  switch (state) {
    case v1::SANDBOX_STATE_CREATING: return "creating";
    case v1::SANDBOX_STATE_RUNNING: return "running";
    case v1::SANDBOX_STATE_PAUSED: return "paused";
    case v1::SANDBOX_STATE_SUSPENDED: return "suspended";
    case v1::SANDBOX_STATE_STOPPED: return "stopped";
    case v1::SANDBOX_STATE_DESTROYED: return "destroyed";
    default: return "unspecified";
  }
}

std::string FileTypeName(v1::FileType type) {
  switch (type) {
    case v1::FILE_TYPE_REGULAR: return "regular";
    case v1::FILE_TYPE_DIRECTORY: return "directory";
    case v1::FILE_TYPE_SYMLINK: return "symlink";
    case v1::FILE_TYPE_OTHER: return "other";
    default: return "unspecified";
  }
}

nlohmann::json ResourcesToJson(const v1::Resources& r) {
  return {{"cpu_millis", r.cpu_millis()}, {"memory_mb", r.memory_mb()}, {"disk_mb", r.disk_mb()}, {"pids", r.pids()},
          {"open_files", r.open_files()}, {"tmpfs_mb", r.tmpfs_mb()}};
}

nlohmann::json SandboxToJson(const v1::Sandbox& s) {
  nlohmann::json labels = nlohmann::json::object();
  for (const auto& [k, v] : s.labels()) labels[k] = v;
  nlohmann::json out = {{"id", s.id()},
                        {"backend", s.backend()},
                        {"state", StateName(s.state())},
                        {"layers", std::vector<std::string>(s.layers().begin(), s.layers().end())},
                        {"layer_names", std::vector<std::string>(s.layer_names().begin(), s.layer_names().end())},
                        {"resources", ResourcesToJson(s.resources())},
                        {"labels", labels},
                        {"job", s.job()},
                        {"created_at_ns", s.created_at_ns()},
                        {"init_pid", s.init_pid()},
                        {"hostname", s.hostname()},
                        {"ttl_s", s.ttl_s()},
                        {"expires_at_ns", s.expires_at_ns()},
                        {"idle_timeout_s", s.idle_timeout_s()},
                        {"memory_bytes", s.memory_bytes()},
                        {"swap_bytes", s.swap_bytes()},
                        {"qos", s.qos().empty() ? "latency" : s.qos()}};
  if (!s.main_process().empty()) out["main_process"] = s.main_process();
  if (s.exposed_size() > 0) {
    nlohmann::json exposed = nlohmann::json::array();
    for (const v1::ExposedPort& x : s.exposed()) {
      exposed.push_back({{"port", x.port()}, {"address", x.address()}, {"token", x.token()}});
    }
    out["exposed"] = std::move(exposed);
  }
  return out;
}

nlohmann::json QosToJson(const google::protobuf::RepeatedPtrField<v1::QosClassCapacity>& classes) {
  nlohmann::json out = nlohmann::json::object();
  for (const v1::QosClassCapacity& q : classes) {
    out[q.qos()] = {{"overcommit", q.overcommit()},           {"sandboxes", q.sandboxes()},
                    {"cpu_millis", q.cpu_millis()},           {"memory_mb", q.memory_mb()},
                    {"free_cpu_millis", q.free_cpu_millis()}, {"free_memory_mb", q.free_memory_mb()}};
  }
  return out;
}

nlohmann::json LayerToJson(const v1::Layer& l) {
  return {{"digest", l.digest()},
          {"name", l.name()},
          {"size_bytes", l.size_bytes()},
          {"created_at_ns", l.created_at_ns()},
          {"in_use", l.in_use()},
          {"mounted", l.mounted()},
          {"projects", std::vector<std::string>(l.projects().begin(), l.projects().end())}};
}

nlohmann::json NodeStatusToJson(const v1::NodeStatus& n) {
  return {{"node_id", n.node_id()},
          {"version", n.version()},
          {"backends", std::vector<std::string>(n.backends().begin(), n.backends().end())},
          {"sandboxes", n.sandboxes()},
          {"layers", n.layers()},
          {"layers_mounted", n.layers_mounted()},
          {"cgroup_version", n.cgroup_version()},
          {"cgroup_parent", n.cgroup_parent()},
          {"idmapped_mounts", n.idmapped_mounts()},
          {"file_backed_erofs", n.file_backed_erofs()},
          {"state_dir", n.state_dir()},
          {"started_at_ns", n.started_at_ns()},
          {"cpus", n.cpus()},
          {"memory_total_bytes", n.memory_total_bytes()},
          {"memory_available_bytes", n.memory_available_bytes()},
          {"qos", QosToJson(n.qos())},
          {"core_scheduling", n.core_scheduling()}};
}

nlohmann::json ExecResultToJson(const v1::ExecResult& r) {
  return {{"exit_code", r.exit_code()},
          {"signal", r.signal()},
          {"oom_killed", r.oom_killed()},
          {"timed_out", r.timed_out()},
          {"stdout", r.stdout()},  // made lossy UTF-8 by DumpJson
          {"stderr", r.stderr()},
          {"stdout_b64", Base64Encode(r.stdout())},
          {"stderr_b64", Base64Encode(r.stderr())},
          {"stdout_truncated", r.stdout_truncated()},
          {"stderr_truncated", r.stderr_truncated()},
          {"stdout_total_bytes", r.stdout_total_bytes()},
          {"stderr_total_bytes", r.stderr_total_bytes()},
          {"duration_ns", r.duration_ns()}};
}

std::string DumpJson(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void PrintJson(const nlohmann::json& j) {
  std::cout << DumpJson(j);
  std::cout.flush();
}

std::string Base64Encode(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (rest == 2) v |= uint8_t(bytes[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string FormatAge(int64_t created_at_ns, int64_t now_ns) {
  if (created_at_ns <= 0) return "-";
  int64_t s = std::max<int64_t>(0, (now_ns - created_at_ns) / 1000000000);
  if (s < 120) return absl::StrCat(s, "s");
  if (s < int64_t{120} * 60) return absl::StrCat(s / 60, "m");
  if (s < int64_t{48} * 3600) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrCat(bytes, "B");
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f%s", v, kUnits[unit]);
}

std::string ShortDigest(const std::string& digest) {
  static constexpr size_t kPrefix = sizeof("sha256:") - 1 + 12;
  return digest.size() > kPrefix ? digest.substr(0, kPrefix) : digest;
}

void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (row.size() > width.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 2, ' ');
    }
    out << line << "\n";
  }
  out.flush();
}

void PrintError(const Status& s) {
  std::cout.flush();
  std::string msg(s.message());
  std::cerr << "error: " << absl::StatusCodeToString(s.code()) << ": " << msg << std::endl;
}

}  // namespace warren::cli
