#include "api/services.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/escaping.h"
#include "api/status_map.h"
#include "common/unique_fd.h"
#include "common/log.h"
#include "warren/v1/process.grpc.pb.h"

namespace warren::api {
namespace {

namespace v1 = ::warren::v1;

constexpr uint64_t kDefaultOutputCap = 16ull << 20;
constexpr uint64_t kMaxOutputCap = 256ull << 20;
constexpr size_t kReadChunk = 1 << 20;
constexpr size_t kMaxWriteChunk = 16 << 20;
// See SandboxesService::Create.
constexpr auto kCreateReplyMargin = std::chrono::milliseconds(20);

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

grpc::Status Invalid(const std::string& msg) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, msg);
}

std::string Quote(const std::string& s) {
  std::string v = s.size() > 80 ? s.substr(0, 80) + "..." : s;
  return "\"" + absl::CHexEscape(v) + "\"";
}

// Constant-time comparison: the token must not leak through timing.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

v1::SandboxState ToProto(node::SandboxState s) {
  switch (s) {
    case node::SandboxState::kCreating: return v1::SANDBOX_STATE_CREATING;
    case node::SandboxState::kRunning: return v1::SANDBOX_STATE_RUNNING;
    case node::SandboxState::kDestroying: return v1::SANDBOX_STATE_STOPPED;
    case node::SandboxState::kPaused: return v1::SANDBOX_STATE_PAUSED;
    case node::SandboxState::kSuspended: return v1::SANDBOX_STATE_SUSPENDED;
  }
  return v1::SANDBOX_STATE_UNSPECIFIED;
}

void ToProto(const node::SandboxInfo& in, v1::Sandbox* out) {
  out->set_id(in.id);
  out->set_backend(in.backend);
  out->set_state(ToProto(in.state));
  for (const auto& d : in.layer_digests) out->add_layers(d);
  for (const auto& n : in.layer_names) out->add_layer_names(n);
  v1::Resources* r = out->mutable_resources();
  r->set_cpu_millis(in.resources.cpu_millis);
  r->set_memory_mb(in.resources.memory_mb);
  r->set_disk_mb(in.resources.disk_mb);
  r->set_pids(in.resources.pids);
  r->set_open_files(in.resources.open_files);
  r->set_tmpfs_mb(in.resources.tmpfs_mb);
  for (const auto& [k, v] : in.labels) (*out->mutable_labels())[k] = v;
  out->set_job(in.job);
  out->set_created_at_ns(in.created_at_ns);
  out->set_init_pid(in.init_pid);
  out->set_hostname(in.hostname);
  out->set_expires_at_ns(in.expires_at_ns);
  out->set_idle_timeout_s(in.idle_timeout_s);
  out->set_last_activity_ns(in.last_activity_ns);
  out->set_ttl_s(in.ttl_s);
}

v1::FileType ToProto(runtime::FileType t) {
  switch (t) {
    case runtime::FileType::kRegular: return v1::FILE_TYPE_REGULAR;
    case runtime::FileType::kDirectory: return v1::FILE_TYPE_DIRECTORY;
    case runtime::FileType::kSymlink: return v1::FILE_TYPE_SYMLINK;
    case runtime::FileType::kOther: return v1::FILE_TYPE_OTHER;
  }
  return v1::FILE_TYPE_UNSPECIFIED;
}

void ToProto(const runtime::FileInfo& in, v1::FileInfo* out) {
  out->set_name(in.name);
  out->set_path(in.path);
  out->set_type(ToProto(in.type));
  out->set_size(in.size);
  out->set_mode(in.mode);
  out->set_uid(in.uid);
  out->set_gid(in.gid);
  out->set_mtime_ns(in.mtime_ns);
  out->set_symlink_target(in.symlink_target);
}

grpc::Status CheckPath(const std::string& field, const std::string& path) {
  if (path.empty()) return Invalid(field + " is empty");
  if (path.find('\0') != std::string::npos) return Invalid(field + "=" + Quote(path) + " contains NUL");
  if (path.size() > 4096) return Invalid(field + " is longer than 4096 bytes");
  return grpc::Status::OK;
}

grpc::Status CheckId(const std::string& id) {
  if (id.empty()) return Invalid("sandbox_id is empty");
  return grpc::Status::OK;
}

grpc::Status CheckEnv(const google::protobuf::Map<std::string, std::string>& env,
                      std::map<std::string, std::string>* out) {
  for (const auto& [k, v] : env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos) {
      return Invalid("env key " + Quote(k) + " must be non-empty without '=' or NUL");
    }
    if (v.find('\0') != std::string::npos) return Invalid("env[" + Quote(k) + "] value contains NUL");
    (*out)[k] = v;
  }
  return grpc::Status::OK;
}

grpc::Status ToExecSpec(const v1::ExecRequest& r, runtime::ExecSpec* out) {
  const v1::ExecRequest* req = &r;
  runtime::ExecSpec& spec = *out;
  bool has_argv = req->argv_size() > 0;
  bool has_shell = !req->shell().empty();
  if (has_argv == has_shell) return Invalid("exactly one of argv or shell must be given");
  if (has_argv) {
    for (int i = 0; i < req->argv_size(); ++i) {
      const std::string& a = req->argv(i);
      if (a.find('\0') != std::string::npos) {
        return Invalid("argv[" + std::to_string(i) + "]=" + Quote(a) + " contains NUL");
      }
      spec.argv.push_back(a);
    }
    if (spec.argv[0].empty()) return Invalid("argv[0] is empty");
  } else {
    if (req->shell().find('\0') != std::string::npos) return Invalid("shell contains NUL");
    spec.shell = req->shell();
  }
  if (grpc::Status es = CheckEnv(req->env(), &spec.env); !es.ok()) return es;
  if (!req->cwd().empty()) {
    if (req->cwd()[0] != '/' || req->cwd().find('\0') != std::string::npos) {
      return Invalid("cwd=" + Quote(req->cwd()) + " must be an absolute path");
    }
    spec.cwd = req->cwd();
  }
  if (!req->user().empty()) {
    if (!node::ValidUser(req->user())) {
      return Invalid("user=" + Quote(req->user()) +
                     " must be \"root\", a user name or \"uid[:gid]\"");
    }
    spec.user = req->user();
  }
  spec.stdin_data = req->stdin();
  spec.timeout = std::chrono::milliseconds(req->timeout_ms());
  spec.kill_grace = std::chrono::milliseconds(req->kill_grace_ms() == 0 ? 500 : req->kill_grace_ms());
  uint64_t cap = req->output_cap_bytes() == 0 ? kDefaultOutputCap : req->output_cap_bytes();
  if (cap > kMaxOutputCap) {
    return Invalid("output_cap_bytes=" + std::to_string(cap) + " exceeds the maximum of " +
                   std::to_string(kMaxOutputCap));
  }
  spec.output_cap_bytes = cap;
  return grpc::Status::OK;
}

