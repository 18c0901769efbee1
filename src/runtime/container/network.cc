// ContainerSandbox's network: a veth pair into the sandbox's own network
// namespace (the one its init holds, made by the shell with CLONE_NEWNET)
// from the node's SandboxNetwork (net/sandbox_network.h).
#include <fcntl.h>

#include "net/sandbox_network.h"
#include "runtime/container/sandbox.h"

namespace warren::runtime::container {

namespace {

StatusOr<net::NetworkPolicy> PolicyOf(const NetworkSpec& n) { return net::ParsePolicy(n.allow, n.deny); }

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

}  // namespace

Status ContainerSandbox::AttachNetwork() {
  if (!spec_.network.enabled) return absl::OkStatus();
  net::SandboxNetwork* nw = st_->options.network.get();
  if (nw == nullptr)
    return absl::FailedPreconditionError("sandbox " + spec_.id +
                                         ": this node has no sandbox network (warrend --sandbox-net)");
  ASSIGN_OR_RETURN(net::NetworkPolicy policy, PolicyOf(spec_.network));
  ASSIGN_OR_RETURN(UniqueFd ns, OpenNetns(init_pid_));
  ASSIGN_OR_RETURN(net::NetworkLease lease, nw->Attach(spec_.id, ns.get(), policy));
  std::lock_guard<std::mutex> l(net_mu_);
  has_network_ = true;
  net_index_ = lease.index;
  network_ = SpecOf(policy);
  return absl::OkStatus();
}

Status ContainerSandbox::AdoptNetwork(const container::record::Container& r) {
  if (!r.network()) return absl::OkStatus();
  net::SandboxNetwork* nw = st_->options.network.get();
  if (nw == nullptr)
    return absl::FailedPreconditionError("sandbox " + spec_.id +
                                         " has a network but this daemon has none (warrend --sandbox-net)");
  NetworkSpec want;
  want.enabled = true;
  want.allow.assign(r.network_allow().begin(), r.network_allow().end());
  want.deny.assign(r.network_deny().begin(), r.network_deny().end());
  ASSIGN_OR_RETURN(net::NetworkPolicy policy, PolicyOf(want));
  ASSIGN_OR_RETURN(UniqueFd ns, OpenNetns(init_pid_));
  ASSIGN_OR_RETURN(net::NetworkLease lease, nw->Adopt(spec_.id, r.network_index(), ns.get(), policy));
  std::lock_guard<std::mutex> l(net_mu_);
  has_network_ = true;
  net_index_ = lease.index;
  network_ = SpecOf(policy);
  return absl::OkStatus();
}

Status ContainerSandbox::SetNetwork(const NetworkSpec& network) {
  ASSIGN_OR_RETURN(net::NetworkPolicy policy, PolicyOf(network));
  std::lock_guard<std::mutex> l(net_mu_);
  if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
  if (!has_network_)
    return absl::FailedPreconditionError("sandbox " + spec_.id +
                                         " was created without a network (create it with network={...})");
  net::SandboxNetwork* nw = st_->options.network.get();
  RETURN_IF_ERROR(nw->SetPolicy(nw->LeaseOf(net_index_), policy));
  network_ = SpecOf(policy);
  return absl::OkStatus();
}

NetworkSpec ContainerSandbox::Network() const {
  std::lock_guard<std::mutex> l(net_mu_);
  return has_network_ ? network_ : NetworkSpec{};
}

void ContainerSandbox::RecordNetwork(container::record::Container* r) const {
  std::lock_guard<std::mutex> l(net_mu_);
  if (!has_network_) return;
  r->set_network(true);
  r->set_network_index(net_index_);
  for (const std::string& a : network_.allow) r->add_network_allow(a);
  for (const std::string& d : network_.deny) r->add_network_deny(d);
}

Status ContainerSandbox::ReleaseNetwork() {
  std::lock_guard<std::mutex> l(net_mu_);
  if (!has_network_) return absl::OkStatus();
  RETURN_IF_ERROR(st_->options.network->Release(net_index_));
  has_network_ = false;
  return absl::OkStatus();
}

}  // namespace warren::runtime::container
