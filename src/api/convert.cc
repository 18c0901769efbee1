#include "api/convert.h"

#include "absl/strings/escaping.h"

namespace warren::api {
namespace {

namespace v1 = ::warren::v1;

constexpr uint64_t kDefaultOutputCap = 16ull << 20;
constexpr uint64_t kMaxOutputCap = 256ull << 20;

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

v1::FileType ToProto(runtime::FileType t) {
  switch (t) {
    case runtime::FileType::kRegular: return v1::FILE_TYPE_REGULAR;
    case runtime::FileType::kDirectory: return v1::FILE_TYPE_DIRECTORY;
    case runtime::FileType::kSymlink: return v1::FILE_TYPE_SYMLINK;
    case runtime::FileType::kOther: return v1::FILE_TYPE_OTHER;
  }
  return v1::FILE_TYPE_UNSPECIFIED;
}

// Everything but the captured output.
void OutcomeFields(const runtime::ExecOutcome& o, v1::ExecResult* r) {
  r->set_exit_code(o.exit_code);
  r->set_signal(o.signal);
  r->set_oom_killed(o.oom_killed);
  r->set_timed_out(o.timed_out);
  r->set_stdout_truncated(o.stdout_truncated);
  r->set_stderr_truncated(o.stderr_truncated);
  r->set_stdout_total_bytes(o.stdout_total);
  r->set_stderr_total_bytes(o.stderr_total);
  r->set_duration_ns(o.duration.count());
}

}  // namespace

grpc::Status Invalid(const std::string& msg) { return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, msg); }

std::string Quote(const std::string& s) {
  std::string v = s.size() > 80 ? s.substr(0, 80) + "..." : s;
  return "\"" + absl::CHexEscape(v) + "\"";
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

grpc::Status ToExecSpec(const v1::ExecRequest& req, runtime::ExecSpec* out) {
  runtime::ExecSpec& spec = *out;
  const bool has_argv = req.argv_size() > 0;
  const bool has_shell = !req.shell().empty();
  if (has_argv == has_shell) return Invalid("exactly one of argv or shell must be given");
  if (has_argv) {
    for (int i = 0; i < req.argv_size(); ++i) {
      const std::string& a = req.argv(i);
      if (a.find('\0') != std::string::npos) {
        return Invalid("argv[" + std::to_string(i) + "]=" + Quote(a) + " contains NUL");
      }
      spec.argv.push_back(a);
    }
    if (spec.argv[0].empty()) return Invalid("argv[0] is empty");
  } else {
    if (req.shell().find('\0') != std::string::npos) return Invalid("shell contains NUL");
    spec.shell = req.shell();
  }
  if (grpc::Status es = CheckEnv(req.env(), &spec.env); !es.ok()) return es;
  if (!req.cwd().empty()) {
    if (req.cwd()[0] != '/' || req.cwd().find('\0') != std::string::npos) {
      return Invalid("cwd=" + Quote(req.cwd()) + " must be an absolute path");
    }
    spec.cwd = req.cwd();
  }
  if (!req.user().empty()) {
    if (!node::ValidUser(req.user())) {
      return Invalid("user=" + Quote(req.user()) + " must be \"root\", a user name or \"uid[:gid]\"");
    }
    spec.user = req.user();
  }
  spec.stdin_data = req.stdin();
  spec.timeout = std::chrono::milliseconds(req.timeout_ms());
  spec.kill_grace = std::chrono::milliseconds(req.kill_grace_ms() == 0 ? 500 : req.kill_grace_ms());
  const uint64_t cap = req.output_cap_bytes() == 0 ? kDefaultOutputCap : req.output_cap_bytes();
  if (cap > kMaxOutputCap) {
    return Invalid("output_cap_bytes=" + std::to_string(cap) + " exceeds the maximum of " +
                   std::to_string(kMaxOutputCap));
  }
  spec.output_cap_bytes = cap;
  spec.merge_stderr = req.merge_stderr();
  return grpc::Status::OK;
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
  out->set_qos(runtime::QosName(in.qos));
  out->set_main_process(in.main_process);
}

void ToProto(const node::ClassCapacity& in, v1::QosClassCapacity* out) {
  out->set_qos(runtime::QosName(in.qos));
  out->set_overcommit(in.overcommit);
  out->set_sandboxes(in.used.sandboxes);
  out->set_cpu_millis(in.used.cpu_millis);
  out->set_memory_mb(in.used.memory_mb);
  out->set_free_cpu_millis(in.free_cpu_millis);
  out->set_free_memory_mb(in.free_memory_mb);
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

void ToProto(const runtime::ExecOutcome& in, v1::ExecResult* out) {
  OutcomeFields(in, out);
  out->set_stdout(in.stdout_data);
  out->set_stderr(in.stderr_data);
}

void ToProto(runtime::ExecOutcome&& in, v1::ExecResult* out) {
  OutcomeFields(in, out);
  *out->mutable_stdout() = std::move(in.stdout_data);
  *out->mutable_stderr() = std::move(in.stderr_data);
}

void ToProto(const node::ProcessStatus& st, v1::ProcessInfo* p) {
  p->set_sandbox_id(st.sandbox_id);
  p->set_process_id(st.process_id);
  for (const auto& a : st.argv) p->add_argv(a);
  if (st.shell) p->set_shell(*st.shell);
  p->set_state(st.running ? v1::PROCESS_STATE_RUNNING : v1::PROCESS_STATE_EXITED);
  // A process's output is read through Output, not kept in its outcome.
  if (!st.running) OutcomeFields(st.outcome, p->mutable_result());
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

void ToProto(const node::JobInfo& j, v1::Job* out) {
  out->set_name(j.name);
  out->set_lease_s(j.lease_s);
  out->set_grace_s(j.grace_s);
  out->set_lease_expires_at_ns(j.lease_expires_at_ns);
  out->set_lapsed(j.lapsed);
  out->set_lapsed_at_ns(j.lapsed_at_ns);
  out->set_sandboxes(j.sandboxes);
}

void ToProto(const image::LayerInfo& li, v1::Layer* out) {
  out->set_digest(li.digest);
  out->set_name(li.name);
  out->set_size_bytes(li.size_bytes);
  out->set_created_at_ns(li.created_at_ns);
  for (const std::string& p : li.projects) out->add_projects(p);
}

}  // namespace warren::api
