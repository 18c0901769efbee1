#include "node/records/sandbox_record.h"

#include "absl/strings/escaping.h"

namespace warren::node {

void AddTransition(Entry& e, SandboxState s, const std::string& reason) {
  e.transitions.push_back({{"state", SandboxStateName(s)}, {"at_ns", NowNs()}, {"reason", reason}});
}

nlohmann::json MakeRecord(const Entry& e, SandboxState state) {
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

Status ParseRecord(const nlohmann::json& rec, Entry* e,
                   const std::function<std::vector<std::string>(const std::vector<std::string>&)>& pristine_of) {
  try {
    const std::string bname = rec.value("backend", std::string());
    e->info.id = rec.at("id").get<std::string>();
    e->info.backend = bname;
    e->info.state = SandboxState::kRunning;
    e->info.layer_digests = rec.at("layers").get<std::vector<std::string>>();
    e->info.layer_names = rec.value("layer_names", std::vector<std::string>());
    if (rec.contains("pristine_layers")) {
      e->info.pristine_layers = rec.at("pristine_layers").get<std::vector<std::string>>();
    } else {  // a record of an older daemon: the same rule as Create
      e->info.pristine_layers = pristine_of(e->info.layer_digests);
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
        if (absl::Base64Unescape(it.key(), &key) && absl::Base64Unescape(it.value().get<std::string>(), &val)) {
          e->spec.env[key] = val;
        }
      }
    }
    e->backend_record = rec.value("backend_record", nlohmann::json::object());
    e->transitions = rec.value("transitions", nlohmann::json::array());
    e->spec.request_id = rec.value("request_id", std::string());
  } catch (const std::exception& ex) {
    return absl::InvalidArgumentError(std::string("malformed record: ") + ex.what());
  }
  return absl::OkStatus();
}

}  // namespace warren::node
