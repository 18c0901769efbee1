// The load side of the cluster scale simulation (bench/cluster/bench_scale.py),
// in C++ so that it takes less of the shared cores than the entry node it
// measures. Two modes:
//
//   scale_peer fakes ID...
//       One fake warren.v1 Sandboxes service per node id, each on a
//       127.0.0.1 port of its own (callback API: no thread per call). A
//       Create answers at once with a RUNNING sandbox "<id>-<12 hex>", a Get
//       echoes the id. Prints "ID HOST:PORT" per node, then "ready", then
//       serves until its stdin closes (the bench's end, or the bench dying).
//
//   scale_peer load TARGET KIND COUNT CONCURRENCY [CHANNELS]
//       Sends COUNT calls (KIND create: Sandboxes.Create of a container with
//       layer base/debian-12@1; get: Sandboxes.Get of fake000-000000000001)
//       to TARGET (a gRPC address, e.g. unix:/path), CONCURRENCY in flight
//       over CHANNELS connections (default 2). Prints one JSON object:
//       {"first": s, "last": s (CLOCK_MONOTONIC, Python's time.monotonic()),
//        "lat_us": [per answered call], "owners": {node: n}, "errors": {code: n}}.
//
// Exit status 2 and a message on stderr for bad arguments.
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "warren/v1/warren.grpc.pb.h"

namespace {

namespace v1 = ::warren::v1;

double Monotonic() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

class FakeNode final : public v1::Sandboxes::CallbackService {
 public:
  explicit FakeNode(std::string id) : id_(std::move(id)) {}

  grpc::ServerUnaryReactor* Create(grpc::CallbackServerContext* ctx, const v1::CreateSandboxRequest* req,
                                   v1::Sandbox* resp) override {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%012llx", static_cast<unsigned long long>(++n_));
    resp->set_id(id_ + "-" + hex);
    resp->set_backend(req->backend().empty() ? "container" : req->backend());
    resp->set_state(v1::SANDBOX_STATE_RUNNING);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const v1::GetSandboxRequest* req,
                                v1::Sandbox* resp) override {
    resp->set_id(req->id());
    resp->set_backend("container");
    resp->set_state(v1::SANDBOX_STATE_RUNNING);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

 private:
  const std::string id_;
  std::atomic<uint64_t> n_{0};
};

int Fakes(const std::vector<std::string>& ids) {
  std::vector<std::unique_ptr<FakeNode>> nodes;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  for (const std::string& id : ids) {
    nodes.push_back(std::make_unique<FakeNode>(id));
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    b.RegisterService(nodes.back().get());
    servers.push_back(b.BuildAndStart());
    if (servers.back() == nullptr || port == 0) {
      std::cerr << "scale_peer: could not serve node " << id << " on 127.0.0.1\n";
      return 1;
    }
    std::cout << id << " 127.0.0.1:" << port << "\n";
  }
  std::cout << "ready" << std::endl;
  char buf[256];
  while (::read(0, buf, sizeof buf) > 0) {
  }
  for (auto& s : servers) s->Shutdown();
  return 0;
}

struct Load {
  std::vector<std::unique_ptr<v1::Sandboxes::Stub>> stubs;
  std::string kind;
  int64_t left = 0;
  int64_t running = 0;
  std::mutex mu;
  std::condition_variable done;
  std::vector<double> lat_us;
  std::map<std::string, int64_t> owners;
  std::map<int, int64_t> errors;
  v1::CreateSandboxRequest create;
  v1::GetSandboxRequest get;
};

// Starts the next call on stub `i` when any are left (else counts this
// caller out). Not called with mu held: a call may complete inline.
void Next(Load* l, size_t i) {
  {
    std::lock_guard<std::mutex> g(l->mu);
    if (l->left == 0) {
      if (--l->running == 0) l->done.notify_all();
      return;
    }
    --l->left;
  }
  struct Call {
    grpc::ClientContext ctx;
    v1::Sandbox resp;
    double t0 = 0;
  };
  auto* c = new Call;
  c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  c->t0 = Monotonic();
  auto finish = [l, c, i](const grpc::Status& s) {
    const double t1 = Monotonic();
    {
      std::lock_guard<std::mutex> g(l->mu);
      if (s.ok()) {
        l->lat_us.push_back((t1 - c->t0) * 1e6);
        const std::string& id = c->resp.id();
        const size_t dash = id.rfind('-');
        ++l->owners[dash == std::string::npos ? id : id.substr(0, dash)];
      } else {
        ++l->errors[s.error_code()];
      }
    }
    delete c;
    Next(l, i);
  };
  v1::Sandboxes::Stub* stub = l->stubs[i % l->stubs.size()].get();
  if (l->kind == "create") {
    stub->async()->Create(&c->ctx, &l->create, &c->resp, finish);
  } else {
    stub->async()->Get(&c->ctx, &l->get, &c->resp, finish);
  }
}

int RunLoad(const std::string& target, const std::string& kind, int64_t count, int64_t concurrency, int channels) {
  Load l;
  l.kind = kind;
  l.left = count;
  l.create.set_backend("container");
  l.create.add_layers("base/debian-12@1");
  l.get.set_id("fake000-000000000001");
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", i);  // distinct channels, not one shared subchannel
    l.stubs.push_back(
        v1::Sandboxes::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
  }
  l.lat_us.reserve(static_cast<size_t>(count));
  const double first = Monotonic();
  {
    std::lock_guard<std::mutex> g(l.mu);
    l.running = concurrency;
  }
  for (int64_t i = 0; i < concurrency; ++i) Next(&l, static_cast<size_t>(i));
  {
    std::unique_lock<std::mutex> g(l.mu);
    l.done.wait(g, [&] { return l.running == 0; });
  }
  const double last = Monotonic();
  std::string out = "{\"first\": " + std::to_string(first) + ", \"last\": " + std::to_string(last) + ", \"lat_us\": [";
  for (size_t i = 0; i < l.lat_us.size(); ++i) {
    if (i != 0) out += ",";
    out += std::to_string(static_cast<int64_t>(l.lat_us[i]));
  }
  out += "], \"owners\": {";
  bool firstkey = true;
  for (const auto& [node, n] : l.owners) {
    out += (firstkey ? "\"" : ", \"") + node + "\": " + std::to_string(n);
    firstkey = false;
  }
  out += "}, \"errors\": {";
  firstkey = true;
  for (const auto& [code, n] : l.errors) {
    out += (firstkey ? "\"" : ", \"") + std::to_string(code) + "\": " + std::to_string(n);
    firstkey = false;
  }
  out += "}}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int Usage() {
  std::cerr << "usage: scale_peer fakes ID...\n"
               "       scale_peer load TARGET create|get COUNT CONCURRENCY [CHANNELS]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const std::string mode = argv[1];
  if (mode == "fakes" && argc >= 3) return Fakes(std::vector<std::string>(argv + 2, argv + argc));
  if (mode == "load" && (argc == 6 || argc == 7)) {
    const std::string kind = argv[3];
    const long long count = std::atoll(argv[4]);
    const long long conc = std::atoll(argv[5]);
    const int channels = argc == 7 ? std::atoi(argv[6]) : 2;
    if ((kind != "create" && kind != "get") || count < 1 || conc < 1 || channels < 1 || channels > 64) {
      std::cerr << "scale_peer load: want KIND create|get, COUNT >= 1, CONCURRENCY >= 1, 1 <= CHANNELS <= 64\n";
      return 2;
    }
    return RunLoad(argv[2], kind, count, conc, channels);
  }
  return Usage();
}
