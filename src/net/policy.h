// A sandbox's egress policy as data: what it may reach outside its own
// network namespace. Parsed from the words a caller writes and compiled into
// the nftables rules of that sandbox's chain (sandbox_network.h).
//
// Entry syntax (allow and deny alike):
//   [PROTO:]CIDR[:PORT[-PORT]]
//   PROTO  tcp | udp | icmp (default: any protocol; a port needs tcp or udp,
//          or none to mean both)
//   CIDR   IPv4 address or a.b.c.d/len (host bits must be zero), or a HOST
//          name ("pypi.org", "*.pythonhosted.org": any name under it)
//   PORT   1..65535
// e.g. "203.0.113.0/24", "tcp:198.51.100.7:443", "udp:203.0.113.53:53",
// "0.0.0.0/0". Or the NAME of a preset the node defines (warrend
// --net-preset pypi=ENTRY,...): the preset's entries as the node defines
// them when the policy is applied (create, set_network, re-adoption).
//
// Host names go through the node's DNS forwarder (dns.h): an allowed name
// resolves, and the addresses it answered become reachable (with the
// entry's protocol and ports) until the policy changes; a name not allowed,
// or denied, does not resolve (NXDOMAIN). The addresses of all allowed names
// of a sandbox share one set: each is reachable through every name entry's
// ports. A name never opens a protected range.
//
// Semantics: deny wins over allow. The PROTECTED ranges (private, shared,
// loopback, link-local incl. 169.254.169.254, multicast and reserved, the
// node's sandbox range) are reachable only through an entry of a preset the
// node's operator defined whose CIDR lies inside one of them (a preset
// "meta=169.254.169.254"), never through a wider entry ("0.0.0.0/0": the
// protected parts stay closed) and never through an API caller's own entry:
// an allow entry written by the caller that lies inside a protected range is
// refused (InvalidArgument naming the entry and the range). Deny entries may
// name anything. The node itself is never reachable (its input hook refuses
// everything a sandbox starts).
#pragma once

#include <cstdint>
#include <map>
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

// Where no sandbox range is known (parsing without a node): 0.0.0.0/32,
// already inside the protected 0.0.0.0/8.
inline constexpr Cidr kNoSandboxRange{0, 32};

struct Rule {
  enum class Proto { kAny, kTcp, kUdp, kIcmp };
  Proto proto = Proto::kAny;
  Cidr dst;
  uint16_t port_lo = 0, port_hi = 0;  // 0: every port
  std::string text;                   // as written, canonical
  std::string host;                   // a host name entry (lower case); dst unused
  bool preset = false;                // from a node preset: may open a protected range
};

// Presets by name: what each expands to.
using Presets = std::map<std::string, std::vector<Rule>>;

struct NetworkPolicy {
  std::vector<Rule> allow, deny;  // presets expanded
  // The entries as given, canonical (a rule's text, or a preset's name):
  // what records and info show.
  std::vector<std::string> allow_text, deny_text;
  const std::vector<std::string>& AllowText() const { return allow_text; }
  const std::vector<std::string>& DenyText() const { return deny_text; }
  bool HasNames() const;
  // Whether `name` (lower case) may be resolved: some allow entry names it
  // and no deny entry does.
  bool AllowsName(const std::string& name) const;
};

// Whether `name` matches the entry `pattern`: the same name, or for
// "*.example.com" any name under example.com. Both lower case.
bool NameMatches(const std::string& pattern, const std::string& name);

// What ParsePolicy refuses beyond bad syntax: an allow entry of the
// caller's (not a preset's) inside one of ProtectedRanges(sandbox_range), or
// naming one of `node_addrs` (the node's own addresses, host byte order).
struct PolicyChecks {
  Cidr sandbox_range = kNoSandboxRange;
  std::vector<uint32_t> node_addrs;
  // False when re-reading a policy a sandbox already holds (re-adoption):
  // such entries are kept but never open anything (CompileChain), so a
  // sandbox of an older daemon survives with its protected parts closed.
  bool refuse = true;
};

// InvalidArgument naming the entry ("network.allow[2]: ...") on bad input.
StatusOr<Rule> ParseRule(const std::string& text);
StatusOr<NetworkPolicy> ParsePolicy(const std::vector<std::string>& allow, const std::vector<std::string>& deny,
                                    const Presets& presets = {}, const PolicyChecks& checks = {});
// "NAME=ENTRY[,ENTRY...]" (NAME: [a-z][a-z0-9_-]{0,31}) into `out`;
// InvalidArgument naming the flag value on bad input.
Status ParsePreset(const std::string& flag, Presets* out);
StatusOr<Cidr> ParseCidr(const std::string& text);

// The ranges a sandbox cannot reach unless a preset's allow entry names them
// (see above); `sandbox_range` is appended.
std::vector<Cidr> ProtectedRanges(const Cidr& sandbox_range);
// What a protected range is, for messages ("link-local, incl. the cloud
// metadata address 169.254.169.254").
std::string ProtectedRangeName(const Cidr& range, const Cidr& sandbox_range);

// The body of one sandbox's nftables chain: one rule per line, in order
// (anti-spoofing on `sandbox_addr`, the connection counter, the node's own
// addresses refused, IPv6 refused,
// denies, preset allows into protected ranges, the protected set, other
// allows, refuse). `protected_set` and
// `refuse_chain` name objects of the same table.
// `conn_counter` names the counter object that counts the sandbox's new
// connections (allowed or not); `refuse_chain` counts and refuses;
// `names_set` holds the addresses its allowed names resolved to.
std::vector<std::string> CompileChain(const NetworkPolicy& p, uint32_t sandbox_addr, const Cidr& sandbox_range,
                                      const std::string& protected_set, const std::string& refuse_chain,
                                      const std::string& conn_counter, const std::string& names_set);

std::string Ipv4ToString(uint32_t addr);  // host byte order

}  // namespace warren::net
