#include "net/dns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace warren::net {

namespace {

constexpr size_t kMaxPacket = 4096;
constexpr uint16_t kTypeA = 1;
constexpr uint16_t kClassIn = 1;
constexpr uint8_t kNoError = 0, kFormErr = 1, kServFail = 2, kNxDomain = 3;
constexpr uint32_t kMinPin = 30, kMaxPin = 3600;  // seconds an answer stays pinned

uint16_t Get16(const std::string& m, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(m[at]) << 8) | static_cast<uint8_t>(m[at + 1]));
}
uint32_t Get32(const std::string& m, size_t at) {
  return (static_cast<uint32_t>(Get16(m, at)) << 16) | Get16(m, at + 2);
}

// Skips a (possibly compressed) name at `*at`; false when malformed.
bool SkipName(const std::string& m, size_t* at) {
  for (int labels = 0; labels < 128; ++labels) {
    if (*at >= m.size()) return false;
    const auto len = static_cast<uint8_t>(m[*at]);
    if (len == 0) {
      *at += 1;
      return true;
    }
    if ((len & 0xc0) == 0xc0) {  // a pointer ends the name
      if (*at + 2 > m.size()) return false;
      *at += 2;
      return true;
    }
    if ((len & 0xc0) != 0) return false;
    *at += 1 + len;
  }
  return false;
}

// The question's name (lower case, dot-joined) of a query, and the offset
// after its type and class; false when it is not one plain question.
bool ParseQuestion(const std::string& q, std::string* name, uint16_t* type, size_t* end) {
  if (q.size() < 12) return false;
  if ((static_cast<uint8_t>(q[2]) & 0xf8) != 0) return false;  // QR=0, opcode QUERY
  if (Get16(q, 4) != 1) return false;                          // one question
  size_t at = 12;
  name->clear();
  for (;;) {
    if (at >= q.size()) return false;
    const auto len = static_cast<uint8_t>(q[at]);
    if (len == 0) break;
    if (len > 63 || at + 1 + len > q.size()) return false;  // no compression in a question
    if (!name->empty()) *name += '.';
    name->append(q, at + 1, len);
    at += 1 + len;
    if (name->size() > 253) return false;
  }
  at += 1;
  if (at + 4 > q.size()) return false;
  *type = Get16(q, at);
  *end = at + 4;
  absl::AsciiStrToLower(name);
  return true;
}

// An answer of our own: the query's id, RD and question, no records.
std::string Reply(const std::string& q, size_t question_end, uint8_t rcode) {
  std::string r = q.substr(0, question_end);
  r[2] = static_cast<char>(0x80 | (static_cast<uint8_t>(q[2]) & 0x01));  // QR, RD as asked
  r[3] = static_cast<char>(0x80 | rcode);                                // RA
  for (size_t i = 6; i < 12; ++i) r[i] = 0;                              // no records
  return r;
}

// The A records of an answer and their smallest TTL; false when malformed.
bool AddressesOf(const std::string& m, std::vector<uint32_t>* addrs, uint32_t* ttl) {
  if (m.size() < 12) return false;
  const uint16_t qd = Get16(m, 4), an = Get16(m, 6);
  size_t at = 12;
  for (uint16_t i = 0; i < qd; ++i) {
    if (!SkipName(m, &at) || at + 4 > m.size()) return false;
    at += 4;
  }
  *ttl = kMaxPin;
  for (uint16_t i = 0; i < an; ++i) {
    if (!SkipName(m, &at) || at + 10 > m.size()) return false;
    const uint16_t type = Get16(m, at), cls = Get16(m, at + 2);
    const uint32_t t = Get32(m, at + 4);
    const uint16_t len = Get16(m, at + 8);
    at += 10;
    if (at + len > m.size()) return false;
    if (type == kTypeA && cls == kClassIn && len == 4) {
      addrs->push_back(Get32(m, at));
      *ttl = std::min(*ttl, t);
    }
    at += len;
  }
  return true;
}

using Clock = std::chrono::steady_clock;

int MsUntil(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 60000));
}

