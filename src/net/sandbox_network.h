// The node's network for sandboxes: one routed veth pair per sandbox that
// asked for a network, its egress policy in nftables, NAT to the outside.
// Sandboxes without a policy keep their loopback-only namespace and are not
// known here.
//
// Layout (one daemon; `T` = a tag of the daemon's state dir, so daemons on
// one host never share objects):
//   link     "wn<T>-<i>" on the host, "eth0" in the sandbox's netns; i-th
//            /30 of the sandbox range: .1 the host end, .2 the sandbox,
//            default route via .1. The pair dies with the sandbox's netns.
//   nft      table inet warren_<T>:
//            set protected   ranges only explicit allows open (policy.h)
//            map egress      ifname : jump sb_<i>, one element per sandbox
//            chain sb_<i>    the sandbox's policy (CompileChain)
//            chain forward   EVERY packet from a sandbox link goes through
//                            its chain (so a changed policy also cuts live
//                            connections: their next packet is refused);
//                            a sandbox link without a map element is
//                            dropped (fail closed); into sandbox links only
//                            established/related
//            chain input     the node refuses what a sandbox starts
//            chain postrouting  masquerade the sandbox range leaving the host
//   sysctl   net.ipv4.ip_forward=1 (host-wide, left on).
//
// Policy changes are one nft transaction (flush + refill of the sandbox's
// chain): atomic, effective for the next packet.
//
// Restart: Open() replaces the table in one transaction (stale sandbox
// chains of a killed daemon go; links of live sandboxes stay but are
// dropped until Adopt re-applies their policy); Adopt re-takes the index;
// Release deletes the link, the map element and the chain.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "net/nft.h"
#include "net/policy.h"
#include "net/rtnl.h"

namespace warren::net {

struct NetworkOptions {
  std::string range = "10.213.0.0/16";  // sandbox addresses, a /30 each
  std::string tag;                      // 1..4 [0-9a-f]; empty: from state_dir
  std::string state_dir;                // what the tag is derived from
};

// What a sandbox holds: persisted by its backend (index) and handed back to
// Adopt/Release.
struct NetworkLease {
  uint32_t index = 0;
  std::string host_link;   // "wn<T>-<i>"
  uint32_t host_addr = 0;  // host byte order
  uint32_t sandbox_addr = 0;
};

class SandboxNetwork {
 public:
  static StatusOr<std::unique_ptr<SandboxNetwork>> Open(const NetworkOptions& options);

  // Builds the sandbox's link in `netns_fd` (borrowed) and applies `policy`.
  // On error nothing is left (link, chain, element, index).
  StatusOr<NetworkLease> Attach(const std::string& sandbox_id, int netns_fd, const NetworkPolicy& policy);
  // After a restart: re-takes `index`, (re)builds the link if the sandbox's
  // namespace lost it, re-applies `policy`.
  StatusOr<NetworkLease> Adopt(const std::string& sandbox_id, uint32_t index, int netns_fd,
                               const NetworkPolicy& policy);
  // Replaces the policy of a leased sandbox (one transaction).
  Status SetPolicy(const NetworkLease& lease, const NetworkPolicy& policy);
  // Removes link, chain and element and frees the index. Idempotent.
  Status Release(uint32_t index);

  // True while `index` is leased (attached or adopted, not released).
  bool InUse(uint32_t index) const;
  const Cidr& range() const { return range_; }
  std::string table() const { return table_; }
  NetworkLease LeaseOf(uint32_t index) const;

 private:
  SandboxNetwork() = default;
  StatusOr<uint32_t> TakeIndex();
  Status Build(const NetworkLease& lease, int netns_fd);
  std::string ChainCmds(const NetworkLease& lease, const NetworkPolicy& policy, bool create) const;

  Cidr range_;
  std::string tag_, table_;
  std::unique_ptr<Nft> nft_;
  std::unique_ptr<Rtnl> host_;  // host netns; guarded by mu_
  mutable std::mutex mu_;
  std::vector<bool> used_;  // by index; guarded by mu_
};

}  // namespace warren::net
