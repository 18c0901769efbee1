#include "cluster/node_record.h"

#include <nlohmann/json.hpp>

namespace warren::cluster {
namespace {
// runtime::QosName of each class, by index (this library stays free of the runtime).
constexpr const char* kQosNames[2] = {"latency", "best-effort"};
}  // namespace

std::string ToJson(const NodeRecord& r) {
  nlohmann::json j = {{"id", r.id},
                      {"address", r.address},
                      {"version", r.version},
                      {"backends", r.backends},
                      {"cpus", r.cpus},
                      {"memory_mb", r.memory_mb},
                      {"max_sandboxes", r.max_sandboxes},
                      {"sandboxes", r.sandboxes},
                      {"free_slots", r.free_slots},
                      {"free_cpu_millis", r.free_cpu_millis},
                      {"free_memory_mb", r.free_memory_mb},
                      {"available_memory_mb", r.available_memory_mb},
                      {"creates_in_flight", r.creates_in_flight},
                      {"creates_queued", r.creates_queued},
                      {"load1", r.load1},
                      {"layers", r.layers},
                      {"drain", r.drain},
                      {"updated_ns", r.updated_ns},
                      {"core_scheduling", r.core_scheduling}};
  for (int c = 0; c < 2; ++c) {
    const QosRecord& q = r.qos[c];
    j["qos"][kQosNames[c]] = {{"overcommit", q.overcommit},        {"bounded", q.bounded},
                              {"sandboxes", q.sandboxes},          {"cpu_millis", q.cpu_millis},
                              {"memory_mb", q.memory_mb},          {"free_cpu_millis", q.free_cpu_millis},
                              {"free_memory_mb", q.free_memory_mb}};
  }
  return j.dump();
}

StatusOr<NodeRecord> NodeRecordFromJson(const std::string& json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("node record is not a JSON object");
  NodeRecord r;
  try {
    r.id = j.at("id").get<std::string>();
    r.address = j.at("address").get<std::string>();
    r.version = j.value("version", "");
    r.backends = j.value("backends", std::vector<std::string>{});
    r.cpus = j.value("cpus", 0u);
    r.memory_mb = j.value("memory_mb", uint64_t{0});
    r.max_sandboxes = j.value("max_sandboxes", 0u);
    r.sandboxes = j.value("sandboxes", 0u);
    r.free_slots = j.value("free_slots", 0u);
    r.free_cpu_millis = j.value("free_cpu_millis", int64_t{0});
    r.free_memory_mb = j.value("free_memory_mb", int64_t{0});
    r.available_memory_mb = j.value("available_memory_mb", uint64_t{0});
    r.creates_in_flight = j.value("creates_in_flight", 0u);
    r.creates_queued = j.value("creates_queued", 0u);
    r.load1 = j.value("load1", 0.0);
    r.layers = j.value("layers", std::vector<std::string>{});
    r.drain = j.value("drain", false);
    r.updated_ns = j.value("updated_ns", int64_t{0});
    r.core_scheduling = j.value("core_scheduling", "");
    if (j.contains("qos")) {
      const nlohmann::json& qj = j.at("qos");
      for (int c = 0; c < 2; ++c) {
        if (!qj.contains(kQosNames[c])) continue;
        const nlohmann::json& o = qj.at(kQosNames[c]);
        QosRecord& q = r.qos[c];
        q.overcommit = o.value("overcommit", 0.0);
        q.bounded = o.value("bounded", false);
        q.sandboxes = o.value("sandboxes", 0u);
        q.cpu_millis = o.value("cpu_millis", uint64_t{0});
        q.memory_mb = o.value("memory_mb", uint64_t{0});
        q.free_cpu_millis = o.value("free_cpu_millis", int64_t{0});
        q.free_memory_mb = o.value("free_memory_mb", int64_t{0});
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(std::string("node record: ") + e.what());
  }
  if (r.id.empty() || r.address.empty()) return absl::InvalidArgumentError("node record without id or address");
  return r;
}

}  // namespace warren::cluster
