// envd's filesystem service (filesystem.proto, package `filesystem`, service
// `Filesystem`): Stat, ListDir, MakeDir, Move and Remove as unary Connect
// calls over the sandbox's SandboxFiles, which resolves every path inside
// the sandbox root (never on the host); directory watches (dir_watch.h) as
// CreateWatcher / GetWatcherEvents / RemoveWatcher (the sync SDK's
// files.watch_dir) and the WatchDir server stream (the async SDK's).
#include <httplib.h>
#include <time.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2b/connect.h"
#include "e2b/dir_watch.h"
#include "e2b/server.h"

namespace warren::e2b {
namespace {

using json = nlohmann::json;

constexpr uint32_t kMaxDepth = 16;                                // ListDir depth bound
constexpr auto kWatchPollEvery = std::chrono::milliseconds(250);  // WatchDir stream

const char* TypeName(runtime::FileType t) {
  switch (t) {
    case runtime::FileType::kRegular: return "FILE_TYPE_FILE";
    case runtime::FileType::kDirectory: return "FILE_TYPE_DIRECTORY";
    case runtime::FileType::kSymlink: return "FILE_TYPE_SYMLINK";
    default: return "FILE_TYPE_UNSPECIFIED";
  }
}

// Go's fs.FileMode.String() of the permission bits ("-rw-r--r--").
std::string Permissions(const runtime::FileInfo& fi) {
  std::string s = fi.type == runtime::FileType::kDirectory ? "d" : fi.type == runtime::FileType::kSymlink ? "L" : "-";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) s.push_back((fi.mode & (0400u >> i)) != 0 ? rwx[i] : '-');
  return s;
}

std::string Rfc3339Ns(int64_t ns) {
  const time_t t = static_cast<time_t>(ns / 1000000000);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[48];
  const size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + n, sizeof buf - n, ".%09lldZ", static_cast<long long>(ns % 1000000000));
  return buf;
}

std::string Name(uint32_t id) { return id == 0 ? "root" : std::to_string(id); }

json Entry(const runtime::FileInfo& fi) {
  json e = {{"name", fi.name},
            {"type", TypeName(fi.type)},
            {"path", fi.path},
            {"size", std::to_string(fi.size)},
            {"mode", fi.mode},
            {"permissions", Permissions(fi)},
            {"owner", Name(fi.uid)},
            {"group", Name(fi.gid)},
            {"modifiedTime", Rfc3339Ns(fi.mtime_ns)},
            {"isSymlink", fi.type == runtime::FileType::kSymlink}};
  if (fi.type == runtime::FileType::kSymlink) e["symlinkTarget"] = fi.symlink_target;
  return e;
}

StatusOr<std::string> PathField(const json& msg, const char* key) {
  if (!msg.contains(key) || !msg[key].is_string() || msg[key].get<std::string>().empty())
    return absl::InvalidArgumentError(std::string(key) + " is missing or empty");
  std::string p = msg[key].get<std::string>();
  if (p.find('\0') != std::string::npos) return absl::InvalidArgumentError(std::string(key) + " contains NUL");
  if (p.size() > 4096) return absl::InvalidArgumentError(std::string(key) + " is longer than 4096 bytes");
  return p;
}

StatusOr<std::shared_ptr<runtime::Sandbox>> Sandbox(E2bState& st, const std::string& id) {
  return st.manager().Running(id);
}

void Audit(E2bState& st, const std::string& id, const char* op, const std::string& path, const Status& s) {
  json a = {{"op", op}, {"path", path}, {"via", "e2b"}};
  if (!s.ok()) a["error"] = s.ToString();
  st.manager().Audit(id, a);
}

StatusOr<json> Stat(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(std::string path, PathField(msg, "path"));
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, Sandbox(st, id));
  StatusOr<runtime::FileInfo> fi = sb->files().Stat(path);
  Audit(st, id, "stat", path, fi.status());
  if (!fi.ok()) return fi.status();
  return json{{"entry", Entry(*fi)}};
}

Status ListInto(runtime::SandboxFiles& files, const std::string& path, uint32_t depth, json* out) {
  ASSIGN_OR_RETURN(std::vector<runtime::FileInfo> entries, files.List(path));
  for (const runtime::FileInfo& fi : entries) {
    out->push_back(Entry(fi));
    if (depth > 1 && fi.type == runtime::FileType::kDirectory)
      RETURN_IF_ERROR(ListInto(files, fi.path, depth - 1, out));
  }
  return absl::OkStatus();
}

