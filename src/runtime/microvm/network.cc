// MicrovmSandbox's network (sandbox.h): its tap on the node's
// SandboxNetwork (net/sandbox_network.h) and its exposed ports (net/expose.h),
// which dial the guest's address over that tap.
#include "common/log.h"
#include "common/rollback.h"
#include "net/expose.h"
#include "net/sandbox_network.h"
#include "runtime/microvm/sandbox.h"

namespace warren::runtime::microvm {

namespace {

constexpr size_t kMaxExposed = 16;

ExposedPort Describe(uint16_t port, const net::Exposure& e) { return ExposedPort{port, e.address(), e.token()}; }

NetworkSpec SpecOf(const net::NetworkPolicy& p) {
  NetworkSpec n;
  n.enabled = true;
  n.allow = p.AllowText();
  n.deny = p.DenyText();
  return n;
}

}  // namespace

Status MicrovmSandbox::SetNetwork(const NetworkSpec& network) {
  std::lock_guard<std::mutex> l(net_mu_);
  if (!has_network_ || p_.network == nullptr)
    return absl::FailedPreconditionError("sandbox " + p_.spec.id +
                                         " was created without a network (create it with network={...})");
  ASSIGN_OR_RETURN(net::NetworkPolicy policy, p_.network->Parse(network.allow, network.deny));
  RETURN_IF_ERROR(p_.network->SetPolicy(p_.network->LeaseOf(net_index_), policy));
  network_ = SpecOf(policy);
  return absl::OkStatus();
}

NetworkSpec MicrovmSandbox::Network() const {
  std::lock_guard<std::mutex> l(net_mu_);
  return has_network_ ? network_ : NetworkSpec{};
}

StatusOr<std::unique_ptr<net::Exposure>> MicrovmSandbox::OpenExposure(uint16_t port, uint16_t listen_port,
                                                                      std::string token) {
  // The guest's address over its tap: the node reaches it like any host on
  // a link of its own (the forward chain does not see it; the input chain
  // lets the replies in as established).
  const std::string target =
      net::Ipv4ToString(p_.network->LeaseOf(net_index_).sandbox_addr) + ":" + std::to_string(port);
  auto dial = [target]() -> StatusOr<UniqueFd> { return net::DialTcp(target); };
  return net::Exposure::Open(p_.network->expose_host(), listen_port, std::move(token), std::move(dial));
}

StatusOr<ExposedPort> MicrovmSandbox::Expose(uint16_t port) {
  if (port == 0) return absl::InvalidArgumentError("expose: port 0 (want 1..65535)");
  std::lock_guard<std::mutex> l(net_mu_);
  if (p_.network == nullptr)
    return absl::FailedPreconditionError("sandbox " + p_.spec.id +
                                         ": this node has no sandbox network (warrend --sandbox-net)");
  if (!has_network_)
    return absl::FailedPreconditionError("sandbox " + p_.spec.id +
                                         ": a microvm exposes ports over its network link; it was created without "
                                         "one (create it with network={...})");
  {
    std::lock_guard<std::mutex> m(mu_);
    if (destroyed_) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " destroyed");
  }
  if (auto it = exposed_.find(port); it != exposed_.end()) return Describe(port, *it->second);
  if (exposed_.size() >= kMaxExposed)
    return absl::ResourceExhaustedError("sandbox " + p_.spec.id + " already exposes " + std::to_string(kMaxExposed) +
                                        " ports (unexpose one first)");
  ASSIGN_OR_RETURN(std::string token, net::NewToken());
  ASSIGN_OR_RETURN(std::unique_ptr<net::Exposure> e, OpenExposure(port, 0, std::move(token)));
  ExposedPort out = Describe(port, *e);
  exposed_[port] = std::move(e);
  return out;
}

Status MicrovmSandbox::Unexpose(uint16_t port) {
  std::lock_guard<std::mutex> l(net_mu_);
  auto it = exposed_.find(port);
  if (it == exposed_.end())
    return absl::NotFoundError("sandbox " + p_.spec.id + " does not expose port " + std::to_string(port));
  exposed_.erase(it);  // closes the listener and its connections
  return absl::OkStatus();
}

std::vector<ExposedPort> MicrovmSandbox::Exposed() const {
  std::lock_guard<std::mutex> l(net_mu_);
  std::vector<ExposedPort> v;
  v.reserve(exposed_.size());
  for (const auto& [port, e] : exposed_) v.push_back(Describe(port, *e));
  return v;
}

StatusOr<NetworkTraffic> MicrovmSandbox::Traffic() const {
  std::lock_guard<std::mutex> l(net_mu_);
  if (!has_network_ || p_.network == nullptr)
    return absl::FailedPreconditionError("sandbox " + p_.spec.id + " has no network link");
  ASSIGN_OR_RETURN(net::NetworkCounters c, p_.network->Counters(p_.network->LeaseOf(net_index_)));
  return NetworkTraffic{c.egress_bytes, c.ingress_bytes, c.connections, c.denied};
}

