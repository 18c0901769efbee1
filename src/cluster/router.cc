#include "cluster/router.h"

#include <algorithm>
#include <condition_variable>

#include "common/log.h"

namespace warren::cluster {
namespace {

namespace v1 = ::warren::v1;

// A refused create (the node is full or gone) moves on; any other answer,
// success or error, and a project's quota refusal are final.
bool MovesOn(const grpc::Status& s) {
  if (s.error_details() == api::kQuotaRefusalDetails) return false;  // a project's quota holds on every node
  return s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED || s.error_code() == grpc::StatusCode::UNAVAILABLE;
}

// A unary Create through the callback API, this thread waiting on a
// condition variable: no completion queue made and polled per call, as a
// blocking stub call does (measured: bench/cluster/bench_scale.py).
grpc::Status CallCreate(v1::Sandboxes::Stub& stub, grpc::ClientContext* cc, const v1::CreateSandboxRequest& req,
                        v1::Sandbox* resp) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status out;
  stub.async()->Create(cc, &req, resp, [&](grpc::Status s) {
    std::lock_guard<std::mutex> l(mu);
    out = std::move(s);
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return done; });
  return out;
}

// Refused: count it as full until its next record.
constexpr uint32_t kFull = 1u << 30;

// As many create request ids as a node remembers (CreateSandboxRequest.request_id).
constexpr size_t kRememberedRequests = 4096;

}  // namespace

Router::Router(const Membership* membership, RouterOptions options)
    : membership_(membership), options_(std::move(options)) {}

std::string Router::NodeOf(const std::string& sandbox_id) {
  const size_t dash = sandbox_id.rfind('-');
  return dash == std::string::npos || dash == 0 ? std::string() : sandbox_id.substr(0, dash);
}

Router::Peer& Router::PeerLocked(const std::string& address) {
  Peer& p = channels_[address];
  if (p.channel == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(600 << 20);
    args.SetMaxSendMessageSize(600 << 20);
    p.channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    p.sandboxes = v1::Sandboxes::NewStub(p.channel);
  }
  return p;
}

std::shared_ptr<grpc::Channel> Router::Channel(const std::string& address) {
  std::lock_guard<std::mutex> l(mu_);
  return PeerLocked(address).channel;
}

std::shared_ptr<v1::Sandboxes::Stub> Router::SandboxesStub(const std::string& address) {
  std::lock_guard<std::mutex> l(mu_);
  return PeerLocked(address).sandboxes;
}

StatusOr<std::shared_ptr<grpc::Channel>> Router::Owner(const grpc::ServerContext& ctx, const std::string& sandbox_id) {
  if (api::IsForwarded(ctx)) return std::shared_ptr<grpc::Channel>();
  const std::string node = NodeOf(sandbox_id);
  if (node.empty() || node == options_.self) return std::shared_ptr<grpc::Channel>();
  auto view = membership_->Nodes();
  for (const NodeRecord& n : *view) {
    if (n.id == node) return Channel(n.address);
  }
  return absl::NotFoundError("sandbox " + sandbox_id + " belongs to node " + node +
                             ", which is not in the cluster (unknown, or its lease expired: its sandboxes are lost)");
}

std::unique_ptr<grpc::ClientContext> Router::Context(const grpc::ServerContext& ctx) {
  std::unique_ptr<grpc::ClientContext> cc = grpc::ClientContext::FromServerContext(ctx);
  cc->AddMetadata(api::kForwardedKey, options_.self);
  if (!options_.token.empty()) cc->AddMetadata("authorization", "Bearer " + options_.token);
  // The node token acts for every project: name the caller's.
  if (const std::string project = api::CallerProject(ctx, options_.token, options_.projects); !project.empty()) {
    cc->AddMetadata(api::kProjectKey, project);
  }
  return cc;
}

void Router::Remember(const std::string& request_id, const std::string& node) {
  std::lock_guard<std::mutex> l(mu_);
  auto [it, added] = request_node_.insert_or_assign(request_id, node);
  if (!added) return;
  request_order_.push_back(request_id);
  if (request_order_.size() > kRememberedRequests) {
    request_node_.erase(request_order_.front());
    request_order_.pop_front();
  }
}

void Router::Count(const NodeRecord& node, uint32_t n) {
  std::lock_guard<std::mutex> l(mu_);
  Placed& p = recent_[node.id];
  if (p.revision != node.mod_revision) p = Placed{node.mod_revision, 0};
  p.count = std::min(kFull, p.count + n);
}