void ToProto(runtime::ExecOutcome&& o, v1::ExecResult* resp) {
  runtime::ExecOutcome* out = &o;
  resp->set_exit_code(out->exit_code);
  resp->set_signal(out->signal);
  resp->set_oom_killed(out->oom_killed);
  resp->set_timed_out(out->timed_out);
  *resp->mutable_stdout() = std::move(out->stdout_data);
  *resp->mutable_stderr() = std::move(out->stderr_data);
  resp->set_stdout_truncated(out->stdout_truncated);
  resp->set_stderr_truncated(out->stderr_truncated);
  resp->set_stdout_total_bytes(out->stdout_total);
  resp->set_stderr_total_bytes(out->stderr_total);
  resp->set_duration_ns(out->duration.count());
}

}  // namespace

bool IsUnixPeer(const grpc::ServerContext& context) {
  return context.peer().rfind("unix:", 0) == 0;
}

class WarrenServices::Impl {
 public:
  Impl(node::SandboxManager* m, ServiceOptions o) : m_(m), o_(std::move(o)) {}

  grpc::Status Authorize(const grpc::ServerContext* ctx) const {
    if (IsUnixPeer(*ctx)) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    if (o_.token.empty() || it == md.end()) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "TCP calls need 'authorization: Bearer <token>'");
    }
    std::string got(it->second.data(), it->second.size());
    if (!SameSecret(got, "Bearer " + o_.token)) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "bad bearer token");
    }
    return grpc::Status::OK;
  }

  node::SandboxManager* m_;
  ServiceOptions o_;
};

#define WARREN_AUTHORIZE(ctx)                          \
  do {                                                 \
    grpc::Status _auth = impl_->Authorize(ctx);        \
    if (!_auth.ok()) return _auth;                     \
  } while (0)
#define ASSIGN_OR_RETURN_GRPC(lhs, expr) \
  ASSIGN_OR_RETURN_GRPC_IMPL_(WARREN_CONCAT_(_gsor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_GRPC_IMPL_(tmp, lhs, expr)       \
  auto tmp = (expr);                                      \
  if (!tmp.ok()) return ToGrpcStatus(tmp.status());       \
  lhs = std::move(tmp).value()
#define WARREN_RETURN_IF_GRPC_ERROR(expr) \
  do {                                    \
    grpc::Status _g = (expr);             \
    if (!_g.ok()) return _g;              \
  } while (0)

namespace {

class SandboxesService final : public v1::Sandboxes::Service {
 public:
  explicit SandboxesService(WarrenServices::Impl* impl) : impl_(impl) {}

  grpc::Status Create(grpc::ServerContext* ctx, const v1::CreateSandboxRequest* req,
                      v1::Sandbox* resp) override {
    WARREN_AUTHORIZE(ctx);
    node::CreateRequest r;
    r.backend = req->backend();
    r.layers.assign(req->layers().begin(), req->layers().end());
    const v1::Resources& res = req->resources();
    r.resources = runtime::Resources{res.cpu_millis(), res.memory_mb(), res.disk_mb(),
                                     res.pids(), res.open_files(), res.tmpfs_mb()};
    r.env.insert(req->env().begin(), req->env().end());
    r.workdir = req->workdir();
    r.user = req->user();
    r.hostname = req->hostname();
    r.labels.insert(req->labels().begin(), req->labels().end());
    r.ttl_s = req->ttl_s();
    r.job = req->job();
    r.idle_timeout_s = req->idle_timeout_s();
    // A create that waits in the node's admission queue gives up at the
    // RPC's deadline or when the client goes away.
    if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
      r.deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       ctx->deadline() - std::chrono::system_clock::now());
    }
    r.cancelled = [ctx] { return ctx->IsCancelled(); };
    r.request_id = req->request_id();
    StatusOr<node::SandboxInfo> info = impl_->m_->Create(r);
    if (!info.ok()) return ToGrpcStatus(info.status());
    // Nobody will ever learn this id if the client gave up: do not leak the
    // sandbox. The client's deadline is earlier than ours by the request's
    // transit time, and our reply needs time to reach it: a reply sent in
    // the last kCreateReplyMargin (20 ms) before our deadline is taken as too late.
    // (One lost in flight anyway is abandoned by the client: see
    // CreateSandboxRequest.request_id.)
    const bool late = ctx->deadline() != std::chrono::system_clock::time_point::max() &&
                      std::chrono::system_clock::now() + kCreateReplyMargin >= ctx->deadline();
    if (late || ctx->IsCancelled()) {
      // A retry with the same request id makes a new one (this call, not
      // the request, was given up: no tombstone as AbandonCreate leaves).
      Status s = impl_->m_->Destroy(info->id);
      warren::Log(spdlog::level::info, "create given up by the client; sandbox destroyed",
                {{"sandbox", info->id}, {"destroy", s.ToString()}, {"late", late ? "true" : "false"}});
      return late ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "create finished too close to its deadline; nothing was kept")
                  : grpc::Status(grpc::StatusCode::CANCELLED, "create cancelled by the client");
    }
    ToProto(*info, resp);
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetSandboxRequest* req,
                   v1::Sandbox* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->id()));
    StatusOr<node::SandboxInfo> info = impl_->m_->Get(req->id());
    if (!info.ok()) return ToGrpcStatus(info.status());
    ToProto(*info, resp);
    if (StatusOr<node::SandboxMemory> m = impl_->m_->Memory(req->id()); m.ok()) {
      resp->set_memory_bytes(m->memory_bytes);
      resp->set_swap_bytes(m->swap_bytes);
    }
    return grpc::Status::OK;
  }

  grpc::Status List(grpc::ServerContext* ctx, const v1::ListSandboxesRequest* req,
                    v1::ListSandboxesResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    std::map<std::string, std::string> labels(req->labels().begin(), req->labels().end());
    for (const node::SandboxInfo& i : impl_->m_->List(labels, req->job())) {
      ToProto(i, resp->add_sandboxes());
    }
    return grpc::Status::OK;
  }

  grpc::Status Destroy(grpc::ServerContext* ctx, const v1::DestroySandboxRequest* req,
                       v1::DestroySandboxResponse*) override {
    WARREN_AUTHORIZE(ctx);
    if (!req->create_request_id().empty()) {
      if (!req->id().empty()) return Invalid("give either id or create_request_id, not both");
      return ToGrpcStatus(impl_->m_->AbandonCreate(req->create_request_id()));
    }
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->id()));
    return ToGrpcStatus(impl_->m_->Destroy(req->id()));
  }

  grpc::Status Exec(grpc::ServerContext* ctx, const v1::ExecRequest* req,
                    v1::ExecResult* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
    runtime::ExecSpec spec;
    WARREN_RETURN_IF_GRPC_ERROR(ToExecSpec(*req, &spec));
    StatusOr<runtime::ExecOutcome> out = impl_->m_->Exec(req->sandbox_id(), spec, req->request_id());
    if (!out.ok()) return ToGrpcStatus(out.status());
    ToProto(std::move(*out), resp);
    return grpc::Status::OK;
  }

 private:
  WarrenServices::Impl* impl_;
};

