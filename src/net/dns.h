// The node's DNS forwarder for sandboxes: every UDP query a sandbox sends to
// port 53 (any server) is redirected here (nftables, sandbox_network.h). A
// name its policy allows is forwarded to the upstream server, and the IPv4
// addresses of the answer are pinned into the sandbox's filter (Pin) BEFORE
// the answer goes back, so its next connection to them passes; any other
// name is answered NXDOMAIN (a denied name does not resolve). AAAA and other
// types of an allowed name are answered empty (the sandbox has no IPv6).
//
// Wire format (RFC 1035) by hand: only the header, the one question and the
// answer records' types, TTLs and A data are read.
//
// Threads: kWorkers, each receiving on the one socket and answering
// synchronously (an upstream answer is awaited at most 2 s). The destructor
// stops and joins them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::net {

class DnsForwarder {
 public:
  static constexpr int kWorkers = 4;
  // Whether the sandbox at `src` (host byte order) may resolve `name`
  // (lower case, no trailing dot); `index` gets its lease index.
  using Allowed = std::function<bool(uint32_t src, const std::string& name, uint32_t* index)>;
  // Pins `addrs` (host byte order) for the sandbox `index` for `ttl_s` seconds.
  using Pin = std::function<Status(uint32_t index, const std::vector<uint32_t>& addrs, uint32_t ttl_s)>;
  struct Stats {
    uint64_t answered = 0, refused = 0, failed = 0;
  };

  // Listens on 0.0.0.0:`port` (0: a free one) for queries; asks `upstream`
  // ("a.b.c.d" or "a.b.c.d:port").
  static StatusOr<std::unique_ptr<DnsForwarder>> Open(uint16_t port, const std::string& upstream, Allowed allowed,
                                                      Pin pin);
  ~DnsForwarder();
  DnsForwarder(const DnsForwarder&) = delete;
  DnsForwarder& operator=(const DnsForwarder&) = delete;

  uint16_t port() const { return port_; }
  Stats stats() const { return {answered_.load(), refused_.load(), failed_.load()}; }

 private:
  DnsForwarder() = default;
  void Work();
  // The answer to one query (empty: drop it).
  std::string Answer(uint32_t src, const std::string& query);

  uint16_t port_ = 0;
  uint32_t upstream_addr_ = 0;
  uint16_t upstream_port_ = 53;
  Allowed allowed_;
  Pin pin_;
  UniqueFd sock_, stop_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> answered_{0}, refused_{0}, failed_{0};
};

// The first `nameserver` of a resolv.conf's text (IPv4 only), or "".
std::string FirstNameserver(const std::string& resolv_conf);

}  // namespace warren::net
