#include "node/records/sandbox_record.h"

namespace warren::node {

namespace {
constexpr uint32_t kRecordVersion = 2;

runtime::Resources ResourcesOf(const record::Resources& r) {
  return runtime::Resources{r.cpu_millis(), r.memory_mb(), r.disk_mb(), r.pids(), r.open_files(), r.tmpfs_mb()};
}
}  // namespace

void AddTransition(Entry& e, SandboxState s, const std::string& reason) {
  record::Transition* t = e.transitions.Add();
  t->set_state(SandboxStateName(s));
  t->set_at_ns(WallNowNs());
  t->set_reason(reason);
}

record::Sandbox MakeRecord(const Entry& e, SandboxState state) {
  record::Sandbox r;
  const bool paused = state == SandboxState::kPaused || state == SandboxState::kSuspended;
  r.set_version(kRecordVersion);
  r.set_id(e.info.id);
  r.set_state(SandboxStateName(paused ? SandboxState::kRunning : state));
  r.set_paused(paused);
  r.set_suspended(state == SandboxState::kSuspended);
  r.set_backend(e.info.backend);
  r.set_dir(e.dir);
  for (const std::string& d : e.info.layer_digests) r.add_layers(d);
  for (const std::string& n : e.info.layer_names) r.add_layer_names(n);
  for (const std::string& d : e.info.pristine_layers) r.add_pristine_layers(d);
  const runtime::Resources& res = e.info.resources;
  record::Resources* rr = r.mutable_resources();
  rr->set_cpu_millis(res.cpu_millis);
  rr->set_memory_mb(res.memory_mb);
  rr->set_disk_mb(res.disk_mb);
  rr->set_pids(res.pids);
  rr->set_open_files(res.open_files);
  rr->set_tmpfs_mb(res.tmpfs_mb);
  for (const auto& [k, v] : e.spec.env) (*r.mutable_env())[k] = v;
  r.set_workdir(e.spec.workdir);
  r.set_user(e.spec.user);
  r.set_hostname(e.info.hostname);
  for (const auto& [k, v] : e.info.labels) (*r.mutable_labels())[k] = v;
  r.set_job(e.info.job);
  r.set_ttl_s(e.info.ttl_s);
  r.set_expires_at_ns(e.info.expires_at_ns);
  r.set_idle_timeout_s(e.info.idle_timeout_s);
  r.set_created_at_ns(e.info.created_at_ns);
  r.set_request_id(e.spec.request_id);
  *r.mutable_transitions() = e.transitions;
  r.set_backend_record(e.backend_record);
  if (e.info.qos != runtime::Qos::kLatency) r.set_qos(runtime::QosName(e.info.qos));
  return r;
}

void ParseRecord(const record::Sandbox& r, Entry* e,
                 const std::function<std::vector<std::string>(const std::vector<std::string>&)>& pristine_of) {
  e->info.id = r.id();
  e->info.backend = r.backend();
  e->info.state = r.suspended() ? SandboxState::kSuspended
                  : r.paused()  ? SandboxState::kPaused
                                : SandboxState::kRunning;
  e->info.layer_digests.assign(r.layers().begin(), r.layers().end());
  e->info.layer_names.assign(r.layer_names().begin(), r.layer_names().end());
  e->info.pristine_layers.assign(r.pristine_layers().begin(), r.pristine_layers().end());
  if (r.version() < kRecordVersion && e->info.pristine_layers.empty()) {
    e->info.pristine_layers = pristine_of(e->info.layer_digests);  // the same rule as Create
  }
  e->info.resources = ResourcesOf(r.resources());
  if (!runtime::ParseQos(r.qos(), &e->info.qos)) e->info.qos = runtime::Qos::kLatency;
  e->info.labels = std::map<std::string, std::string>(r.labels().begin(), r.labels().end());
  e->info.job = r.job();
  e->info.hostname = r.hostname();
  e->info.ttl_s = r.ttl_s();
  e->info.created_at_ns = r.created_at_ns();
  e->info.expires_at_ns = r.expires_at_ns();
  e->info.idle_timeout_s = r.idle_timeout_s();
  e->info.last_activity_ns = WallNowNs();  // idle time restarts with the daemon
  e->spec.backend = r.backend();
  e->spec.layers = e->info.layer_names;
  e->spec.resources = e->info.resources;
  e->spec.qos = runtime::QosName(e->info.qos);
  e->spec.env = std::map<std::string, std::string>(r.env().begin(), r.env().end());
  e->spec.workdir = r.workdir().empty() ? "/" : r.workdir();
  e->spec.user = r.user().empty() ? "root" : r.user();
  e->spec.hostname = e->info.hostname;
  e->spec.labels = e->info.labels;
  e->spec.job = e->info.job;
  e->spec.ttl_s = e->info.ttl_s;
  e->spec.idle_timeout_s = e->info.idle_timeout_s;
  e->spec.request_id = r.request_id();
  e->backend_record = r.backend_record();
  e->transitions = r.transitions();
}

runtime::SandboxSpec SpecOf(const record::Sandbox& r) {
  runtime::SandboxSpec s;
  s.id = r.id();
  s.dir = r.dir();
  s.resources = ResourcesOf(r.resources());
  if (!runtime::ParseQos(r.qos(), &s.qos)) s.qos = runtime::Qos::kLatency;
  s.env = std::map<std::string, std::string>(r.env().begin(), r.env().end());
  s.workdir = r.workdir().empty() ? "/" : r.workdir();
  s.user = r.user().empty() ? "root" : r.user();
  s.hostname = r.hostname();
  return s;
}

}  // namespace warren::node
