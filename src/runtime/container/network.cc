// ContainerSandbox's network: a veth pair into the sandbox's own network
// namespace (the one its init holds, made by the shell with CLONE_NEWNET)
// from the node's SandboxNetwork (net/sandbox_network.h), and its exposed
// ports (net/expose.h), which reach the sandbox's loopback from inside its
// namespace whether or not it has a link.
#include <fcntl.h>

#include "common/log.h"
#include "net/expose.h"
#include "net/sandbox_network.h"
#include "runtime/container/sandbox.h"

namespace warren::runtime::container {

namespace {

constexpr size_t kMaxExposed = 16;

NetworkSpec SpecOf(const net::NetworkPolicy& p) {
  NetworkSpec n;
  n.enabled = true;
  n.allow = p.AllowText();
  n.deny = p.DenyText();
  return n;
}

StatusOr<UniqueFd> OpenNetns(pid_t pid) {
  const std::string p = "/proc/" + std::to_string(pid) + "/ns/net";
  UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + p + ")");
  return fd;
}

ExposedPort Describe(uint16_t port, const net::Exposure& e) { return ExposedPort{port, e.address(), e.token()}; }

Status NoNodeNetwork(const std::string& id) {
  return absl::FailedPreconditionError("sandbox " + id + ": this node has no sandbox network (warrend --sandbox-net)");
}

}  // namespace

Status ContainerSandbox::WriteResolvConf(uint32_t nameserver) {
  ASSIGN_OR_RETURN(std::unique_ptr<FileWriter> w, files().OpenWrite("/etc/resolv.conf", 0644, true));
  RETURN_IF_ERROR(w->Write("nameserver " + net::Ipv4ToString(nameserver) + "\n"));
  return w->Commit().status();
}

Status ContainerSandbox::AttachNetwork() {
  if (!spec_.network.enabled) return absl::OkStatus();
  net::SandboxNetwork* nw = st_->options.network.get();
  if (nw == nullptr) return NoNodeNetwork(spec_.id);
  ASSIGN_OR_RETURN(net::NetworkPolicy policy, nw->Parse(spec_.network.allow, spec_.network.deny));
  ASSIGN_OR_RETURN(UniqueFd ns, OpenNetns(init_pid_));
  ASSIGN_OR_RETURN(net::NetworkLease lease, nw->Attach(spec_.id, ns.get(), policy));
  if (nw->has_dns()) {
    // Any server it names is redirected to the forwarder; this one is for
    // an image that names none (glibc would then ask its own loopback).
    Status rs = WriteResolvConf(lease.host_addr);
    if (!rs.ok()) {
      (void)nw->Release(lease.index);
      return rs;
    }
  }
  std::lock_guard<std::mutex> l(net_mu_);
  has_network_ = true;
  net_index_ = lease.index;
  network_ = SpecOf(policy);
  return absl::OkStatus();
}

Status ContainerSandbox::AdoptNetwork(const container::record::Container& r) {
  net::SandboxNetwork* nw = st_->options.network.get();
  if (r.network()) {
    if (nw == nullptr)
      return absl::FailedPreconditionError("sandbox " + spec_.id +
                                           " has a network but this daemon has none (warrend --sandbox-net)");
    std::vector<std::string> allow(r.network_allow().begin(), r.network_allow().end());
    std::vector<std::string> deny(r.network_deny().begin(), r.network_deny().end());
    ASSIGN_OR_RETURN(net::NetworkPolicy policy, nw->Parse(allow, deny, /*recorded=*/true));
    ASSIGN_OR_RETURN(UniqueFd ns, OpenNetns(init_pid_));
    ASSIGN_OR_RETURN(net::NetworkLease lease, nw->Adopt(spec_.id, r.network_index(), ns.get(), policy));
    std::lock_guard<std::mutex> l(net_mu_);
    has_network_ = true;
    net_index_ = lease.index;
    network_ = SpecOf(policy);
  }
  // Exposed ports listen again with their tokens, on their old node port
  // when it is still free. One that cannot is dropped (logged), not the sandbox.
  for (const container::record::Container::Exposed& x : r.exposed()) {
    const auto port = static_cast<uint16_t>(x.port());
    StatusOr<std::unique_ptr<net::Exposure>> e = NoNodeNetwork(spec_.id);
    if (nw != nullptr) {
      e = OpenExposure(port, static_cast<uint16_t>(x.listen_port()), x.token());
      if (!e.ok()) e = OpenExposure(port, 0, x.token());
    }
    if (!e.ok()) {
      Log(spdlog::level::warn, "exposed port not restored",
          {{"sandbox", spec_.id}, {"port", std::to_string(port)}, {"error", e.status().ToString()}});
      continue;
    }
    std::lock_guard<std::mutex> l(net_mu_);
    exposed_[port] = std::move(*e);
  }
  return absl::OkStatus();
}

