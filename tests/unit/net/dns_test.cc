#include "net/dns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
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

TEST(DnsForwarderTest, FirstNameserver) {
  EXPECT_EQ(FirstNameserver("# x\nsearch a\nnameserver fe80::1\nnameserver 10.255.255.53\nnameserver 1.1.1.1\n"),
            "10.255.255.53");
  EXPECT_EQ(FirstNameserver("search a\n"), "");
}

}  // namespace
}  // namespace warren::net
