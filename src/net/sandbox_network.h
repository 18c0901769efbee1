// The node's network for sandboxes: one routed link per sandbox that asked
// for a network (a veth pair into a container's network namespace, or a tap
// device for a VM's NIC), its egress policy in nftables, NAT to the outside.
// Sandboxes without a policy keep their loopback-only namespace and are not
// known here.
//
// Layout (one daemon; `T` = a tag of the daemon's state dir, so daemons on
// one host never share objects):
//   link     "wn<T>-<i>" on the host, "eth0" in the sandbox's netns; i-th
//            /30 of the sandbox range: .1 the host end, .2 the sandbox,
//            default route via .1. The pair dies with the sandbox's netns.
//            A VM's link (Attach with kTapLink) is a persistent tap of the
//            same name, the host end of the same /30; the guest's NIC is
//            .2 (its agent sets address, route and resolver from the
//            host's hello). QEMU holds a queue of it (OpenTapQueue); it
//            stays through QEMU's end (suspend) and a daemon restart, and
//            goes with Release. The rules below are the same for both.
//   nft      table inet warren_<T>:
//            set protected   ranges only a preset's allows open (policy.h)
//            map egress      ifname : jump sb_<i>, one element per sandbox
//            chain sb_<i>    the sandbox's policy (CompileChain); anything
//                            for the node's own addresses is refused first
//            chain rf_<i>    counts a refused packet (counter deny_<i>),
//                            logs it to NFLOG group <tag> (at most 20/s
//                            per sandbox, burst 40: the denied hook), then
//                            refuses it (chain refuse: TCP reset, else ICMP
//                            admin-prohibited)
//            counter conn_<i> / deny_<i>  its new connections (allowed or
//                            not) / its refused packets: a port scan of
//                            anything it may not reach is counted, never
//                            silent
//            chain forward   EVERY packet from a sandbox link goes through
//                            its chain (so a changed policy also cuts live
//                            connections: their next packet is refused);
//                            a sandbox link without a map element is
//                            dropped (fail closed); into sandbox links only
//                            established/related
//            chain input     what a sandbox starts towards the node goes
//                            through its chain too (refused and counted
//                            there), but for DNS queries redirected to the
//                            node's forwarder
//            set names_<i>   addresses its allowed host names resolved to
//                            (pinned by the forwarder; emptied by a change)
//            chain prerouting  every UDP query to port 53 from a sandbox is
//                            redirected to the forwarder (dns.h), and every
//                            TCP one from a sandbox in set dns_tcp (those
//                            whose policy names hosts; for the others the
//                            node's port 53 is closed like any other)
//            chain postrouting  masquerade the sandbox range leaving the host
//   sysctl   net.ipv4.ip_forward=1 (host-wide, left on).
//
// Policy changes are one nft transaction (flush + refill of the sandbox's
// chain): atomic, effective for the next packet.
//
// Restart: Open() replaces the table in one transaction (stale sandbox
// chains of a killed daemon go; links of live sandboxes stay but are
// dropped until Adopt re-applies their policy); Adopt re-takes the index;
// Release deletes the sandbox's objects (see there). Indices are taken
// round-robin, so a released one (whose link may still be on its way out
// with its namespace) is not reused at once.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "net/dns.h"
#include "net/nflog.h"
#include "net/nft.h"
#include "net/policy.h"
#include "net/rtnl.h"

namespace warren::net {

struct NetworkOptions {
  std::string range = "10.213.0.0/16";    // sandbox addresses, a /30 each
  std::string tag;                        // 1..4 [0-9a-f]; empty: from state_dir
  std::string state_dir;                  // what the tag is derived from
  Presets presets;                        // named entry lists (policy.h)
  std::string expose_host = "127.0.0.1";  // where exposed ports listen (expose.h)
  // Upstream of the DNS forwarder (dns.h), "a.b.c.d[:port]"; "" = none
  // (host name entries are refused).
  std::string dns_upstream;
};

// What a sandbox's link carried and refused since it was made (bytes from
// the link's counters; connections and denials from nftables, which start
// from zero again when a restarted daemon re-adopts the sandbox).
struct NetworkCounters {
  uint64_t egress_bytes = 0;   // sent by the sandbox (to anywhere, refused included)
  uint64_t ingress_bytes = 0;  // received by it
  uint64_t connections = 0;    // new connections it started, allowed or not
  uint64_t denied = 0;         // packets of it refused (policy, the node, siblings)
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

