// The metrics room: label mapping (node/metrics.h), the Prometheus families
// the hooks feed, the scrape-time gauges, and MetricsServer's start errors
// and serving.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "common/unique_fd.h"
#include "metrics/prometheus_metrics.h"
#include "node/metrics.h"
#include "status_matchers.h"

namespace warren::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

TEST(Labels, DestroyCauseMapsTheNodesReasons) {
  EXPECT_EQ(node::DestroyCause("destroy requested"), "client");
  EXPECT_EQ(node::DestroyCause("ttl expired"), "ttl");
  EXPECT_EQ(node::DestroyCause("idle timeout"), "idle");
  EXPECT_EQ(node::DestroyCause("job destroy requested"), "job");
  EXPECT_EQ(node::DestroyCause("job lease lapsed beyond its grace period"), "job");
  EXPECT_EQ(node::DestroyCause("create abandoned by its client"), "abandoned");
  EXPECT_EQ(node::DestroyCause("fork failed"), "fork");
  EXPECT_EQ(node::DestroyCause("grade finished"), "grade");
  EXPECT_EQ(node::DestroyCause("n0-0123456789ab gone"), "other");  // never free text as a label
}

TEST(Labels, Outcomes) {
  EXPECT_EQ(node::OutcomeLabel(absl::OkStatus()), "ok");
  EXPECT_EQ(node::OutcomeLabel(absl::InvalidArgumentError("x")), "invalid_argument");
  EXPECT_EQ(node::OutcomeLabel(absl::ResourceExhaustedError("x")), "resource_exhausted");
  EXPECT_EQ(node::ExecOutcomeLabel(absl::OkStatus(), false, false), "ok");
  EXPECT_EQ(node::ExecOutcomeLabel(absl::OkStatus(), true, false), "timed_out");
  EXPECT_EQ(node::ExecOutcomeLabel(absl::OkStatus(), false, true), "oom_killed");
  EXPECT_EQ(node::ExecOutcomeLabel(absl::NotFoundError("x"), true, true), "not_found");
}

TEST(PrometheusMetrics, HooksFeedTheirFamilies) {
  PrometheusMetrics m;
  m.OnCreate("container", absl::OkStatus(), 20ms);
  m.OnCreate("container", absl::OkStatus(), 3s);
  m.OnCreate("container", absl::InvalidArgumentError("bad"), 1ms);
  m.OnDestroy("container", "ttl expired");
  m.OnExec("container", "ok", 2ms);
  m.OnExec("container", "unavailable", 2ms);
  m.OnSuspend("container", 4096);
  m.OnResume("container", true, 1024);
  m.OnFnCall("ok", 5ms);
  const std::string text = m.Render();
  EXPECT_THAT(text, HasSubstr("warren_sandbox_creates_total{backend=\"container\",outcome=\"ok\"} 2"));
  EXPECT_THAT(text, HasSubstr("warren_sandbox_creates_total{backend=\"container\",outcome=\"invalid_argument\"} 1"));
  // Only successful creates have a latency; 20 ms <= 0.025 < 3 s.
  EXPECT_THAT(text, HasSubstr("warren_sandbox_create_seconds_count{backend=\"container\"} 2"));
  EXPECT_THAT(text, HasSubstr("warren_sandbox_create_seconds_bucket{backend=\"container\",le=\"0.025\"} 1"));
  EXPECT_THAT(text, HasSubstr("warren_sandbox_create_seconds_bucket{backend=\"container\",le=\"5\"} 2"));
  EXPECT_THAT(text, HasSubstr("warren_sandbox_destroys_total{backend=\"container\",reason=\"ttl\"} 1"));
  EXPECT_THAT(text, HasSubstr("warren_execs_total{backend=\"container\",outcome=\"unavailable\"} 1"));
  EXPECT_THAT(text, HasSubstr("warren_exec_seconds_count{backend=\"container\"} 1"));
  EXPECT_THAT(text, HasSubstr("warren_sandbox_suspend_swap_bytes_total{backend=\"container\"} 4096"));
  EXPECT_THAT(text, HasSubstr("warren_sandbox_resumes_total{backend=\"container\",from=\"suspended\"} 1"));
  EXPECT_THAT(text, HasSubstr("warren_sandbox_resume_prefetch_bytes_total{backend=\"container\"} 1024"));
  EXPECT_THAT(text, HasSubstr("warren_fncall_call_seconds_count 1"));
}

TEST(Gauges, RenderTheSnapshot) {
  node::NodeGauges g;
  g.sandboxes[{"container", "running"}] = 3;
  g.sandboxes[{"microvm", "suspended"}] = 1;
  g.creates_queued = 7;
  const std::string no_fncall = RenderGauges(g);
  EXPECT_THAT(no_fncall, HasSubstr("warren_sandboxes{backend=\"container\",state=\"running\"} 3"));
  EXPECT_THAT(no_fncall, HasSubstr("warren_sandboxes{backend=\"microvm\",state=\"suspended\"} 1"));
  EXPECT_THAT(no_fncall, HasSubstr("warren_create_queue_depth 7"));
  EXPECT_THAT(no_fncall, Not(HasSubstr("warren_fncall_workers")));
  g.fncall = true;
  g.fncall_workers_busy = 2;
  EXPECT_THAT(RenderGauges(g), HasSubstr("warren_fncall_workers{state=\"busy\"} 2"));
}

TEST(MetricsServer, BadAddressesAreInvalidArgumentNamingTheFlag) {
  auto m = std::make_shared<PrometheusMetrics>();
  for (const char* bad :
       {"", "9100", "localhost:9100", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:9x", "[::1:9100", "300.1.1.1:9100"}) {
    EXPECT_THAT(MetricsServer::Start(bad, m),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--metrics-listen")))
        << bad;
  }
}

// An HTTP/1.0 GET of /metrics on 127.0.0.1:`port`: the whole response.
std::string Scrape(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return "connect failed";
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::write(fd.get(), req.data(), req.size()) != static_cast<ssize_t>(req.size())) return "write failed";
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd.get(), buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST(MetricsServer, ServesCountersAndWatchedGaugesAndRefusesAPortInUse) {
  auto m = std::make_shared<PrometheusMetrics>();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<MetricsServer> server, MetricsServer::Start("127.0.0.1:0", m));
  ASSERT_GT(server->port(), 0);
  m->OnPause("container");
  std::string text = Scrape(server->port());
  EXPECT_THAT(text, HasSubstr("200 OK"));
  EXPECT_THAT(text, HasSubstr("warren_sandbox_pauses_total{backend=\"container\"} 1"));
  EXPECT_THAT(text, Not(HasSubstr("warren_sandboxes")));  // no source watched yet
  {
    std::shared_ptr<void> watch = server->Watch([] {
      node::NodeGauges g;
      g.sandboxes[{"container", "paused"}] = 1;
      return g;
    });
    EXPECT_THAT(Scrape(server->port()), HasSubstr("warren_sandboxes{backend=\"container\",state=\"paused\"} 1"));
  }
  EXPECT_THAT(Scrape(server->port()), Not(HasSubstr("warren_sandboxes")));  // withdrawn with its handle

  const std::string taken = "127.0.0.1:" + std::to_string(server->port());
  StatusOr<std::unique_ptr<MetricsServer>> second = MetricsServer::Start(taken, m);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(StatusErrno(second.status()), EADDRINUSE);
  EXPECT_THAT(second.status().message(), HasSubstr("bind(" + taken + ") for --metrics-listen"));
}

}  // namespace
}  // namespace warren::metrics
