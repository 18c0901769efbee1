#include "api/processes_service.h"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "api/convert.h"
#include "api/status_map.h"

namespace warren::api {
namespace {

namespace v1 = ::warren::v1;

constexpr size_t kStreamChunk = 256 << 10;                   // bytes of output per ProcessEvent
constexpr size_t kExecStreamBuffer = 4 << 20;                // per stream, lossless back-pressure window
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

grpc::Status CheckRef(const v1::ProcessRef& r) {
  if (r.sandbox_id().empty()) return Invalid("ref.sandbox_id is empty");
  if (r.process_id().empty()) return Invalid("ref.process_id is empty");
  return grpc::Status::OK;
}

// Input of an ExecStream message (the first one's exec.stdin was queued by Start).
void Apply(const v1::ExecStreamRequest& in, node::ManagedProcess& mp) {
  if (!in.stdin().empty() || in.close_stdin()) (void)mp.Write(in.stdin(), in.close_stdin());
  if (in.signal() != 0) (void)mp.Signal(in.signal(), true);
  if (in.resize_rows() > 0 && in.resize_cols() > 0 && in.resize_rows() <= 65535 && in.resize_cols() <= 65535) {
    (void)mp.Resize(static_cast<uint16_t>(in.resize_rows()), static_cast<uint16_t>(in.resize_cols()));
  }
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

}  // namespace

grpc::Status ProcessesService::ExecStream(grpc::ServerContext* ctx,
                                          grpc::ServerReaderWriter<v1::ProcessEvent, v1::ExecStreamRequest>* stream) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  v1::ExecStreamRequest first;
  if (!stream->Read(&first)) return Invalid("ExecStream: the first message (with exec) is missing");
  if (!first.has_exec()) return Invalid("ExecStream: the first message must carry exec");
  const std::string id = first.exec().sandbox_id();
  RETURN_IF_GRPC_ERROR(CheckId(id));
  WARREN_REMOTE_OWNER(deps_, ctx, id, owner);
  if (owner != nullptr) {
    return ForwardBidi<v1::Processes>(*deps_.forward, ctx, owner, first, stream,
                                      [](v1::Processes::Stub& s, grpc::ClientContext* c) { return s.ExecStream(c); });
  }
  runtime::ExecSpec spec;
  RETURN_IF_GRPC_ERROR(ToExecSpec(first.exec(), &spec));
  node::ProcessOptions opts = ToProcessOptions(first.options(), spec);
  opts.lossless = true;
  opts.buffer_bytes = kExecStreamBuffer;
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp, deps_.manager->StartAttached(id, spec, opts));
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
    if (!cv.wait_for(l, std::chrono::seconds(ok ? 10 : 0), [&] { return reader_done; })) ctx->TryCancel();
  }
  reader.join();
  if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away; process killed");
  return grpc::Status::OK;
}

grpc::Status ProcessesService::Spawn(grpc::ServerContext* ctx, const v1::SpawnRequest* req, v1::ProcessInfo* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->exec().sandbox_id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->exec().sandbox_id(), v1::Processes, Spawn, *req, resp);
  runtime::ExecSpec spec;
  RETURN_IF_GRPC_ERROR(ToExecSpec(req->exec(), &spec));
  node::ProcessOptions opts = ToProcessOptions(req->options(), spec);
  if (opts.buffer_bytes > node::kMaxProcessBufferBytes) {
    return Invalid("options.buffer_bytes=" + std::to_string(opts.buffer_bytes) + " exceeds the maximum of " +
                   std::to_string(node::kMaxProcessBufferBytes));
  }
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                        deps_.manager->Spawn(req->exec().sandbox_id(), spec, opts));
  ToProto(mp->Info(), resp);
  return grpc::Status::OK;
}

grpc::Status ProcessesService::List(grpc::ServerContext* ctx, const v1::ListProcessesRequest* req,
                                    v1::ListProcessesResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->sandbox_id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->sandbox_id(), v1::Processes, List, *req, resp);
  ASSIGN_OR_RETURN_GRPC(std::vector<node::ProcessStatus> all, deps_.manager->Processes(req->sandbox_id()));
  for (const auto& st : all) ToProto(st, resp->add_processes());
  return grpc::Status::OK;
}