StatusOr<json> ListDir(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(std::string path, PathField(msg, "path"));
  uint32_t depth = 1;
  if (msg.contains("depth") && !msg["depth"].is_null()) {
    if (!msg["depth"].is_number_unsigned() || msg["depth"].get<uint64_t>() > kMaxDepth)
      return absl::InvalidArgumentError("depth must be an integer in [0, " + std::to_string(kMaxDepth) + "]");
    depth = std::max<uint32_t>(1, msg["depth"].get<uint32_t>());
  }
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, Sandbox(st, id));
  json entries = json::array();
  Status s = ListInto(sb->files(), path, depth, &entries);
  Audit(st, id, "list", path, s);
  RETURN_IF_ERROR(s);
  return json{{"entries", entries}};
}

// envd creates missing parents and answers AlreadyExists for an existing path.
StatusOr<json> MakeDir(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(std::string path, PathField(msg, "path"));
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, Sandbox(st, id));
  if (sb->files().Stat(path).ok()) return absl::AlreadyExistsError("directory \"" + path + "\" already exists");
  Status s = sb->files().Mkdir(path, 0755, /*parents=*/true);
  Audit(st, id, "mkdir", path, s);
  RETURN_IF_ERROR(s);
  ASSIGN_OR_RETURN(runtime::FileInfo fi, sb->files().Stat(path));
  return json{{"entry", Entry(fi)}};
}

StatusOr<json> Move(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(std::string from, PathField(msg, "source"));
  ASSIGN_OR_RETURN(std::string to, PathField(msg, "destination"));
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, Sandbox(st, id));
  Status s = sb->files().Rename(from, to);
  Audit(st, id, "rename", from, s);
  RETURN_IF_ERROR(s);
  ASSIGN_OR_RETURN(runtime::FileInfo fi, sb->files().Stat(to));
  return json{{"entry", Entry(fi)}};
}

StatusOr<json> Remove(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(std::string path, PathField(msg, "path"));
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, Sandbox(st, id));
  Status s = sb->files().Remove(path, /*recursive=*/true);
  Audit(st, id, "remove", path, s);
  RETURN_IF_ERROR(s);
  return json::object();
}

json EventJson(const WatchEvent& e, bool include_entry) {
  json j = {{"name", e.name}, {"type", WatchEventTypeName(e.type)}};
  if (include_entry && e.type != WatchEventType::kRemove) j["entry"] = Entry(e.info);
  return j;
}

// CreateWatcherRequest / WatchDirRequest {path, recursive, include_entry,
// allow_network_mounts}: the watch, its baseline listed.
StatusOr<std::unique_ptr<DirWatch>> StartWatch(E2bState& st, const std::string& id, const json& msg,
                                               bool* include_entry) {
  ASSIGN_OR_RETURN(std::string path, PathField(msg, "path"));
  for (const char* key : {"recursive", "includeEntry", "allowNetworkMounts"}) {
    if (msg.contains(key) && !msg[key].is_null() && !msg[key].is_boolean())
      return absl::InvalidArgumentError(std::string(key) + " must be a boolean");
  }
  const bool recursive = msg.value("recursive", false);
  *include_entry = msg.value("includeEntry", false);
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, Sandbox(st, id));
  StatusOr<std::unique_ptr<DirWatch>> w = DirWatch::Start(sb->files(), path, recursive);
  Audit(st, id, "watch", path, w.status());
  return w;
}

StatusOr<std::string> WatcherId(const json& msg) {
  if (!msg.contains("watcherId") || !msg["watcherId"].is_string() || msg["watcherId"].get<std::string>().empty())
    return absl::InvalidArgumentError("watcherId is missing or empty");
  return msg["watcherId"].get<std::string>();
}

StatusOr<json> CreateWatcher(E2bState& st, const std::string& id, const json& msg) {
  auto w = std::make_shared<WatcherTable::Watcher>();
  ASSIGN_OR_RETURN(w->watch, StartWatch(st, id, msg, &w->include_entry));
  ASSIGN_OR_RETURN(std::string watcher, st.watchers().Add(id, std::move(w)));
  return json{{"watcherId", watcher}};
}

// The changes since the previous call (or the watcher's creation). A
// watch that failed (its directory removed) answers its error, and is over.
StatusOr<json> GetWatcherEvents(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(std::string watcher, WatcherId(msg));
  ASSIGN_OR_RETURN(std::shared_ptr<WatcherTable::Watcher> w, st.watchers().Find(id, watcher));
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, Sandbox(st, id));
  std::lock_guard<std::mutex> lock(w->mu);
  StatusOr<std::vector<WatchEvent>> events = w->watch->Poll(sb->files());
  if (!events.ok()) {
    (void)st.watchers().Remove(id, watcher);
    return events.status();
  }
  json out = json::array();
  for (const WatchEvent& e : *events) out.push_back(EventJson(e, w->include_entry));
  return json{{"events", out}};
}