class FilesService final : public v1::Files::Service {
 public:
  explicit FilesService(WarrenServices::Impl* impl) : impl_(impl) {}

  // Records a file call in the sandbox's audit log; returns `st`.
  grpc::Status Audited(const std::string& id, const char* op, const std::string& path, int64_t t0,
                       grpc::Status st, uint64_t bytes = 0, const std::string& to = std::string()) {
    nlohmann::json a = {{"op", op}, {"path", path}, {"start_ns", t0}, {"end_ns", NowNs()}};
    if (!to.empty()) a["to"] = to;
    if (bytes > 0) a["bytes"] = bytes;
    if (!st.ok()) a["error"] = st.error_message();
    impl_->m_->Audit(id, std::move(a));
    return st;
  }

  grpc::Status Write(grpc::ServerContext* ctx, grpc::ServerReader<v1::WriteFileRequest>* reader,
                     v1::WriteFileResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    v1::WriteFileRequest msg;
    if (!reader->Read(&msg)) return Invalid("empty stream: the first message must carry the header");
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(msg.sandbox_id()));
    WARREN_RETURN_IF_GRPC_ERROR(CheckPath("path", msg.path()));
    const std::string path = msg.path();
    const std::string id = msg.sandbox_id();
    const std::string request_id = msg.request_id();
    const int64_t t0 = NowNs();
    bool ran = false;
    StatusOr<node::RecordedCall> rc = impl_->m_->Idempotent(id, request_id, [&]() -> StatusOr<node::RecordedCall> {
      ran = true;
      ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, impl_->m_->Running(id));
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
    nlohmann::json a = {{"op", "write"}, {"path", path}, {"start_ns", t0}, {"end_ns", NowNs()}};
    if (!request_id.empty()) {
      a["request_id"] = request_id;
      a["replayed"] = !ran;
    }
    if (rc.ok()) {
      a["bytes"] = rc->bytes;
    } else {
      a["error"] = rc.status().ToString();
    }
    impl_->m_->Audit(id, std::move(a));
    if (!rc.ok()) return ToGrpcStatus(rc.status());
    resp->set_bytes_written(rc->bytes);
    return grpc::Status::OK;
  }

  grpc::Status Read(grpc::ServerContext* ctx, const v1::ReadFileRequest* req,
                    grpc::ServerWriter<v1::ReadFileChunk>* writer) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
    WARREN_RETURN_IF_GRPC_ERROR(CheckPath("path", req->path()));
    const int64_t t0 = NowNs();
    uint64_t total = 0;
    grpc::Status st = [&]() -> grpc::Status {
      ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, impl_->m_->Running(req->sandbox_id()));
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

