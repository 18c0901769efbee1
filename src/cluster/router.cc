#include "cluster/router.h"

#include <algorithm>

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

std::shared_ptr<grpc::Channel> Router::Channel(const std::string& address) {
  std::lock_guard<std::mutex> l(mu_);
  std::shared_ptr<grpc::Channel>& ch = channels_[address];
  if (ch == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(600 << 20);
    args.SetMaxSendMessageSize(600 << 20);
    ch = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  return ch;
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
  std::vector<std::string> order;
  std::map<std::string, uint32_t> recent = RecentFor(*view);
  {
    std::lock_guard<std::mutex> l(mu_);
    order = cluster::Place(*view, pr, recent, rng_, options_.placement);
    auto seen = req.request_id().empty() ? request_node_.end() : request_node_.find(req.request_id());
    if (seen != request_node_.end()) {
      // A retry goes first to the node that got the last try: it answers
      // with the sandbox it made. Its refusal means it made none: move on.
      order.erase(std::remove(order.begin(), order.end(), seen->second), order.end());
      order.insert(order.begin(), seen->second);
    }
  }
  if (order.empty()) {
    *status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                           "no node can take this sandbox: " + ExplainNoCandidate(*view, pr, recent));
    return true;
  }
  std::string refusals;
  for (const std::string& id : order) {
    if (ctx->IsCancelled()) {
      *status = grpc::Status(grpc::StatusCode::CANCELLED, "create cancelled by the client");
      return true;
    }
    const NodeRecord* node = nullptr;
    for (const NodeRecord& n : *view) {
      if (n.id == id) node = &n;
    }
    if (node == nullptr) continue;  // a retry's earlier node, gone from the cluster: its sandbox is lost
    Count(*node, 1);
    if (!req.request_id().empty()) Remember(req.request_id(), id);
    grpc::Status st;
    if (id == options_.self) {
      st = local(resp);
    } else {
      std::unique_ptr<grpc::ClientContext> cc = Context(*ctx);
      st = v1::Sandboxes::NewStub(Channel(node->address))->Create(cc.get(), req, resp);
    }
    if (!MovesOn(st)) {
      *status = st;
      return true;
    }
    Count(*node, kFull);
    Log(spdlog::level::info, "placement: node refused the create; trying the next",
        {{"node", id}, {"code", std::to_string(st.error_code())}, {"error", st.error_message()}});
    refusals += (refusals.empty() ? "" : "; ") + id + ": " + st.error_message();
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