  // `netns_fd` of Attach/Adopt for a VM: its link is a tap on the host.
  static constexpr int kTapLink = -1;

  // Builds the sandbox's link in `netns_fd` (borrowed; kTapLink: a tap) and
  // applies `policy`. On error nothing is left (link, chain, element, index).
  StatusOr<NetworkLease> Attach(const std::string& sandbox_id, int netns_fd, const NetworkPolicy& policy);
  // After a restart: re-takes `index`, (re)builds the link if the sandbox's
  // namespace lost it, re-applies `policy`.
  StatusOr<NetworkLease> Adopt(const std::string& sandbox_id, uint32_t index, int netns_fd,
                               const NetworkPolicy& policy);
  // A queue of a leased VM's tap, for its QEMU (net/tap.h).
  StatusOr<UniqueFd> OpenTapQueue(const NetworkLease& lease);
  // Replaces the policy of a leased sandbox (one transaction).
  Status SetPolicy(const NetworkLease& lease, const NetworkPolicy& policy);
  // Removes chains, counters, set and element, and the link unless
  // `netns_dying` (the sandbox's processes are gone: the kernel removes the
  // pair with its namespace, asynchronously and in batches, off the
  // destroy's path; never for a tap, which is persistent); frees the index.
  // Idempotent.
  Status Release(uint32_t index, bool netns_dying = false);
  // Deletes this daemon's links ("wn<T>-*") whose index is not leased: after
  // a restart's adoptions, the taps of VMs a crash left without a record
  // (a create cut short). Returns how many went.
  int DropUnleasedLinks();
  // The sandbox's counters now.
  StatusOr<NetworkCounters> Counters(const NetworkLease& lease) const;
  // A policy from entries, this node's presets expanded (policy.h);
  // InvalidArgument for host names on a node without a DNS forwarder, and
  // for a caller's allow entry inside a protected range or naming one of the
  // node's addresses, unless `recorded` (a policy a sandbox already holds,
  // re-read at adoption: kept, such entries open nothing).
  StatusOr<NetworkPolicy> Parse(const std::vector<std::string>& allow, const std::vector<std::string>& deny,
                                bool recorded = false) const;
  // Whether the node resolves host names for sandboxes.
  bool has_dns() const { return dns_ != nullptr; }
  // Called (on the log reader's thread) for each logged refused packet of a
  // leased sandbox. Replacing or clearing it waits for a call in progress:
  // after SetDeniedHook(nullptr) returns, it is never called again.
  using DeniedHook = std::function<void(const std::string& sandbox_id, const LoggedPacket& packet)>;
  void SetDeniedHook(DeniedHook hook);
  const std::string& expose_host() const { return expose_host_; }

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

  // The forwarder's questions: may the sandbox at `src` resolve `name`?
  bool NameAllowed(uint32_t src, const std::string& name, uint32_t* index) const;
  Status Pin(uint32_t index, const std::vector<uint32_t>& addrs);
  void OnDenied(const LoggedPacket& p);

  Cidr range_;
  std::string tag_, table_;
  Presets presets_;
  std::string expose_host_;
  std::map<uint32_t, NetworkPolicy> policies_;  // by index; guarded by mu_
  std::map<uint32_t, std::string> ids_;         // sandbox id by index; guarded by mu_
  uint16_t log_group_ = 0;
  std::mutex hook_mu_;
  DeniedHook hook_;  // guarded by hook_mu_
  std::unique_ptr<Nft> nft_;
  std::unique_ptr<Rtnl> host_;  // host netns; guarded by mu_
  mutable std::mutex mu_;
  std::vector<bool> used_;             // by index; guarded by mu_
  size_t next_ = 0;                    // where TakeIndex looks first; guarded by mu_
  std::unique_ptr<DnsForwarder> dns_;  // last: stopped first, they call back into the above
  std::unique_ptr<NflogReader> nflog_;
};

}  // namespace warren::net