  grpc::Status Stat(grpc::ServerContext* ctx, const v1::StatRequest* req,
                    v1::FileInfo* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
    WARREN_RETURN_IF_GRPC_ERROR(CheckPath("path", req->path()));
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, impl_->m_->Running(req->sandbox_id()));
    const int64_t t0 = NowNs();
    StatusOr<runtime::FileInfo> fi = sb->files().Stat(req->path());
    if (fi.ok()) ToProto(*fi, resp);
    return Audited(req->sandbox_id(), "stat", req->path(), t0,
                   fi.ok() ? grpc::Status::OK : ToGrpcStatus(fi.status()));
  }

  grpc::Status ListDir(grpc::ServerContext* ctx, const v1::ListDirRequest* req,
                       v1::ListDirResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
    WARREN_RETURN_IF_GRPC_ERROR(CheckPath("path", req->path()));
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, impl_->m_->Running(req->sandbox_id()));
    const int64_t t0 = NowNs();
    StatusOr<std::vector<runtime::FileInfo>> entries = sb->files().List(req->path());
    if (entries.ok()) {
      for (const auto& fi : *entries) ToProto(fi, resp->add_entries());
    }
    return Audited(req->sandbox_id(), "list", req->path(), t0,
                   entries.ok() ? grpc::Status::OK : ToGrpcStatus(entries.status()));
  }

  grpc::Status Mkdir(grpc::ServerContext* ctx, const v1::MkdirRequest* req, v1::Empty*) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
    WARREN_RETURN_IF_GRPC_ERROR(CheckPath("path", req->path()));
    if (req->mode() > 07777) return Invalid("mode=" + std::to_string(req->mode()) + " exceeds 07777");
    const int64_t t0 = NowNs();
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, impl_->m_->Running(req->sandbox_id()));
    return Audited(req->sandbox_id(), "mkdir", req->path(), t0, ToGrpcStatus(
        sb->files().Mkdir(req->path(), req->mode() == 0 ? 0755 : req->mode(), req->parents())));
  }

  grpc::Status Remove(grpc::ServerContext* ctx, const v1::RemoveRequest* req, v1::Empty*) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
    WARREN_RETURN_IF_GRPC_ERROR(CheckPath("path", req->path()));
    const int64_t t0 = NowNs();
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, impl_->m_->Running(req->sandbox_id()));
    return Audited(req->sandbox_id(), "remove", req->path(), t0,
                   ToGrpcStatus(sb->files().Remove(req->path(), req->recursive())));
  }

  grpc::Status Rename(grpc::ServerContext* ctx, const v1::RenameRequest* req, v1::Empty*) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
    WARREN_RETURN_IF_GRPC_ERROR(CheckPath("from", req->from()));
    WARREN_RETURN_IF_GRPC_ERROR(CheckPath("to", req->to()));
    const int64_t t0 = NowNs();
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<runtime::Sandbox> sb, impl_->m_->Running(req->sandbox_id()));
    return Audited(req->sandbox_id(), "rename", req->from(), t0,
                   ToGrpcStatus(sb->files().Rename(req->from(), req->to())), 0, req->to());
  }

 private:
  WarrenServices::Impl* impl_;
};

class LayersService final : public v1::Layers::Service {
 public:
  explicit LayersService(WarrenServices::Impl* impl) : impl_(impl) {}

  void ToLayer(const image::LayerInfo& li, v1::Layer* out) {
    out->set_digest(li.digest);
    out->set_name(li.name);
    out->set_size_bytes(li.size_bytes);
    out->set_created_at_ns(li.created_at_ns);
    out->set_in_use(impl_->m_->LayerUsers(li.digest));
    out->set_mounted(impl_->m_->layers().IsMounted(li.digest));
  }

  grpc::Status Build(grpc::ServerContext* ctx, grpc::ServerReader<v1::BuildLayerRequest>* reader,
                     v1::Layer* resp) override {
    WARREN_AUTHORIZE(ctx);
    v1::BuildLayerRequest msg;
    if (!reader->Read(&msg)) return Invalid("empty stream: the first message must carry the name");
    if (msg.name().empty()) return Invalid("name is empty");
    const std::string name = msg.name();
    node::LayerProvider& layers = impl_->m_->layers();
    if (!msg.source_dir().empty()) {
      if (!IsUnixPeer(*ctx)) {
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                            "source_dir builds are accepted only over the unix socket");
      }
      if (msg.source_dir()[0] != '/') {
        return Invalid("source_dir=" + Quote(msg.source_dir()) + " must be an absolute path");
      }
      if (!msg.tar_chunk().empty()) return Invalid("give either source_dir or tar_chunk, not both");
      ASSIGN_OR_RETURN_GRPC(image::LayerInfo li, layers.BuildFromDir(name, msg.source_dir()));
      warren::Log(spdlog::level::info, "layer built", {{"layer", name}, {"digest", li.digest}, {"from", msg.source_dir()}});
      ToLayer(li, resp);
      return grpc::Status::OK;
    }
    // Spool the tar next to the store (same file system, no copy of a huge
    // upload into memory); removed whatever happens.
    std::string dir = layers.TmpDir();
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ToGrpcStatus(ErrnoToStatus(errno, "mkdir(" + dir + ")"));
    }
    std::string path = dir + "/upload-XXXXXX";
    UniqueFd fd(::mkostemp(path.data(), O_CLOEXEC));
    if (!fd.valid()) return ToGrpcStatus(ErrnoToStatus(errno, "mkostemp(" + path + ")"));
    struct Unlink {
      std::string p;
      ~Unlink() { ::unlink(p.c_str()); }
    } unlink_guard{path};
    uint64_t total = 0;
    do {
      if (!msg.source_dir().empty()) return Invalid("source_dir is only allowed in the first message");
      const std::string& data = msg.tar_chunk();
      size_t off = 0;
      while (off < data.size()) {
        ssize_t n = ::write(fd.get(), data.data() + off, data.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return ToGrpcStatus(ErrnoToStatus(errno, "write(" + path + ")"));
        off += static_cast<size_t>(n);
      }
      total += data.size();
    } while (reader->Read(&msg));
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "upload cancelled");
    if (total == 0) return Invalid("no tar data and no source_dir");
    fd.reset();
    ASSIGN_OR_RETURN_GRPC(image::LayerInfo li, layers.BuildFromTar(name, path));
    warren::Log(spdlog::level::info, "layer built", {{"layer", name}, {"digest", li.digest}, {"tar_bytes", std::to_string(total)}});
    ToLayer(li, resp);
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetLayerRequest* req, v1::Layer* resp) override {
    WARREN_AUTHORIZE(ctx);
    if (req->ref().empty()) return Invalid("ref is empty");
    ASSIGN_OR_RETURN_GRPC(image::LayerInfo li, impl_->m_->layers().Resolve(req->ref()));
    ToLayer(li, resp);
    return grpc::Status::OK;
  }

  grpc::Status List(grpc::ServerContext* ctx, const v1::ListLayersRequest*,
                    v1::ListLayersResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    for (const auto& li : impl_->m_->layers().List()) ToLayer(li, resp->add_layers());
    return grpc::Status::OK;
  }

  grpc::Status Remove(grpc::ServerContext* ctx, const v1::RemoveLayerRequest* req, v1::Empty*) override {
    WARREN_AUTHORIZE(ctx);
    if (req->ref().empty()) return Invalid("ref is empty");
    return ToGrpcStatus(impl_->m_->RemoveLayer(req->ref()));
  }

 private:
  WarrenServices::Impl* impl_;
};

