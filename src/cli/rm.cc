// warren rm ID...: destroy sandboxes. Keeps going past failures; exit 1 if
// any failed. Human output: each destroyed id on its own line. --json:
// {"destroyed": [ids], "failed": [{"id", "code", "message"}]}.
#include <iostream>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace warren::cli {
namespace {

int RunRm(Invocation& inv) {
  Client client(inv.global);
  nlohmann::json destroyed = nlohmann::json::array();
  nlohmann::json failed = nlohmann::json::array();
  for (const std::string& id : inv.rm_ids) {
    grpc::ClientContext ctx;
    client.Prepare(&ctx);
    v1::DestroySandboxRequest req;
    req.set_id(id);
    v1::DestroySandboxResponse resp;
    Status st = FromGrpc(client.sandboxes().Destroy(&ctx, req, &resp));
    if (st.ok()) {
      destroyed.push_back(id);
      if (!inv.global.json) std::cout << id << std::endl;
    } else {
      failed.push_back(
          {{"id", id}, {"code", absl::StatusCodeToString(st.code())}, {"message", std::string(st.message())}});
      PrintError(Status(st.code(), id + ": " + std::string(st.message())));
    }
  }
  if (inv.global.json) PrintJson({{"destroyed", destroyed}, {"failed", failed}});
  return failed.empty() ? kExitOk : kExitError;
}

}  // namespace

void AddRmCommand(CLI::App& root, Invocation& inv) {
  CLI::App* sub = root.add_subcommand("rm", "Destroy sandboxes.");
  sub->fallthrough();
  sub->add_option("ids", inv.rm_ids, "sandbox ids")->required();
  sub->callback([&inv] {
    inv.verb = "rm";
    inv.run = RunRm;
  });
}

}  // namespace warren::cli
