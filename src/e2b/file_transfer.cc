// envd's HTTP file transfer (`/files`, envd's OpenAPI spec): GET ?path= answers
// the file's bytes; POST with a multipart/form-data body (field "file", the
// file name being its path when several are sent, else ?path=) or an
// application/octet-stream body (?path=) writes files, creating missing
// parents, and answers [{name, type, path}]. Paths are resolved inside the
// sandbox by SandboxFiles, as warren's own files API does.
#include <httplib.h>

#include <string>

#include <nlohmann/json.hpp>

#include "e2b/server.h"

namespace warren::e2b {
namespace {

using json = nlohmann::json;

constexpr size_t kReadChunk = 1 << 20;

// envd's error body {code: HTTP status, message}.
void Fail(httplib::Response& res, const Status& s) {
  int status = 500;
  switch (s.code()) {
    case absl::StatusCode::kNotFound: status = 404; break;
    case absl::StatusCode::kInvalidArgument: status = 400; break;
    case absl::StatusCode::kUnauthenticated: status = 401; break;
    case absl::StatusCode::kPermissionDenied: status = 403; break;
    case absl::StatusCode::kResourceExhausted: status = 507; break;
    case absl::StatusCode::kFailedPrecondition: status = 400; break;
    default: break;
  }
  res.status = status;
  res.set_content(json{{"code", status}, {"message", std::string(s.message())}}.dump(-1, ' ', false,
                                                                                     json::error_handler_t::replace),
                  "application/json");
}

Status CheckPath(const std::string& p) {
  if (p.empty()) return absl::InvalidArgumentError("path is empty");
  if (p.find('\0') != std::string::npos) return absl::InvalidArgumentError("path contains NUL");
  if (p.size() > 4096) return absl::InvalidArgumentError("path is longer than 4096 bytes");
  return absl::OkStatus();
}

std::string BaseName(const std::string& p) {
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

void Download(E2bState& st, const httplib::Request& req, httplib::Response& res) {
  StatusOr<std::string> id = Addressed(st, req);
  if (!id.ok()) return Fail(res, id.status());
  const std::string path = req.get_param_value("path");
  if (Status s = CheckPath(path); !s.ok()) return Fail(res, s);
  // Opened before answering (errors get their status); the bytes are then
  // streamed in chunks, never held whole.
  std::shared_ptr<runtime::FileReader> reader;
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, st.manager().Running(*id));
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::FileReader> r, sb->files().OpenRead(path, 0, 0));
    reader = std::move(r);
    return absl::OkStatus();
  }();
  if (s.ok()) {
    res.set_chunked_content_provider("application/octet-stream", [reader](size_t, httplib::DataSink& sink) {
      StatusOr<std::string> data = reader->Read(kReadChunk);
      if (!data.ok()) return false;  // the connection is cut: the client sees a short body, not a whole file
      if (data->empty()) {
        sink.done();
        return true;
      }
      return sink.write(data->data(), data->size());
    });
  }
  json a = {{"op", "read"}, {"path", path}, {"via", "e2b"}};
  if (!s.ok()) a["error"] = s.ToString();
  st.manager().Audit(*id, a);
  if (!s.ok()) Fail(res, s);
}

Status WriteOne(E2bState& st, const std::string& id, const std::string& path, const std::string& data, json* out) {
  RETURN_IF_ERROR(CheckPath(path));
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, st.manager().Running(id));
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::FileWriter> w, sb->files().OpenWrite(path, 0644, /*make_parents=*/true));
    RETURN_IF_ERROR(w->Write(data));
    return w->Commit().status();
  }();
  json a = {{"op", "write"}, {"path", path}, {"bytes", data.size()}, {"via", "e2b"}};
  if (!s.ok()) a["error"] = s.ToString();
  st.manager().Audit(id, a);
  RETURN_IF_ERROR(s);
  out->push_back({{"name", BaseName(path)}, {"type", "file"}, {"path", path}});
  return absl::OkStatus();
}

void Upload(E2bState& st, const httplib::Request& req, httplib::Response& res) {
  StatusOr<std::string> id = Addressed(st, req);
  if (!id.ok()) return Fail(res, id.status());
  if (req.has_header("Content-Encoding"))
    return Fail(res, absl::InvalidArgumentError("Content-Encoding \"" + req.get_header_value("Content-Encoding") +
                                                "\" is not supported; send the file uncompressed"));
  json out = json::array();
  if (req.is_multipart_form_data()) {
    const auto range = req.files.equal_range("file");
    const size_t n = static_cast<size_t>(std::distance(range.first, range.second));
    if (n == 0) return Fail(res, absl::InvalidArgumentError("multipart body has no \"file\" part"));
    for (auto it = range.first; it != range.second; ++it) {
      const std::string path = n == 1 && req.has_param("path") ? req.get_param_value("path") : it->second.filename;
      if (Status s = WriteOne(st, *id, path, it->second.content, &out); !s.ok()) return Fail(res, s);
    }
  } else {
    if (Status s = WriteOne(st, *id, req.get_param_value("path"), req.body, &out); !s.ok()) return Fail(res, s);
  }
  res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace

void AddFileTransferRoutes(httplib::Server& server, const std::shared_ptr<E2bState>& state) {
  server.Get("/files", [state](const httplib::Request& req, httplib::Response& res) { Download(*state, req, res); });
  server.Post("/files", [state](const httplib::Request& req, httplib::Response& res) { Upload(*state, req, res); });
}

}  // namespace warren::e2b
