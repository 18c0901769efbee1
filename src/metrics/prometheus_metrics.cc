#include "metrics/prometheus_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <exception>
#include <utility>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "common/unique_fd.h"
#include "node/sandbox_types.h"

namespace warren::metrics {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Histogram;

// Bucket bounds, seconds. A container create takes ~10-100 ms, a microVM's
// cold boot seconds (TCG: tens of seconds, bounded by the boot timeout).
const Histogram::BucketBoundaries kCreateBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
// An exec is ~1 ms of overhead plus whatever the command runs.
const Histogram::BucketBoundaries kExecBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                  0.5,   1,      2.5,   5,    10,    30,   60,  300};
// An fncall call: ~5 ms warm, up to its run and compile timeouts.
const Histogram::BucketBoundaries kFnCallBuckets = {0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                    0.5,    1,     2.5,  5,     10,   30,  60};

double Seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

struct PrometheusMetrics::Families {
  explicit Families(prometheus::Registry& r)
      : creates(prometheus::BuildCounter()
                    .Name("warren_sandbox_creates_total")
                    .Help("Sandbox creates finished, by backend and outcome (ok or the error's status code)")
                    .Register(r)),
        create_seconds(prometheus::BuildHistogram()
                           .Name("warren_sandbox_create_seconds")
                           .Help("Time of a successful sandbox create, admission queue included")
                           .Register(r)),
        destroys(prometheus::BuildCounter()
                     .Name("warren_sandbox_destroys_total")
                     .Help("Sandboxes destroyed, by backend and reason (client, ttl, idle, job, abandoned, fork, "
                           "grade, other)")
                     .Register(r)),
        execs(prometheus::BuildCounter()
                  .Name("warren_execs_total")
                  .Help("Unary execs that reached their sandbox, by backend and outcome (ok whatever the exit "
                        "code, timed_out, oom_killed, or the error's status code)")
                  .Register(r)),
        exec_seconds(prometheus::BuildHistogram()
                         .Name("warren_exec_seconds")
                         .Help("Time of a unary exec that returned an outcome")
                         .Register(r)),
        pauses(prometheus::BuildCounter()
                   .Name("warren_sandbox_pauses_total")
                   .Help("Sandboxes paused (frozen)")
                   .Register(r)),
        suspends(prometheus::BuildCounter()
                     .Name("warren_sandbox_suspends_total")
                     .Help("Sandboxes suspended (frozen, memory reclaimed)")
                     .Register(r)),
        suspend_bytes(prometheus::BuildCounter()
                          .Name("warren_sandbox_suspend_swap_bytes_total")
                          .Help("Memory of suspended sandboxes in swap (or written out) right after their suspend")
                          .Register(r)),
        resumes(prometheus::BuildCounter()
                    .Name("warren_sandbox_resumes_total")
                    .Help("Sandboxes resumed, by the state they left (paused, suspended)")
                    .Register(r)),
        prefetch_bytes(prometheus::BuildCounter()
                           .Name("warren_sandbox_resume_prefetch_bytes_total")
                           .Help("Bytes read back from swap before a suspended sandbox resumed")
                           .Register(r)),
        fncalls(prometheus::BuildCounter()
                    .Name("warren_fncall_calls_total")
                    .Help("fncall calls finished, by outcome (ok, sandbox_error, or the error's status code)")
                    .Register(r)),
        fncall_seconds(prometheus::BuildHistogram()
                           .Name("warren_fncall_call_seconds")
                           .Help("Time of an fncall call, layer resolution and worker wait included")
                           .Register(r)) {}

  Family<Counter>& creates;
  Family<Histogram>& create_seconds;
  Family<Counter>& destroys;
  Family<Counter>& execs;
  Family<Histogram>& exec_seconds;
  Family<Counter>& pauses;
  Family<Counter>& suspends;
  Family<Counter>& suspend_bytes;
  Family<Counter>& resumes;
  Family<Counter>& prefetch_bytes;
  Family<Counter>& fncalls;
  Family<Histogram>& fncall_seconds;
};

