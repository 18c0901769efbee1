// E2B's REST API (the sandbox lifecycle part of its OpenAPI spec, as the
// SDK's generated client in e2b/api/client reads it) over SandboxManager.
//
// The timeout: a sandbox created with autoPause (the SDK's lifecycle
// on_timeout "pause") is suspended when it passes, not destroyed: it is the
// one sandbox of a job of its own ("e2b-autopause-<hex>") whose lease is the
// timeout; set_timeout and connect renew the lease (connect also resumes),
// kill destroys the job, and a sandbox left paused is destroyed
// kPausedKeepS after it paused. Any other sandbox's timeout is its TTL.
#include <httplib.h>
#include <time.h>

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "api/projects.h"
#include "common/secret.h"
#include "common/time.h"
#include "e2b/server.h"

namespace warren::e2b {
namespace {

using json = nlohmann::json;

// envd version the SDK gates features on (e2b/envd/versions.py): 0.4.0+
// sends no user when none is asked (the sandbox's own applies), 0.5.2+ may
// close stdin; below 0.5.7 uploads are multipart (no octet-stream, no gzip).
constexpr const char* kEnvdVersion = "0.5.2";
constexpr const char* kTemplateLabel = "e2b.template";
constexpr const char* kMetaPrefix = "e2b.meta.";
constexpr uint32_t kDefaultTimeoutS = 300;  // the SDK's and E2B's default
constexpr uint32_t kMaxTimeoutS = 86400;    // E2B's maximum (24 h)
// autoPause: the label that marks it, the job name's prefix, and how long a
// sandbox paused by its timeout is kept (the job's grace).
constexpr const char* kOnTimeoutLabel = "e2b.on_timeout";
constexpr const char* kAutoPauseJobPrefix = "e2b-autopause-";
constexpr uint32_t kPausedKeepS = 86400;

// E2B's error body: {"code": <HTTP status>, "message"}.
void Reply(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(json{{"code", status}, {"message", message}}.dump(), "application/json");
}

void ReplyStatus(httplib::Response& res, const Status& s) {
  int status = 500;
  switch (s.code()) {
    case absl::StatusCode::kNotFound: status = 404; break;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: status = 400; break;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists: status = 409; break;
    case absl::StatusCode::kResourceExhausted: status = 429; break;
    case absl::StatusCode::kPermissionDenied: status = 403; break;
    case absl::StatusCode::kUnavailable: status = 503; break;
    case absl::StatusCode::kDeadlineExceeded: status = 504; break;
    default: break;
  }
  Reply(res, status, std::string(s.message()));
}

std::string Rfc3339(int64_t unix_ns) {
  const time_t t = static_cast<time_t>(unix_ns / 1000000000);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

json Metadata(const node::SandboxInfo& info) {
  json m = json::object();
  for (const auto& [k, v] : info.labels) {
    if (k.rfind(kMetaPrefix, 0) == 0) m[k.substr(std::char_traits<char>::length(kMetaPrefix))] = v;
  }
  return m;
}

bool IsE2b(const node::SandboxInfo& info) { return info.labels.count(kTemplateLabel) != 0; }

// Whether `info` pauses at its timeout (autoPause): it is then its job's.
bool AutoPauses(const node::SandboxInfo& info) {
  const auto it = info.labels.find(kOnTimeoutLabel);
  return it != info.labels.end() && it->second == "pause" && !info.job.empty();
}

// When the sandbox's timeout passes (unix ns; 0 = never): its TTL, or its
// job's lease for an autoPause sandbox.
int64_t EndNs(E2bState& st, const node::SandboxInfo& info) {
  if (!AutoPauses(info)) return info.expires_at_ns;
  StatusOr<node::JobInfo> job = st.manager().GetJob(info.job);
  return job.ok() ? job->lease_expires_at_ns : 0;
}

// SandboxDetail / ListedSandbox.
json Detail(const node::SandboxInfo& info, int64_t end_ns) {
  const auto tmpl = info.labels.find(kTemplateLabel);
  const bool paused = info.state == node::SandboxState::kPaused || info.state == node::SandboxState::kSuspended;
  return json{{"templateID", tmpl == info.labels.end() ? "" : tmpl->second},
              {"sandboxID", info.id},
              {"clientID", "warren"},
              {"startedAt", Rfc3339(info.created_at_ns)},
              {"endAt", Rfc3339(end_ns != 0 ? end_ns : info.created_at_ns)},
              {"envdVersion", kEnvdVersion},
              {"cpuCount", (info.resources.cpu_millis + 999) / 1000},
              {"memoryMB", info.resources.memory_mb},
              {"diskSizeMB", info.resources.disk_mb},
              {"state", paused ? "paused" : "running"},
              {"lifecycle", {{"onTimeout", AutoPauses(info) ? "pause" : "kill"}, {"autoResume", false}}},
              {"metadata", Metadata(info)}};
}

// The `Sandbox` answer of create, connect and resume.
json SandboxJson(const node::SandboxInfo& info, const std::string& token) {
  const auto tmpl = info.labels.find(kTemplateLabel);
  return json{{"templateID", tmpl == info.labels.end() ? "" : tmpl->second},
              {"sandboxID", info.id},
              {"clientID", "warren"},
              {"envdVersion", kEnvdVersion},
              {"envdAccessToken", token}};
}

// The project the request's API key acts for ("" = every project), in
// *project; false after answering the 401 E2B answers.
bool Authorized(const E2bState& st, const httplib::Request& req, httplib::Response& res, std::string* project) {
  if (!req.has_header("X-API-KEY")) {
    Reply(res, 401, "missing X-API-KEY header (E2B_API_KEY)");
    return false;
  }
  StatusOr<std::string> p = st.KeyProject(req.get_header_value("X-API-KEY"));
  if (!p.ok()) {
    Reply(res, 401, std::string(p.status().message()));
    return false;
  }
  *project = *std::move(p);
  return true;
}

// The JSON body, or a 400 naming what is wrong.
bool Body(const httplib::Request& req, httplib::Response& res, json* out) {
  *out = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
  if (out->is_discarded() || !out->is_object()) {
    Reply(res, 400, "request body is not a JSON object");
    return false;
  }
  return true;
}

// A timeout field in seconds within (0, kMaxTimeoutS], else a 400 naming it.
bool Seconds(const json& body, const char* key, uint32_t dflt, httplib::Response& res, uint32_t* out) {
  *out = dflt;
  if (!body.contains(key) || body[key].is_null()) return true;
  if (!body[key].is_number_integer() || body[key].get<int64_t>() < 0 || body[key].get<int64_t>() > kMaxTimeoutS) {
    Reply(res, 400,
          std::string(key) + " must be an integer number of seconds in [0, " + std::to_string(kMaxTimeoutS) +
              "], got " + body[key].dump());
    return false;
  }
  *out = static_cast<uint32_t>(body[key].get<int64_t>());
  return true;
}

// Whether a caller acting for `project` sees `info`: an E2B sandbox of
// that project or one below it.
bool Visible(const node::SandboxInfo& info, const std::string& project) {
  return IsE2b(info) && api::InProject(project, api::ProjectOf(info));
}

// An E2B sandbox of this node that `project` sees: NotFound for any other
// id (the same answer whether it exists in another project or not at all).
StatusOr<node::SandboxInfo> Find(E2bState& st, const std::string& id, const std::string& project) {
  StatusOr<node::SandboxInfo> info = st.manager().Get(id);
  if (!info.ok() || !Visible(*info, project)) return absl::NotFoundError("sandbox \"" + id + "\" not found");
  return info;
}

void Create(E2bState& st, const httplib::Request& req, httplib::Response& res) {
  std::string project;
  if (!Authorized(st, req, res, &project)) return;
  json body;
  if (!Body(req, res, &body)) return;
  if (!body.contains("templateID") || !body["templateID"].is_string())
    return Reply(res, 400, "templateID (a string) is required");
  StatusOr<std::pair<std::string, std::vector<std::string>>> tmpl =
      st.templates().Resolve(body["templateID"].get<std::string>());
  if (!tmpl.ok()) return ReplyStatus(res, tmpl.status());
  node::CreateRequest r;
  r.layers = tmpl->second;
  uint32_t timeout = 0;
  if (!Seconds(body, "timeout", kDefaultTimeoutS, res, &timeout)) return;
  r.ttl_s = timeout == 0 ? kDefaultTimeoutS : timeout;
  r.labels[kTemplateLabel] = tmpl->first;
  bool auto_pause = false;
  if (body.contains("autoPause") && !body["autoPause"].is_null()) {
    if (!body["autoPause"].is_boolean())
      return Reply(res, 400, "autoPause must be a boolean, got " + body["autoPause"].dump());
    auto_pause = body["autoPause"].get<bool>();
  }
  for (const char* field : {"metadata", "envVars"}) {
    if (!body.contains(field) || body[field].is_null()) continue;
    if (!body[field].is_object()) return Reply(res, 400, std::string(field) + " must be an object of strings");
    for (const auto& [k, v] : body[field].items()) {
      if (!v.is_string()) return Reply(res, 400, std::string(field) + "[\"" + k + "\"] is not a string");
      if (field[0] == 'm') {
        r.labels[kMetaPrefix + k] = v.get<std::string>();
      } else {
        r.env[k] = v.get<std::string>();
      }
    }
  }
  // A project's create carries its label and holds its share of the
  // project's quotas (cluster-wide) while it runs, as warren.v1's.
  StatusOr<std::unique_ptr<api::QuotaHold>> quota = api::AdmitCreate(st.options().projects, st.manager(), project, &r);
  if (!quota.ok()) {
    // A quota holds until one of the project's sandboxes goes: the SDK,
    // which retries a bare 429, is told not to (E2B's Should-Retry header).
    if (quota.status().code() == absl::StatusCode::kResourceExhausted) res.set_header("Should-Retry", "false");
    return ReplyStatus(res, quota.status());
  }
  if (auto_pause) {
    // Its own job, whose lease is the timeout, instead of a TTL.
    r.job = kAutoPauseJobPrefix + RandomHex(12);
    r.labels[kOnTimeoutLabel] = "pause";
    if (StatusOr<node::JobInfo> job = st.manager().JobHeartbeat(r.job, r.ttl_s, kPausedKeepS); !job.ok())
      return ReplyStatus(res, job.status());
    r.ttl_s = 0;
  }
  StatusOr<node::SandboxInfo> info = st.manager().Create(r);
  if (!info.ok()) {
    if (auto_pause) (void)st.manager().DestroyJob(r.job, "e2b create failed");  // forgets its lease
    return ReplyStatus(res, info.status());
  }
  res.status = 201;
  res.set_content(SandboxJson(*info, st.NewAccessToken(info->id)).dump(), "application/json");
}

void List(E2bState& st, const httplib::Request& req, httplib::Response& res) {
  std::string project;
  if (!Authorized(st, req, res, &project)) return;
  // metadata filter: "k1=v1&k2=v2" (URL-encoded once more as a query value).
  std::map<std::string, std::string> labels;
  const std::string meta = req.has_param("metadata") ? req.get_param_value("metadata") : "";
  for (absl::string_view kv : absl::StrSplit(meta, '&', absl::SkipEmpty())) {
    const size_t eq = kv.find('=');
    if (eq == absl::string_view::npos) return Reply(res, 400, "metadata filter \"" + meta + "\" is not k=v&k=v");
    labels[kMetaPrefix + httplib::detail::decode_url(std::string(kv.substr(0, eq)), true)] =
        httplib::detail::decode_url(std::string(kv.substr(eq + 1)), true);
  }
  const std::string states = req.has_param("state") ? req.get_param_value("state") : "";
  json out = json::array();
  for (const node::SandboxInfo& info : st.manager().List(labels, "")) {
    if (!Visible(info, project)) continue;
    json d = Detail(info, EndNs(st, info));
    if (!states.empty() && states.find(d["state"].get<std::string>()) == std::string::npos) continue;
    out.push_back(std::move(d));
  }
  res.set_content(out.dump(), "application/json");
}

void Get(E2bState& st, const httplib::Request& req, httplib::Response& res) {
  std::string project;
  if (!Authorized(st, req, res, &project)) return;
  StatusOr<node::SandboxInfo> info = Find(st, req.matches[1], project);
  if (!info.ok()) return ReplyStatus(res, info.status());
  res.set_content(Detail(*info, EndNs(st, *info)).dump(), "application/json");
}

void Kill(E2bState& st, const httplib::Request& req, httplib::Response& res) {
  std::string project;
  if (!Authorized(st, req, res, &project)) return;
  const std::string id = req.matches[1];
  StatusOr<node::SandboxInfo> info = Find(st, id, project);
  if (!info.ok()) return ReplyStatus(res, info.status());
  if (AutoPauses(*info)) {
    // The sandbox and its job's lease go together.
    if (st.manager().DestroyJob(info->job, "e2b kill") == 0) return Reply(res, 404, "sandbox \"" + id + "\" not found");
  } else if (Status s = st.manager().Destroy(id); !s.ok()) {
    return ReplyStatus(res, s);
  }
  st.Forget(id);
  res.status = 204;
}

// POST /sandboxes/{id}/timeout {"timeout": s} and /refreshes {"duration": s}:
// the sandbox now ends that many seconds from now.
void SetTimeout(E2bState& st, const httplib::Request& req, httplib::Response& res, const char* field) {
  std::string project;
  if (!Authorized(st, req, res, &project)) return;
  json body;
  if (!Body(req, res, &body)) return;
  uint32_t s = 0;
  if (!Seconds(body, field, kDefaultTimeoutS, res, &s)) return;
  const std::string id = req.matches[1];
  StatusOr<node::SandboxInfo> info = Find(st, id, project);
  if (!info.ok()) return ReplyStatus(res, info.status());
  // 0 would mean "no TTL" (or "keep the lease") to warren; to E2B it is "end
  // now", the shortest.
  const uint32_t ttl = s == 0 ? 1 : s;
  if (AutoPauses(*info)) {
    if (StatusOr<node::JobInfo> job = st.manager().JobHeartbeat(info->job, ttl, 0); !job.ok())
      return ReplyStatus(res, job.status());
  } else if (StatusOr<node::SandboxInfo> ext = st.manager().ExtendTtl(id, ttl); !ext.ok()) {
    return ReplyStatus(res, ext.status());
  }
  res.status = 204;
}

void Pause(E2bState& st, const httplib::Request& req, httplib::Response& res) {
  std::string project;
  if (!Authorized(st, req, res, &project)) return;
  const std::string id = req.matches[1];
  StatusOr<node::SandboxInfo> info = Find(st, id, project);
  if (!info.ok()) return ReplyStatus(res, info.status());
  if (info->state == node::SandboxState::kPaused || info->state == node::SandboxState::kSuspended)
    return Reply(res, 409, "sandbox \"" + id + "\" is already paused");
  if (Status s = st.manager().Pause(id); !s.ok()) return ReplyStatus(res, s);
  // E2B keeps a paused sandbox until it is resumed (its timeout starts again
  // then): here for kPausedKeepS. An autoPause sandbox's lease runs on (when
  // it lapses the sandbox is suspended, and kept as long).
  if (!AutoPauses(*info)) {
    if (StatusOr<node::SandboxInfo> kept = st.manager().ExtendTtl(id, kPausedKeepS); !kept.ok())
      return ReplyStatus(res, kept.status());
  }
  res.status = 204;
}

// POST /sandboxes/{id}/resume (201) and /[v2/]sandboxes/{id}/connect (200):
// the sandbox runs again (a no-op when it runs), with {"timeout": s} its TTL
// from now; the answer carries its envd access token.
void Resume(E2bState& st, const httplib::Request& req, httplib::Response& res, int ok_status) {
  std::string project;
  if (!Authorized(st, req, res, &project)) return;
  json body;
  if (!Body(req, res, &body)) return;
  uint32_t s = 0;
  if (!Seconds(body, "timeout", 0, res, &s)) return;
  const std::string id = req.matches[1];
  StatusOr<node::SandboxInfo> before = Find(st, id, project);
  if (!before.ok()) return ReplyStatus(res, before.status());
  if (Status r = st.manager().Resume(id); !r.ok()) return ReplyStatus(res, r);
  // A running sandbox's end only moves later (E2B's connect); a paused one's
  // timeout starts again (E2B's default when none is asked).
  const bool was_running = before->state == node::SandboxState::kRunning;
  if (s == 0 && !was_running && !AutoPauses(*before)) s = kDefaultTimeoutS;
  const int64_t asked_end = WallNowNs() + int64_t{s} * 1000000000;
  if (AutoPauses(*before)) {
    // The lease starts again (0: as long as before), so that it does not
    // pause the sandbox again at once; a running sandbox's only moves later.
    const int64_t end = EndNs(st, *before);
    if (!(was_running && s != 0 && end >= asked_end)) {
      if (StatusOr<node::JobInfo> job = st.manager().JobHeartbeat(before->job, s, 0); !job.ok())
        return ReplyStatus(res, job.status());
    }
  } else if (s != 0 && !(was_running && (before->expires_at_ns == 0 || before->expires_at_ns >= asked_end))) {
    if (StatusOr<node::SandboxInfo> info = st.manager().ExtendTtl(id, s); !info.ok())
      return ReplyStatus(res, info.status());
  }
  StatusOr<node::SandboxInfo> info = Find(st, id, project);
  if (!info.ok()) return ReplyStatus(res, info.status());
  res.status = ok_status;
  res.set_content(SandboxJson(*info, st.AccessToken(id)).dump(), "application/json");
}

}  // namespace

void AddLifecycleRoutes(httplib::Server& server, const std::shared_ptr<E2bState>& state) {
  auto h = [state](void (*f)(E2bState&, const httplib::Request&, httplib::Response&)) {
    return [state, f](const httplib::Request& req, httplib::Response& res) { f(*state, req, res); };
  };
  server.Post("/sandboxes", h(Create));
  server.Post("/v2/sandboxes", h(Create));
  server.Get("/sandboxes", h(List));
  server.Get("/v2/sandboxes", h(List));
  server.Get(R"(/sandboxes/([^/]+))", h(Get));
  server.Delete(R"(/sandboxes/([^/]+))", h(Kill));
  server.Post(R"(/sandboxes/([^/]+)/timeout)", [state](const httplib::Request& req, httplib::Response& res) {
    SetTimeout(*state, req, res, "timeout");
  });
  server.Post(R"(/sandboxes/([^/]+)/refreshes)", [state](const httplib::Request& req, httplib::Response& res) {
    SetTimeout(*state, req, res, "duration");
  });
  server.Post(R"(/sandboxes/([^/]+)/pause)", h(Pause));
  server.Post(R"(/sandboxes/([^/]+)/resume)",
              [state](const httplib::Request& req, httplib::Response& res) { Resume(*state, req, res, 201); });
  server.Post(R"((?:/v2)?/sandboxes/([^/]+)/connect)",
              [state](const httplib::Request& req, httplib::Response& res) { Resume(*state, req, res, 200); });
}

}  // namespace warren::e2b
