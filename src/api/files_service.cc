#include "api/files_service.h"

#include "api/convert.h"
#include "api/status_map.h"
#include "common/time.h"

namespace warren::api {
namespace {

namespace v1 = ::warren::v1;

constexpr size_t kReadChunk = 1 << 20;
constexpr size_t kMaxWriteChunk = 16 << 20;

}  // namespace

grpc::Status FilesService::Audited(const std::string& id, const char* op, const std::string& path, int64_t t0,
                                   grpc::Status st, uint64_t bytes, const std::string& to) {
  nlohmann::json a = {{"op", op}, {"path", path}, {"start_ns", t0}, {"end_ns", WallNowNs()}};
  if (!to.empty()) a["to"] = to;
  if (bytes > 0) a["bytes"] = bytes;
  if (!st.ok()) a["error"] = st.error_message();
  deps_.manager->Audit(id, a);
  return st;
}

grpc::Status FilesService::Write(grpc::ServerContext* ctx, grpc::ServerReader<v1::WriteFileRequest>* reader,
                                 v1::WriteFileResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  v1::WriteFileRequest msg;
  if (!reader->Read(&msg)) return Invalid("empty stream: the first message must carry the header");
  RETURN_IF_GRPC_ERROR(CheckId(msg.sandbox_id()));
  WARREN_REMOTE_OWNER(deps_, ctx, msg.sandbox_id(), owner);
  if (owner != nullptr) {
    return ForwardClientStream<v1::Files>(
        *deps_.forward, *ctx, owner, msg, reader, resp,
        [](v1::Files::Stub& s, grpc::ClientContext* c, v1::WriteFileResponse* r) { return s.Write(c, r); });
  }
  RETURN_IF_GRPC_ERROR(CheckPath("path", msg.path()));
  const std::string path = msg.path();
  const std::string id = msg.sandbox_id();
  const std::string request_id = msg.request_id();
  const int64_t t0 = WallNowNs();
  bool ran = false;
  node::SandboxManager* m = deps_.manager;
  StatusOr<node::RecordedCall> rc = m->Idempotent(id, request_id, [&]() -> StatusOr<node::RecordedCall> {
    ran = true;
    ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, m->Running(id));
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::FileWriter> w,
                     sb->files().OpenWrite(path, msg.mode() == 0 ? 0644 : msg.mode(), msg.make_parents()));
    do {
      if (msg.data().size() > kMaxWriteChunk) {
        return absl::InvalidArgumentError("data chunk of " + std::to_string(msg.data().size()) +
                                          " bytes exceeds 16 MiB; send 1 MiB chunks");
      }
      if (!msg.data().empty()) RETURN_IF_ERROR(w->Write(msg.data()));
    } while (reader->Read(&msg));
    if (ctx->IsCancelled()) return absl::CancelledError("write cancelled");
    node::RecordedCall r;
    ASSIGN_OR_RETURN(r.bytes, w->Commit());
    return r;
  });
  nlohmann::json a = {{"op", "write"}, {"path", path}, {"start_ns", t0}, {"end_ns", WallNowNs()}};
  if (!request_id.empty()) {
    a["request_id"] = request_id;
    a["replayed"] = !ran;
  }
  if (rc.ok()) {
    a["bytes"] = rc->bytes;
  } else {
    a["error"] = rc.status().ToString();
  }
  m->Audit(id, a);
  if (!rc.ok()) return ToGrpcStatus(rc.status());
  resp->set_bytes_written(rc->bytes);
  return grpc::Status::OK;
}

