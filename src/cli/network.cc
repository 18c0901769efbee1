// warren network ID [--allow E]... [--deny E]...: replaces a sandbox's
// egress policy (Sandboxes.SetNetwork); prints the policy in force.
#include <iostream>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace warren::cli {
namespace {

int RunNetwork(Invocation& inv) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::SetNetworkRequest req;
  req.set_id(inv.network.id);
  for (const std::string& e : inv.network.allow) req.mutable_network()->add_allow(e);
  for (const std::string& e : inv.network.deny) req.mutable_network()->add_deny(e);
  v1::NetworkPolicy got;
  Status st = FromGrpc(client.sandboxes().SetNetwork(&ctx, req, &got));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    nlohmann::json j;
    j["allow"] = std::vector<std::string>(got.allow().begin(), got.allow().end());
    j["deny"] = std::vector<std::string>(got.deny().begin(), got.deny().end());
    PrintJson(j);
  } else {
    for (const std::string& e : got.allow()) std::cout << "allow " << e << "\n";
    for (const std::string& e : got.deny()) std::cout << "deny " << e << "\n";
    std::cout.flush();
  }
  return kExitOk;
}

}  // namespace

void AddNetworkCommand(CLI::App& root, Invocation& inv) {
  CLI::App* sub = root.add_subcommand(
      "network", "Replace a sandbox's egress policy (created with --network); applies to the next packet.");
  sub->fallthrough();
  sub->add_option("id", inv.network.id, "sandbox id")->required();
  sub->add_option("--allow", inv.network.allow, "[tcp:|udp:|icmp:]CIDR[:PORT[-PORT]]; repeatable")
      ->allow_extra_args(false);
  sub->add_option("--deny", inv.network.deny, "wins over --allow; repeatable")->allow_extra_args(false);
  sub->callback([&inv] {
    inv.verb = "network";
    inv.run = RunNetwork;
  });
}

}  // namespace warren::cli
