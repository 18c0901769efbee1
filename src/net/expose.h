// An exposed port: a TCP listener on the node that lets a connection through
// to a port inside a sandbox only when the connection's first HTTP request
// carries the exposure's token, as the header `X-Warren-Token: <token>` or
// the query parameter `warren_token=<token>` (for a browser). Refused:
// `401` and the connection closed. Admitted: the request as received and
// every byte after it are joined to a fresh connection into the sandbox
// (`Dial`) in both directions until either side ends (so keep-alive
// requests, streaming and WebSocket upgrades pass; later requests on an
// admitted connection are not checked again). Dial failure: `502`.
//
// Threads: one accepting, one per connection (at most kMaxConnections at
// once; more are answered `503`). The destructor stops accepting, ends
// every connection and joins every thread: after it returns, nothing
// listens and no thread calls `Dial` any more.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::net {

class Exposure {
 public:
  static constexpr size_t kMaxConnections = 64;
  // A connection into the sandbox; called on a connection's thread.
  using Dial = std::function<StatusOr<UniqueFd>()>;

  // Listens on `host`:`listen_port` (IPv4 address; port 0: any free one).
  // `token`: non-empty, what a client must present.
  static StatusOr<std::unique_ptr<Exposure>> Open(const std::string& host, uint16_t listen_port, std::string token,
                                                  Dial dial);
  ~Exposure();
  Exposure(const Exposure&) = delete;
  Exposure& operator=(const Exposure&) = delete;

  uint16_t listen_port() const { return listen_port_; }
  std::string address() const;  // "host:port"
  const std::string& token() const { return token_; }
  uint64_t admitted() const { return admitted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  Exposure() = default;
  void AcceptLoop();
  void Serve(UniqueFd client);
  struct Conn {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  std::string host_, token_;
  uint16_t listen_port_ = 0;
  Dial dial_;
  UniqueFd listen_;
  UniqueFd stop_;  // eventfd: readable once the destructor runs
  std::thread acceptor_;
  std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;  // guarded by mu_
  std::atomic<uint64_t> admitted_{0}, refused_{0};
};

// 32 hex digits from getrandom(2).
StatusOr<std::string> NewToken();

// A TCP connection to 127.0.0.1:`port` inside the network namespace
// `netns_fd` (borrowed): the socket is made by a short-lived thread that
// setns()es there (it keeps that namespace), so the sandbox's servers are
// reached on its own loopback whether or not it has a link. Connect bounded
// by 5 s.
StatusOr<UniqueFd> DialInNetns(int netns_fd, uint16_t port);

}  // namespace warren::net
