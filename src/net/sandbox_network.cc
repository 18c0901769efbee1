#include "net/sandbox_network.h"

#include <cstdio>

#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/rollback.h"

namespace warren::net {

namespace {

constexpr const char* kProtected = "protected";
constexpr const char* kRefuse = "refuse";

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
  n->used_.assign(size_t{1} << (32 - n->range_.len - 2), false);
  ASSIGN_OR_RETURN(n->nft_, Nft::Open());
  ASSIGN_OR_RETURN(n->host_, Rtnl::Open());
  RETURN_IF_ERROR(WriteFile("/proc/sys/net/ipv4/ip_forward", "1"));

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
  cmds += "add rule " + t + " input iifname " + links + " goto " + kRefuse + "\n";
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
  for (size_t i = 0; i < used_.size(); ++i) {
    if (!used_[i]) {
      used_[i] = true;
      return static_cast<uint32_t>(i);
    }
  }
  return absl::ResourceExhaustedError("sandbox network " + range_.ToString() + " is full (" +
                                      std::to_string(used_.size()) + " sandboxes)");
}

std::string SandboxNetwork::ChainCmds(const NetworkLease& lease, const NetworkPolicy& policy, bool create) const {
  const std::string t = "inet " + table_;
  const std::string chain = "sb_" + Hex(lease.index);
  std::string cmds;
  if (create) cmds += "add chain " + t + " " + chain + "\n";
  cmds += "flush chain " + t + " " + chain + "\n";
  for (const std::string& r : CompileChain(policy, lease.sandbox_addr, range_, kProtected, kRefuse))
    cmds += "add rule " + t + " " + chain + " " + r + "\n";
  return cmds;
}

Status SandboxNetwork::Build(const NetworkLease& lease, int netns_fd) {
  std::lock_guard<std::mutex> l(mu_);
  Rollback rb;
  RETURN_IF_ERROR(host_->AddVeth(lease.host_link, "eth0", netns_fd));
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
  // The chain and its map element first: the link never forwards unfiltered.
  const std::string t = "inet " + table_;
  RETURN_IF_ERROR(nft_->Run(ChainCmds(lease, policy, true) + "add element " + t + " egress { \"" + lease.host_link +
                            "\" : jump sb_" + Hex(index) + " }\n"));
  Status s = Build(lease, netns_fd);
  if (!s.ok()) return Status(s.code(), "sandbox " + sandbox_id + " network: " + std::string(s.message()));
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
  const std::string t = "inet " + table_;
  RETURN_IF_ERROR(nft_->Run(ChainCmds(lease, policy, true) + "add element " + t + " egress { \"" + lease.host_link +
                            "\" : jump sb_" + Hex(index) + " }\n"));
  bool have_link;
  {
    std::lock_guard<std::mutex> l(mu_);
    have_link = host_->IfIndex(lease.host_link) != 0;
  }
  if (!have_link) RETURN_IF_ERROR(Build(lease, netns_fd));
  rb.Commit();
  return lease;
}

Status SandboxNetwork::SetPolicy(const NetworkLease& lease, const NetworkPolicy& policy) {
  return nft_->Run(ChainCmds(lease, policy, false));
}

Status SandboxNetwork::Release(uint32_t index) {
  const NetworkLease lease = LeaseOf(index);
  Status first;
  {
    std::lock_guard<std::mutex> l(mu_);
    first = host_->DelLink(lease.host_link);
  }
  // Each object alone: a half-made attach may lack some of them.
  const std::string t = "inet " + table_;
  (void)nft_->Run("delete element " + t + " egress { \"" + lease.host_link + "\" }");
  (void)nft_->Run("delete chain " + t + " sb_" + Hex(index));
  auto chain = nft_->List("list chain " + t + " sb_" + Hex(index));
  if (chain.ok() && first.ok())
    first = absl::InternalError("nftables: chain sb_" + Hex(index) + " of " + table_ + " still there after delete");
  std::lock_guard<std::mutex> l(mu_);
  if (index < used_.size()) used_[index] = false;
  return first;
}

}  // namespace warren::net
