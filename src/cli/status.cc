// warren status: the node's status; warren version: this client's version.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"

#ifndef WARREN_VERSION
#define WARREN_VERSION "0.0.0"
#endif

namespace warren::cli {
namespace {

int RunStatus(Invocation& inv) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::NodeStatus n;
  Status st = FromGrpc(client.node().Status(&ctx, v1::NodeStatusRequest(), &n));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson(NodeStatusToJson(n));
    return kExitOk;
  }
  auto yes_no = [](bool b) { return std::string(b ? "yes" : "no"); };
  std::vector<std::vector<std::string>> rows = {
      {"node_id:", n.node_id()},
      {"version:", n.version()},
      {"backends:", absl::StrJoin(n.backends(), ",")},
      {"sandboxes:", absl::StrCat(n.sandboxes())},
      {"layers:", absl::StrCat(n.layers(), " (", n.layers_mounted(), " mounted)")},
      {"cgroup:", absl::StrCat(n.cgroup_version(), " ", n.cgroup_parent())},
      {"idmapped_mounts:", yes_no(n.idmapped_mounts())},
      {"file_backed_erofs:", yes_no(n.file_backed_erofs())},
      {"state_dir:", n.state_dir()},
      {"uptime:", FormatAge(n.started_at_ns(), WallNowNs())},
      {"cpus:", absl::StrCat(n.cpus())},
      {"memory:",
       absl::StrCat(FormatBytes(n.memory_available_bytes()), " available of ", FormatBytes(n.memory_total_bytes()))},
  };
  PrintTable(std::cout, rows);
  return kExitOk;
}

int RunVersion(Invocation& inv) {
  if (inv.global.json) {
    PrintJson({{"client_version", WARREN_VERSION}});
  } else {
    std::cout << "warren " << WARREN_VERSION << std::endl;
  }
  return kExitOk;
}

}  // namespace

void AddStatusCommands(CLI::App& root, Invocation& inv) {
  CLI::App* status = root.add_subcommand("status", "Show the node's status.");
  status->fallthrough();
  status->callback([&inv] {
    inv.verb = "status";
    inv.run = RunStatus;
  });
  CLI::App* version = root.add_subcommand("version", "Print the client version.");
  version->fallthrough();
  version->callback([&inv] {
    inv.verb = "version";
    inv.run = RunVersion;
  });
}

}  // namespace warren::cli