grpc::Status FilesService::Read(grpc::ServerContext* ctx, const v1::ReadFileRequest* req,
                                grpc::ServerWriter<v1::ReadFileChunk>* writer) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
  WARREN_REMOTE_OWNER(deps_, ctx, req->sandbox_id(), owner);
  if (owner != nullptr) {
    return ForwardServerStream<v1::Files>(
        *deps_.forward, *ctx, owner, *req, writer,
        [](v1::Files::Stub& s, grpc::ClientContext* c, const v1::ReadFileRequest& q) { return s.Read(c, q); });
  }
  RETURN_IF_GRPC_ERROR(CheckPath("path", req->path()));
  const int64_t t0 = WallNowNs();
  uint64_t total = 0;
  grpc::Status st = [&]() -> grpc::Status {
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, deps_.manager->Running(req->sandbox_id()));
    ASSIGN_OR_RETURN_GRPC(std::unique_ptr<runtime::FileReader> r,
                          sb->files().OpenRead(req->path(), req->offset(), req->length()));
    v1::ReadFileChunk chunk;
    while (true) {
      if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "read cancelled");
      ASSIGN_OR_RETURN_GRPC(std::string data, r->Read(kReadChunk));
      if (data.empty()) break;
      total += data.size();
      *chunk.mutable_data() = std::move(data);
      if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    return grpc::Status::OK;
  }();
  return Audited(req->sandbox_id(), "read", req->path(), t0, st, total);
}

grpc::Status FilesService::Stat(grpc::ServerContext* ctx, const v1::StatRequest* req, v1::FileInfo* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->sandbox_id(), v1::Files, Stat, *req, resp);
  RETURN_IF_GRPC_ERROR(CheckPath("path", req->path()));
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, deps_.manager->Running(req->sandbox_id()));
  const int64_t t0 = WallNowNs();
  StatusOr<runtime::FileInfo> fi = sb->files().Stat(req->path());
  if (fi.ok()) ToProto(*fi, resp);
  return Audited(req->sandbox_id(), "stat", req->path(), t0, fi.ok() ? grpc::Status::OK : ToGrpcStatus(fi.status()));
}

grpc::Status FilesService::ListDir(grpc::ServerContext* ctx, const v1::ListDirRequest* req, v1::ListDirResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->sandbox_id(), v1::Files, ListDir, *req, resp);
  RETURN_IF_GRPC_ERROR(CheckPath("path", req->path()));
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, deps_.manager->Running(req->sandbox_id()));
  const int64_t t0 = WallNowNs();
  StatusOr<std::vector<runtime::FileInfo>> entries = sb->files().List(req->path());
  if (entries.ok()) {
    for (const auto& fi : *entries) ToProto(fi, resp->add_entries());
  }
  return Audited(req->sandbox_id(), "list", req->path(), t0,
                 entries.ok() ? grpc::Status::OK : ToGrpcStatus(entries.status()));
}

grpc::Status FilesService::Mkdir(grpc::ServerContext* ctx, const v1::MkdirRequest* req, v1::Empty* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->sandbox_id(), v1::Files, Mkdir, *req, resp);
  RETURN_IF_GRPC_ERROR(CheckPath("path", req->path()));
  if (req->mode() > 07777) return Invalid("mode=" + std::to_string(req->mode()) + " exceeds 07777");
  const int64_t t0 = WallNowNs();
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, deps_.manager->Running(req->sandbox_id()));
  return Audited(req->sandbox_id(), "mkdir", req->path(), t0,
                 ToGrpcStatus(sb->files().Mkdir(req->path(), req->mode() == 0 ? 0755 : req->mode(), req->parents())));
}

grpc::Status FilesService::Remove(grpc::ServerContext* ctx, const v1::RemoveRequest* req, v1::Empty* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->sandbox_id(), v1::Files, Remove, *req, resp);
  RETURN_IF_GRPC_ERROR(CheckPath("path", req->path()));
  const int64_t t0 = WallNowNs();
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, deps_.manager->Running(req->sandbox_id()));
  return Audited(req->sandbox_id(), "remove", req->path(), t0,
                 ToGrpcStatus(sb->files().Remove(req->path(), req->recursive())));
}

grpc::Status FilesService::Rename(grpc::ServerContext* ctx, const v1::RenameRequest* req, v1::Empty* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->sandbox_id(), v1::Files, Rename, *req, resp);
  RETURN_IF_GRPC_ERROR(CheckPath("from", req->from()));
  RETURN_IF_GRPC_ERROR(CheckPath("to", req->to()));
  const int64_t t0 = WallNowNs();
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, deps_.manager->Running(req->sandbox_id()));
  return Audited(req->sandbox_id(), "rename", req->from(), t0, ToGrpcStatus(sb->files().Rename(req->from(), req->to())),
                 0, req->to());
}

}  // namespace warren::api