PrometheusMetrics::PrometheusMetrics()
    : registry_(std::make_shared<prometheus::Registry>()), f_(std::make_unique<Families>(*registry_)) {}

PrometheusMetrics::~PrometheusMetrics() = default;

void PrometheusMetrics::OnCreate(std::string_view backend, const Status& result, std::chrono::nanoseconds took) {
  const std::string b(backend);
  f_->creates.Add({{"backend", b}, {"outcome", node::OutcomeLabel(result)}}).Increment();
  if (result.ok()) f_->create_seconds.Add({{"backend", b}}, kCreateBuckets).Observe(Seconds(took));
}

void PrometheusMetrics::OnDestroy(std::string_view backend, std::string_view reason) {
  f_->destroys.Add({{"backend", std::string(backend)}, {"reason", std::string(node::DestroyCause(reason))}})
      .Increment();
}

void PrometheusMetrics::OnExec(std::string_view backend, std::string_view outcome, std::chrono::nanoseconds took) {
  const std::string b(backend);
  f_->execs.Add({{"backend", b}, {"outcome", std::string(outcome)}}).Increment();
  // An exec that failed with an error never ran to an outcome: its time is no latency.
  if (outcome == "ok" || outcome == "timed_out" || outcome == "oom_killed") {
    f_->exec_seconds.Add({{"backend", b}}, kExecBuckets).Observe(Seconds(took));
  }
}

void PrometheusMetrics::OnPause(std::string_view backend) {
  f_->pauses.Add({{"backend", std::string(backend)}}).Increment();
}

void PrometheusMetrics::OnSuspend(std::string_view backend, uint64_t swap_bytes) {
  const std::string b(backend);
  f_->suspends.Add({{"backend", b}}).Increment();
  f_->suspend_bytes.Add({{"backend", b}}).Increment(static_cast<double>(swap_bytes));
}

void PrometheusMetrics::OnResume(std::string_view backend, bool from_suspended, uint64_t prefetched_bytes) {
  const std::string b(backend);
  f_->resumes.Add({{"backend", b}, {"from", from_suspended ? "suspended" : "paused"}}).Increment();
  if (from_suspended) f_->prefetch_bytes.Add({{"backend", b}}).Increment(static_cast<double>(prefetched_bytes));
}

void PrometheusMetrics::OnFnCall(std::string_view outcome, std::chrono::nanoseconds took) {
  f_->fncalls.Add({{"outcome", std::string(outcome)}}).Increment();
  f_->fncall_seconds.Add({}, kFnCallBuckets).Observe(Seconds(took));
}

std::string PrometheusMetrics::Render() const { return prometheus::TextSerializer().Serialize(registry_->Collect()); }

// ---------------------------------------------------------------- gauges