Status ContainerSandbox::SetNetwork(const NetworkSpec& network) {
  std::lock_guard<std::mutex> l(net_mu_);
  if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
  if (!has_network_)
    return absl::FailedPreconditionError("sandbox " + spec_.id +
                                         " was created without a network (create it with network={...})");
  net::SandboxNetwork* nw = st_->options.network.get();
  ASSIGN_OR_RETURN(net::NetworkPolicy policy, nw->Parse(network.allow, network.deny));
  RETURN_IF_ERROR(nw->SetPolicy(nw->LeaseOf(net_index_), policy));
  network_ = SpecOf(policy);
  return absl::OkStatus();
}

NetworkSpec ContainerSandbox::Network() const {
  std::lock_guard<std::mutex> l(net_mu_);
  return has_network_ ? network_ : NetworkSpec{};
}

StatusOr<std::unique_ptr<net::Exposure>> ContainerSandbox::OpenExposure(uint16_t port, uint16_t listen_port,
                                                                        std::string token) {
  const pid_t pid = init_pid_;
  const int pidfd = pidfd_.get();  // outlives every exposure (closed after them)
  auto dial = [pid, pidfd, port]() -> StatusOr<UniqueFd> {
    ASSIGN_OR_RETURN(UniqueFd ns, OpenNetns(pid));
    // The pid may have been reused if init died: the pidfd tells.
    if (PidfdSignal(pidfd, 0) != 0) return absl::FailedPreconditionError("sandbox init is gone");
    return net::DialInNetns(ns.get(), port);
  };
  return net::Exposure::Open(st_->options.network->expose_host(), listen_port, std::move(token), std::move(dial));
}

StatusOr<ExposedPort> ContainerSandbox::Expose(uint16_t port) {
  if (port == 0) return absl::InvalidArgumentError("expose: port 0 (want 1..65535)");
  if (st_->options.network == nullptr) return NoNodeNetwork(spec_.id);
  std::lock_guard<std::mutex> l(net_mu_);
  if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
  if (auto it = exposed_.find(port); it != exposed_.end()) return Describe(port, *it->second);
  if (exposed_.size() >= kMaxExposed)
    return absl::ResourceExhaustedError("sandbox " + spec_.id + " already exposes " + std::to_string(kMaxExposed) +
                                        " ports (unexpose one first)");
  ASSIGN_OR_RETURN(std::string token, net::NewToken());
  ASSIGN_OR_RETURN(std::unique_ptr<net::Exposure> e, OpenExposure(port, 0, std::move(token)));
  ExposedPort out = Describe(port, *e);
  exposed_[port] = std::move(e);
  return out;
}

Status ContainerSandbox::Unexpose(uint16_t port) {
  std::lock_guard<std::mutex> l(net_mu_);
  auto it = exposed_.find(port);
  if (it == exposed_.end())
    return absl::NotFoundError("sandbox " + spec_.id + " does not expose port " + std::to_string(port));
  exposed_.erase(it);  // closes the listener and its connections
  return absl::OkStatus();
}

std::vector<ExposedPort> ContainerSandbox::Exposed() const {
  std::lock_guard<std::mutex> l(net_mu_);
  std::vector<ExposedPort> v;
  v.reserve(exposed_.size());
  for (const auto& [port, e] : exposed_) v.push_back(Describe(port, *e));
  return v;
}

StatusOr<NetworkTraffic> ContainerSandbox::Traffic() const {
  std::lock_guard<std::mutex> l(net_mu_);
  if (!has_network_) return absl::FailedPreconditionError("sandbox " + spec_.id + " has no network link");
  net::SandboxNetwork* nw = st_->options.network.get();
  ASSIGN_OR_RETURN(net::NetworkCounters c, nw->Counters(nw->LeaseOf(net_index_)));
  return NetworkTraffic{c.egress_bytes, c.ingress_bytes, c.connections, c.denied};
}

void ContainerSandbox::RecordNetwork(container::record::Container* r) const {
  std::lock_guard<std::mutex> l(net_mu_);
  for (const auto& [port, e] : exposed_) {
    container::record::Container::Exposed* x = r->add_exposed();
    x->set_port(port);
    x->set_listen_port(e->listen_port());
    x->set_token(e->token());
  }
  if (!has_network_) return;
  r->set_network(true);
  r->set_network_index(net_index_);
  for (const std::string& a : network_.allow) r->add_network_allow(a);
  for (const std::string& d : network_.deny) r->add_network_deny(d);
}

Status ContainerSandbox::ReleaseNetwork() {
  std::lock_guard<std::mutex> l(net_mu_);
  exposed_.clear();  // nothing listens for it any more
  if (!has_network_) return absl::OkStatus();
  RETURN_IF_ERROR(st_->options.network->Release(net_index_, /*netns_dying=*/true));
  has_network_ = false;
  return absl::OkStatus();
}

}  // namespace warren::runtime::container