grpc::Status ProcessesService::Get(grpc::ServerContext* ctx, const v1::ProcessRef* req, v1::ProcessInfo* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckRef(*req));
  WARREN_FORWARD_UNARY(deps_, ctx, req->sandbox_id(), v1::Processes, Get, *req, resp);
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                        deps_.manager->FindProcess(req->sandbox_id(), req->process_id()));
  ToProto(mp->Info(), resp);
  return grpc::Status::OK;
}

grpc::Status ProcessesService::Wait(grpc::ServerContext* ctx, const v1::WaitProcessRequest* req,
                                    v1::ProcessInfo* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckRef(req->ref()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->ref().sandbox_id(), v1::Processes, Wait, *req, resp);
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                        deps_.manager->FindProcess(req->ref().sandbox_id(), req->ref().process_id()));
  const auto until = node::ManagedProcess::Clock::now() + std::chrono::milliseconds(req->timeout_ms());
  while (!ctx->IsCancelled()) {
    auto slice = std::min(until, node::ManagedProcess::Clock::now() + kReadSlice);
    if (mp->WaitFinished(slice) || slice >= until) break;
  }
  ToProto(mp->Info(), resp);
  return grpc::Status::OK;
}

grpc::Status ProcessesService::Signal(grpc::ServerContext* ctx, const v1::SignalProcessRequest* req, v1::Empty* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckRef(req->ref()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->ref().sandbox_id(), v1::Processes, Signal, *req, resp);
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                        deps_.manager->FindProcess(req->ref().sandbox_id(), req->ref().process_id()));
  (void)deps_.manager->Running(req->ref().sandbox_id());  // a paused sandbox resumes (the signal must act)
  return ToGrpcStatus(mp->Signal(req->signal(), !req->group_only()));
}

grpc::Status ProcessesService::Input(grpc::ServerContext* ctx, const v1::ProcessInputRequest* req, v1::Empty* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckRef(req->ref()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->ref().sandbox_id(), v1::Processes, Input, *req, resp);
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                        deps_.manager->FindProcess(req->ref().sandbox_id(), req->ref().process_id()));
  (void)deps_.manager->Running(req->ref().sandbox_id());
  return ToGrpcStatus(mp->Write(req->data(), req->close()));
}

grpc::Status ProcessesService::Resize(grpc::ServerContext* ctx, const v1::ResizeRequest* req, v1::Empty* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckRef(req->ref()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->ref().sandbox_id(), v1::Processes, Resize, *req, resp);
  if (req->rows() == 0 || req->cols() == 0 || req->rows() > 65535 || req->cols() > 65535) {
    return Invalid("rows and cols must be in [1, 65535]");
  }
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                        deps_.manager->FindProcess(req->ref().sandbox_id(), req->ref().process_id()));
  return ToGrpcStatus(mp->Resize(static_cast<uint16_t>(req->rows()), static_cast<uint16_t>(req->cols())));
}

grpc::Status ProcessesService::Output(grpc::ServerContext* ctx, const v1::ProcessOutputRequest* req,
                                      grpc::ServerWriter<v1::ProcessEvent>* writer) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckRef(req->ref()));
  WARREN_REMOTE_OWNER(deps_, ctx, req->ref().sandbox_id(), owner);
  if (owner != nullptr) {
    return ForwardServerStream<v1::Processes>(*deps_.forward, *ctx, owner, *req, writer,
                                              [](v1::Processes::Stub& s, grpc::ClientContext* c,
                                                 const v1::ProcessOutputRequest& q) { return s.Output(c, q); });
  }
  ASSIGN_OR_RETURN_GRPC(std::shared_ptr<node::ManagedProcess> mp,
                        deps_.manager->FindProcess(req->ref().sandbox_id(), req->ref().process_id()));
  if (!StreamOutput(ctx, *mp, {req->stdout_offset(), req->stderr_offset(), req->control_offset()}, req->follow(), false,
                    writer)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  }
  return grpc::Status::OK;
}

}  // namespace warren::api