namespace {

prometheus::MetricFamily NewFamily(std::string name, std::string help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

prometheus::MetricFamily GaugeFamily(std::string name, std::string help) {
  return NewFamily(std::move(name), std::move(help), prometheus::MetricType::Gauge);
}

// A counter read at scrape time from where it is kept (its name ends in
// "_total", as the counters above).
prometheus::MetricFamily CounterFamily(std::string name, std::string help) {
  return NewFamily(std::move(name), std::move(help), prometheus::MetricType::Counter);
}

// One sample of `f` (a gauge's or a counter's value, by the family's type).
void AddSample(prometheus::MetricFamily& f, std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  (f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value) = value;
  f.metric.push_back(std::move(m));
}

std::vector<prometheus::MetricFamily> GaugeFamilies(const node::NodeGauges& g) {
  std::vector<prometheus::MetricFamily> out;
  prometheus::MetricFamily sandboxes =
      GaugeFamily("warren_sandboxes", "Sandboxes in the node's table, by backend and state");
  for (const auto& [key, n] : g.sandboxes) AddSample(sandboxes, {{"backend", key.first}, {"state", key.second}}, n);
  out.push_back(std::move(sandboxes));
  out.push_back(GaugeFamily("warren_creates_in_flight", "Creates holding a create slot"));
  AddSample(out.back(), {}, g.creates_in_flight);
  out.push_back(GaugeFamily("warren_create_queue_depth", "Creates waiting for a create slot"));
  AddSample(out.back(), {}, g.creates_queued);
  out.push_back(GaugeFamily("warren_layer_mounts", "Layers mounted on this node"));
  AddSample(out.back(), {}, static_cast<double>(g.layer_mounts));
  out.push_back(GaugeFamily("warren_layer_mounted_bytes", "Size of the EROFS images of the layers mounted now"));
  AddSample(out.back(), {}, static_cast<double>(g.layer_mounted_bytes));
  out.push_back(CounterFamily("warren_layer_cache_lookups_total",
                              "Layer mount cache lookups by result: hit (the layer was mounted), miss (this lookup "
                              "mounted it), failed (its mount failed)"));
  AddSample(out.back(), {{"result", "hit"}}, static_cast<double>(g.layer_cache_hits));
  AddSample(out.back(), {{"result", "miss"}}, static_cast<double>(g.layer_cache_misses));
  AddSample(out.back(), {{"result", "failed"}}, static_cast<double>(g.layer_cache_failures));
  out.push_back(CounterFamily("warren_layer_cache_evictions_total", "Unused layer mounts removed after their grace"));
  AddSample(out.back(), {}, static_cast<double>(g.layer_cache_evictions));
  if (g.read_cache) {
    out.push_back(GaugeFamily("warren_layer_read_cache_cap_bytes", "Size cap of the node-local layer read cache"));
    AddSample(out.back(), {}, static_cast<double>(g.read_cache_cap_bytes));
    out.push_back(GaugeFamily("warren_layer_read_cache_bytes", "Layer chunks the node-local read cache holds now"));
    AddSample(out.back(), {}, static_cast<double>(g.read_cache_bytes));
    out.push_back(GaugeFamily("warren_layer_read_cache_metadata_bytes",
                              "Of warren_layer_read_cache_bytes, the metadata of mounted layers, kept local "
                              "(never evicted while mounted)"));
    AddSample(out.back(), {}, static_cast<double>(g.read_cache_metadata_bytes));
    out.push_back(CounterFamily("warren_layer_read_cache_chunks_total",
                                "Chunks the layer read cache served, by result: hit (held locally), miss (read from "
                                "the store)"));
    AddSample(out.back(), {{"result", "hit"}}, static_cast<double>(g.read_cache_hits));
    AddSample(out.back(), {{"result", "miss"}}, static_cast<double>(g.read_cache_misses));
    out.push_back(CounterFamily("warren_layer_read_cache_evictions_total",
                                "Chunks the layer read cache dropped to stay under its cap (LRU)"));
    AddSample(out.back(), {}, static_cast<double>(g.read_cache_evictions));
    out.push_back(CounterFamily("warren_layer_read_cache_write_errors_total",
                                "Chunks read from the store but not kept: the cache's disk refused the write"));
    AddSample(out.back(), {}, static_cast<double>(g.read_cache_write_errors));
    out.push_back(CounterFamily("warren_layer_read_cache_prefetched_bytes_total",
                                "Bytes the layer read cache read ahead from layers' hot lists (part of "
                                "warren_layer_store_read_bytes_total)"));
    AddSample(out.back(), {}, static_cast<double>(g.read_cache_prefetched_bytes));
    out.push_back(CounterFamily("warren_layer_store_read_bytes_total",
                                "Bytes of a layer's EROFS image read from the layer store through the read cache"));
    for (const auto& [layer, n] : g.layer_store_read_bytes) {
      AddSample(out.back(), {{"layer", layer}}, static_cast<double>(n));
    }
  }
  if (g.fncall) {
    out.push_back(GaugeFamily("warren_fncall_workers", "Warm fncall workers, by state (busy, idle)"));
    AddSample(out.back(), {{"state", "busy"}}, g.fncall_workers_busy);
    AddSample(out.back(), {{"state", "idle"}}, g.fncall_workers_idle);
  }
  return out;
}

}  // namespace

std::string RenderGauges(const node::NodeGauges& gauges) {
  return prometheus::TextSerializer().Serialize(GaugeFamilies(gauges));
}

// Scrape-time gauges from a source that can be withdrawn: the exposer holds
// this collector (weakly) for the server's life; the source only while its
// owner's handle lives.
class MetricsServer::GaugeCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> l(mu_);
    if (!source_) return {};
    return GaugeFamilies(source_());
  }
  void Set(std::function<node::NodeGauges()> source) {
    std::lock_guard<std::mutex> l(mu_);
    source_ = std::move(source);
  }

 private:
  mutable std::mutex mu_;  // held while source_ runs: Set(nullptr) waits for it
  std::function<node::NodeGauges()> source_;
};

