#include "node/records/legacy_record.h"

#include "absl/strings/escaping.h"

namespace warren::node {

StatusOr<record::Sandbox> FromLegacyRecord(const nlohmann::json& j) {
  record::Sandbox r;
  try {
    r.set_version(1);
    r.set_id(j.value("id", std::string()));
    r.set_state(j.value("state", std::string()));
    r.set_paused(j.value("paused", false));
    r.set_suspended(j.value("suspended", false));
    r.set_backend(j.value("backend", std::string()));
    r.set_dir(j.value("dir", std::string()));
    if (r.state() == "running" && (!j.contains("layers") || !j.contains("resources"))) {
      return absl::InvalidArgumentError("malformed record: a running sandbox without layers or resources");
    }
    for (const auto& d : j.value("layers", std::vector<std::string>())) r.add_layers(d);
    for (const auto& d : j.value("layer_names", std::vector<std::string>())) r.add_layer_names(d);
    // Absent in the oldest records: the reader derives them (version < 2).
    for (const auto& d : j.value("pristine_layers", std::vector<std::string>())) r.add_pristine_layers(d);
    if (j.contains("resources")) {
      const auto& x = j.at("resources");
      record::Resources* res = r.mutable_resources();
      res->set_cpu_millis(x.at("cpu_millis").get<uint32_t>());
      res->set_memory_mb(x.at("memory_mb").get<uint32_t>());
      res->set_disk_mb(x.at("disk_mb").get<uint32_t>());
      res->set_pids(x.at("pids").get<uint32_t>());
      res->set_open_files(x.at("open_files").get<uint32_t>());
      res->set_tmpfs_mb(x.at("tmpfs_mb").get<uint32_t>());
    }
    if (j.contains("env_b64") && j["env_b64"].is_object()) {
      for (auto it = j["env_b64"].begin(); it != j["env_b64"].end(); ++it) {
        std::string key, val;
        if (absl::Base64Unescape(it.key(), &key) && absl::Base64Unescape(it.value().get<std::string>(), &val)) {
          (*r.mutable_env())[key] = val;
        }
      }
    }
    r.set_workdir(j.value("workdir", std::string("/")));
    r.set_user(j.value("user", std::string("root")));
    r.set_hostname(j.value("hostname", std::string()));
    for (const auto& [k, v] : j.value("labels", std::map<std::string, std::string>())) (*r.mutable_labels())[k] = v;
    r.set_job(j.value("job", std::string()));
    r.set_ttl_s(j.value("ttl_s", 0u));
    r.set_expires_at_ns(j.value("expires_at_ns", int64_t{0}));
    r.set_idle_timeout_s(j.value("idle_timeout_s", 0u));
    r.set_created_at_ns(j.value("created_at_ns", int64_t{0}));
    r.set_request_id(j.value("request_id", std::string()));
    for (const auto& t : j.value("transitions", nlohmann::json::array())) {
      record::Transition* tr = r.add_transitions();
      tr->set_state(t.value("state", std::string()));
      tr->set_at_ns(t.value("at_ns", int64_t{0}));
      tr->set_reason(t.value("reason", std::string()));
    }
    if (j.contains("backend_record") && j["backend_record"].is_object()) {
      r.set_backend_record(j["backend_record"].dump());
    }
  } catch (const std::exception& ex) {
    return absl::InvalidArgumentError(std::string("malformed record: ") + ex.what());
  }
  return r;
}

}  // namespace warren::node