void FillNetworkHello(const net::NetworkLease& lease, bool has_dns, proto::Hello* setup) {
  setup->net_addr = lease.sandbox_addr;
  setup->net_prefix = 30;
  setup->net_gateway = lease.host_addr;
  const uint32_t a = lease.sandbox_addr;
  setup->net_mac = {'\x02',
                    '\x57',
                    static_cast<char>(a >> 24),
                    static_cast<char>(a >> 16),
                    static_cast<char>(a >> 8),
                    static_cast<char>(a)};
  // Any server it names is redirected to the forwarder; this one is for an
  // image that names none.
  if (has_dns) setup->nameserver = lease.host_addr;
}

StatusOr<std::optional<net::NetworkPolicy>> CreatePolicy(const std::shared_ptr<net::SandboxNetwork>& network,
                                                         const SandboxSpec& spec) {
  if (!spec.network.enabled) return std::optional<net::NetworkPolicy>();
  if (network == nullptr)
    return absl::FailedPreconditionError("sandbox " + spec.id +
                                         ": this node has no sandbox network (warrend --sandbox-net)");
  ASSIGN_OR_RETURN(net::NetworkPolicy policy, network->Parse(spec.network.allow, spec.network.deny));
  return std::optional<net::NetworkPolicy>(std::move(policy));
}

StatusOr<UniqueFd> AttachTap(const std::shared_ptr<net::SandboxNetwork>& network, const std::string& id,
                             const net::NetworkPolicy& policy, record::Microvm* rec, Rollback* rb,
                             std::optional<net::NetworkLease>* lease) {
  ASSIGN_OR_RETURN(*lease, network->Attach(id, net::SandboxNetwork::kTapLink, policy));
  rb->Add([network, index = (*lease)->index] { (void)network->Release(index); });
  ASSIGN_OR_RETURN(UniqueFd tap, network->OpenTapQueue(**lease));
  rec->set_network(true);
  rec->set_network_index((*lease)->index);
  for (const std::string& a : policy.AllowText()) rec->add_network_allow(a);
  for (const std::string& d : policy.DenyText()) rec->add_network_deny(d);
  return tap;
}

Status AdoptRecordedNetwork(const std::shared_ptr<net::SandboxNetwork>& network, const std::string& id,
                            const record::Microvm& rec, Rollback* rb) {
  if (!rec.network()) return absl::OkStatus();
  if (network == nullptr)
    return absl::FailedPreconditionError("sandbox " + id +
                                         " has a network but this daemon has none (warrend --sandbox-net)");
  std::vector<std::string> allow(rec.network_allow().begin(), rec.network_allow().end());
  std::vector<std::string> deny(rec.network_deny().begin(), rec.network_deny().end());
  ASSIGN_OR_RETURN(net::NetworkPolicy policy, network->Parse(allow, deny, /*recorded=*/true));
  ASSIGN_OR_RETURN(net::NetworkLease lease,
                   network->Adopt(id, rec.network_index(), net::SandboxNetwork::kTapLink, policy));
  rb->Add([network, index = lease.index] { (void)network->Release(index); });
  return absl::OkStatus();
}

void MicrovmSandbox::RestoreExposures(const record::Microvm& rec) {
  std::lock_guard<std::mutex> l(net_mu_);
  for (const record::Microvm::Exposed& x : rec.exposed()) {
    const auto port = static_cast<uint16_t>(x.port());
    StatusOr<std::unique_ptr<net::Exposure>> e = absl::FailedPreconditionError("no network link on this node for it");
    if (p_.network != nullptr && has_network_) {
      e = OpenExposure(port, static_cast<uint16_t>(x.listen_port()), x.token());
      if (!e.ok()) e = OpenExposure(port, 0, x.token());
    }
    if (!e.ok()) {
      Log(spdlog::level::warn, "exposed port not restored",
          {{"sandbox", p_.spec.id}, {"port", std::to_string(port)}, {"error", e.status().ToString()}});
      continue;
    }
    exposed_[port] = std::move(*e);
  }
}

void MicrovmSandbox::RecordNetwork(record::Microvm* r) const {
  std::lock_guard<std::mutex> l(net_mu_);
  r->clear_exposed();
  r->clear_network_allow();
  r->clear_network_deny();
  for (const auto& [port, e] : exposed_) {
    record::Microvm::Exposed* x = r->add_exposed();
    x->set_port(port);
    x->set_listen_port(e->listen_port());
    x->set_token(e->token());
  }
  r->set_network(has_network_);
  if (!has_network_) return;
  r->set_network_index(net_index_);
  for (const std::string& a : network_.allow) r->add_network_allow(a);
  for (const std::string& d : network_.deny) r->add_network_deny(d);
}

Status MicrovmSandbox::ReleaseNetwork() {
  std::lock_guard<std::mutex> l(net_mu_);
  exposed_.clear();  // nothing listens for it any more
  if (!has_network_ || p_.network == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(p_.network->Release(net_index_));  // the tap too: persistent
  has_network_ = false;
  return absl::OkStatus();
}

StatusOr<UniqueFd> MicrovmSandbox::OpenTapQueue() const {
  std::lock_guard<std::mutex> l(net_mu_);
  if (!has_network_) return UniqueFd();
  if (p_.network == nullptr)
    return absl::FailedPreconditionError("sandbox " + p_.spec.id + " has a network but this daemon has none");
  return p_.network->OpenTapQueue(p_.network->LeaseOf(net_index_));
}

}  // namespace warren::runtime::microvm