// Waits until `fd` is ready for `events`; false on `deadline` or `stop` (an
// eventfd) becoming readable.
bool WaitReady(int fd, int stop, short events, Clock::time_point deadline) {
  pollfd p[2] = {{fd, events, 0}, {stop, POLLIN, 0}};
  const int timeout = MsUntil(deadline);
  return timeout != 0 && ::poll(p, 2, timeout) > 0 && p[1].revents == 0;
}

// Reads exactly `n` bytes from the non-blocking `fd`; false on EOF, an
// error, `deadline` or `stop` becoming readable.
bool ReadFull(int fd, int stop, char* out, size_t n, Clock::time_point deadline) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0 || (errno != EAGAIN && errno != EINTR) || !WaitReady(fd, stop, POLLIN, deadline)) {
      return false;
    }
  }
  return true;
}

bool WriteFull(int fd, int stop, const std::string& data, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t r = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (r > 0) {
      sent += static_cast<size_t>(r);
    } else if (r == 0 || (errno != EAGAIN && errno != EINTR) || !WaitReady(fd, stop, POLLOUT, deadline)) {
      return false;
    }
  }
  return true;
}

// A DNS message with the 2-byte length prefix of TCP (RFC 1035 4.2.2).
std::string Framed(const std::string& m) {
  std::string out;
  out += static_cast<char>(m.size() >> 8);
  out += static_cast<char>(m.size() & 0xff);
  return out + m;
}

bool AnswersQuery(const std::string& resp, const std::string& query) {
  return resp.size() >= 12 && resp[0] == query[0] && resp[1] == query[1] && (static_cast<uint8_t>(resp[2]) & 0x80) != 0;
}

}  // namespace

std::string FirstNameserver(const std::string& resolv_conf) {
  for (absl::string_view line : absl::StrSplit(resolv_conf, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "nameserver")) continue;
    std::string addr(absl::StripAsciiWhitespace(line));
    in_addr a{};
    if (inet_pton(AF_INET, addr.c_str(), &a) == 1) return addr;
  }
  return "";
}

