#include "net/sandbox_network.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/rollback.h"
#include "net/tap.h"

namespace warren::net {

namespace {

constexpr const char* kProtected = "protected";
constexpr const char* kRefuse = "refuse";
constexpr const char* kDnsTcp = "dns_tcp";

std::string Hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%x", v);
  return b;
}

// FNV-1a, 16 bits of it: a stable short tag of the daemon's state dir.
std::string TagOf(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return Hex((h ^ (h >> 16)) & 0xffff);
}

// "packets N bytes M" of `nft list counter`'s output: the packets.
uint64_t PacketsOf(const std::string& listing) {
  const size_t at = listing.find("packets ");
  return at == std::string::npos ? 0 : std::strtoull(listing.c_str() + at + 8, nullptr, 10);
}

uint64_t LinkStat(const std::string& link, const char* name) {
  StatusOr<std::string> v = ReadSmallFile("/sys/class/net/" + link + "/statistics/" + name, 64);
  return v.ok() ? std::strtoull(v->c_str(), nullptr, 10) : 0;
}

// The IPv4 addresses of the node's interfaces now (host byte order); none
// when they cannot be listed (the chain refuses them all the same).
std::vector<uint32_t> NodeAddresses() {
  std::vector<uint32_t> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    sockaddr_in a{};
    std::memcpy(&a, i->ifa_addr, sizeof a);
    out.push_back(ntohl(a.sin_addr.s_addr));
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<SandboxNetwork>> SandboxNetwork::Open(const NetworkOptions& options) {
  auto n = std::unique_ptr<SandboxNetwork>(new SandboxNetwork());
  StatusOr<Cidr> r = ParseCidr(options.range);
  if (!r.ok()) return absl::InvalidArgumentError("--sandbox-net: " + std::string(r.status().message()));
  if (r->len > 28 || r->len < 8)
    return absl::InvalidArgumentError("--sandbox-net " + options.range + ": prefix must be /8../28");
  n->range_ = *r;
  n->tag_ = options.tag.empty() ? TagOf(options.state_dir) : options.tag;
  if (n->tag_.empty() || n->tag_.size() > 4 || n->tag_.find_first_not_of("0123456789abcdef") != std::string::npos)
    return absl::InvalidArgumentError("network tag '" + n->tag_ + "' must be 1..4 of [0-9a-f]");
  n->table_ = "warren_" + n->tag_;
  n->presets_ = options.presets;
  n->expose_host_ = options.expose_host;
  n->used_.assign(size_t{1} << (32 - n->range_.len - 2), false);
  ASSIGN_OR_RETURN(n->nft_, Nft::Open());
  ASSIGN_OR_RETURN(n->host_, Rtnl::Open());
  RETURN_IF_ERROR(WriteFile("/proc/sys/net/ipv4/ip_forward", "1"));
  n->log_group_ = static_cast<uint16_t>(std::strtoul(n->tag_.c_str(), nullptr, 16));
  {
    SandboxNetwork* raw = n.get();
    StatusOr<std::unique_ptr<NflogReader>> lr =
        NflogReader::Open(n->log_group_, [raw](const LoggedPacket& p) { raw->OnDenied(p); });
    if (lr.ok()) {
      n->nflog_ = std::move(*lr);
    } else {
      Log(spdlog::level::warn, "refused packets are counted, not audited", {{"error", lr.status().ToString()}});
    }
  }
  if (!options.dns_upstream.empty()) {
    SandboxNetwork* raw = n.get();
    ASSIGN_OR_RETURN(n->dns_, DnsForwarder::Open(
                                  0, options.dns_upstream,
                                  [raw](uint32_t src, const std::string& name, uint32_t* index) {
                                    return raw->NameAllowed(src, name, index);
                                  },
                                  [raw](uint32_t index, const std::vector<uint32_t>& addrs, uint32_t) {
                                    return raw->Pin(index, addrs);
                                  }));
  }

  std::vector<std::string> prot;
  for (const Cidr& c : ProtectedRanges(n->range_)) prot.push_back(c.ToString());
  const std::string links = "\"wn" + n->tag_ + "-*\"";
  const std::string t = "inet " + n->table_;
  // add+delete+add: the table is replaced in one transaction whether or not
  // a previous daemon left one.
  std::string cmds = "add table " + t + "\ndelete table " + t + "\nadd table " + t + "\n";
  cmds += "add set " + t + " " + kProtected + " { type ipv4_addr; flags interval; auto-merge; elements = { " +
          absl::StrJoin(prot, ", ") + " } }\n";
  cmds += "add map " + t + " egress { type ifname : verdict; }\n";
  cmds += "add chain " + t + " " + kRefuse + "\n";
  cmds += "add rule " + t + " " + kRefuse + " counter meta l4proto tcp reject with tcp reset\n";
  cmds += "add rule " + t + " " + kRefuse + " counter reject with icmpx admin-prohibited\n";
  cmds += "add chain " + t + " forward { type filter hook forward priority filter; policy accept; }\n";
  cmds += "add rule " + t + " forward iifname " + links + " iifname vmap @egress\n";
  cmds += "add rule " + t + " forward iifname " + links + " drop\n";
  cmds += "add rule " + t + " forward oifname " + links + " ct state established,related accept\n";
  cmds += "add rule " + t + " forward oifname " + links + " drop\n";
  cmds += "add chain " + t + " input { type filter hook input priority filter; policy accept; }\n";
  cmds += "add rule " + t + " input iifname " + links + " ct state established,related accept\n";
  if (n->dns_ != nullptr) {
    const std::string port = std::to_string(n->dns_->port());
    const std::string tcp_port = std::to_string(n->dns_->tcp_port());
    cmds += "add rule " + t + " input iifname " + links + " udp dport " + port + " ct status dnat accept\n";
    cmds += "add rule " + t + " input iifname " + links + " tcp dport " + tcp_port + " ct status dnat accept\n";
    cmds += "add chain " + t + " prerouting { type nat hook prerouting priority dstnat; policy accept; }\n";
    cmds += "add rule " + t + " prerouting iifname " + links + " udp dport 53 redirect to :" + port + "\n";
    // TCP only from sandboxes whose policy names hosts (set kDnsTcp): for
    // the others, port 53 of the node stays as closed as any other port.
    cmds += "add set " + t + " " + kDnsTcp + " { type ifname; }\n";
    cmds += "add rule " + t + " prerouting iifname @" + kDnsTcp + " tcp dport 53 redirect to :" + tcp_port + "\n";
  }
  cmds += "add rule " + t + " input iifname " + links + " iifname vmap @egress\n";
  cmds += "add rule " + t + " input iifname " + links + " goto " + kRefuse + "\n";
  // The forwarder listens on every address (a redirected query arrives at
  // the node end of its link); it answers sandboxes only.
  if (n->dns_ != nullptr) {
    cmds += "add rule " + t + " input udp dport " + std::to_string(n->dns_->port()) + " drop\n";
    cmds += "add rule " + t + " input tcp dport " + std::to_string(n->dns_->tcp_port()) + " drop\n";
  }
  cmds += "add chain " + t + " postrouting { type nat hook postrouting priority srcnat; policy accept; }\n";
  cmds += "add rule " + t + " postrouting ip saddr " + n->range_.ToString() + " oifname != " + links + " masquerade\n";
  RETURN_IF_ERROR(n->nft_->Run(cmds));
  return n;
}

NetworkLease SandboxNetwork::LeaseOf(uint32_t index) const {
  NetworkLease l;
  l.index = index;
  l.host_link = "wn" + tag_ + "-" + Hex(index);
  l.host_addr = range_.addr + index * 4 + 1;
  l.sandbox_addr = range_.addr + index * 4 + 2;
  return l;
}

bool SandboxNetwork::InUse(uint32_t index) const {
  std::lock_guard<std::mutex> l(mu_);
  return index < used_.size() && used_[index];
}

StatusOr<uint32_t> SandboxNetwork::TakeIndex() {
  std::lock_guard<std::mutex> l(mu_);
  for (size_t k = 0; k < used_.size(); ++k) {
    const size_t i = (next_ + k) % used_.size();
    if (!used_[i]) {
      used_[i] = true;
      next_ = i + 1;
      return static_cast<uint32_t>(i);
    }
  }
  return absl::ResourceExhaustedError("sandbox network " + range_.ToString() + " is full (" +
                                      std::to_string(used_.size()) + " sandboxes)");
}

std::string SandboxNetwork::ChainCmds(const NetworkLease& lease, const NetworkPolicy& policy, bool create) const {
  const std::string t = "inet " + table_;
  const std::string i = Hex(lease.index);
  const std::string chain = "sb_" + i, refuse = "rf_" + i;
  std::string cmds;
  if (create) {
    cmds += "add counter " + t + " conn_" + i + "\n";
    cmds += "add counter " + t + " deny_" + i + "\n";
    cmds += "add chain " + t + " " + refuse + "\n";
    cmds += "flush chain " + t + " " + refuse + "\n";
    cmds += "add rule " + t + " " + refuse + " counter name \"deny_" + i + "\"\n";
    if (nflog_ != nullptr)
      cmds += "add rule " + t + " " + refuse + " limit rate 20/second burst 40 packets log prefix \"" + i +
              "\" group " + std::to_string(log_group_) + "\n";
    cmds += "add rule " + t + " " + refuse + " goto " + kRefuse + "\n";
    cmds += "add set " + t + " names_" + i + " { type ipv4_addr; size 65536; }\n";
    cmds += "add chain " + t + " " + chain + "\n";
  }
  cmds += "flush chain " + t + " " + chain + "\n";
  cmds += "flush set " + t + " names_" + i + "\n";  // resolved again under the new policy
  for (const std::string& r :
       CompileChain(policy, lease.sandbox_addr, range_, kProtected, refuse, "conn_" + i, "names_" + i))
    cmds += "add rule " + t + " " + chain + " " + r + "\n";
  if (create) {
    cmds += "add element " + t + " egress { \"" + lease.host_link + "\" : jump " + chain + " }\n";
  }
  if (dns_ != nullptr) {
    // add+delete: absent afterwards whether or not it was there.
    const std::string elem = " " + std::string(kDnsTcp) + " { \"" + lease.host_link + "\" }\n";
    cmds += "add element " + t + elem;
    if (!policy.HasNames()) cmds += "delete element " + t + elem;
  }
  return cmds;
}

Status SandboxNetwork::Build(const NetworkLease& lease, int netns_fd) {
  std::lock_guard<std::mutex> l(mu_);
  Rollback rb;
  if (netns_fd == kTapLink) {
    // A tap of that name is a leftover (a released index's link is deleted):
    // replaced, so its address and state are this lease's.
    RETURN_IF_ERROR(host_->DelLink(lease.host_link));
    RETURN_IF_ERROR(OpenTap(lease.host_link, /*persist=*/true).status());
    rb.Add([this, lease] { (void)host_->DelLink(lease.host_link); });
    RETURN_IF_ERROR(host_->AddAddr(lease.host_link, lease.host_addr, 30));
    RETURN_IF_ERROR(host_->SetUp(lease.host_link));
    rb.Commit();
    return absl::OkStatus();
  }
  Status added = host_->AddVeth(lease.host_link, "eth0", netns_fd);
  if (StatusErrno(added) == EEXIST) {  // left by a namespace the kernel has not freed yet
    RETURN_IF_ERROR(host_->DelLink(lease.host_link));
    added = host_->AddVeth(lease.host_link, "eth0", netns_fd);
  }
  RETURN_IF_ERROR(added);
  rb.Add([this, lease] { (void)host_->DelLink(lease.host_link); });
  RETURN_IF_ERROR(host_->AddAddr(lease.host_link, lease.host_addr, 30));
  RETURN_IF_ERROR(host_->SetUp(lease.host_link));
  ASSIGN_OR_RETURN(std::unique_ptr<Rtnl> in, Rtnl::InNetns(netns_fd));
  RETURN_IF_ERROR(in->AddAddr("eth0", lease.sandbox_addr, 30));
  RETURN_IF_ERROR(in->SetUp("eth0"));
  RETURN_IF_ERROR(in->AddDefaultRoute(lease.host_addr));
  rb.Commit();
  return absl::OkStatus();
}

StatusOr<NetworkLease> SandboxNetwork::Attach(const std::string& sandbox_id, int netns_fd,
                                              const NetworkPolicy& policy) {
  ASSIGN_OR_RETURN(uint32_t index, TakeIndex());
  Rollback rb;
  rb.Add([this, index] { (void)Release(index); });
  const NetworkLease lease = LeaseOf(index);
  // The chains and map elements first: the link never forwards unfiltered.
  RETURN_IF_ERROR(nft_->Run(ChainCmds(lease, policy, true)));
  Status s = Build(lease, netns_fd);
  if (!s.ok()) return Status(s.code(), "sandbox " + sandbox_id + " network: " + std::string(s.message()));
  {
    std::lock_guard<std::mutex> l(mu_);
    policies_[index] = policy;
    ids_[index] = sandbox_id;
  }
  rb.Commit();
  return lease;
}

StatusOr<NetworkLease> SandboxNetwork::Adopt(const std::string& sandbox_id, uint32_t index, int netns_fd,
                                             const NetworkPolicy& policy) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (index >= used_.size())
      return absl::InvalidArgumentError("sandbox " + sandbox_id + ": network index " + std::to_string(index) +
                                        " outside " + range_.ToString());
    if (used_[index])
      return absl::AlreadyExistsError("sandbox " + sandbox_id + ": network index " + std::to_string(index) +
                                      " already in use");
    used_[index] = true;
  }
  Rollback rb;
  rb.Add([this, index] { (void)Release(index); });
  const NetworkLease lease = LeaseOf(index);
  RETURN_IF_ERROR(nft_->Run(ChainCmds(lease, policy, true)));
  bool have_link;
  {
    std::lock_guard<std::mutex> l(mu_);
    have_link = host_->IfIndex(lease.host_link) != 0;
  }
  if (!have_link) RETURN_IF_ERROR(Build(lease, netns_fd));
  {
    std::lock_guard<std::mutex> l(mu_);
    policies_[index] = policy;
    ids_[index] = sandbox_id;
  }
  rb.Commit();
  return lease;
}

