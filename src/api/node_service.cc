#include "api/node_service.h"

#include <sys/sysinfo.h>

#include <array>
#include <sstream>

#include "api/convert.h"
#include "api/projects.h"
#include "api/status_map.h"
#include "common/file_util.h"

namespace warren::api {
namespace {

namespace v1 = ::warren::v1;

// MemAvailable of /proc/meminfo; 0 when unreadable.
uint64_t MemAvailableBytes() {
  StatusOr<std::string> meminfo = ReadSmallFile("/proc/meminfo");
  if (!meminfo.ok()) return 0;
  std::istringstream in(*meminfo);
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  for (int i = 0; i < 64 && in >> key >> kb >> unit; ++i) {
    if (key == "MemAvailable:") return kb << 10;
  }
  return 0;
}

grpc::Status NotInCluster() {
  return {grpc::StatusCode::FAILED_PRECONDITION,
          "this node is not in a cluster (start warrend with --cluster etcd=URL, README \"Run a cluster\")"};
}

}  // namespace

grpc::Status NodeService::Status(grpc::ServerContext* ctx, const v1::NodeStatusRequest*, v1::NodeStatus* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  node::SandboxManager& m = *deps_.manager;
  node::NodeCounters c = m.Counters();
  resp->set_node_id(m.options().node_id);
  resp->set_version(facts_.version);
  for (const auto& b : m.BackendNames()) resp->add_backends(b);
  for (const auto& b : extra_backends_) resp->add_backends(b);
  resp->set_sandboxes(c.sandboxes);
  resp->set_layers(static_cast<uint32_t>(m.layers().List().size()));
  resp->set_layers_mounted(static_cast<uint32_t>(m.layers().MountedCount()));
  if (facts_.cgroup_version != 0) resp->set_cgroup_version("v" + std::to_string(facts_.cgroup_version));
  resp->set_cgroup_parent(facts_.cgroup_parent);
  resp->set_idmapped_mounts(facts_.idmapped_mounts);
  resp->set_file_backed_erofs(m.layers().FileBackedErofs());
  resp->set_state_dir(m.options().state_dir);
  resp->set_started_at_ns(c.started_at_ns);
  resp->set_cpus(c.cpus);
  struct sysinfo si;
  if (sysinfo(&si) == 0) resp->set_memory_total_bytes(static_cast<uint64_t>(si.totalram) * si.mem_unit);
  resp->set_memory_available_bytes(MemAvailableBytes());
  const std::array<node::ClassUsage, 2> usage = m.ClassUsages();
  for (runtime::Qos q : {runtime::Qos::kLatency, runtime::Qos::kBestEffort}) {
    ToProto(node::CapacityOf(m.options().limits, q, usage[static_cast<int>(q)]), resp->add_qos());
  }
  resp->set_core_scheduling(node::CoreScheduling());
  if (facts_.microvm_accel.valid()) {
    // The probe is bounded (1 s) and started with the daemon: a status call
    // right after start waits for its end rather than answering "unknown".
    if (facts_.microvm_accel.wait_for(std::chrono::seconds(3)) == std::future_status::ready) {
      resp->set_microvm_accel(facts_.microvm_accel.get().accel);
      resp->set_microvm_accel_reason(facts_.microvm_accel.get().reason);
    } else {
      resp->set_microvm_accel_reason("the KVM probe has not finished");
    }
  }
  return grpc::Status::OK;
}

grpc::Status NodeService::ListNodes(grpc::ServerContext* ctx, const v1::ListNodesRequest*,
                                    v1::ListNodesResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(RequireEveryProject(deps_, *ctx, "node ls"));
  if (members_ == nullptr) return NotInCluster();
  for (v1::ClusterNode& n : members_->Nodes()) *resp->add_nodes() = std::move(n);
  return grpc::Status::OK;
}

grpc::Status NodeService::Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req, v1::ClusterNode* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(RequireEveryProject(deps_, *ctx, "node drain"));
  if (members_ == nullptr) return NotInCluster();
  const std::string& id = req->node_id();
  if (id.empty() || id == members_->Self() || IsForwarded(*ctx)) {
    if (!id.empty() && id != members_->Self()) {
      return {grpc::StatusCode::NOT_FOUND, "node " + id + " is not this node (" + members_->Self() + ")"};
    }
    StatusOr<v1::ClusterNode> n = members_->SetDrain(req->drain());
    if (!n.ok()) return ToGrpcStatus(n.status());
    *resp = *std::move(n);
    return grpc::Status::OK;
  }
  StatusOr<std::shared_ptr<grpc::Channel>> ch = members_->NodeChannel(id);
  if (!ch.ok()) return ToGrpcStatus(ch.status());
  if (deps_.forward == nullptr) return {grpc::StatusCode::INTERNAL, "cluster members without a forwarder"};
  std::unique_ptr<grpc::ClientContext> cc = deps_.forward->Context(*ctx);
  grpc::Status st = v1::Node::NewStub(*ch)->Drain(cc.get(), *req, resp);
  resp->set_self(false);  // relative to the node the client asked, not the one that drained
  return st;
}

}  // namespace warren::api
