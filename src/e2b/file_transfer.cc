// envd's HTTP file transfer (`/files`, envd's OpenAPI spec): GET ?path= answers
// the file's bytes; POST with a multipart/form-data body (field "file"; the
// first named by ?path= when given, the others by their file names) or an
// application/octet-stream body (?path=) writes files, creating missing
// parents, and answers [{name, type, path}]. Paths are resolved inside the
// sandbox by SandboxFiles, as warren's own files API does. Uploads are
// streamed into temporary files and made visible only once the whole body
// was read; a body over --e2b-max-upload-mb is a 413 naming the limit, and
// an upload that fails leaves no file and no directory it created.
#include <httplib.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "e2b/server.h"

namespace warren::e2b {
namespace {

using json = nlohmann::json;

constexpr size_t kReadChunk = 1 << 20;

// envd's error body {code: HTTP status, message}; `status` 0 = by s's code.
void Fail(httplib::Response& res, const Status& s, int status = 0) {
  if (status != 0) {
    res.status = status;
    res.set_content(BodyJson(status, std::string(s.message())), "application/json");
    return;
  }
  status = 500;
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
  res.set_content(BodyJson(status, std::string(s.message())), "application/json");
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

// One file of an upload: written to a temporary file as its bytes arrive,
// visible at its path only once the whole upload was read (Commit). A
// pending file that is dropped leaves nothing behind: its temporary file
// goes with the writer, and the parent directories it created are removed.
class PendingFile {
 public:
  PendingFile(runtime::SandboxFiles* files, std::string path) : files_(files), path_(std::move(path)) {}
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;
  ~PendingFile() {
    writer_.reset();
    if (committed_ || created_.empty()) return;
    // Each directory this upload created, deepest first, while empty: one
    // that another upload filled meanwhile stays, with its files.
    for (std::string dir = path_.substr(0, path_.rfind('/')); dir.size() >= created_.size();
         dir = dir.substr(0, dir.rfind('/'))) {
      if (!files_->Remove(dir, /*recursive=*/false).ok()) break;
    }
  }

  Status Open() {
    RETURN_IF_ERROR(CheckPath(path_));
    // The first missing ancestor, created below by make_parents: removed
    // again if this file is dropped.
    std::string prefix;
    for (size_t i = path_.find('/', 1); i != std::string::npos; i = path_.find('/', i + 1)) {
      prefix = path_.substr(0, i);
      if (!files_->Stat(prefix).ok()) {
        created_ = prefix;
        break;
      }
    }
    ASSIGN_OR_RETURN(writer_, files_->OpenWrite(path_, 0644, /*make_parents=*/true));
    return absl::OkStatus();
  }
  Status Write(std::string_view data) {
    bytes_ += data.size();
    return writer_->Write(data);
  }
  Status Commit() {
    RETURN_IF_ERROR(writer_->Commit().status());
    committed_ = true;
    return absl::OkStatus();
  }
  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }

 private:
  runtime::SandboxFiles* const files_;
  const std::string path_;
  std::unique_ptr<runtime::FileWriter> writer_;
  std::string created_;  // first parent directory this upload created; "" = none
  uint64_t bytes_ = 0;
  bool committed_ = false;
};

// The body is read as it arrives (never held whole) into pending files and
// counted: past E2bOptions::max_body_bytes the rest is read and dropped, the
// upload answered 413 naming the limit, and nothing written (a body whose
// Content-Length is over the limit is never read into a file at all).
void Upload(E2bState& st, const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
  // An answer before the body was read: the connection cannot be reused.
  auto refuse = [&res](const Status& s) {
    res.set_header("Connection", "close");
    Fail(res, s);
  };
  StatusOr<std::string> id = Addressed(st, req);
  if (!id.ok()) return refuse(id.status());
  if (req.has_header("Content-Encoding"))
    return refuse(absl::InvalidArgumentError("Content-Encoding \"" + req.get_header_value("Content-Encoding") +
                                             "\" is not supported; send the file uncompressed"));
  StatusOr<std::shared_ptr<runtime::Sandbox>> sb = st.manager().Running(*id);
  if (!sb.ok()) return refuse(sb.status());
  runtime::SandboxFiles* files = &(*sb)->files();
  const uint64_t limit = st.options().max_body_bytes;
  std::vector<std::unique_ptr<PendingFile>> pending;
  Status failed;          // the first error; the rest of the body is then dropped
  uint64_t received = 0;  // body bytes read
  bool over = false;      // past the limit: the rest is dropped, nothing kept
  bool to_file = false;   // the bytes being read belong to pending.back()
  auto take = [&](const char* data, size_t n) {
    received += n;
    if (!over && received > limit) {
      over = true;
      pending.clear();
    }
    if (over || !failed.ok() || !to_file) return true;
    if (Status s = pending.back()->Write(std::string_view(data, n)); !s.ok()) failed = s;
    return true;
  };
  auto open = [&](const std::string& path) {
    to_file = false;
    if (over || !failed.ok()) return;
    auto f = std::make_unique<PendingFile>(files, path);
    if (Status s = f->Open(); !s.ok()) {
      failed = s;
      return;
    }
    pending.push_back(std::move(f));
    to_file = true;
  };
  bool read = false;
  std::string first_path = req.get_param_value("path");
  if (req.is_multipart_form_data()) {
    size_t parts = 0;
    read = reader(
        [&](const httplib::MultipartFormData& part) {
          to_file = false;
          if (part.name != "file") return true;  // not a file: its bytes are dropped
          // ?path= names the first file; the others are named by their file names.
          const std::string path = parts++ == 0 && req.has_param("path") ? first_path : part.filename;
          if (first_path.empty()) first_path = path;
          open(path);
          return true;
        },
        take);
    if (read && failed.ok() && !over && parts == 0)
      failed = absl::InvalidArgumentError("multipart body has no \"file\" part");
  } else {
    // A body announced over the limit is never opened a file for.
    uint64_t length = 0;
    const bool too_long = absl::SimpleAtoi(req.get_header_value("Content-Length"), &length) && length > limit;
    if (!too_long) open(first_path);
    read = reader(take);
  }
  if (over || res.status == 413) {
    pending.clear();
    const Status s = absl::ResourceExhaustedError(BodyLimitMessage(limit));
    st.manager().Audit(*id, json{{"op", "write"}, {"path", first_path}, {"via", "e2b"}, {"error", s.ToString()}});
    res.set_header("Connection", "close");
    return Fail(res, s, 413);
  }
  if (!read && failed.ok()) failed = absl::InvalidArgumentError("the upload body could not be read (malformed or cut)");
  json out = json::array();
  if (failed.ok()) {
    for (const auto& f : pending) {
      if (failed = f->Commit(); !failed.ok()) break;
    }
  }
  for (const auto& f : pending) {
    json a = {{"op", "write"}, {"path", f->path()}, {"bytes", f->bytes()}, {"via", "e2b"}};
    if (!failed.ok()) a["error"] = failed.ToString();
    st.manager().Audit(*id, a);
    out.push_back({{"name", BaseName(f->path())}, {"type", "file"}, {"path", f->path()}});
  }
  if (!failed.ok()) {
    pending.clear();
    if (!read) res.set_header("Connection", "close");
    return Fail(res, failed);
  }
  res.status = 200;
  res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace

void AddFileTransferRoutes(httplib::Server& server, const std::shared_ptr<E2bState>& state) {
  server.Get("/files", [state](const httplib::Request& req, httplib::Response& res) { Download(*state, req, res); });
  server.Post("/files", [state](const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader) { Upload(*state, req, res, reader); });
}

}  // namespace warren::e2b
