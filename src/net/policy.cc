#include "net/policy.h"

#include <arpa/inet.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace warren::net {

namespace {

uint32_t Mask(uint8_t len) { return len == 0 ? 0 : ~uint32_t{0} << (32 - len); }

StatusOr<uint16_t> ParsePort(const std::string& s, const std::string& entry) {
  uint32_t v = 0;
  if (!absl::SimpleAtoi(s, &v) || v == 0 || v > 65535)
    return absl::InvalidArgumentError("bad port '" + s + "' in '" + entry + "' (1..65535)");
  return static_cast<uint16_t>(v);
}

const char* ProtoName(Rule::Proto p) {
  switch (p) {
    case Rule::Proto::kTcp: return "tcp";
    case Rule::Proto::kUdp: return "udp";
    case Rule::Proto::kIcmp: return "icmp";
    case Rule::Proto::kAny: break;
  }
  return "";
}

// nft match of one rule, without verdict; `daddr` matches its address.
std::string Match(const Rule& r, const std::string& daddr) {
  std::string m = "ip daddr " + daddr;
  std::string ports;
  if (r.port_lo != 0) {
    ports = std::to_string(r.port_lo);
    if (r.port_hi != r.port_lo) ports += "-" + std::to_string(r.port_hi);
  }
  switch (r.proto) {
    case Rule::Proto::kTcp: return m + (ports.empty() ? " meta l4proto tcp" : " tcp dport " + ports);
    case Rule::Proto::kUdp: return m + (ports.empty() ? " meta l4proto udp" : " udp dport " + ports);
    case Rule::Proto::kIcmp: return m + " meta l4proto icmp";
    case Rule::Proto::kAny: return m + (ports.empty() ? "" : " th dport " + ports);
  }
  return m;
}

std::string Match(const Rule& r) { return Match(r, r.dst.ToString()); }

// A host name entry: labels of [a-z0-9-] (not starting or ending in '-'),
// at least two (a bare word is a preset's name), at most 253 characters; or
// "*." and at least one label.
bool ValidHost(const std::string& h) {
  absl::string_view s = h;
  const bool wildcard = absl::StartsWith(s, "*.");
  if (wildcard) s.remove_prefix(2);
  if (s.empty() || s.size() > 253 || (!wildcard && s.find('.') == absl::string_view::npos)) return false;
  for (absl::string_view label : absl::StrSplit(s, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    if (label.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != absl::string_view::npos) return false;
  }
  // The last label is not all digits (that would be an IPv4 address).
  return s.substr(s.rfind('.') + 1).find_first_not_of("0123456789") != absl::string_view::npos;
}

}  // namespace

bool NameMatches(const std::string& pattern, const std::string& name) {
  if (absl::StartsWith(pattern, "*.")) {
    const absl::string_view suffix = absl::string_view(pattern).substr(1);  // ".example.com"
    return name.size() > suffix.size() && absl::EndsWith(name, suffix);
  }
  return pattern == name;
}

bool NetworkPolicy::HasNames() const {
  for (const Rule& r : allow)
    if (!r.host.empty()) return true;
  for (const Rule& r : deny)
    if (!r.host.empty()) return true;
  return false;
}

bool NetworkPolicy::AllowsName(const std::string& name) const {
  for (const Rule& r : deny)
    if (!r.host.empty() && NameMatches(r.host, name)) return false;
  for (const Rule& r : allow)
    if (!r.host.empty() && NameMatches(r.host, name)) return true;
  return false;
}

bool Cidr::Contains(const Cidr& o) const { return o.len >= len && (o.addr & Mask(len)) == addr; }

std::string Ipv4ToString(uint32_t addr) {
  in_addr a{htonl(addr)};
  char buf[INET_ADDRSTRLEN];
  return inet_ntop(AF_INET, &a, buf, sizeof buf) ? buf : "?";
}

std::string Cidr::ToString() const { return Ipv4ToString(addr) + "/" + std::to_string(len); }

StatusOr<Cidr> ParseCidr(const std::string& text) {
  std::string ip = text;
  uint32_t len = 32;
  if (size_t slash = text.find('/'); slash != std::string::npos) {
    ip = text.substr(0, slash);
    if (!absl::SimpleAtoi(text.substr(slash + 1), &len) || len > 32)
      return absl::InvalidArgumentError("bad prefix length in '" + text + "' (0..32)");
  }
  in_addr a{};
  if (inet_pton(AF_INET, ip.c_str(), &a) != 1) {
    bool name = !ip.empty() && ip.find_first_not_of("0123456789.") != std::string::npos;
    return absl::InvalidArgumentError("'" + text + "' is not an IPv4 address or CIDR" +
                                      (name ? " (a host name is not allowed here)" : ""));
  }
  Cidr c{ntohl(a.s_addr), static_cast<uint8_t>(len)};
  if ((c.addr & ~Mask(c.len)) != 0)
    return absl::InvalidArgumentError("'" + text + "' has host bits set (did you mean " +
                                      Cidr{c.addr & Mask(c.len), c.len}.ToString() + "?)");
  return c;
}

StatusOr<Rule> ParseRule(const std::string& text) {
  Rule r;
  std::string rest = text;
  for (auto [name, proto] : {std::pair{"tcp:", Rule::Proto::kTcp}, std::pair{"udp:", Rule::Proto::kUdp},
                             std::pair{"icmp:", Rule::Proto::kIcmp}}) {
    if (rest.rfind(name, 0) == 0) {
      r.proto = proto;
      rest = rest.substr(std::string(name).size());
      break;
    }
  }
  std::string cidr = rest;
  if (size_t colon = rest.find(':'); colon != std::string::npos) {
    cidr = rest.substr(0, colon);
    std::string ports = rest.substr(colon + 1);
    if (r.proto == Rule::Proto::kIcmp) return absl::InvalidArgumentError("icmp has no ports: '" + text + "'");
    std::vector<std::string> lh = absl::StrSplit(ports, absl::MaxSplits('-', 1));
    ASSIGN_OR_RETURN(r.port_lo, ParsePort(lh[0], text));
    r.port_hi = r.port_lo;
    if (lh.size() == 2) {
      ASSIGN_OR_RETURN(r.port_hi, ParsePort(lh[1], text));
      if (r.port_hi < r.port_lo) return absl::InvalidArgumentError("port range reversed in '" + text + "'");
    }
  }
  const std::string lower = absl::AsciiStrToLower(cidr);
  if (lower.find_first_of("abcdefghijklmnopqrstuvwxyz*") != std::string::npos) {
    if (!ValidHost(lower))
      return absl::InvalidArgumentError("'" + cidr + "' is neither an IPv4 address or CIDR nor a host name");
    r.host = lower;
  } else {
    StatusOr<Cidr> c = ParseCidr(cidr);
    if (!c.ok()) return c.status();
    r.dst = *c;
  }
  r.text = std::string(ProtoName(r.proto)) + (r.proto == Rule::Proto::kAny ? "" : ":") +
           (r.host.empty() ? r.dst.ToString() : r.host);
  if (r.port_lo != 0)
    r.text += ":" + std::to_string(r.port_lo) + (r.port_hi != r.port_lo ? "-" + std::to_string(r.port_hi) : "");
  return r;
}

namespace {

// A preset's name: [a-z][a-z0-9_-]{0,31}.
bool PresetName(const std::string& s) {
  if (s.empty() || s.size() > 32 || s[0] < 'a' || s[0] > 'z') return false;
  return s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") == std::string::npos;
}

std::string Names(const Presets& presets) {
  std::string out;
  for (const auto& [name, rules] : presets) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

}  // namespace

StatusOr<NetworkPolicy> ParsePolicy(const std::vector<std::string>& allow, const std::vector<std::string>& deny,
                                    const Presets& presets, const PolicyChecks& checks) {
  const std::vector<Cidr> prot = ProtectedRanges(checks.sandbox_range);
  NetworkPolicy p;
  for (auto [list, out, text, name] :
       {std::tuple{&allow, &p.allow, &p.allow_text, "allow"}, std::tuple{&deny, &p.deny, &p.deny_text, "deny"}}) {
    if (list->size() > 256) return absl::InvalidArgumentError(std::string("network.") + name + ": over 256 entries");
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string& e = (*list)[i];
      const std::string where = "network." + std::string(name) + "[" + std::to_string(i) + "]: ";
      if (auto it = presets.find(e); it != presets.end()) {
        for (Rule r : it->second) {
          r.preset = true;
          out->push_back(std::move(r));
        }
        text->push_back(e);
        continue;
      }
      StatusOr<Rule> r = ParseRule(e);
      if (!r.ok()) {
        std::string why(r.status().message());
        if (PresetName(e)) why = "'" + e + "' is no preset of this node (its presets: " + Names(presets) + ")";
        return absl::InvalidArgumentError(where + why);
      }
      // A caller's own entry never opens a protected range: refused here
      // rather than compiled into a rule the protected set would shadow, so
      // the caller learns it at once. A wider entry ("0.0.0.0/0") is fine:
      // its protected parts stay closed (CompileChain).
      if (checks.refuse && out == &p.allow && r->host.empty()) {
        for (const Cidr& pr : prot) {
          if (!pr.Contains(r->dst)) continue;
          return absl::InvalidArgumentError(
              where + "'" + e + "' lies inside the protected range " + pr.ToString() + " (" +
              ProtectedRangeName(pr, checks.sandbox_range) +
              "); only a preset the node's operator defines (warrend --net-preset) opens it");
        }
        // Never reachable (the chain refuses the node's addresses first):
        // say so rather than accept an entry that can never work.
        for (uint32_t a : checks.node_addrs) {
          if (r->dst.len == 32 && r->dst.addr == a)
            return absl::InvalidArgumentError(where + "'" + e +
                                              "' is an address of this node, which no sandbox can reach");
        }
      }
      out->push_back(*r);
      text->push_back(r->text);
    }
  }
  return p;
}

Status ParsePreset(const std::string& flag, Presets* out) {
  const size_t eq = flag.find('=');
  const std::string name = flag.substr(0, eq);
  if (eq == std::string::npos || !PresetName(name))
    return absl::InvalidArgumentError("--net-preset '" + flag +
                                      "': want NAME=ENTRY[,ENTRY...], NAME [a-z][a-z0-9_-]{0,31}");
  if (out->count(name) != 0) return absl::InvalidArgumentError("--net-preset " + name + " given twice");
  std::vector<Rule> rules;
  for (absl::string_view e : absl::StrSplit(flag.substr(eq + 1), ',', absl::SkipEmpty())) {
    StatusOr<Rule> r = ParseRule(std::string(e));
    if (!r.ok()) return absl::InvalidArgumentError("--net-preset " + name + ": " + std::string(r.status().message()));
    rules.push_back(*r);
  }
  if (rules.empty()) return absl::InvalidArgumentError("--net-preset " + name + ": no entries");
  (*out)[name] = std::move(rules);
  return absl::OkStatus();
}

namespace {

struct NamedRange {
  const char* cidr;
  const char* what;
};
constexpr NamedRange kProtected[] = {
    {"0.0.0.0/8", "this network"},
    {"10.0.0.0/8", "private"},
    {"100.64.0.0/10", "shared address space"},
    {"127.0.0.0/8", "loopback"},
    {"169.254.0.0/16", "link-local, incl. the cloud metadata address 169.254.169.254"},
    {"172.16.0.0/12", "private"},
    {"192.0.0.0/24", "IETF protocol assignments"},
    {"192.168.0.0/16", "private"},
    {"198.18.0.0/15", "benchmarking"},
    {"224.0.0.0/3", "multicast and reserved"},
};

}  // namespace

std::vector<Cidr> ProtectedRanges(const Cidr& sandbox_range) {
  std::vector<Cidr> v;
  for (const NamedRange& r : kProtected) v.push_back(*ParseCidr(r.cidr));
  v.push_back(sandbox_range);
  return v;
}

std::string ProtectedRangeName(const Cidr& range, const Cidr& sandbox_range) {
  if (range.addr == sandbox_range.addr && range.len == sandbox_range.len) return "this node's sandboxes";
  for (const NamedRange& r : kProtected)
    if (range.ToString() == r.cidr) return r.what;
  return "protected";
}

std::vector<std::string> CompileChain(const NetworkPolicy& p, uint32_t sandbox_addr, const Cidr& sandbox_range,
                                      const std::string& protected_set, const std::string& refuse_chain,
                                      const std::string& conn_counter, const std::string& names_set) {
  std::vector<std::string> out;
  // Root inside has no CAP_NET_ADMIN/NET_RAW, but a forged source would
  // dodge the per-sandbox accounting: drop it.
  out.push_back("ip saddr != " + Ipv4ToString(sandbox_addr) + " drop");
  out.push_back("ct state new counter name \"" + conn_counter + "\"");
  // The chain also runs in the input hook: the node's own addresses are
  // never reachable, whatever the policy allows.
  out.push_back("fib daddr type local goto " + refuse_chain);
  out.push_back("meta nfproto ipv6 goto " + refuse_chain);
  // Denied names are never resolved (dns.h): no rule of their own.
  for (const Rule& r : p.deny)
    if (r.host.empty()) out.push_back(Match(r) + " goto " + refuse_chain);
  const std::vector<Cidr> prot = ProtectedRanges(sandbox_range);
  auto inside_protected = [&](const Cidr& c) {
    for (const Cidr& pr : prot)
      if (pr.Contains(c)) return true;
    return false;
  };
  for (const Rule& r : p.allow)
    if (r.preset && r.host.empty() && inside_protected(r.dst)) out.push_back(Match(r) + " accept");
  out.push_back("ip daddr @" + protected_set + " goto " + refuse_chain);
  for (const Rule& r : p.allow) {
    if (!r.host.empty()) {
      out.push_back(Match(r, "@" + names_set) + " accept");
    } else if (!inside_protected(r.dst)) {
      out.push_back(Match(r) + " accept");
    }
  }
  out.push_back("goto " + refuse_chain);
  return out;
}

}  // namespace warren::net