namespace {

// "IPV4:PORT" or "[IPV6]:PORT" as a socket address, or InvalidArgument.
StatusOr<sockaddr_storage> ParseListen(const std::string& listen, socklen_t* len) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError("--metrics-listen " + node::Quote(listen) + ": " + why);
  };
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return bad("expected HOST:PORT (an IPv4 address or [IPv6] address, and a port)");
  std::string host = listen.substr(0, colon);
  const std::string port_s = listen.substr(colon + 1);
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_s.data(), port_s.data() + port_s.size(), port);
  if (port_s.empty() || ec != std::errc() || end != port_s.data() + port_s.size() || port > 65535) {
    return bad("port " + node::Quote(port_s) + " is not a number in 0..65535");
  }
  sockaddr_storage ss{};
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a->sin6_addr) != 1) {
      return bad("host " + node::Quote(host) + " is not an IPv6 address");
    }
    *len = sizeof(sockaddr_in6);
    return ss;
  }
  auto* a = reinterpret_cast<sockaddr_in*>(&ss);
  a->sin_family = AF_INET;
  a->sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a->sin_addr) != 1) {
    return bad("host " + node::Quote(host) + " is not an IPv4 address (or [IPv6] in brackets)");
  }
  *len = sizeof(sockaddr_in);
  return ss;
}

// Binds (and drops) a socket on the address the way civetweb will, so that
// a port in use or an address not on this host is an errno naming the
// address rather than civetweb's generic failure.
Status ProbeBind(const std::string& listen, const sockaddr_storage& addr, socklen_t len) {
  UniqueFd fd(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket() for --metrics-listen " + listen);
  const int one = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as civetweb does
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    return ErrnoToStatus(errno, "bind(" + listen + ") for --metrics-listen");
  }
  if (::listen(fd.get(), 1) != 0) return ErrnoToStatus(errno, "listen(" + listen + ") for --metrics-listen");
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                              std::shared_ptr<PrometheusMetrics> metrics) {
  socklen_t len = 0;
  ASSIGN_OR_RETURN(sockaddr_storage addr, ParseListen(listen, &len));
  RETURN_IF_ERROR(ProbeBind(listen, addr, len));
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->metrics_ = std::move(metrics);
  s->gauges_ = std::make_shared<GaugeCollector>();
  try {
    // Two threads: a scrape is one request every few seconds.
    s->exposer_ = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError("--metrics-listen " + listen + ": cannot serve: " + e.what());
  }
  s->exposer_->RegisterCollectable(s->metrics_->registry());
  s->exposer_->RegisterCollectable(s->gauges_);
  std::vector<int> ports = s->exposer_->GetListeningPorts();
  s->port_ = ports.empty() ? 0 : ports.front();
  return s;
}

MetricsServer::~MetricsServer() {
  exposer_.reset();  // joins civetweb's threads: no scrape runs after this
}

std::shared_ptr<void> MetricsServer::Watch(std::function<node::NodeGauges()> gauges) {
  gauges_->Set(std::move(gauges));
  return std::shared_ptr<void>(nullptr, [collector = gauges_](void*) { collector->Set(nullptr); });
}

}  // namespace warren::metrics
