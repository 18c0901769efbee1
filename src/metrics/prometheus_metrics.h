// The node's metrics in Prometheus form: node::Metrics counted into a
// prometheus-cpp registry (counters, histograms), and the server of
// `warrend --metrics-listen` that exposes them with the node's scrape-time
// gauges on GET /metrics (Prometheus text format, civetweb from
// prometheus-cpp-pull). Names follow Prometheus' conventions: `warren_`
// prefix, `_total` counters, `_seconds` histograms, base units, labels of
// small bounded sets only (backend, outcome, reason, state; never an id).
// README.md "Metrics" lists every name.
//
// Thread-safe. Prometheus headers stay in the .cc (only warrend includes this).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.h"
#include "node/metrics.h"

namespace prometheus {
class Registry;
class Exposer;
}  // namespace prometheus

namespace warren::metrics {

class PrometheusMetrics final : public node::Metrics {
 public:
  PrometheusMetrics();
  ~PrometheusMetrics() override;

  void OnCreate(std::string_view backend, const Status& result, std::chrono::nanoseconds took) override;
  void OnDestroy(std::string_view backend, std::string_view reason) override;
  void OnExec(std::string_view backend, std::string_view outcome, std::chrono::nanoseconds took) override;
  void OnPause(std::string_view backend) override;
  void OnSuspend(std::string_view backend, uint64_t swap_bytes) override;
  void OnResume(std::string_view backend, bool from_suspended, uint64_t prefetched_bytes) override;
  void OnFnCall(std::string_view outcome, std::chrono::nanoseconds took) override;

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }
  // Everything counted so far in the text format (tests).
  std::string Render() const;

 private:
  struct Families;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> f_;
};

// The node's gauges as Prometheus families (warren_sandboxes{backend,state},
// warren_creates_in_flight, warren_create_queue_depth, warren_layer_mounts,
// warren_fncall_workers{state}), in the text format (tests).
std::string RenderGauges(const node::NodeGauges& gauges);

// GET /metrics on one address.
class MetricsServer {
 public:
  // `listen`: "IPV4:PORT" or "[IPV6]:PORT" (port 0 = any free one).
  // InvalidArgument naming the flag for a malformed address; the bind's
  // errno (EADDRINUSE, EADDRNOTAVAIL, ...) naming the address when it
  // cannot listen there.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                        std::shared_ptr<PrometheusMetrics> metrics);
  ~MetricsServer();  // stops serving (waits for a scrape in progress)

  int port() const { return port_; }
  // From now on every scrape also reports `gauges()` (called on the
  // server's thread, at most once per scrape), until the returned handle is
  // destroyed, which waits for a call in progress: destroy it before what
  // `gauges` reads.
  [[nodiscard]] std::shared_ptr<void> Watch(std::function<node::NodeGauges()> gauges);

 private:
  class GaugeCollector;
  MetricsServer() = default;

  std::shared_ptr<PrometheusMetrics> metrics_;
  std::shared_ptr<GaugeCollector> gauges_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace warren::metrics
