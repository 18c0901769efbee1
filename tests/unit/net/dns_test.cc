#include "net/dns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "status_matchers.h"

namespace warren::net {
namespace {

std::string Query(uint16_t id, const std::string& name, uint16_t type) {
  std::string q;
  q += static_cast<char>(id >> 8);
  q += static_cast<char>(id & 0xff);
  q += std::string("\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00", 10);  // RD, one question
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    q += static_cast<char>(dot - start);
    q += name.substr(start, dot - start);
    start = dot + 1;
  }
  q += '\0';
  q += static_cast<char>(type >> 8);
  q += static_cast<char>(type & 0xff);
  q += std::string("\x00\x01", 2);
  return q;
}

UniqueFd UdpOnLoopback(uint16_t* port) {
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  EXPECT_EQ(::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  *port = ntohs(a.sin_port);
  return s;
}

// Sends `q` to 127.0.0.1:port from `s` and returns the answer ("" after 3 s).
std::string Ask(int s, uint16_t port, const std::string& q) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::sendto(s, q.data(), q.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
            static_cast<ssize_t>(q.size()));
  pollfd p{s, POLLIN, 0};
  if (::poll(&p, 1, 3000) != 1) return "";
  std::string buf(4096, '\0');
  ssize_t n = ::recv(s, buf.data(), buf.size(), 0);
  buf.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return buf;
}

TEST(DnsForwarderTest, AnswersAllowedNamesOnlyAndPinsBeforeAnswering) {
  // The upstream: every A query answered with 203.0.113.7, TTL 5 s.
  uint16_t up_port = 0;
  UniqueFd up = UdpOnLoopback(&up_port);
  std::atomic<int> asked{0};
  std::atomic<bool> stop{false};
  std::thread upstream([&] {
    while (!stop.load()) {
      pollfd p{up.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) != 1) continue;
      std::string q(512, '\0');
      sockaddr_in from{};
      socklen_t fl = sizeof from;
      ssize_t n = ::recvfrom(up.get(), q.data(), q.size(), 0, reinterpret_cast<sockaddr*>(&from), &fl);
      if (n < 12) continue;
      q.resize(static_cast<size_t>(n));
      asked.fetch_add(1);
      std::string r = q;
      r[2] = '\x81';
      r[3] = '\x80';
      r[7] = 1;  // one answer
      r += std::string("\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x05\x00\x04\xcb\x00\x71\x07", 16);
      (void)::sendto(up.get(), r.data(), r.size(), 0, reinterpret_cast<sockaddr*>(&from), fl);
    }
  });
  std::mutex mu;
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> pins;
  std::vector<uint32_t> pin_ttls;
  auto allowed = [](uint32_t src, const std::string& name, uint32_t* index) {
    EXPECT_EQ(src, INADDR_LOOPBACK);
    *index = 7;
    return name == "pypi.test";
  };
  auto pin = [&](uint32_t index, const std::vector<uint32_t>& addrs, uint32_t ttl) {
    std::lock_guard<std::mutex> l(mu);
    pins.emplace_back(index, addrs);
    pin_ttls.push_back(ttl);
    return absl::OkStatus();
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DnsForwarder> f,
                       DnsForwarder::Open(0, "127.0.0.1:" + std::to_string(up_port), allowed, pin));
  uint16_t me_port = 0;
  UniqueFd me = UdpOnLoopback(&me_port);

  const std::string denied = Ask(me.get(), f->port(), Query(0x1234, "npm.test", 1));
  ASSERT_GE(denied.size(), 12u);
  EXPECT_EQ(denied.substr(0, 2), "\x12\x34");
  EXPECT_EQ(denied[3] & 0x0f, 3);  // NXDOMAIN
  EXPECT_EQ(asked.load(), 0);      // never forwarded
  EXPECT_TRUE(pins.empty());

  const std::string ok = Ask(me.get(), f->port(), Query(0x4321, "PyPI.test", 1));
  ASSERT_GE(ok.size(), 16u);
  EXPECT_EQ(ok[3] & 0x0f, 0);
  EXPECT_EQ(ok[7], 1);  // the upstream's answer
  EXPECT_EQ(asked.load(), 1);
  {
    std::lock_guard<std::mutex> l(mu);
    ASSERT_EQ(pins.size(), 1u);
    EXPECT_EQ(pins[0].first, 7u);
    EXPECT_EQ(pins[0].second, std::vector<uint32_t>{0xcb007107});  // 203.0.113.7
    EXPECT_EQ(pin_ttls[0], 30u);                                   // at least 30 s
  }

