#include "net/expose.h"
#include "net/gateway.h"

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

// A "sandbox's server" on loopback: answers each connection with the
// request head it received (HTTP/1.0 200, then the head).
class HeadEchoServer {
 public:
  HeadEchoServer() {
    sockaddr_in a = Loopback(0);
    EXPECT_EQ(::bind(srv_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(srv_.get(), 8), 0);
    socklen_t len = sizeof a;
    EXPECT_EQ(::getsockname(srv_.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        pollfd p{srv_.get(), POLLIN, 0};
        if (::poll(&p, 1, 50) != 1) continue;
        UniqueFd c(::accept4(srv_.get(), nullptr, nullptr, SOCK_CLOEXEC));
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
  }
  ~HeadEchoServer() {
    stop_.store(true);
    thread_.join();
  }
  uint16_t port() const { return port_; }

 private:
  UniqueFd srv_{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(ExposureTest, TokenGatesTheConnection) {
  HeadEchoServer server;
  const uint16_t srv_port = server.port();
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

TEST(GatewayTest, ParsesPortIdDomainHosts) {
  // value_or: a host that does not parse reads as port 0 and fails below.
  GatewayTarget t = ParseGatewayHost("8000-n1-ab12cd.localhost:8090", "localhost").value_or(GatewayTarget{});
  EXPECT_EQ(t.port, 8000);
  EXPECT_EQ(t.sandbox_id, "n1-ab12cd");
  t = ParseGatewayHost("443-N1-AB12.Sandboxes.Example.COM", "sandboxes.example.com").value_or(GatewayTarget{});
  EXPECT_EQ(t.port, 443);
  EXPECT_EQ(t.sandbox_id, "n1-ab12");  // host names are case-insensitive; ids are lower case
  for (const char* bad : {"localhost", "8000.localhost", "-n1-ab.localhost", "8000-.localhost", "0-n1-a.localhost",
                          "65536-n1-a.localhost", "123456-n1-a.localhost", "80x-n1-a.localhost", "8000-n1_a.localhost",
                          "8000-n1-a.otherhost", "8000-n1-a.xlocalhost", "8000-n1-a"}) {
    EXPECT_FALSE(ParseGatewayHost(bad, "localhost").has_value()) << bad;
  }
}

TEST(GatewayTest, RoutesByHostToTheResolvedAddress) {
  HeadEchoServer upstream;  // stands for the sandbox's exposure
  std::atomic<int> asked{0};
  auto resolve = [&](const std::string& id, uint16_t port) -> StatusOr<std::string> {
    asked.fetch_add(1);
    if (id == "n1-abc" && port == 8000) return "127.0.0.1:" + std::to_string(upstream.port());
    if (id == "n1-down" && port == 8000) return std::string("127.0.0.1:1");
    if (id == "n1-err") return absl::UnavailableError("node n1 did not answer");
    return absl::NotFoundError("sandbox " + id + " has no exposed port " + std::to_string(port));
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ExposeGateway> g, ExposeGateway::Open("127.0.0.1", 0, "localhost", resolve));
  const uint16_t port = g->listen_port();

  // Admitted: the request goes on unchanged (token and all: the exposure checks it).
  const std::string req = "GET /x?warren_token=t HTTP/1.1\r\nHost: 8000-n1-abc.localhost:" + std::to_string(port) +
                          "\r\nX-Warren-Token: t\r\n\r\n";
  const std::string ok = Roundtrip(port, req);
  EXPECT_THAT(ok, StartsWith("HTTP/1.0 200 OK"));
  EXPECT_THAT(ok, HasSubstr(req));

  EXPECT_THAT(Roundtrip(port, "GET / HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 400"));
  const std::string other = Roundtrip(port, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n");
  EXPECT_THAT(other, StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(other, HasSubstr("PORT-SANDBOX_ID.localhost"));
  const std::string missing = Roundtrip(port, "GET / HTTP/1.1\r\nHost: 9000-n1-abc.localhost\r\n\r\n");
  EXPECT_THAT(missing, StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(missing, HasSubstr("no exposed port 9000"));
  EXPECT_THAT(Roundtrip(port, "GET / HTTP/1.1\r\nHost: 8000-n1-err.localhost\r\n\r\n"), StartsWith("HTTP/1.1 502"));
  EXPECT_THAT(Roundtrip(port, "GET / HTTP/1.1\r\nHost: 8000-n1-down.localhost\r\n\r\n"), StartsWith("HTTP/1.1 502"));
  EXPECT_EQ(asked.load(), 4);  // not for the two hosts that name no sandbox
}

TEST(GatewayTest, BadInput) {
  auto resolve = [](const std::string&, uint16_t) -> StatusOr<std::string> { return absl::InternalError("unused"); };
  EXPECT_THAT(ExposeGateway::Open("127.0.0.1", 0, "", resolve).status().message(), HasSubstr("domain"));
  EXPECT_THAT(ExposeGateway::Open("127.0.0.1", 0, ".localhost", resolve).status().message(), HasSubstr("domain"));
  EXPECT_THAT(ExposeGateway::Open("nowhere", 0, "localhost", resolve).status().message(),
              HasSubstr("not an IPv4 address"));
  EXPECT_THAT(DialTcp("localhost:80").status().message(), HasSubstr("not an IPv4 HOST:PORT"));
  EXPECT_THAT(DialTcp("127.0.0.1:0").status().message(), HasSubstr("not an IPv4 HOST:PORT"));
}

}  // namespace
}  // namespace warren::net