uint64_t MemAvailableBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  for (int i = 0; i < 64 && f >> key >> kb >> unit; ++i) {
    if (key == "MemAvailable:") return kb << 10;
  }
  return 0;
}

class NodeService final : public v1::Node::Service {
 public:
  explicit NodeService(WarrenServices::Impl* impl) : impl_(impl) {}

  grpc::Status Status(grpc::ServerContext* ctx, const v1::NodeStatusRequest*,
                      v1::NodeStatus* resp) override {
    WARREN_AUTHORIZE(ctx);
    node::SandboxManager& m = *impl_->m_;
    node::NodeCounters c = m.Counters();
    const NodeFacts& f = impl_->o_.facts;
    resp->set_node_id(m.options().node_id);
    resp->set_version(f.version);
    for (const auto& b : m.BackendNames()) resp->add_backends(b);
    for (const auto& b : impl_->o_.extra_backends) resp->add_backends(b);
    resp->set_sandboxes(c.sandboxes);
    resp->set_layers(static_cast<uint32_t>(m.layers().List().size()));
    resp->set_layers_mounted(static_cast<uint32_t>(m.layers().MountedCount()));
    if (f.cgroup_version != 0) resp->set_cgroup_version("v" + std::to_string(f.cgroup_version));
    resp->set_cgroup_parent(f.cgroup_parent);
    resp->set_idmapped_mounts(f.idmapped_mounts);
    resp->set_file_backed_erofs(m.layers().FileBackedErofs());
    resp->set_state_dir(m.options().state_dir);
    resp->set_started_at_ns(c.started_at_ns);
    resp->set_cpus(c.cpus);
    struct sysinfo si;
    if (sysinfo(&si) == 0) resp->set_memory_total_bytes(static_cast<uint64_t>(si.totalram) * si.mem_unit);
    resp->set_memory_available_bytes(MemAvailableBytes());
    return grpc::Status::OK;
  }

 private:
  WarrenServices::Impl* impl_;
};

class LifecycleService final : public v1::Lifecycle::Service {
 public:
  explicit LifecycleService(WarrenServices::Impl* impl) : impl_(impl) {}