std::map<std::string, uint32_t> Router::RecentFor(const std::vector<NodeRecord>& view) {
  std::map<std::string, uint32_t> out;
  std::lock_guard<std::mutex> l(mu_);
  for (const NodeRecord& n : view) {
    auto it = recent_.find(n.id);
    if (it != recent_.end() && it->second.revision == n.mod_revision) out[n.id] = it->second.count;
  }
  return out;
}

uint32_t Router::RecentOf(const NodeRecord& node) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = recent_.find(node.id);
  return it != recent_.end() && it->second.revision == node.mod_revision ? it->second.count : 0;
}

bool Router::Place(grpc::ServerContext* ctx, const v1::CreateSandboxRequest& req, v1::Sandbox* resp,
                   const std::function<grpc::Status(v1::Sandbox*)>& local, grpc::Status* status) {
  if (api::IsForwarded(*ctx)) return false;
  auto view = membership_->Nodes();
  // A backend no node offers (an unknown name, or one this cluster lacks):
  // no node would take it, whatever the load, so the entry answers as a
  // single node does (its own validation: InvalidArgument naming it), not
  // RESOURCE_EXHAUSTED, which a client would retry.
  if (!req.backend().empty() && std::none_of(view->begin(), view->end(), [&](const NodeRecord& n) {
        return std::find(n.backends.begin(), n.backends.end(), req.backend()) != n.backends.end();
      })) {
    return false;
  }
  PlacementRequest pr;
  pr.backend = req.backend();
  pr.cpu_millis = req.resources().cpu_millis();
  pr.memory_mb = req.resources().memory_mb();
  pr.qos = req.qos() == "best-effort" ? 1 : 0;
  pr.layers.assign(req.layers().begin(), req.layers().end());
  // A retry goes first to the node that got the last try: it answers with
  // the sandbox it made. Its refusal means it made none: move on. Gone from
  // the cluster: its sandbox is lost, the others are tried.
  const NodeRecord* retry = nullptr;
  if (!req.request_id().empty()) {
    std::string seen;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = request_node_.find(req.request_id());
      if (it != request_node_.end()) seen = it->second;
    }
    for (const NodeRecord& n : *view) {
      if (!seen.empty() && n.id == seen) retry = &n;
    }
  }
  // Per handler thread: a decision draws without a lock.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  Candidates cands(
      *view, pr, [this](const NodeRecord& n) { return RecentOf(n); }, rng, options_.placement);
  bool retry_tried = false;
  auto next = [&]() -> const NodeRecord* {
    if (retry != nullptr && !retry_tried) {
      retry_tried = true;
      return retry;
    }
    const NodeRecord* n = cands.Next();
    while (n != nullptr && n == retry) n = cands.Next();
    return n;
  };
  const NodeRecord* node = next();
  if (node == nullptr) {
    *status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                           "no node can take this sandbox: " + ExplainNoCandidate(*view, pr, RecentFor(*view)));
    return true;
  }
  std::string refusals;
  for (; node != nullptr; node = next()) {
    // Not before the first try: the forwarded call carries the caller's
    // cancellation, and on a sync server IsCancelled() polls a completion
    // queue (~10 % of an entry's CPU when it ran on every create).
    if (!refusals.empty() && ctx->IsCancelled()) {
      *status = grpc::Status(grpc::StatusCode::CANCELLED, "create cancelled by the client");
      return true;
    }
    Count(*node, 1);
    if (!req.request_id().empty()) Remember(req.request_id(), node->id);
    grpc::Status st;
    if (node->id == options_.self) {
      st = local(resp);
    } else {
      std::unique_ptr<grpc::ClientContext> cc = Context(*ctx);
      st = CallCreate(*SandboxesStub(node->address), cc.get(), req, resp);
    }
    if (!MovesOn(st)) {
      *status = st;
      return true;
    }
    Count(*node, kFull);
    Log(spdlog::level::info, "placement: node refused the create; trying the next",
        {{"node", node->id}, {"code", std::to_string(st.error_code())}, {"error", st.error_message()}});
    refusals += (refusals.empty() ? "" : "; ") + node->id + ": " + st.error_message();
  }
  *status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "every candidate node refused: " + refusals);
  return true;
}

std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>> Router::Peers(const grpc::ServerContext& ctx) {
  std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>> out;
  if (api::IsForwarded(ctx)) return out;
  auto view = membership_->Nodes();
  for (const NodeRecord& n : *view) {
    if (n.id != options_.self) out.emplace_back(n.id, Channel(n.address));
  }
  return out;
}

}  // namespace warren::cluster
