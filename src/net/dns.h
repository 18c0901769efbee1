// The node's DNS forwarder for sandboxes: every query a sandbox sends to
// port 53 (any server), over UDP or TCP, is redirected here (nftables,
// sandbox_network.h). A
// name its policy allows is forwarded to the upstream server, and the IPv4
// addresses of the answer are pinned into the sandbox's filter (Pin) BEFORE
// the answer goes back, so its next connection to them passes; any other
// name is answered NXDOMAIN (a denied name does not resolve). AAAA and other
// types of an allowed name are answered empty (the sandbox has no IPv6).
//
// Wire format (RFC 1035) by hand: only the header, the one question and the
// answer records' types, TTLs and A data are read.
//
// DNS over TCP (RFC 7766: what a resolver falls back to after a truncated
// UDP answer): each message with its 2-byte length prefix, several per
// connection, answered in order under the same rules as UDP. The upstream
// is asked over UDP first and, for a TCP query whose UDP answer came back
// truncated (TC), again over TCP, so the full answer is pinned and returned.
// A connection is closed after kTcpIdleMs without a whole query or after
// kTcpQueries queries; at most kTcpPerSource connections per source address
// and kTcpMax in all (more are closed at once: one sandbox cannot starve the
// others' TCP lookups, and UDP lookups never wait for TCP ones).
//
// Threads: kWorkers, each receiving on the UDP socket and answering
// synchronously (an upstream answer is awaited at most 2 s); one accepting
// TCP connections, and one per open connection. The destructor stops and
// joins them all.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::net {

class DnsForwarder {
 public:
  static constexpr int kWorkers = 4;
  static constexpr int kTcpIdleMs = 10000;
  static constexpr int kTcpQueries = 64;
  static constexpr size_t kTcpPerSource = 4;
  static constexpr size_t kTcpMax = 64;
  // Whether the sandbox at `src` (host byte order) may resolve `name`
  // (lower case, no trailing dot); `index` gets its lease index.
  using Allowed = std::function<bool(uint32_t src, const std::string& name, uint32_t* index)>;
  // Pins `addrs` (host byte order) for the sandbox `index` for `ttl_s` seconds.
  using Pin = std::function<Status(uint32_t index, const std::vector<uint32_t>& addrs, uint32_t ttl_s)>;
  struct Stats {
    uint64_t answered = 0, refused = 0, failed = 0;
  };

  // Listens on 0.0.0.0:`port` (0: a free one) for queries over UDP, and on
  // 0.0.0.0:`port` over TCP (0: a free one, not necessarily the same); asks
  // `upstream` ("a.b.c.d" or "a.b.c.d:port").
  static StatusOr<std::unique_ptr<DnsForwarder>> Open(uint16_t port, const std::string& upstream, Allowed allowed,
                                                      Pin pin);
  ~DnsForwarder();
  DnsForwarder(const DnsForwarder&) = delete;
  DnsForwarder& operator=(const DnsForwarder&) = delete;

  uint16_t port() const { return port_; }          // UDP
  uint16_t tcp_port() const { return tcp_port_; }  // TCP
  Stats stats() const { return {answered_.load(), refused_.load(), failed_.load()}; }
  // TCP connections being served now (a closed one counts until its thread
  // has seen the close).
  size_t tcp_connections() const { return tcp_live_.load(); }

 private:
  DnsForwarder() = default;
  struct TcpClient {
    std::thread thread;
    uint32_t src = 0;
    std::atomic<bool> done{false};
  };
  void Work();
  void Accept();
  void ServeTcp(int conn, uint32_t src);
  // The answer to one query (empty: drop it); `tcp`: it came over TCP.
  std::string Answer(uint32_t src, const std::string& query, bool tcp);
  // A socket of `type` (SOCK_DGRAM, SOCK_STREAM) connected to the upstream
  // with 2 s send/receive timeouts; invalid on failure.
  UniqueFd ConnectUpstream(int type) const;
  // The upstream's answer to `query` ("" when none came within 2 s).
  std::string AskUdp(const std::string& query) const;
  std::string AskTcp(const std::string& query) const;

  uint16_t port_ = 0, tcp_port_ = 0;
  uint32_t upstream_addr_ = 0;
  uint16_t upstream_port_ = 53;
  Allowed allowed_;
  Pin pin_;
  UniqueFd sock_, listen_, stop_;
  std::vector<std::thread> workers_;  // UDP workers and the TCP acceptor
  // Open TCP connections; touched by the acceptor only (and the destructor
  // once the acceptor is joined).
  std::vector<std::unique_ptr<TcpClient>> tcp_clients_;
  std::atomic<uint64_t> answered_{0}, refused_{0}, failed_{0};
  std::atomic<size_t> tcp_live_{0};
};

// The first `nameserver` of a resolv.conf's text (IPv4 only), or "".
std::string FirstNameserver(const std::string& resolv_conf);

}  // namespace warren::net