StatusOr<std::unique_ptr<DnsForwarder>> DnsForwarder::Open(uint16_t port, const std::string& upstream, Allowed allowed,
                                                           Pin pin) {
  auto f = std::unique_ptr<DnsForwarder>(new DnsForwarder());
  std::string host = upstream;
  if (size_t colon = upstream.find(':'); colon != std::string::npos) {
    host = upstream.substr(0, colon);
    uint32_t p = 0;
    if (!absl::SimpleAtoi(upstream.substr(colon + 1), &p) || p == 0 || p > 65535)
      return absl::InvalidArgumentError("DNS upstream '" + upstream + "': bad port");
    f->upstream_port_ = static_cast<uint16_t>(p);
  }
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) != 1)
    return absl::InvalidArgumentError("DNS upstream '" + upstream + "' is not an IPv4 address[:port]");
  f->upstream_addr_ = ntohl(a.s_addr);
  f->allowed_ = std::move(allowed);
  f->pin_ = std::move(pin);
  f->sock_.reset(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!f->sock_.valid()) return ErrnoToStatus(errno, "socket(AF_INET, SOCK_DGRAM)");
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(f->sock_.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0)
    return ErrnoToStatus(errno, "bind(0.0.0.0:" + std::to_string(port) + ", udp)");
  socklen_t len = sizeof sa;
  if (::getsockname(f->sock_.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    return ErrnoToStatus(errno, "getsockname(dns)");
  f->port_ = ntohs(sa.sin_port);
  f->listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!f->listen_.valid()) return ErrnoToStatus(errno, "socket(AF_INET, SOCK_STREAM)");
  const int one = 1;
  if (::setsockopt(f->listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    return ErrnoToStatus(errno, "setsockopt(dns tcp, SO_REUSEADDR)");
  sa.sin_port = htons(port);
  if (::bind(f->listen_.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0)
    return ErrnoToStatus(errno, "bind(0.0.0.0:" + std::to_string(port) + ", tcp)");
  if (::listen(f->listen_.get(), 128) != 0) return ErrnoToStatus(errno, "listen(dns tcp)");
  len = sizeof sa;
  if (::getsockname(f->listen_.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    return ErrnoToStatus(errno, "getsockname(dns tcp)");
  f->tcp_port_ = ntohs(sa.sin_port);
  f->stop_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!f->stop_.valid()) return ErrnoToStatus(errno, "eventfd");
  for (int i = 0; i < kWorkers; ++i) f->workers_.emplace_back([p = f.get()] { p->Work(); });
  f->workers_.emplace_back([p = f.get()] { p->Accept(); });
  return f;
}

DnsForwarder::~DnsForwarder() {
  const uint64_t one = 1;
  if (stop_.valid()) (void)!::write(stop_.get(), &one, sizeof one);
  for (std::thread& t : workers_) t.join();
  // The acceptor is gone: the list is ours. Each connection sees `stop_` too.
  for (const std::unique_ptr<TcpClient>& c : tcp_clients_) c->thread.join();
}

void DnsForwarder::Accept() {
  for (;;) {
    pollfd p[2] = {{listen_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(p, 2, 1000) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    for (auto it = tcp_clients_.begin(); it != tcp_clients_.end();) {
      if ((*it)->done.load()) {
        (*it)->thread.join();
        it = tcp_clients_.erase(it);
      } else {
        ++it;
      }
    }
    if ((p[0].revents & POLLIN) == 0) continue;
    sockaddr_in from{};
    socklen_t fl = sizeof from;
    UniqueFd conn(::accept4(listen_.get(), reinterpret_cast<sockaddr*>(&from), &fl, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    const uint32_t src = ntohl(from.sin_addr.s_addr);
    const auto same = static_cast<size_t>(
        std::count_if(tcp_clients_.begin(), tcp_clients_.end(), [src](const auto& c) { return c->src == src; }));
    if (tcp_clients_.size() >= kTcpMax || same >= kTcpPerSource) {
      refused_.fetch_add(1);
      continue;  // closed: the client retries or gives up
    }
    auto c = std::make_unique<TcpClient>();
    c->src = src;
    TcpClient* raw = c.get();
    tcp_live_.fetch_add(1);
    c->thread = std::thread([this, raw, fd = conn.release()] {
      UniqueFd own(fd);
      ServeTcp(own.get(), raw->src);
      own.reset();
      tcp_live_.fetch_sub(1);
      raw->done.store(true);
    });
    tcp_clients_.push_back(std::move(c));
  }
}

void DnsForwarder::ServeTcp(int conn, uint32_t src) {
  for (int i = 0; i < kTcpQueries; ++i) {
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(kTcpIdleMs);
    char prefix[2];
    if (!ReadFull(conn, stop_.get(), prefix, sizeof prefix, deadline)) return;
    const size_t len = (static_cast<size_t>(static_cast<uint8_t>(prefix[0])) << 8) | static_cast<uint8_t>(prefix[1]);
    if (len < 12) return;
    std::string query(len, '\0');
    if (!ReadFull(conn, stop_.get(), query.data(), len, deadline)) return;
    const std::string answer = Answer(src, query, true);
    if (answer.empty() || answer.size() > 65535) return;
    if (!WriteFull(conn, stop_.get(), Framed(answer), Clock::now() + std::chrono::seconds(2))) return;
  }
}

void DnsForwarder::Work() {
  std::string buf(kMaxPacket, '\0');
  for (;;) {
    pollfd p[2] = {{sock_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    sockaddr_in from{};
    socklen_t fl = sizeof from;
    ssize_t n = ::recvfrom(sock_.get(), buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &fl);
    if (n <= 0) continue;  // another worker took it
    const std::string answer = Answer(ntohl(from.sin_addr.s_addr), buf.substr(0, static_cast<size_t>(n)), false);
    if (!answer.empty())
      (void)::sendto(sock_.get(), answer.data(), answer.size(), 0, reinterpret_cast<const sockaddr*>(&from), fl);
  }
}

UniqueFd DnsForwarder::ConnectUpstream(int type) const {
  UniqueFd up(::socket(AF_INET, type | SOCK_CLOEXEC, 0));
  sockaddr_in ua{};
  ua.sin_family = AF_INET;
  ua.sin_port = htons(upstream_port_);
  ua.sin_addr.s_addr = htonl(upstream_addr_);
  timeval tv{2, 0};  // SO_SNDTIMEO also bounds a TCP connect()
  if (!up.valid() || ::setsockopt(up.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      ::setsockopt(up.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
      ::connect(up.get(), reinterpret_cast<const sockaddr*>(&ua), sizeof ua) != 0)
    return UniqueFd();
  return up;
}

std::string DnsForwarder::AskUdp(const std::string& query) const {
  UniqueFd up = ConnectUpstream(SOCK_DGRAM);
  std::string resp(kMaxPacket, '\0');
  if (!up.valid() || ::send(up.get(), query.data(), query.size(), 0) != static_cast<ssize_t>(query.size())) return "";
  // Skip stray datagrams: the answer carries the query's id.
  for (int i = 0; i < 4; ++i) {
    const ssize_t n = ::recv(up.get(), resp.data(), resp.size(), 0);
    if (n < 12) return "";
    resp.resize(static_cast<size_t>(n));
    if (AnswersQuery(resp, query)) return resp;
    resp.resize(kMaxPacket);
  }
  return "";
}

std::string DnsForwarder::AskTcp(const std::string& query) const {
  UniqueFd up = ConnectUpstream(SOCK_STREAM);
  const std::string framed = Framed(query);
  if (!up.valid() ||
      ::send(up.get(), framed.data(), framed.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(framed.size()))
    return "";
  char prefix[2];
  if (::recv(up.get(), prefix, sizeof prefix, MSG_WAITALL) != 2) return "";
  const size_t len = (static_cast<size_t>(static_cast<uint8_t>(prefix[0])) << 8) | static_cast<uint8_t>(prefix[1]);
  std::string resp(len, '\0');
  if (len < 12 || ::recv(up.get(), resp.data(), len, MSG_WAITALL) != static_cast<ssize_t>(len)) return "";
  return AnswersQuery(resp, query) ? resp : "";
}

std::string DnsForwarder::Answer(uint32_t src, const std::string& query, bool tcp) {
  std::string name;
  uint16_t type = 0;
  size_t end = 0;
  if (!ParseQuestion(query, &name, &type, &end)) {
    if (query.size() < 12) return "";
    failed_.fetch_add(1);
    std::string r = query.substr(0, 12);
    r[2] = static_cast<char>(0x80);
    r[3] = static_cast<char>(0x80 | kFormErr);
    for (size_t i = 4; i < 12; ++i) r[i] = 0;
    return r;
  }
  uint32_t index = 0;
  if (!allowed_(src, name, &index)) {
    refused_.fetch_add(1);
    return Reply(query, end, kNxDomain);
  }
  if (type != kTypeA) {  // no IPv6 for sandboxes; other types are not needed to connect
    answered_.fetch_add(1);
    return Reply(query, end, kNoError);
  }
  std::string resp = AskUdp(query);
  // Truncated (TC): a TCP client gets the whole answer, asked over TCP; a
  // UDP client gets the truncated one and retries over TCP itself.
  if (tcp && resp.size() >= 12 && (static_cast<uint8_t>(resp[2]) & 0x02) != 0) {
    std::string full = AskTcp(query);
    if (!full.empty()) resp = std::move(full);
  }
  if (resp.empty()) {
    failed_.fetch_add(1);
    return Reply(query, end, kServFail);
  }
  std::vector<uint32_t> addrs;
  uint32_t ttl = 0;
  if (!AddressesOf(resp, &addrs, &ttl)) {
    failed_.fetch_add(1);
    return Reply(query, end, kServFail);
  }
  // Pinned before the sandbox learns the addresses: its next connection passes.
  if (!addrs.empty() && !pin_(index, addrs, std::clamp(ttl, kMinPin, kMaxPin)).ok()) {
    failed_.fetch_add(1);
    return Reply(query, end, kServFail);
  }
  answered_.fetch_add(1);
  return resp;
}

}  // namespace warren::net
