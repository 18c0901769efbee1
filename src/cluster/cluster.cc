#include "cluster/cluster.h"

#include <algorithm>

#include "cluster/local_record.h"
#include "common/file_util.h"
#include "common/log.h"

namespace warren::cluster {
namespace {

namespace v1 = ::warren::v1;

constexpr char kPrefix[] = "/warren/nodes/";

Status CheckAdvertise(const std::string& a) {
  const size_t colon = a.rfind(':');
  if (a.empty() || colon == std::string::npos || colon == 0 || colon + 1 == a.size()) {
    return absl::InvalidArgumentError("cluster: advertised address \"" + a +
                                      "\" must be HOST:PORT (--cluster-advertise or --listen)");
  }
  const std::string host = a.substr(0, colon), port = a.substr(colon + 1);
  if (port == "0") {
    return absl::InvalidArgumentError("cluster: advertised address \"" + a +
                                      "\" has port 0; give --listen a port (or --cluster-advertise)");
  }
  if (host == "0.0.0.0" || host == "[::]" || host == "::") {
    return absl::InvalidArgumentError("cluster: advertised address \"" + a +
                                      "\" is a wildcard; give --cluster-advertise HOST:PORT the others can reach");
  }
  return absl::OkStatus();
}

v1::ClusterNode ToProto(const NodeRecord& r, const std::string& self) {
  v1::ClusterNode n;
  n.set_id(r.id);
  n.set_address(r.address);
  n.set_version(r.version);
  for (const std::string& b : r.backends) n.add_backends(b);
  n.set_cpus(r.cpus);
  n.set_memory_mb(r.memory_mb);
  n.set_max_sandboxes(r.max_sandboxes);
  n.set_sandboxes(r.sandboxes);
  n.set_free_slots(r.free_slots);
  n.set_free_cpu_millis(r.free_cpu_millis);
  n.set_free_memory_mb(r.free_memory_mb);
  n.set_available_memory_mb(r.available_memory_mb);
  n.set_load1(r.load1);
  n.set_drain(r.drain);
  n.set_updated_ns(r.updated_ns);
  n.set_self(r.id == self);
  for (int c = 0; c < 2; ++c) {
    const QosRecord& q = r.qos[c];
    v1::QosClassCapacity* o = n.add_qos();
    o->set_qos(c == 1 ? "best-effort" : "latency");
    o->set_overcommit(q.overcommit);
    o->set_sandboxes(q.sandboxes);
    o->set_cpu_millis(q.cpu_millis);
    o->set_memory_mb(q.memory_mb);
    o->set_free_cpu_millis(q.free_cpu_millis);
    o->set_free_memory_mb(q.free_memory_mb);
  }
  n.set_core_scheduling(r.core_scheduling);
  return n;
}

}  // namespace

StatusOr<std::vector<std::string>> ParseClusterSpec(const std::string& spec) {
  if (spec.rfind("etcd=", 0) != 0) {
    return absl::InvalidArgumentError("--cluster \"" + spec + "\" must be etcd=URL[,URL...]");
  }
  std::vector<std::string> out;
  std::string rest = spec.substr(5);
  for (size_t start = 0; start <= rest.size();) {
    size_t comma = rest.find(',', start);
    if (comma == std::string::npos) comma = rest.size();
    std::string url = rest.substr(start, comma - start);
    if (url.empty()) return absl::InvalidArgumentError("--cluster \"" + spec + "\" has an empty etcd URL");
    out.push_back(url);
    start = comma + 1;
  }
  return out;
}

StatusOr<std::unique_ptr<Cluster>> Cluster::Join(const ClusterFlags& flags, node::SandboxManager* manager) {
  EtcdOptions eo;
  ASSIGN_OR_RETURN(eo.endpoints, ParseClusterSpec(flags.spec));
  RETURN_IF_ERROR(CheckAdvertise(flags.advertise));
  if (flags.token.empty()) return absl::InvalidArgumentError("--cluster needs --token-file (nodes call each other)");
  eo.ca_file = flags.etcd_ca;
  eo.cert_file = flags.etcd_cert;
  eo.key_file = flags.etcd_key;
  eo.user = flags.etcd_user;
  if (!flags.etcd_password_file.empty()) {
    ASSIGN_OR_RETURN(std::string pw, ReadSmallFile(flags.etcd_password_file));
    while (!pw.empty() && (pw.back() == '\n' || pw.back() == '\r')) pw.pop_back();
    eo.password = pw;
  }
  std::unique_ptr<Cluster> c(new Cluster());
  ASSIGN_OR_RETURN(c->etcd_, EtcdClient::New(eo));

  const std::string self = manager->options().node_id;
  // A live record of this id from another address is another node: refuse.
  // From this address it is this node's own, left by a daemon that died.
  ASSIGN_OR_RETURN(std::vector<EtcdKv> existing, c->etcd_->RangePrefix(kPrefix + self));
  for (const EtcdKv& kv : existing) {
    if (kv.key != kPrefix + self) continue;
    StatusOr<NodeRecord> r = NodeRecordFromJson(kv.value);
    if (r.ok() && r->address != flags.advertise) {
      return absl::AlreadyExistsError("cluster: node id " + self + " is already registered by " + r->address +
                                      " (node ids must be unique: --node-id)");
    }
  }

  c->self_ = self;
  c->drain_->store(flags.drain);
  c->refresh_ = std::chrono::milliseconds(flags.refresh_ms);
  LocalNode ln;
  ln.address = flags.advertise;
  ln.version = "0.1.0";
  ln.drain = flags.drain;
  ln.extra_backends = flags.extra_backends;
  c->projects_ = std::make_unique<ProjectStore>(c->etcd_.get(), self, manager);
  MembershipOptions mo;
  mo.prefix = kPrefix;
  mo.lease_s = flags.lease_s;
  mo.refresh = std::chrono::milliseconds(flags.refresh_ms);
  mo.after_refresh = [projects = c->projects_.get()](int64_t lease) { projects->Reconcile(lease); };
  ASSIGN_OR_RETURN(c->membership_, Membership::Join(c->etcd_.get(), mo, [manager, ln, drain = c->drain_]() mutable {
                     ln.drain = drain->load();
                     return LocalRecord(*manager, ln);
                   }));
  c->projects_->SetLease(c->membership_->lease());
  RouterOptions ro;
  ro.self = self;
  ro.token = flags.token;
  ro.projects = c->projects_.get();
  c->router_ = std::make_unique<Router>(c->membership_.get(), ro);
  Log(spdlog::level::info, "cluster: joined",
      {{"node", self},
       {"address", flags.advertise},
       {"etcd", flags.spec.substr(5)},
       {"nodes", std::to_string(c->membership_->Nodes()->size())}});
  return c;
}

Cluster::~Cluster() { Leave(); }

std::vector<v1::ClusterNode> Cluster::Nodes() {
  std::vector<v1::ClusterNode> out;
  auto view = membership_->Nodes();
  out.reserve(view->size());
  for (const NodeRecord& r : *view) out.push_back(ToProto(r, self_));
  std::sort(out.begin(), out.end(), [](const v1::ClusterNode& a, const v1::ClusterNode& b) { return a.id() < b.id(); });
  return out;
}

StatusOr<v1::ClusterNode> Cluster::SetDrain(bool drain) {
  const bool was = drain_->exchange(drain);
  if (was != drain) {
    Log(spdlog::level::info, drain ? "cluster: draining (no new sandboxes)" : "cluster: taking new sandboxes again",
        {{"node", self_}});
  }
  // Published at once: placement everywhere sees it from their next refresh.
  RETURN_IF_ERROR(membership_->RefreshNow(std::max<std::chrono::milliseconds>(4 * refresh_, std::chrono::seconds(5))));
  for (const v1::ClusterNode& n : Nodes()) {
    if (n.id() == self_) return n;
  }
  return absl::UnavailableError("cluster: this node's record is not in its view (lease lost?)");
}

StatusOr<std::shared_ptr<grpc::Channel>> Cluster::NodeChannel(const std::string& id) {
  auto view = membership_->Nodes();
  for (const NodeRecord& r : *view) {
    if (r.id == id) return router_->ChannelTo(r.address);
  }
  return absl::NotFoundError("node " + id + " is not in the cluster (unknown, or its lease expired)");
}

void Cluster::Leave() {
  if (membership_) membership_->Leave();
}

}  // namespace warren::cluster
