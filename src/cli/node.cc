// warren node ls | drain ID | undrain ID: the cluster's nodes as the node
// the client talks to sees them, and their drain flags (README "Run a
// cluster"). FAILED_PRECONDITION from a node that is not in a cluster.
// `node ls --json`: NodesSummaryJson (commands.h).
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace warren::cli {
namespace {

nlohmann::json ClusterNodeToJson(const v1::ClusterNode& n) {
  return {{"id", n.id()},
          {"address", n.address()},
          {"version", n.version()},
          {"backends", std::vector<std::string>(n.backends().begin(), n.backends().end())},
          {"cpus", n.cpus()},
          {"memory_mb", n.memory_mb()},
          {"max_sandboxes", n.max_sandboxes()},
          {"sandboxes", n.sandboxes()},
          {"free_slots", n.free_slots()},
          {"free_cpu_millis", n.free_cpu_millis()},
          {"free_memory_mb", n.free_memory_mb()},
          {"available_memory_mb", n.available_memory_mb()},
          {"load1", n.load1()},
          {"drain", n.drain()},
          {"updated_ns", n.updated_ns()},
          {"self", n.self()},
          {"qos", QosToJson(n.qos())},
          {"core_scheduling", n.core_scheduling()}};
}

// One sample of the summary: {"name", "labels", "value"}.
nlohmann::json Sample(const std::string& name, nlohmann::json labels, double value) {
  return {{"name", name}, {"labels", std::move(labels)}, {"value", value}};
}

std::vector<std::string> NodeRow(const v1::ClusterNode& n) {
  return {n.id() + (n.self() ? " *" : ""),
          n.address(),
          n.drain() ? "draining" : "ready",
          absl::StrCat(n.sandboxes(), "/", n.max_sandboxes()),
          absl::StrCat(n.cpus()),
          absl::StrCat(n.free_cpu_millis()),
          absl::StrCat(n.free_memory_mb(), "M"),
          absl::StrCat(n.load1()),
          absl::StrJoin(n.backends(), ","),
          FormatAge(n.updated_ns(), WallNowNs())};
}

int RunNode(Invocation& inv, const std::string& action) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  std::vector<v1::ClusterNode> nodes;
  grpc::Status gs;
  if (action == "ls") {
    v1::ListNodesResponse resp;
    gs = client.node().ListNodes(&ctx, v1::ListNodesRequest(), &resp);
    nodes.assign(resp.nodes().begin(), resp.nodes().end());
  } else {
    v1::DrainRequest req;
    req.set_node_id(inv.node_id);
    req.set_drain(action == "drain");
    v1::ClusterNode n;
    gs = client.node().Drain(&ctx, req, &n);
    nodes.push_back(n);
  }
  if (Status st = FromGrpc(gs); !st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    if (action == "ls") {
      PrintJson(NodesSummaryJson(nodes));
    } else {
      PrintJson(ClusterNodeToJson(nodes.at(0)));
    }
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "ADDRESS", "STATE", "SANDBOXES", "CPUS", "FREE_MILLICPU", "FREE_MEM", "LOAD1", "BACKENDS", "UPDATED"}};
  for (const v1::ClusterNode& n : nodes) rows.push_back(NodeRow(n));
  PrintTable(std::cout, rows);
  return kExitOk;
}

}  // namespace

nlohmann::json NodesSummaryJson(const std::vector<v1::ClusterNode>& nodes) {
  nlohmann::json metrics = nlohmann::json::array();
  for (const v1::ClusterNode& n : nodes) {
    const nlohmann::json node = {{"node", n.id()}};
    metrics.push_back(Sample("warren_node_info",
                             {{"node", n.id()},
                              {"address", n.address()},
                              {"version", n.version()},
                              {"backends", absl::StrJoin(n.backends(), ",")},
                              {"core_scheduling", n.core_scheduling()}},
                             1));
    metrics.push_back(Sample("warren_node_sandboxes", node, n.sandboxes()));
    metrics.push_back(Sample("warren_node_sandboxes_max", node, n.max_sandboxes()));
    metrics.push_back(Sample("warren_node_free_slots", node, n.free_slots()));
    metrics.push_back(Sample("warren_node_cpus", node, n.cpus()));
    metrics.push_back(Sample("warren_node_cpu_free_millis", node, static_cast<double>(n.free_cpu_millis())));
    metrics.push_back(Sample("warren_node_memory_bytes", node, static_cast<double>(n.memory_mb()) * (1 << 20)));
    metrics.push_back(
        Sample("warren_node_memory_free_bytes", node, static_cast<double>(n.free_memory_mb()) * (1 << 20)));
    metrics.push_back(
        Sample("warren_node_memory_available_bytes", node, static_cast<double>(n.available_memory_mb()) * (1 << 20)));
    metrics.push_back(Sample("warren_node_load1", node, n.load1()));
    metrics.push_back(Sample("warren_node_draining", node, n.drain() ? 1 : 0));
    metrics.push_back(Sample("warren_node_updated_timestamp_seconds", node, static_cast<double>(n.updated_ns()) / 1e9));
    for (const v1::QosClassCapacity& q : n.qos()) {
      const nlohmann::json cls = {{"node", n.id()}, {"qos", q.qos()}};
      metrics.push_back(Sample("warren_node_qos_sandboxes", cls, q.sandboxes()));
      metrics.push_back(Sample("warren_node_qos_overcommit_ratio", cls, q.overcommit()));
      metrics.push_back(Sample("warren_node_qos_cpu_requested_millis", cls, static_cast<double>(q.cpu_millis())));
      metrics.push_back(
          Sample("warren_node_qos_memory_requested_bytes", cls, static_cast<double>(q.memory_mb()) * (1 << 20)));
      if (q.overcommit() > 0) {  // a class not counted has no bound to be free under
        metrics.push_back(Sample("warren_node_qos_cpu_free_millis", cls, static_cast<double>(q.free_cpu_millis())));
        metrics.push_back(
            Sample("warren_node_qos_memory_free_bytes", cls, static_cast<double>(q.free_memory_mb()) * (1 << 20)));
      }
    }
  }
  nlohmann::json records = nlohmann::json::array();
  for (const v1::ClusterNode& n : nodes) records.push_back(ClusterNodeToJson(n));
  return {{"metrics", metrics}, {"nodes", records}};
}

void AddNodeCommands(CLI::App& root, Invocation& inv) {
  CLI::App* node = root.add_subcommand("node", "Cluster nodes: list them, drain one (no new sandboxes), undrain it.");
  node->require_subcommand(1);
  CLI::App* ls = node->add_subcommand("ls", "List the cluster's nodes (* = the node answering).");
  ls->fallthrough();
  ls->callback([&inv] {
    inv.verb = "node ls";
    inv.run = [](Invocation& i) { return RunNode(i, "ls"); };
  });
  CLI::App* drain = node->add_subcommand("drain", "Stop placing new sandboxes on a node (its running ones stay).");
  drain->fallthrough();
  drain->add_option("id", inv.node_id, "node id (warren node ls)")->required();
  drain->callback([&inv] {
    inv.verb = "node drain";
    inv.run = [](Invocation& i) { return RunNode(i, "drain"); };
  });
  CLI::App* undrain = node->add_subcommand("undrain", "Place new sandboxes on a drained node again.");
  undrain->fallthrough();
  undrain->add_option("id", inv.node_id, "node id (warren node ls)")->required();
  undrain->callback([&inv] {
    inv.verb = "node undrain";
    inv.run = [](Invocation& i) { return RunNode(i, "undrain"); };
  });
}

}  // namespace warren::cli