StatusOr<UniqueFd> SandboxNetwork::OpenTapQueue(const NetworkLease& lease) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (lease.index >= used_.size() || !used_[lease.index])
      return absl::FailedPreconditionError("network index " + std::to_string(lease.index) + " is not leased");
    if (host_->IfIndex(lease.host_link) == 0)
      return absl::NotFoundError("tap " + lease.host_link + " is gone (deleted outside warrend?)");
  }
  return OpenTap(lease.host_link, /*persist=*/false);
}

Status SandboxNetwork::SetPolicy(const NetworkLease& lease, const NetworkPolicy& policy) {
  // The forwarder follows the new policy from the same moment: its pins of
  // the old one are flushed in the same transaction.
  std::lock_guard<std::mutex> l(mu_);
  RETURN_IF_ERROR(nft_->Run(ChainCmds(lease, policy, false)));
  policies_[lease.index] = policy;
  return absl::OkStatus();
}

Status SandboxNetwork::Release(uint32_t index, bool netns_dying) {
  const NetworkLease lease = LeaseOf(index);
  Status first;
  if (!netns_dying) {
    std::lock_guard<std::mutex> l(mu_);
    first = host_->DelLink(lease.host_link);
  }
  // One transaction, referrers first (each libnftables call re-reads the
  // table's cache: one call, not six). A half-made attach may lack some of
  // the objects, which fails the whole transaction: then each alone, and
  // check that none is left.
  const std::string t = "inet " + table_;
  const std::string i = Hex(index);
  std::vector<std::string> deletes = {"delete element " + t + " egress { \"" + lease.host_link + "\" }",
                                      "delete chain " + t + " sb_" + i,
                                      "delete chain " + t + " rf_" + i,
                                      "delete set " + t + " names_" + i,
                                      "delete counter " + t + " conn_" + i,
                                      "delete counter " + t + " deny_" + i};
  if (dns_ != nullptr) {
    const std::string elem = " " + std::string(kDnsTcp) + " { \"" + lease.host_link + "\" }";
    deletes.insert(deletes.begin(), {"add element " + t + elem, "delete element " + t + elem});
  }
  if (!nft_->Run(absl::StrJoin(deletes, "\n") + "\n").ok()) {
    for (const std::string& d : deletes) (void)nft_->Run(d);
    for (const std::string& what : {"chain " + t + " sb_" + i, "chain " + t + " rf_" + i, "counter " + t + " conn_" + i,
                                    "counter " + t + " deny_" + i, "set " + t + " names_" + i}) {
      if (nft_->List("list " + what).ok() && first.ok())
        first = absl::InternalError("nftables: " + what + " still there after delete");
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  if (index < used_.size()) used_[index] = false;
  policies_.erase(index);
  ids_.erase(index);
  return first;
}

int SandboxNetwork::DropUnleasedLinks() {
  const std::string prefix = "wn" + tag_ + "-";
  std::vector<std::string> names;
  if (struct if_nameindex* list = ::if_nameindex(); list != nullptr) {
    for (const struct if_nameindex* i = list; i->if_index != 0; ++i) {
      const std::string name = i->if_name;
      if (name.rfind(prefix, 0) == 0) names.push_back(name);
    }
    ::if_freenameindex(list);
  }
  int dropped = 0;
  std::lock_guard<std::mutex> l(mu_);
  for (const std::string& name : names) {
    char* end = nullptr;
    const unsigned long index = std::strtoul(name.c_str() + prefix.size(), &end, 16);
    if (end == nullptr || *end != '\0' || (index < used_.size() && used_[index])) continue;
    if (host_->DelLink(name).ok()) ++dropped;
  }
  return dropped;
}

void SandboxNetwork::SetDeniedHook(DeniedHook hook) {
  std::lock_guard<std::mutex> l(hook_mu_);
  hook_ = std::move(hook);
}

void SandboxNetwork::OnDenied(const LoggedPacket& p) {
  std::string id;
  {
    const uint32_t index = static_cast<uint32_t>(std::strtoul(p.prefix.c_str(), nullptr, 16));
    std::lock_guard<std::mutex> l(mu_);
    auto it = ids_.find(index);
    if (it == ids_.end()) return;
    id = it->second;
  }
  std::lock_guard<std::mutex> l(hook_mu_);
  if (hook_) hook_(id, p);
}

StatusOr<NetworkPolicy> SandboxNetwork::Parse(const std::vector<std::string>& allow,
                                              const std::vector<std::string>& deny, bool recorded) const {
  PolicyChecks checks;
  checks.sandbox_range = range_;
  checks.refuse = !recorded;
  if (!recorded) checks.node_addrs = NodeAddresses();
  ASSIGN_OR_RETURN(NetworkPolicy p, ParsePolicy(allow, deny, presets_, checks));
  if (p.HasNames() && dns_ == nullptr)
    return absl::InvalidArgumentError(
        "network: host names need the node's DNS forwarder (warrend --net-dns-upstream); "
        "this node has none");
  return p;
}

bool SandboxNetwork::NameAllowed(uint32_t src, const std::string& name, uint32_t* index) const {
  if (src < range_.addr + 2) return false;
  const uint32_t i = (src - range_.addr) / 4;
  std::lock_guard<std::mutex> l(mu_);
  if (i >= used_.size() || !used_[i] || LeaseOf(i).sandbox_addr != src) return false;
  auto it = policies_.find(i);
  if (it == policies_.end() || !it->second.AllowsName(name)) return false;
  *index = i;
  return true;
}

Status SandboxNetwork::Pin(uint32_t index, const std::vector<uint32_t>& addrs) {
  std::string elems;
  for (uint32_t a : addrs) elems += (elems.empty() ? "" : ", ") + Ipv4ToString(a);
  return nft_->Run("add element inet " + table_ + " names_" + Hex(index) + " { " + elems + " }");
}

StatusOr<NetworkCounters> SandboxNetwork::Counters(const NetworkLease& lease) const {
  const std::string t = "inet " + table_;
  const std::string i = Hex(lease.index);
  NetworkCounters c;
  ASSIGN_OR_RETURN(std::string conn, nft_->List("list counter " + t + " conn_" + i));
  ASSIGN_OR_RETURN(std::string deny, nft_->List("list counter " + t + " deny_" + i));
  c.connections = PacketsOf(conn);
  c.denied = PacketsOf(deny);
  // The host end's receive side is what the sandbox sent.
  c.egress_bytes = LinkStat(lease.host_link, "rx_bytes");
  c.ingress_bytes = LinkStat(lease.host_link, "tx_bytes");
  return c;
}

}  // namespace warren::net
