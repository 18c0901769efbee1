// Exposed ports (Exposure) and the relay under them (HttpRelay, also under
// the exposure gateway: net/gateway.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::net {

// What an HttpRelay does with a connection once its first request head
// (up to, without, the "\r\n\r\n" that ends it) has arrived: refuse it with
// `status` ("401 Unauthorized"...) and `message`, or send `head` on to a
// connection `dial` opens and join the two.
struct RelayAdmission {
  using Dial = std::function<StatusOr<UniqueFd>()>;
  std::string status, message;  // non-empty status: refused
  std::string head;             // admitted: the head sent upstream
  Dial dial;

  static RelayAdmission Refuse(std::string status, std::string message) {
    return RelayAdmission{std::move(status), std::move(message), {}, {}};
  }
  static RelayAdmission Admit(std::string head, Dial dial) {
    return RelayAdmission{{}, {}, std::move(head), std::move(dial)};
  }
};

// A TCP listener that reads each connection's first HTTP request head (16
// KiB, 10 s at most: `431`, or closed), asks `admit` what to do with it,
// and either answers the refusal or joins the connection to the one
// `dial` opens, both ways, until either side ends (keep-alive requests,
// streaming and WebSocket upgrades pass; later requests on an admitted
// connection are not looked at). Dial failure: `502`.
//
// Threads: one accepting, one per connection (at most kMaxConnections at
// once; more are answered `503`); `admit` and `dial` run on a connection's
// thread. The destructor stops accepting, ends every connection and joins
// every thread: after it returns, nothing listens and nothing is called.
class HttpRelay {
 public:
  static constexpr size_t kMaxConnections = 64;
  using Admit = std::function<RelayAdmission(std::string_view head)>;

  // Listens on `host`:`listen_port` (IPv4 address; port 0: any free one).
  static StatusOr<std::unique_ptr<HttpRelay>> Open(const std::string& host, uint16_t listen_port, Admit admit);
  ~HttpRelay();
  HttpRelay(const HttpRelay&) = delete;
  HttpRelay& operator=(const HttpRelay&) = delete;

  uint16_t listen_port() const { return listen_port_; }
  std::string address() const;  // "host:port"
  uint64_t admitted() const { return admitted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  HttpRelay() = default;
  void AcceptLoop();
  void Serve(UniqueFd client);
  struct Conn {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  std::string host_;
  uint16_t listen_port_ = 0;
  Admit admit_;
  UniqueFd listen_;
  UniqueFd stop_;  // eventfd: readable once the destructor runs
  std::thread acceptor_;
  std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;  // guarded by mu_
  std::atomic<uint64_t> admitted_{0}, refused_{0};
};

// An exposed port: an HttpRelay on the node that lets a connection through
// to a port inside a sandbox only when its first HTTP request carries the
// exposure's token, as the header `X-Warren-Token: <token>` (removed before
// the request goes on: the sandbox never sees it) or the query parameter
// `warren_token=<token>` (for a browser). Refused: `401` and the connection
// closed. Admitted: joined to a fresh connection into the sandbox (`Dial`).
class Exposure {
 public:
  static constexpr size_t kMaxConnections = HttpRelay::kMaxConnections;
  // A connection into the sandbox; called on a connection's thread.
  using Dial = RelayAdmission::Dial;

  // Listens on `host`:`listen_port` (IPv4 address; port 0: any free one).
  // `token`: non-empty, what a client must present.
  static StatusOr<std::unique_ptr<Exposure>> Open(const std::string& host, uint16_t listen_port, std::string token,
                                                  Dial dial);

  uint16_t listen_port() const { return relay_->listen_port(); }
  std::string address() const { return relay_->address(); }  // "host:port"
  const std::string& token() const { return token_; }
  uint64_t admitted() const { return relay_->admitted(); }
  uint64_t refused() const { return relay_->refused(); }

 private:
  std::string token_;
  std::unique_ptr<HttpRelay> relay_;
};

// 32 hex digits from getrandom(2).
StatusOr<std::string> NewToken();

// A TCP connection to `address` ("IPv4:port"), connect bounded by 5 s.
StatusOr<UniqueFd> DialTcp(const std::string& address);

// A TCP connection to 127.0.0.1:`port` inside the network namespace
// `netns_fd` (borrowed): the socket is made by a short-lived thread that
// setns()es there (it keeps that namespace), so the sandbox's servers are
// reached on its own loopback whether or not it has a link. Connect bounded
// by 5 s.
StatusOr<UniqueFd> DialInNetns(int netns_fd, uint16_t port);

}  // namespace warren::net
