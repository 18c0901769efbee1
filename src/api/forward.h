// The cluster hook of the warren.v1 services: a call about a sandbox owned by
// another node is forwarded to that node, a create is placed, a list fans
// out. The services know only this interface; src/cluster implements it.
// Without a Forwarder (single node) every call is served locally.
//
// A forwarded call carries kForwardedKey in its metadata: its receiver serves
// it locally, whatever the id names (no second hop, no loop).
//
// Thread-safe: called concurrently from the server's handler threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "api/projects.h"
#include "common/status.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::api {

// Metadata key of a call forwarded by another node (value: its node id).
inline constexpr char kForwardedKey[] = "x-warren-forwarded";

// Whether `ctx`'s call was forwarded by another node.
bool IsForwarded(const grpc::ServerContext& ctx);

class Forwarder {
 public:
  virtual ~Forwarder() = default;

  // The channel to the node owning `sandbox_id`; nullptr when this node owns
  // it or the call was forwarded to us. NotFound when the id names a node
  // that is not in the cluster.
  virtual StatusOr<std::shared_ptr<grpc::Channel>> Owner(const grpc::ServerContext& ctx,
                                                         const std::string& sandbox_id) = 0;

  // A client context for forwarding `ctx`'s call: its deadline and
  // cancellation propagate; it carries this node's token and kForwardedKey.
  virtual std::unique_ptr<grpc::ClientContext> Context(const grpc::ServerContext& ctx) = 0;

  // Places a create: tries the chosen nodes in order (`local` serves it on
  // this node) until one admits it. Returns false when the call is served
  // locally without placement (forwarded to us), leaving `*status` unset.
  virtual bool Place(grpc::ServerContext* ctx, const warren::v1::CreateSandboxRequest& req, warren::v1::Sandbox* resp,
                     const std::function<grpc::Status(warren::v1::Sandbox*)>& local, grpc::Status* status) = 0;

  // The other nodes' channels for a fan-out (empty when the call was
  // forwarded to us, so it is answered from this node only).
  virtual std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>> Peers(const grpc::ServerContext& ctx) = 0;
};

// Forwards a unary call: `call(stub, client_ctx, req, resp)`.
template <typename Service, typename Req, typename Resp, typename Call>
grpc::Status ForwardUnary(Forwarder& f, const grpc::ServerContext& ctx, const std::shared_ptr<grpc::Channel>& ch,
                          const Req& req, Resp* resp, Call call) {
  std::unique_ptr<grpc::ClientContext> cc = f.Context(ctx);
  auto stub = Service::NewStub(ch);
  return call(*stub, cc.get(), req, resp);
}

// Forwards a server-streaming call: `open(stub, client_ctx, req)` returns the
// ClientReader whose messages are relayed to `writer`.
template <typename Service, typename Req, typename Msg, typename Open>
grpc::Status ForwardServerStream(Forwarder& f, const grpc::ServerContext& ctx, const std::shared_ptr<grpc::Channel>& ch,
                                 const Req& req, grpc::ServerWriter<Msg>* writer, Open open) {
  std::unique_ptr<grpc::ClientContext> cc = f.Context(ctx);
  auto stub = Service::NewStub(ch);
  auto reader = open(*stub, cc.get(), req);
  Msg m;
  while (reader->Read(&m)) {
    if (!writer->Write(m)) {
      cc->TryCancel();
      break;
    }
  }
  return reader->Finish();
}

// Forwards a client-streaming call whose `first` message was already read.
// The caller's half-close is relayed as one; the caller's cancellation
// cancels the owner's call (a half-close there would commit what arrived,
// e.g. half a Files.Write, as the whole).
template <typename Service, typename Req, typename Resp, typename Open>
grpc::Status ForwardClientStream(Forwarder& f, const grpc::ServerContext& ctx, const std::shared_ptr<grpc::Channel>& ch,
                                 Req first, grpc::ServerReader<Req>* reader, Resp* resp, Open open) {
  std::unique_ptr<grpc::ClientContext> cc = f.Context(ctx);
  auto stub = Service::NewStub(ch);
  auto writer = open(*stub, cc.get(), resp);
  bool ok = writer->Write(first);
  while (ok && reader->Read(&first)) ok = writer->Write(first);
  if (ctx.IsCancelled()) {
    cc->TryCancel();
    writer->Finish();
    return {grpc::StatusCode::CANCELLED, "the caller cancelled the stream"};
  }
  writer->WritesDone();
  return writer->Finish();
}