StatusOr<json> RemoveWatcher(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(std::string watcher, WatcherId(msg));
  RETURN_IF_ERROR(st.watchers().Remove(id, watcher));
  return json::object();
}

// WatchDir: a start event, then the changes as `filesystem` events, polled
// every kWatchPollEvery while the sandbox runs (a paused sandbox is neither
// resumed nor polled); keepalives as the client asks (Keepalive-Ping-Interval).
// Ends with the watch's error (its directory removed, the sandbox gone).
void WatchDir(E2bState& st, const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
  auto fail = [&res](const Status& s) {
    res.status = 200;
    res.set_content(EndStream(s), "application/connect+json");
  };
  StatusOr<std::string> body = ReadBody(reader, res, st.options().max_body_bytes);
  if (!body.ok()) return fail(body.status());
  StatusOr<std::string> id = Addressed(st, req);
  if (!id.ok()) return fail(id.status());
  StatusOr<json> msg = FirstMessage(*body);
  if (!msg.ok()) return fail(msg.status());
  StatusOr<std::chrono::seconds> keepalive = KeepaliveInterval(req);
  if (!keepalive.ok()) return fail(keepalive.status());
  struct Stream {
    E2bState* st;
    std::string id;
    std::unique_ptr<DirWatch> watch;
    std::shared_ptr<runtime::Sandbox> sb;
    bool include_entry = false;
    bool started = false;
    std::chrono::seconds keepalive;
    std::chrono::steady_clock::time_point last_event{};
  };
  auto s = std::make_shared<Stream>();
  s->st = &st;
  s->id = *id;
  s->keepalive = *keepalive;
  StatusOr<std::unique_ptr<DirWatch>> w = StartWatch(st, *id, *msg, &s->include_entry);
  if (!w.ok()) return fail(w.status());
  s->watch = *std::move(w);
  StatusOr<std::shared_ptr<runtime::Sandbox>> sb = Sandbox(st, *id);
  if (!sb.ok()) return fail(sb.status());
  s->sb = *std::move(sb);
  res.set_chunked_content_provider("application/connect+json", [s](size_t, httplib::DataSink& sink) {
    auto write = [&sink, &s](const std::string& bytes) {
      s->last_event = std::chrono::steady_clock::now();
      return sink.write(bytes.data(), bytes.size());
    };
    if (!s->started) {
      s->started = true;
      return write(Envelope(json{{"start", json::object()}}));
    }
    std::this_thread::sleep_for(kWatchPollEvery);
    if (!sink.is_writable()) return false;
    StatusOr<node::SandboxInfo> info = s->st->manager().Get(s->id);
    if (!info.ok()) {
      (void)write(EndStream(absl::NotFoundError("sandbox " + s->id + " is gone")));
      sink.done();
      return true;
    }
    if (info->state == node::SandboxState::kRunning) {
      StatusOr<std::vector<WatchEvent>> events = s->watch->Poll(s->sb->files());
      if (!events.ok()) {
        (void)write(EndStream(events.status()));
        sink.done();
        return true;
      }
      for (const WatchEvent& e : *events) {
        if (!write(Envelope(json{{"filesystem", EventJson(e, s->include_entry)}}))) return false;
      }
    }
    if (s->keepalive.count() > 0 && std::chrono::steady_clock::now() - s->last_event >= s->keepalive)
      return write(Envelope(json{{"keepalive", json::object()}}));
    return true;
  });
}

}  // namespace

void AddFilesystemRoutes(httplib::Server& server, const std::shared_ptr<E2bState>& state) {
  auto unary = [state](UnaryFn f) {
    return [state, f](const httplib::Request& req, httplib::Response& res) { ConnectUnary(*state, req, res, f); };
  };
  server.Post("/filesystem.Filesystem/Stat", unary(Stat));
  server.Post("/filesystem.Filesystem/ListDir", unary(ListDir));
  server.Post("/filesystem.Filesystem/MakeDir", unary(MakeDir));
  server.Post("/filesystem.Filesystem/Move", unary(Move));
  server.Post("/filesystem.Filesystem/Remove", unary(Remove));
  server.Post("/filesystem.Filesystem/CreateWatcher", unary(CreateWatcher));
  server.Post("/filesystem.Filesystem/GetWatcherEvents", unary(GetWatcherEvents));
  server.Post("/filesystem.Filesystem/RemoveWatcher", unary(RemoveWatcher));
  server.Post("/filesystem.Filesystem/WatchDir",  // a streaming call: its request comes chunked (StreamsBody)
              [state](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                WatchDir(*state, req, res, reader);
              });
}

}  // namespace warren::e2b
