// The exposure gateway: one HTTP listener (on a cluster's entry node, or a
// single node) that reaches any sandbox's exposed port by name, so a client
// needs one address, not one per node and port. The name is the Host of the
// request, `PORT-SANDBOX_ID.DOMAIN` (as E2B's `PORT-ID.e2b.app` and
// Daytona's preview URLs: one wildcard DNS name, or `*.localhost`, which
// resolves to loopback without DNS, RFC 6761 §6.3). The gateway finds that
// exposure (`Resolve`: on this node, or asked of the sandbox's node) and
// joins the connection to it, request unchanged: the exposure itself still
// checks the token (X-Warren-Token header or warren_token query parameter)
// and answers 401 without it.
//
// Answers of its own: `400` (no Host), `404` (a Host not of the form, or no
// such sandbox or exposed port), `502` (the exposure does not answer), and
// HttpRelay's (net/expose.h) 431 and 503.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "net/expose.h"

namespace warren::net {

// A Host header's `PORT-SANDBOX_ID.DOMAIN[:port]`, parsed.
struct GatewayTarget {
  uint16_t port = 0;
  std::string sandbox_id;
};
// nullopt unless `host` is PORT-ID.`domain` (optionally :port-suffixed;
// case-insensitive), PORT in 1..65535 and ID of [a-z0-9-].
std::optional<GatewayTarget> ParseGatewayHost(std::string_view host, std::string_view domain);

class ExposeGateway {
 public:
  // The address ("IPv4:port") of sandbox `sandbox_id`'s exposure of
  // `port`; NotFound when there is none (or no such sandbox).
  using Resolve = std::function<StatusOr<std::string>(const std::string& sandbox_id, uint16_t port)>;

  // Listens on `host`:`listen_port` (IPv4; 0: any free port) for names under
  // `domain` (e.g. "localhost", "sandboxes.example.com").
  static StatusOr<std::unique_ptr<ExposeGateway>> Open(const std::string& host, uint16_t listen_port,
                                                       std::string domain, Resolve resolve);

  uint16_t listen_port() const { return relay_->listen_port(); }
  std::string address() const { return relay_->address(); }
  const std::string& domain() const { return domain_; }

 private:
  std::string domain_;
  std::unique_ptr<HttpRelay> relay_;
};

}  // namespace warren::net