// Forwards a bidirectional stream whose `first` message was already read,
// and whose owner answers that first message at once (ExecStream): then one
// thread relays the caller's messages, this one the owner's replies. As
// the local ExecStream, a caller that does not half-close within 10 s of the
// owner's end is cut off.
template <typename Service, typename Req, typename Resp, typename Open>
grpc::Status ForwardBidi(Forwarder& f, grpc::ServerContext* ctx, const std::shared_ptr<grpc::Channel>& ch,
                         const Req& first, grpc::ServerReaderWriter<Resp, Req>* stream, Open open) {
  std::unique_ptr<grpc::ClientContext> cc = f.Context(*ctx);
  auto stub = Service::NewStub(ch);
  auto up = open(*stub, cc.get());
  // The owner answers the first message at once, with its first reply
  // (ExecStream: `started`) or by ending the call (bad input: NotFound,
  // InvalidArgument...). That end is relayed as it is, before the caller's
  // other messages are read: a caller waiting for the first reply does not
  // half-close, so waiting for it would end in the cut-off below (CANCELLED).
  Resp r;
  if (!up->Write(first) || !up->Read(&r)) return up->Finish();
  if (!stream->Write(r)) {
    cc->TryCancel();
    return up->Finish();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool pump_done = false;
  std::thread pump([&] {
    Req m;
    bool ok = true;
    while (ok && stream->Read(&m)) ok = up->Write(m);
    up->WritesDone();
    std::lock_guard<std::mutex> l(mu);
    pump_done = true;
    cv.notify_all();
  });
  while (up->Read(&r)) {
    if (!stream->Write(r)) {
      cc->TryCancel();
      break;
    }
  }
  {
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, std::chrono::seconds(10), [&] { return pump_done; })) ctx->TryCancel();
  }
  pump.join();
  return up->Finish();
}

// Runs `call(stub, client_ctx, resp)` on every other node at once (none
// when there is no Forwarder or `ctx`'s call was forwarded); their answers
// in `*out`. A node that does not answer fails the whole call with
// UNAVAILABLE naming it (retryable): a partial answer would read as "gone".
// A node that refuses the caller (PERMISSION_DENIED: another project's) refuses the call.
template <typename Service, typename Resp, typename Call>
grpc::Status FanOut(Forwarder* f, const grpc::ServerContext& ctx, std::vector<Resp>* out, Call call) {
  if (f == nullptr) return grpc::Status::OK;
  auto peers = f->Peers(ctx);
  std::vector<grpc::Status> statuses(peers.size());
  out->assign(peers.size(), Resp());
  std::vector<std::thread> calls;
  calls.reserve(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    calls.emplace_back([&, i] {
      std::unique_ptr<grpc::ClientContext> cc = f->Context(ctx);
      auto stub = Service::NewStub(peers[i].second);
      statuses[i] = call(*stub, cc.get(), &(*out)[i]);
    });
  }
  for (std::thread& t : calls) t.join();
  for (size_t i = 0; i < peers.size(); ++i) {
    if (statuses[i].error_code() == grpc::StatusCode::PERMISSION_DENIED) return statuses[i];
    if (!statuses[i].ok()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "node " + peers[i].first + " did not answer: " + statuses[i].error_message());
    }
  }
  return grpc::Status::OK;
}

}  // namespace warren::api

// Serves the call on the owning node when that is another one (which checks
// the caller's project); on this node, returns PERMISSION_DENIED unless the
// caller may touch the sandbox (api/projects.h). `id` is the sandbox id; the
// rest names the stub's method and the call's shape.
#define WARREN_FORWARD_UNARY(deps, ctx, id, Service, Method, req, resp)                                          \
  do {                                                                                                           \
    if ((deps).forward != nullptr) {                                                                             \
      StatusOr<std::shared_ptr<grpc::Channel>> owner_ = (deps).forward->Owner(*(ctx), (id));                     \
      if (!owner_.ok()) return ToGrpcStatus(owner_.status());                                                    \
      if (*owner_ != nullptr) {                                                                                  \
        return ::warren::api::ForwardUnary<Service>(                                                             \
            *(deps).forward, *(ctx), *owner_, (req), (resp),                                                     \
            [](Service::Stub& s, grpc::ClientContext* c, const auto& q, auto* p) { return s.Method(c, q, p); }); \
      }                                                                                                          \
    }                                                                                                            \
    RETURN_IF_GRPC_ERROR(::warren::api::CheckSandboxAccess((deps), *(ctx), (id)));                               \
  } while (0)

// Declares `var`, the channel to the node owning sandbox `id` when that is
// another one (else null); returns the lookup's error from the handler, and
// PERMISSION_DENIED when this node owns the sandbox and the caller may not
// touch it (api/projects.h).
#define WARREN_REMOTE_OWNER(deps, ctx, id, var)                                              \
  std::shared_ptr<grpc::Channel> var;                                                        \
  if ((deps).forward != nullptr) {                                                           \
    StatusOr<std::shared_ptr<grpc::Channel>> var##_or = (deps).forward->Owner(*(ctx), (id)); \
    if (!var##_or.ok()) return ToGrpcStatus(var##_or.status());                              \
    (var) = *std::move(var##_or);                                                            \
  }                                                                                          \
  if ((var) == nullptr) {                                                                    \
    RETURN_IF_GRPC_ERROR(::warren::api::CheckSandboxAccess((deps), *(ctx), (id)));           \
  }
