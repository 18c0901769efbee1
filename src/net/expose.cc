#include "net/expose.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <chrono>
#include <cstdlib>
#include <string_view>

#include "common/log.h"
#include "common/secret.h"

namespace warren::net {

namespace {

constexpr size_t kMaxHead = 16 << 10;
constexpr int kHeadTimeoutMs = 10000;
constexpr std::string_view kHeader = "x-warren-token";
constexpr std::string_view kQuery = "warren_token=";

// Writes all of `data` to the non-blocking `fd`, waiting for room; false on
// error or once `stop` is readable.
bool WriteAllPoll(int fd, const char* data, size_t n, int stop) {
  while (n > 0) {
    ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN) return false;
    pollfd p[2] = {{fd, POLLOUT, 0}, {stop, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return false;
    if (p[1].revents != 0) return false;
  }
  return true;
}

void Reply(int fd, int stop, const char* status, const std::string& msg) {
  const std::string r = std::string("HTTP/1.1 ") + status +
                        "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(msg.size() + 1) +
                        "\r\nConnection: close\r\n\r\n" + msg + "\n";
  (void)WriteAllPoll(fd, r.data(), r.size(), stop);
  ::shutdown(fd, SHUT_WR);
}

std::string_view Strip(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool EqualsLower(std::string_view s, std::string_view lower) {
  if (s.size() != lower.size()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != lower[i]) return false;
  }
  return true;
}

// Whether the request head carries `token` (header or query parameter), and
// the head without the token header (the sandbox never sees the token in it).
bool CheckToken(std::string_view head, const std::string& token, std::string* forward) {
  bool ok = false;
  const size_t eol = head.find("\r\n");
  const std::string_view line = head.substr(0, eol);
  const size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 != std::string_view::npos && sp2 > sp1) {
    const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    if (size_t q = target.find('?'); q != std::string_view::npos) {
      std::string_view query = target.substr(q + 1);
      while (!query.empty()) {
        const size_t amp = query.find('&');
        const std::string_view part = query.substr(0, amp);
        if (part.substr(0, kQuery.size()) == kQuery && SameSecret(part.substr(kQuery.size()), token)) ok = true;
        query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
      }
    }
  }
  forward->assign(line);
  forward->append("\r\n");
  size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) e = head.size();
    const std::string_view h = head.substr(pos, e - pos);
    pos = e + 2;
    const size_t colon = h.find(':');
    if (colon != std::string_view::npos && EqualsLower(Strip(h.substr(0, colon)), kHeader)) {
      if (SameSecret(Strip(h.substr(colon + 1)), token)) ok = true;
      continue;
    }
    forward->append(h);
    forward->append("\r\n");
  }
  return ok;
}

// Copies bytes both ways between the non-blocking sockets `a` and `b` until
// both directions ended (each EOF passed on as a shutdown), an error, or `stop`.
void Pump(int a, int b, int stop) {
  char buf[64 << 10];
  bool a_open = true, b_open = true;
  while (a_open || b_open) {
    pollfd p[3] = {{a_open ? a : -1, POLLIN, 0}, {b_open ? b : -1, POLLIN, 0}, {stop, POLLIN, 0}};
    if (::poll(p, 3, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[2].revents != 0) return;
    for (int side = 0; side < 2; ++side) {
      if (p[side].fd < 0 || p[side].revents == 0) continue;
      const int src = side == 0 ? a : b, dst = side == 0 ? b : a;
      ssize_t n = ::recv(src, buf, sizeof buf, 0);
      if (n > 0) {
        if (!WriteAllPoll(dst, buf, static_cast<size_t>(n), stop)) return;
      } else if (n == 0) {
        (side == 0 ? a_open : b_open) = false;
        ::shutdown(dst, SHUT_WR);
      } else if (errno != EAGAIN && errno != EINTR) {
        return;
      }
    }
  }
}

}  // namespace

StatusOr<std::string> NewToken() {
  unsigned char b[16];
  if (::getrandom(b, sizeof b, 0) != static_cast<ssize_t>(sizeof b)) return ErrnoToStatus(errno, "getrandom(16)");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string t;
  for (unsigned char c : b) {
    t += kHex[c >> 4];
    t += kHex[c & 15];
  }
  return t;
}

StatusOr<UniqueFd> DialInNetns(int netns_fd, uint16_t port) {
  StatusOr<UniqueFd> out = absl::InternalError("unset");
  const std::string what = "127.0.0.1:" + std::to_string(port) + " in the sandbox";
  std::thread t([&] {
    // setns(CLONE_NEWNET) changes only this thread; the socket keeps the
    // namespace it was made in.
    if (::setns(netns_fd, CLONE_NEWNET) != 0) {
      out = ErrnoToStatus(errno, "setns(netns fd " + std::to_string(netns_fd) + ", CLONE_NEWNET)");
      return;
    }
    UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) {
      out = ErrnoToStatus(errno, "socket(AF_INET, SOCK_STREAM) for " + what);
      return;
    }
    timeval tv{5, 0};  // a blocking connect gives up after SO_SNDTIMEO
    (void)::setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      out = ErrnoToStatus(errno, "connect(" + what + ")");
      return;
    }
    out = std::move(s);
  });
  t.join();
  return out;
}

