#include "net/expose.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "status_matchers.h"

namespace warren::net {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Sends `request`, half-closes, and reads the answer to EOF (5 s at most).
std::string Roundtrip(uint16_t port, const std::string& request) {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a = Loopback(port);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "connect failed";
  EXPECT_EQ(::send(s.get(), request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  ::shutdown(s.get(), SHUT_WR);
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{s.get(), POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) break;
    ssize_t n = ::recv(s.get(), buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

TEST(ExposureTest, TokenGatesTheConnection) {
  // The "sandbox's server": answers with the request head it received.
  UniqueFd srv(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a = Loopback(0);
  ASSERT_EQ(::bind(srv.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(srv.get(), 8), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(srv.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  const uint16_t srv_port = ntohs(a.sin_port);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    while (!stop.load()) {
      pollfd p{srv.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) != 1) continue;
      UniqueFd c(::accept4(srv.get(), nullptr, nullptr, SOCK_CLOEXEC));
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = ::recv(c.get(), buf, sizeof buf, 0);
        if (n <= 0) break;
        head.append(buf, static_cast<size_t>(n));
      }
      const std::string r = "HTTP/1.0 200 OK\r\n\r\n" + head;
      (void)::send(c.get(), r.data(), r.size(), MSG_NOSIGNAL);
    }
  });
  std::atomic<int> dials{0};
  auto dial = [&]() -> StatusOr<UniqueFd> {
    dials.fetch_add(1);
    UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in to = Loopback(srv_port);
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) return ErrnoToStatus(errno, "connect");
    return s;
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Exposure> e, Exposure::Open("127.0.0.1", 0, "t0k3n", dial));
  const uint16_t port = e->listen_port();
  EXPECT_EQ(e->address(), "127.0.0.1:" + std::to_string(port));

  EXPECT_THAT(Roundtrip(port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"), StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(Roundtrip(port, "GET / HTTP/1.1\r\nX-Warren-Token: wrong\r\n\r\n"), StartsWith("HTTP/1.1 401"));
  EXPECT_EQ(dials.load(), 0);  // a refused connection never reaches the sandbox

  const std::string by_header = Roundtrip(port, "GET /a HTTP/1.1\r\nHost: x\r\nx-warren-token:  t0k3n \r\n\r\n");
  EXPECT_THAT(by_header, StartsWith("HTTP/1.0 200 OK"));
  EXPECT_THAT(by_header, HasSubstr("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_THAT(by_header, Not(HasSubstr("t0k3n")));  // the sandbox never sees the header
  EXPECT_THAT(Roundtrip(port, "GET /b?x=1&warren_token=t0k3n HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.0 200 OK"));
  EXPECT_EQ(dials.load(), 2);
  EXPECT_EQ(e->admitted(), 2u);
  EXPECT_EQ(e->refused(), 2u);

  e.reset();  // closed: nothing listens any more
  EXPECT_EQ(Roundtrip(port, "GET / HTTP/1.1\r\n\r\n"), "connect failed");
  stop.store(true);
  server.join();
}

TEST(ExposureTest, DialFailureIs502) {
  auto dial = []() -> StatusOr<UniqueFd> { return ErrnoToStatus(ECONNREFUSED, "connect(127.0.0.1:9 in the sandbox)"); };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Exposure> e, Exposure::Open("127.0.0.1", 0, "t", dial));
  const std::string r = Roundtrip(e->listen_port(), "GET / HTTP/1.1\r\nX-Warren-Token: t\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 502"));
  EXPECT_THAT(r, HasSubstr("Connection refused"));
}

TEST(ExposureTest, BadInput) {
  auto dial = []() -> StatusOr<UniqueFd> { return absl::InternalError("unused"); };
  EXPECT_THAT(Exposure::Open("localhost", 0, "t", dial).status().message(), HasSubstr("not an IPv4 address"));
  EXPECT_THAT(Exposure::Open("127.0.0.1", 0, "", dial).status().message(), HasSubstr("token"));
}

}  // namespace
}  // namespace warren::net