  grpc::Status ExtendTtl(grpc::ServerContext* ctx, const v1::ExtendTtlRequest* req, v1::Sandbox* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->id()));
    ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, impl_->m_->ExtendTtl(req->id(), req->ttl_s()));
    ToProto(info, resp);
    return grpc::Status::OK;
  }

  grpc::Status Pause(grpc::ServerContext* ctx, const v1::PauseRequest* req, v1::Sandbox* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->id()));
    WARREN_RETURN_IF_GRPC_ERROR(ToGrpcStatus(impl_->m_->Pause(req->id())));
    ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, impl_->m_->Get(req->id()));
    ToProto(info, resp);
    return grpc::Status::OK;
  }

  grpc::Status Resume(grpc::ServerContext* ctx, const v1::ResumeRequest* req, v1::Sandbox* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->id()));
    WARREN_RETURN_IF_GRPC_ERROR(ToGrpcStatus(impl_->m_->Resume(req->id(), !req->no_prefetch())));
    ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, impl_->m_->Get(req->id()));
    ToProto(info, resp);
    return grpc::Status::OK;
  }

  grpc::Status Snapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest* req,
                        v1::SnapshotResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->id()));
    node::SnapshotRequest r;
    r.id = req->id();
    r.name = req->name();
    r.exclude.assign(req->exclude().begin(), req->exclude().end());
    for (const auto& x : r.exclude) {
      if (x.empty() || x.find('\0') != std::string::npos) return Invalid("exclude entry " + Quote(x) + " is empty or has NUL");
    }
    r.pause = !req->no_pause();
    ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, impl_->m_->Get(req->id()));
    ASSIGN_OR_RETURN_GRPC(image::LayerInfo li, impl_->m_->Snapshot(r));
    v1::Layer* l = resp->mutable_layer();
    l->set_digest(li.digest);
    l->set_name(li.name);
    l->set_size_bytes(li.size_bytes);
    l->set_created_at_ns(li.created_at_ns);
    for (const auto& d : info.layer_digests) resp->add_layers(d);
    resp->add_layers(li.digest);
    return grpc::Status::OK;
  }

  grpc::Status Grade(grpc::ServerContext* ctx, const v1::GradeRequest* req, v1::GradeResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->id()));
    node::GradeRequest g;
    g.id = req->id();
    WARREN_RETURN_IF_GRPC_ERROR(ToExecSpec(req->grader(), &g.grader));
    g.protected_paths.assign(req->protected_paths().begin(), req->protected_paths().end());
    g.solution.assign(req->solution().begin(), req->solution().end());
    ASSIGN_OR_RETURN_GRPC(node::GradeResult res, impl_->m_->Grade(g));
    ToProto(std::move(res.outcome), resp->mutable_result());
    for (const auto& t : res.touched) resp->add_touched(t);
    resp->set_grade_sandbox_id(res.grade_sandbox_id);
    resp->set_touched_truncated(res.touched_truncated);
    resp->set_rejected(res.rejected);
    return grpc::Status::OK;
  }

  static void ToJob(const node::JobInfo& j, v1::Job* out) {
    out->set_name(j.name);
    out->set_lease_s(j.lease_s);
    out->set_grace_s(j.grace_s);
    out->set_lease_expires_at_ns(j.lease_expires_at_ns);
    out->set_lapsed(j.lapsed);
    out->set_lapsed_at_ns(j.lapsed_at_ns);
    out->set_sandboxes(j.sandboxes);
  }

  grpc::Status JobHeartbeat(grpc::ServerContext* ctx, const v1::JobHeartbeatRequest* req, v1::Job* resp) override {
    WARREN_AUTHORIZE(ctx);
    ASSIGN_OR_RETURN_GRPC(node::JobInfo j, impl_->m_->JobHeartbeat(req->job(), req->lease_s(), req->grace_s()));
    ToJob(j, resp);
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::JobRequest* req, v1::Job* resp) override {
    WARREN_AUTHORIZE(ctx);
    if (req->job().empty()) return Invalid("job is empty");
    ASSIGN_OR_RETURN_GRPC(node::JobInfo j, impl_->m_->GetJob(req->job()));
    ToJob(j, resp);
    return grpc::Status::OK;
  }

  grpc::Status SuspendJob(grpc::ServerContext* ctx, const v1::JobRequest* req, v1::JobActionResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    if (req->job().empty()) return Invalid("job is empty");
    resp->set_affected(impl_->m_->SuspendJob(req->job(), "job suspend requested"));
    return grpc::Status::OK;
  }

  grpc::Status ResumeJob(grpc::ServerContext* ctx, const v1::JobRequest* req, v1::JobActionResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    if (req->job().empty()) return Invalid("job is empty");
    resp->set_affected(impl_->m_->ResumeJob(req->job()));
    return grpc::Status::OK;
  }

  grpc::Status DestroyJob(grpc::ServerContext* ctx, const v1::JobRequest* req, v1::JobActionResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    if (req->job().empty()) return Invalid("job is empty");
    resp->set_affected(impl_->m_->DestroyJob(req->job(), "job destroy requested"));
    return grpc::Status::OK;
  }

  grpc::Status Suspend(grpc::ServerContext* ctx, const v1::SuspendRequest* req, v1::Sandbox* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->id()));
    WARREN_RETURN_IF_GRPC_ERROR(ToGrpcStatus(impl_->m_->Suspend(req->id())));
    ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, impl_->m_->Get(req->id()));
    ToProto(info, resp);
    if (StatusOr<node::SandboxMemory> m = impl_->m_->Memory(req->id()); m.ok()) {
      resp->set_memory_bytes(m->memory_bytes);
      resp->set_swap_bytes(m->swap_bytes);
    }
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    (void)req;
    for (const node::JobInfo& j : impl_->m_->ListJobs()) ToJob(j, resp->add_jobs());
    return grpc::Status::OK;
  }

  grpc::Status AuditLog(grpc::ServerContext* ctx, const v1::AuditLogRequest* req,
                        v1::AuditLogResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->id()));
    ASSIGN_OR_RETURN_GRPC(std::vector<nlohmann::json> entries, impl_->m_->AuditLog(req->id()));
    for (const auto& e : entries) {
      resp->add_entries(e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
    return grpc::Status::OK;
  }

 private:
  WarrenServices::Impl* impl_;
};

// ---------------------------------------------------------------- processes (issue 3)
constexpr size_t kStreamChunk = 256 << 10;             // bytes of output per ProcessEvent
constexpr size_t kExecStreamBuffer = 4 << 20;          // per stream, lossless back-pressure window
constexpr auto kReadSlice = std::chrono::milliseconds(200);  // cancellation checks while waiting

node::ProcessOptions ToProcessOptions(const v1::StartOptions& o, const runtime::ExecSpec& spec) {
  node::ProcessOptions p;
  p.start.pty = o.pty();
  p.start.rows = static_cast<uint16_t>(std::min<uint32_t>(o.rows() == 0 ? 24 : o.rows(), 65535));
  p.start.cols = static_cast<uint16_t>(std::min<uint32_t>(o.cols() == 0 ? 80 : o.cols(), 65535));
  p.start.control_fd = o.control_fd();
  p.buffer_bytes = o.buffer_bytes() == 0 ? node::kDefaultProcessBufferBytes : o.buffer_bytes();
  p.timeout = spec.timeout;
  p.kill_grace = spec.kill_grace;
  return p;
}

void ToProto(const runtime::ExecOutcome& o, v1::ExecResult* r) {
  r->set_exit_code(o.exit_code);
  r->set_signal(o.signal);
  r->set_oom_killed(o.oom_killed);
  r->set_timed_out(o.timed_out);
  r->set_stdout_total_bytes(o.stdout_total);
  r->set_stderr_total_bytes(o.stderr_total);
  r->set_duration_ns(o.duration.count());
}

void ToProto(const node::ProcessStatus& st, v1::ProcessInfo* p) {
  p->set_sandbox_id(st.sandbox_id);
  p->set_process_id(st.process_id);
  for (const auto& a : st.argv) p->add_argv(a);
  if (st.shell) p->set_shell(*st.shell);
  p->set_state(st.running ? v1::PROCESS_STATE_RUNNING : v1::PROCESS_STATE_EXITED);
  if (!st.running) ToProto(st.outcome, p->mutable_result());
  p->set_pty(st.pty);
  p->set_started_at_ns(st.started_at_ns);
  p->set_pid(st.pid);
  p->set_stdout_total_bytes(st.totals[0]);
  p->set_stderr_total_bytes(st.totals[1]);
  p->set_stdout_first_offset(st.first_offsets[0]);
  p->set_stderr_first_offset(st.first_offsets[1]);
  p->set_buffer_bytes(st.buffer_bytes);
}