StatusOr<UniqueFd> DialTcp(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  int port = 0;
  if (colon == std::string::npos || ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr) != 1 ||
      (port = std::atoi(address.c_str() + colon + 1)) <= 0 || port > 65535) {
    return absl::InvalidArgumentError("not an IPv4 HOST:PORT: '" + address + "'");
  }
  a.sin_port = htons(static_cast<uint16_t>(port));
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return ErrnoToStatus(errno, "socket(AF_INET, SOCK_STREAM) for " + address);
  timeval tv{5, 0};  // a blocking connect gives up after SO_SNDTIMEO
  (void)::setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    return ErrnoToStatus(errno, "connect(" + address + ")");
  return s;
}

StatusOr<std::unique_ptr<Exposure>> Exposure::Open(const std::string& host, uint16_t listen_port, std::string token,
                                                   Dial dial) {
  if (token.empty()) return absl::InvalidArgumentError("an exposure needs a token");
  auto e = std::unique_ptr<Exposure>(new Exposure());
  e->token_ = std::move(token);
  ASSIGN_OR_RETURN(
      e->relay_, HttpRelay::Open(host, listen_port, [token = e->token_, dial = std::move(dial)](std::string_view head) {
        std::string forward;
        if (!CheckToken(head, token, &forward)) {
          return RelayAdmission::Refuse("401 Unauthorized",
                                        "this port is exposed behind a token: send it as the "
                                        "X-Warren-Token header or the warren_token query parameter");
        }
        forward.resize(forward.size() - 2);  // its last "\r\n"
        return RelayAdmission::Admit(std::move(forward), dial);
      }));
  return e;
}

StatusOr<std::unique_ptr<HttpRelay>> HttpRelay::Open(const std::string& host, uint16_t listen_port, Admit admit) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(listen_port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
    return absl::InvalidArgumentError("expose host '" + host + "' is not an IPv4 address");
  auto e = std::unique_ptr<HttpRelay>(new HttpRelay());
  e->host_ = host;
  e->admit_ = std::move(admit);
  e->listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!e->listen_.valid()) return ErrnoToStatus(errno, "socket(AF_INET, SOCK_STREAM)");
  const int one = 1;
  (void)::setsockopt(e->listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const std::string where = host + ":" + std::to_string(listen_port);
  if (::bind(e->listen_.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    return ErrnoToStatus(errno, "bind(" + where + ")");
  if (::listen(e->listen_.get(), 128) != 0) return ErrnoToStatus(errno, "listen(" + where + ")");
  socklen_t len = sizeof a;
  if (::getsockname(e->listen_.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return ErrnoToStatus(errno, "getsockname(" + where + ")");
  e->listen_port_ = ntohs(a.sin_port);
  e->stop_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!e->stop_.valid()) return ErrnoToStatus(errno, "eventfd");
  e->acceptor_ = std::thread([p = e.get()] { p->AcceptLoop(); });
  return e;
}

HttpRelay::~HttpRelay() {
  const uint64_t one = 1;
  if (stop_.valid()) (void)!::write(stop_.get(), &one, sizeof one);
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::unique_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> l(mu_);
    conns.swap(conns_);
  }
  for (auto& c : conns) c->thread.join();
}

std::string HttpRelay::address() const { return host_ + ":" + std::to_string(listen_port_); }

void HttpRelay::AcceptLoop() {
  for (;;) {
    pollfd p[2] = {{listen_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c.valid()) {
      // Out of fds: wait a little instead of spinning on a readable listener.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        pollfd s{stop_.get(), POLLIN, 0};
        (void)::poll(&s, 1, 100);
      }
      continue;
    }
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done.load()) {
        (*it)->thread.join();
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    if (conns_.size() >= kMaxConnections) {
      refused_.fetch_add(1);
      Reply(c.get(), stop_.get(), "503 Service Unavailable", "too many connections to this port");
      continue;
    }
    auto conn = std::make_unique<Conn>();
    Conn* raw = conn.get();
    conn->thread = std::thread([this, raw, fd = c.release()] {
      Serve(UniqueFd(fd));
      raw->done.store(true);
    });
    conns_.push_back(std::move(conn));
  }
}

void HttpRelay::Serve(UniqueFd client) {
  std::string head;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kHeadTimeoutMs);
  size_t end = std::string::npos;
  char buf[4096];
  while ((end = head.find("\r\n\r\n")) == std::string::npos) {
    if (head.size() > kMaxHead) {
      refused_.fetch_add(1);
      Reply(client.get(), stop_.get(), "431 Request Header Fields Too Large", "request head over 16 KiB");
      return;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd p[2] = {{client.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(p, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    if (p[0].revents == 0) continue;
    ssize_t n = ::recv(client.get(), buf, sizeof buf, 0);
    if (n == 0) return;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return;
    }
    head.append(buf, static_cast<size_t>(n));
  }
  RelayAdmission a = admit_(std::string_view(head).substr(0, end));
  if (!a.status.empty()) {
    refused_.fetch_add(1);
    Reply(client.get(), stop_.get(), a.status.c_str(), a.message);
    return;
  }
  StatusOr<UniqueFd> up = a.dial();
  if (!up.ok()) {
    Reply(client.get(), stop_.get(), "502 Bad Gateway", std::string(up.status().message()));
    return;
  }
  admitted_.fetch_add(1);
  const int fl = ::fcntl(up->get(), F_GETFL);
  if (fl < 0 || ::fcntl(up->get(), F_SETFL, fl | O_NONBLOCK) != 0) return;
  std::string& forward = a.head;
  forward.append("\r\n\r\n");
  forward.append(head, end + 4, std::string::npos);  // body bytes already read
  if (!WriteAllPoll(up->get(), forward.data(), forward.size(), stop_.get())) return;
  Pump(client.get(), up->get(), stop_.get());
}

}  // namespace warren::net
