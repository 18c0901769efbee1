// warren network ID [--allow E]... [--deny E]...: replaces a sandbox's
// egress policy (Sandboxes.SetNetwork); prints the policy in force.
// warren expose ID PORT [--close]: exposes a sandbox's port on the node
// (Sandboxes.Expose; prints address and token) or closes it (Unexpose).
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

int RunExpose(Invocation& inv) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  Status st;
  v1::ExposedPort got;
  if (inv.network.close) {
    v1::UnexposeRequest req;
    req.set_id(inv.network.id);
    req.set_port(inv.network.port);
    v1::Empty empty;
    st = FromGrpc(client.sandboxes().Unexpose(&ctx, req, &empty));
  } else {
    v1::ExposeRequest req;
    req.set_id(inv.network.id);
    req.set_port(inv.network.port);
    st = FromGrpc(client.sandboxes().Expose(&ctx, req, &got));
  }
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.network.close) return kExitOk;
  if (inv.global.json) {
    PrintJson({{"port", got.port()}, {"address", got.address()}, {"token", got.token()}});
  } else {
    std::cout << "address " << got.address() << "\ntoken " << got.token() << "\n";
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
  CLI::App* ex = root.add_subcommand(
      "expose", "Serve a sandbox's port on the node behind a token (X-Warren-Token header); --close ends it.");
  ex->fallthrough();
  ex->add_option("id", inv.network.id, "sandbox id")->required();
  ex->add_option("port", inv.network.port, "port inside the sandbox (its loopback)")
      ->required()
      ->check(CLI::Range(1, 65535));
  ex->add_flag("--close", inv.network.close, "stop exposing the port (its open connections end)");
  ex->callback([&inv] {
    inv.verb = "expose";
    inv.run = RunExpose;
  });
}

}  // namespace warren::cli
