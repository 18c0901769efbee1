// A sandbox's egress policy as data: what it may reach outside its own
// network namespace. Parsed from the words a caller writes and compiled into
// the nftables rules of that sandbox's chain (sandbox_network.h).
//
// Entry syntax (allow and deny alike):
//   [PROTO:]CIDR[:PORT[-PORT]]
//   PROTO  tcp | udp | icmp (default: any protocol; a port needs tcp or udp,
//          or none to mean both)
//   CIDR   IPv4 address or a.b.c.d/len (host bits must be zero)
//   PORT   1..65535
// e.g. "203.0.113.0/24", "tcp:198.51.100.7:443", "udp:192.0.2.53:53",
// "0.0.0.0/0". Host names are refused (InvalidArgument) for now.
//
// Semantics: deny wins over allow. The PROTECTED ranges (private, shared,
// loopback, link-local incl. 169.254.169.254, multicast and reserved, the
// node's sandbox range) are reachable only through an allow entry whose CIDR
// lies inside one of them (an explicit "10.1.2.0/24"), never through a wider
// one ("0.0.0.0/0"). The node itself is never reachable (its input hook
// refuses everything a sandbox starts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace warren::net {

struct Cidr {
  uint32_t addr = 0;  // host byte order, host bits zero
  uint8_t len = 0;    // 0..32
  bool Contains(const Cidr& o) const;
  std::string ToString() const;  // "a.b.c.d/len"
};

struct Rule {
  enum class Proto { kAny, kTcp, kUdp, kIcmp };
  Proto proto = Proto::kAny;
  Cidr dst;
  uint16_t port_lo = 0, port_hi = 0;  // 0: every port
  std::string text;                   // as written, canonical
};

struct NetworkPolicy {
  std::vector<Rule> allow, deny;
  // The entries, canonical (ToString of each rule): what records and info show.
  std::vector<std::string> AllowText() const;
  std::vector<std::string> DenyText() const;
};

// InvalidArgument naming the entry ("network.allow[2]: ...") on bad input.
StatusOr<Rule> ParseRule(const std::string& text);
StatusOr<NetworkPolicy> ParsePolicy(const std::vector<std::string>& allow, const std::vector<std::string>& deny);
StatusOr<Cidr> ParseCidr(const std::string& text);

// The ranges a sandbox cannot reach unless an allow entry names them
// (see above); `sandbox_range` is appended.
std::vector<Cidr> ProtectedRanges(const Cidr& sandbox_range);

// The body of one sandbox's nftables chain: one rule per line, in order
// (anti-spoofing on `sandbox_addr`, denies, explicit allows into protected
// ranges, the protected set, other allows, refuse). `protected_set` and
// `refuse_chain` name objects of the same table.
std::vector<std::string> CompileChain(const NetworkPolicy& p, uint32_t sandbox_addr, const Cidr& sandbox_range,
                                      const std::string& protected_set, const std::string& refuse_chain);

std::string Ipv4ToString(uint32_t addr);  // host byte order

}  // namespace warren::net