void ToProto(node::OutputData&& d, v1::OutputChunk* c) {
  switch (d.stream) {
    case node::ProcStream::kStdout: c->set_stream(v1::OUTPUT_STREAM_STDOUT); break;
    case node::ProcStream::kStderr: c->set_stream(v1::OUTPUT_STREAM_STDERR); break;
    case node::ProcStream::kControl: c->set_stream(v1::OUTPUT_STREAM_CONTROL); break;
  }
  c->set_offset(d.offset);
  c->set_dropped_bytes(d.dropped);
  c->set_stdout_mark(d.stdout_mark);
  c->set_stderr_mark(d.stderr_mark);
  *c->mutable_data() = std::move(d.data);
}

grpc::Status CheckRef(const v1::ProcessRef& r) {
  if (r.sandbox_id().empty()) return Invalid("ref.sandbox_id is empty");
  if (r.process_id().empty()) return Invalid("ref.process_id is empty");
  return grpc::Status::OK;
}

// Streams mp's output from `offsets` to `write` until the process finished
// and everything was sent (follow) or until what is buffered now was sent.
// Returns false when the client went away (a write failed or the call was
// cancelled).
template <typename Writer>
bool StreamOutput(grpc::ServerContext* ctx, node::ManagedProcess& mp, std::array<uint64_t, 3> offsets, bool follow,
                  bool lossless, Writer* writer) {
  for (;;) {
    if (ctx->IsCancelled()) return false;
    auto deadline = node::ManagedProcess::Clock::now() + (follow ? kReadSlice : std::chrono::milliseconds(0));
    node::ManagedProcess::ReadResult r = mp.Read(offsets, kStreamChunk, deadline);
    for (node::OutputData& d : r.chunks) {
      const int s = static_cast<int>(d.stream);
      offsets[s] = d.offset + d.data.size();
      v1::ProcessEvent ev;
      ToProto(std::move(d), ev.mutable_output());
      if (!writer->Write(ev)) return false;
    }
    if (lossless) mp.Consumed({offsets[0], offsets[1]});
    if (r.chunks.empty() && (r.finished || !follow)) break;
  }
  node::ProcessStatus st = mp.Info();
  if (!st.running) {
    v1::ProcessEvent ev;
    ToProto(st.outcome, ev.mutable_exit());
    if (!writer->Write(ev)) return false;
  }
  return true;
}

class ProcessesService final : public v1::Processes::Service {
 public:
  explicit ProcessesService(WarrenServices::Impl* impl) : impl_(impl) {}

  grpc::Status ExecStream(grpc::ServerContext* ctx,
                          grpc::ServerReaderWriter<v1::ProcessEvent, v1::ExecStreamRequest>* stream) override {
    WARREN_AUTHORIZE(ctx);
    v1::ExecStreamRequest first;
    if (!stream->Read(&first)) return Invalid("ExecStream: the first message (with exec) is missing");
    if (!first.has_exec()) return Invalid("ExecStream: the first message must carry exec");
    const std::string id = first.exec().sandbox_id();
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(id));
    runtime::ExecSpec spec;
    WARREN_RETURN_IF_GRPC_ERROR(ToExecSpec(first.exec(), &spec));
    node::ProcessOptions opts = ToProcessOptions(first.options(), spec);
    opts.lossless = true;
    opts.buffer_bytes = kExecStreamBuffer;
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp, impl_->m_->StartAttached(id, spec, opts));
    Apply(first, *mp);
    {
      v1::ProcessEvent ev;
      ToProto(mp->Info(), ev.mutable_started());
      if (!stream->Write(ev)) {
        mp->Stop();
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
    }
    // Client messages (stdin, signals, resizes) on their own thread; the
    // client half-closing its side closes stdin.
    std::mutex mu;
    std::condition_variable cv;
    bool reader_done = false;
    std::thread reader([&] {
      v1::ExecStreamRequest in;
      while (stream->Read(&in)) Apply(in, *mp);
      (void)mp->Write("", true);
      std::lock_guard<std::mutex> l(mu);
      reader_done = true;
      cv.notify_all();
    });
    const bool ok = StreamOutput(ctx, *mp, {0, 0, 0}, true, true, stream);
    if (!ok) mp->Stop();  // the client went away: the whole tree goes
    {
      // The client half-closes once it got `exit`; a client that does not is cut off.
      std::unique_lock<std::mutex> l(mu);
      if (!cv.wait_for(l, std::chrono::seconds(ok ? 10 : 0), [&] { return reader_done; })) {
        ctx->TryCancel();
      }
    }
    reader.join();
    if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away; process killed");
    return grpc::Status::OK;
  }

  grpc::Status Spawn(grpc::ServerContext* ctx, const v1::SpawnRequest* req, v1::ProcessInfo* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->exec().sandbox_id()));
    runtime::ExecSpec spec;
    WARREN_RETURN_IF_GRPC_ERROR(ToExecSpec(req->exec(), &spec));
    node::ProcessOptions opts = ToProcessOptions(req->options(), spec);
    if (opts.buffer_bytes > node::kMaxProcessBufferBytes) {
      return Invalid("options.buffer_bytes=" + std::to_string(opts.buffer_bytes) + " exceeds the maximum of " +
                     std::to_string(node::kMaxProcessBufferBytes));
    }
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                          impl_->m_->Spawn(req->exec().sandbox_id(), spec, opts));
    ToProto(mp->Info(), resp);
    return grpc::Status::OK;
  }

  grpc::Status List(grpc::ServerContext* ctx, const v1::ListProcessesRequest* req,
                    v1::ListProcessesResponse* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
    ASSIGN_OR_RETURN_GRPC(std::vector<node::ProcessStatus> all, impl_->m_->Processes(req->sandbox_id()));
    for (const auto& st : all) ToProto(st, resp->add_processes());
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* ctx, const v1::ProcessRef* req, v1::ProcessInfo* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckRef(*req));
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                          impl_->m_->FindProcess(req->sandbox_id(), req->process_id()));
    ToProto(mp->Info(), resp);
    return grpc::Status::OK;
  }

  grpc::Status Wait(grpc::ServerContext* ctx, const v1::WaitProcessRequest* req, v1::ProcessInfo* resp) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckRef(req->ref()));
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                          impl_->m_->FindProcess(req->ref().sandbox_id(), req->ref().process_id()));
    const auto until = node::ManagedProcess::Clock::now() + std::chrono::milliseconds(req->timeout_ms());
    while (!ctx->IsCancelled()) {
      auto slice = std::min(until, node::ManagedProcess::Clock::now() + kReadSlice);
      if (mp->WaitFinished(slice) || slice >= until) break;
    }
    ToProto(mp->Info(), resp);
    return grpc::Status::OK;
  }

  grpc::Status Signal(grpc::ServerContext* ctx, const v1::SignalProcessRequest* req, v1::Empty*) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckRef(req->ref()));
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                          impl_->m_->FindProcess(req->ref().sandbox_id(), req->ref().process_id()));
    (void)impl_->m_->Running(req->ref().sandbox_id());  // a paused sandbox resumes (the signal must act)
    return ToGrpcStatus(mp->Signal(req->signal(), !req->group_only()));
  }

  grpc::Status Input(grpc::ServerContext* ctx, const v1::ProcessInputRequest* req, v1::Empty*) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckRef(req->ref()));
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                          impl_->m_->FindProcess(req->ref().sandbox_id(), req->ref().process_id()));
    (void)impl_->m_->Running(req->ref().sandbox_id());
    return ToGrpcStatus(mp->Write(req->data(), req->close()));
  }

  grpc::Status Resize(grpc::ServerContext* ctx, const v1::ResizeRequest* req, v1::Empty*) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckRef(req->ref()));
    if (req->rows() == 0 || req->cols() == 0 || req->rows() > 65535 || req->cols() > 65535)
      return Invalid("rows and cols must be in [1, 65535]");
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                          impl_->m_->FindProcess(req->ref().sandbox_id(), req->ref().process_id()));
    return ToGrpcStatus(mp->Resize(static_cast<uint16_t>(req->rows()), static_cast<uint16_t>(req->cols())));
  }

  grpc::Status Output(grpc::ServerContext* ctx, const v1::ProcessOutputRequest* req,
                      grpc::ServerWriter<v1::ProcessEvent>* writer) override {
    WARREN_AUTHORIZE(ctx);
    WARREN_RETURN_IF_GRPC_ERROR(CheckRef(req->ref()));
    ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                          impl_->m_->FindProcess(req->ref().sandbox_id(), req->ref().process_id()));
    if (!StreamOutput(ctx, *mp, {req->stdout_offset(), req->stderr_offset(), req->control_offset()}, req->follow(),
                      false, writer)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    return grpc::Status::OK;
  }

 private:
  // Input of an ExecStream message (the first one's exec.stdin was queued by Start).
  static void Apply(const v1::ExecStreamRequest& in, node::ManagedProcess& mp) {
    if (!in.stdin().empty() || in.close_stdin()) (void)mp.Write(in.stdin(), in.close_stdin());
    if (in.signal() != 0) (void)mp.Signal(in.signal(), true);
    if (in.resize_rows() > 0 && in.resize_cols() > 0 && in.resize_rows() <= 65535 && in.resize_cols() <= 65535)
      (void)mp.Resize(static_cast<uint16_t>(in.resize_rows()), static_cast<uint16_t>(in.resize_cols()));
  }

  WarrenServices::Impl* impl_;
};

}  // namespace

