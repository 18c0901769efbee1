// envd's filesystem service (filesystem.proto, package `filesystem`, service
// `Filesystem`): Stat, ListDir, MakeDir, Move and Remove as unary Connect
// calls over the sandbox's SandboxFiles, which resolves every path inside
// the sandbox root (never on the host). Watches are not served.
#include <httplib.h>
#include <time.h>

#include <string>

#include <nlohmann/json.hpp>

#include "e2b/server.h"

namespace warren::e2b {
namespace {

using json = nlohmann::json;

constexpr uint32_t kMaxDepth = 16;  // ListDir depth bound

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
}

}  // namespace warren::e2b