  const std::string aaaa = Ask(me.get(), f->port(), Query(0x5555, "pypi.test", 28));
  ASSERT_GE(aaaa.size(), 12u);
  EXPECT_EQ(aaaa[3] & 0x0f, 0);
  EXPECT_EQ(aaaa[7], 0);  // empty: no IPv6 for sandboxes
  EXPECT_EQ(asked.load(), 1);
  EXPECT_EQ(f->stats().refused, 1u);
  stop.store(true);
  upstream.join();
}

// A TCP connection to 127.0.0.1:port (blocking, 5 s timeouts).
UniqueFd TcpTo(uint16_t port) {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  timeval tv{5, 0};
  EXPECT_EQ(::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(s.get(), reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  return s;
}

std::string Framed(const std::string& m) {
  return std::string{static_cast<char>(m.size() >> 8), static_cast<char>(m.size() & 0xff)} + m;
}

// One length-prefixed message from `s` ("" on EOF or timeout).
std::string ReadFramed(int s) {
  unsigned char len[2];
  if (::recv(s, len, 2, MSG_WAITALL) != 2) return "";
  std::string m((len[0] << 8) | len[1], '\0');
  if (::recv(s, m.data(), m.size(), MSG_WAITALL) != static_cast<ssize_t>(m.size())) return "";
  return m;
}

// An answer to `q` with A records `addrs` (TTL 60); `tc`: truncated, no records.
std::string AnswerWith(std::string q, const std::vector<uint32_t>& addrs, bool tc) {
  q[2] = static_cast<char>(tc ? 0x83 : 0x81);
  q[3] = '\x80';
  q[7] = static_cast<char>(tc ? 0 : addrs.size());
  if (tc) return q;
  for (uint32_t a : addrs) {
    q += std::string("\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04", 12);
    for (int shift = 24; shift >= 0; shift -= 8) q += static_cast<char>((a >> shift) & 0xff);
  }
  return q;
}

TEST(DnsForwarderTest, AnswersOverTcpUnderTheSameRules) {
  // The upstream on one loopback port, UDP and TCP: over UDP "big.test" is
  // truncated (TC, no records), other names get 203.0.113.7; over TCP every
  // name gets 203.0.113.8 and 203.0.113.9.
  uint16_t up_port = 0;
  UniqueFd up = UdpOnLoopback(&up_port);
  UniqueFd up_tcp(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in ua{};
  ua.sin_family = AF_INET;
  ua.sin_port = htons(up_port);
  ua.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(up_tcp.get(), reinterpret_cast<sockaddr*>(&ua), sizeof ua), 0);
  ASSERT_EQ(::listen(up_tcp.get(), 8), 0);
  std::atomic<int> asked_udp{0}, asked_tcp{0};
  std::atomic<bool> stop{false};
  std::thread upstream([&] {
    while (!stop.load()) {
      pollfd p[2] = {{up.get(), POLLIN, 0}, {up_tcp.get(), POLLIN, 0}};
      if (::poll(p, 2, 50) < 1) continue;
      if (p[0].revents != 0) {
        std::string q(512, '\0');
        sockaddr_in from{};
        socklen_t fl = sizeof from;
        ssize_t n = ::recvfrom(up.get(), q.data(), q.size(), 0, reinterpret_cast<sockaddr*>(&from), &fl);
        if (n < 12) continue;
        q.resize(static_cast<size_t>(n));
        asked_udp.fetch_add(1);
        const bool big = q.find(
                             "\x03"
                             "big") != std::string::npos;
        const std::string r = AnswerWith(q, {0xcb007107}, big);
        (void)::sendto(up.get(), r.data(), r.size(), 0, reinterpret_cast<sockaddr*>(&from), fl);
      }
      if (p[1].revents != 0) {
        UniqueFd c(::accept4(up_tcp.get(), nullptr, nullptr, SOCK_CLOEXEC));
        timeval tv{2, 0};
        (void)::setsockopt(c.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        const std::string q = ReadFramed(c.get());
        if (q.size() < 12) continue;
        asked_tcp.fetch_add(1);
        const std::string r = Framed(AnswerWith(q, {0xcb007108, 0xcb007109}, false));
        (void)::send(c.get(), r.data(), r.size(), MSG_NOSIGNAL);
      }
    }
  });
  std::mutex mu;
  std::vector<std::vector<uint32_t>> pins;
  auto allowed = [](uint32_t, const std::string& name, uint32_t* index) {
    *index = 3;
    return name == "pypi.test" || name == "big.test";
  };
  auto pin = [&](uint32_t, const std::vector<uint32_t>& addrs, uint32_t) {
    std::lock_guard<std::mutex> l(mu);
    pins.push_back(addrs);
    return absl::OkStatus();
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DnsForwarder> f,
                       DnsForwarder::Open(0, "127.0.0.1:" + std::to_string(up_port), allowed, pin));
  ASSERT_NE(f->tcp_port(), 0);

  {
    // Two queries pipelined on one connection, answered in order.
    UniqueFd c = TcpTo(f->tcp_port());
    const std::string both = Framed(Query(0x0101, "npm.test", 1)) + Framed(Query(0x0202, "pypi.test", 1));
    ASSERT_EQ(::send(c.get(), both.data(), both.size(), MSG_NOSIGNAL), static_cast<ssize_t>(both.size()));
    const std::string denied = ReadFramed(c.get());
    ASSERT_GE(denied.size(), 12u);
    EXPECT_EQ(denied.substr(0, 2), "\x01\x01");
    EXPECT_EQ(denied[3] & 0x0f, 3);  // NXDOMAIN, never forwarded
    const std::string ok = ReadFramed(c.get());
    ASSERT_GE(ok.size(), 12u);
    EXPECT_EQ(ok.substr(0, 2), "\x02\x02");
    EXPECT_EQ(ok[3] & 0x0f, 0);
    EXPECT_EQ(ok[7], 1);
    EXPECT_EQ(asked_udp.load(), 1);
    EXPECT_EQ(asked_tcp.load(), 0);  // not truncated: the UDP answer is whole
    std::lock_guard<std::mutex> l(mu);
    ASSERT_EQ(pins.size(), 1u);
    EXPECT_EQ(pins[0], std::vector<uint32_t>{0xcb007107});
  }
  {
    // Truncated over UDP: a TCP client gets the whole answer, pinned whole.
    UniqueFd c = TcpTo(f->tcp_port());
    const std::string q = Framed(Query(0x0303, "big.test", 1));
    ASSERT_EQ(::send(c.get(), q.data(), q.size(), MSG_NOSIGNAL), static_cast<ssize_t>(q.size()));
    const std::string big = ReadFramed(c.get());
    ASSERT_GE(big.size(), 12u);
    EXPECT_EQ(big[2] & 0x02, 0);  // not truncated
    EXPECT_EQ(big[7], 2);
    EXPECT_EQ(asked_tcp.load(), 1);
    std::lock_guard<std::mutex> l(mu);
    ASSERT_EQ(pins.size(), 2u);
    EXPECT_EQ(pins[1], (std::vector<uint32_t>{0xcb007108, 0xcb007109}));
  }
  {
    // A UDP client gets the truncated answer (and would retry over TCP).
    uint16_t me_port = 0;
    UniqueFd me = UdpOnLoopback(&me_port);
    const std::string tc = Ask(me.get(), f->port(), Query(0x0404, "big.test", 1));
    ASSERT_GE(tc.size(), 12u);
    EXPECT_NE(tc[2] & 0x02, 0);
    EXPECT_EQ(asked_tcp.load(), 1);
  }
  {
    // At most kTcpPerSource connections per source: the next one is closed.
    // The connections above are closed by us; wait until the forwarder has
    // seen it, or they would still count against this source.
    for (int i = 0; i < 500 && f->tcp_connections() != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(f->tcp_connections(), 0u);
    std::vector<UniqueFd> held;
    for (size_t i = 0; i < DnsForwarder::kTcpPerSource; ++i) held.push_back(TcpTo(f->tcp_port()));
    // The acceptor has taken them all once one answers.
    const std::string q = Framed(Query(0x0505, "npm.test", 1));
    ASSERT_EQ(::send(held.back().get(), q.data(), q.size(), MSG_NOSIGNAL), static_cast<ssize_t>(q.size()));
    ASSERT_GE(ReadFramed(held.back().get()).size(), 12u);
    UniqueFd extra = TcpTo(f->tcp_port());
    char b = 0;
    EXPECT_EQ(::recv(extra.get(), &b, 1, 0), 0);  // closed by the forwarder, not timed out
    ASSERT_EQ(::send(held.front().get(), q.data(), q.size(), MSG_NOSIGNAL), static_cast<ssize_t>(q.size()));
    EXPECT_GE(ReadFramed(held.front().get()).size(), 12u);  // the held ones still answer
  }
  f.reset();  // stops with connections open
  stop.store(true);
  upstream.join();
}

TEST(DnsForwarderTest, FirstNameserver) {
  EXPECT_EQ(FirstNameserver("# x\nsearch a\nnameserver fe80::1\nnameserver 10.255.255.53\nnameserver 1.1.1.1\n"),
            "10.255.255.53");
  EXPECT_EQ(FirstNameserver("search a\n"), "");
}

}  // namespace
}  // namespace warren::net