struct WarrenServices::Holder {
  explicit Holder(Impl* impl)
      : sandboxes(impl), files(impl), layers(impl), node(impl), lifecycle(impl), processes(impl) {}
  SandboxesService sandboxes;
  FilesService files;
  LayersService layers;
  NodeService node;
  LifecycleService lifecycle;
  ProcessesService processes;
};

WarrenServices::WarrenServices(node::SandboxManager* manager, ServiceOptions options)
    : impl_(std::make_unique<Impl>(manager, std::move(options))),
      holder_(std::make_unique<Holder>(impl_.get())) {}

WarrenServices::~WarrenServices() = default;

std::vector<grpc::Service*> WarrenServices::services() {
  return {&holder_->sandboxes, &holder_->files, &holder_->layers, &holder_->node, &holder_->lifecycle,
          &holder_->processes};
}

StatusOr<std::unique_ptr<grpc::Server>> StartServer(const ServerOptions& options,
                                                    WarrenServices& services, int* tcp_port,
                                                    const std::vector<grpc::Service*>& extra) {
  grpc::ServerBuilder builder;
  if (!options.unix_socket.empty()) {
    builder.AddListeningPort("unix:" + options.unix_socket, grpc::InsecureServerCredentials());
  }
  if (!options.tcp_listen.empty()) {
    builder.AddListeningPort(options.tcp_listen, grpc::InsecureServerCredentials(), tcp_port);
  }
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Execs block a handler thread for their duration: allow many threads so
  // hundreds of long execs do not starve short calls.
  grpc::ResourceQuota quota("warrend");
  quota.SetMaxThreads(options.max_threads);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 16);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  for (grpc::Service* s : services.services()) builder.RegisterService(s);
  for (grpc::Service* s : extra) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError("gRPC server failed to start on unix:" + options.unix_socket +
                                  (options.tcp_listen.empty() ? "" : " and " + options.tcp_listen) +
                                  " (address in use or not permitted?)");
  }
  if (!options.tcp_listen.empty() && tcp_port != nullptr && *tcp_port == 0) {
    server->Shutdown();
    return absl::UnavailableError("could not listen on " + options.tcp_listen);
  }
  if (!options.unix_socket.empty() && ::chmod(options.unix_socket.c_str(), 0660) != 0) {
    Status s = ErrnoToStatus(errno, "chmod(" + options.unix_socket + ")");
    server->Shutdown();
    return s;
  }
  return server;
}

}  // namespace warren::api
