#include "net/gateway.h"

#include <cctype>
#include <utility>

namespace warren::net {

namespace {

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The value of the request head's Host header ("" when absent).
std::string_view HostOf(std::string_view head) {
  size_t pos = head.find("\r\n");
  while (pos != std::string_view::npos && pos + 2 < head.size()) {
    pos += 2;
    const size_t e = head.find("\r\n", pos);
    const std::string_view line = head.substr(pos, e == std::string_view::npos ? std::string_view::npos : e - pos);
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos && IEquals(Trim(line.substr(0, colon)), "host")) {
      return Trim(line.substr(colon + 1));
    }
    pos = e;
  }
  return {};
}

}  // namespace

std::optional<GatewayTarget> ParseGatewayHost(std::string_view host, std::string_view domain) {
  if (const size_t colon = host.rfind(':'); colon != std::string_view::npos) host = host.substr(0, colon);
  if (host.size() <= domain.size() + 1 || host[host.size() - domain.size() - 1] != '.' ||
      !IEquals(host.substr(host.size() - domain.size()), domain)) {
    return std::nullopt;
  }
  const std::string_view label = host.substr(0, host.size() - domain.size() - 1);
  const size_t dash = label.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash > 5 || dash + 1 >= label.size()) return std::nullopt;
  uint32_t port = 0;
  for (char c : label.substr(0, dash)) {
    if (c < '0' || c > '9') return std::nullopt;
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port == 0 || port > 65535) return std::nullopt;
  GatewayTarget t;
  t.port = static_cast<uint16_t>(port);
  for (char c : label.substr(dash + 1)) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!((l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '-')) return std::nullopt;
    t.sandbox_id += l;
  }
  return t;
}

StatusOr<std::unique_ptr<ExposeGateway>> ExposeGateway::Open(const std::string& host, uint16_t listen_port,
                                                             std::string domain, Resolve resolve) {
  if (domain.empty() || domain.front() == '.' || domain.back() == '.')
    return absl::InvalidArgumentError("expose gateway domain '" + domain + "': a name such as localhost");
  auto g = std::unique_ptr<ExposeGateway>(new ExposeGateway());
  g->domain_ = std::move(domain);
  ASSIGN_OR_RETURN(
      g->relay_,
      HttpRelay::Open(host, listen_port, [domain = g->domain_, resolve = std::move(resolve)](std::string_view head) {
        const std::string_view host_header = HostOf(head);
        if (host_header.empty()) return RelayAdmission::Refuse("400 Bad Request", "the request has no Host header");
        const std::optional<GatewayTarget> t = ParseGatewayHost(host_header, domain);
        if (!t) {
          return RelayAdmission::Refuse("404 Not Found", "not a sandbox's port: the host must be PORT-SANDBOX_ID." +
                                                             domain + ", got " + std::string(host_header));
        }
        StatusOr<std::string> addr = resolve(t->sandbox_id, t->port);
        if (!addr.ok()) {
          const bool missing = addr.status().code() == absl::StatusCode::kNotFound;
          return RelayAdmission::Refuse(missing ? "404 Not Found" : "502 Bad Gateway",
                                        std::string(addr.status().message()));
        }
        return RelayAdmission::Admit(std::string(head), [a = *addr] { return DialTcp(a); });
      }));
  return g;
}

}  // namespace warren::net
