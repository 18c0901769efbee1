// warren audit ID: the sandbox's audit log (every exec and file call, kept by
// the daemon outside the sandbox); warren pause ID / warren resume ID;
// warren suspend ID (pause + memory reclaimed into swap); warren ttl ID SECONDS.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace warren::cli {
namespace {

std::string Field(const nlohmann::json& e, const char* key) {
  if (!e.contains(key)) return "";
  return e[key].is_string() ? e[key].get<std::string>() : e[key].dump();
}

int RunAudit(Invocation& inv) {
  Client client(inv.global);
  v1::Lifecycle::Stub stub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::AuditLogRequest req;
  req.set_id(inv.lifecycle_id);
  v1::AuditLogResponse resp;
  Status st = FromGrpc(stub.AuditLog(&ctx, req, &resp));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& line : resp.entries()) {
    all.push_back(nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
  }
  if (inv.global.json) {
    PrintJson(all);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"START_NS", "MS", "OP", "WHAT", "EXIT", "BYTES"}};
  for (const nlohmann::json& e : all) {
    if (!e.is_object()) continue;
    int64_t s = e.value("start_ns", int64_t{0}), t = e.value("end_ns", int64_t{0});
    std::string what = e.contains("shell")  ? Field(e, "shell")
                       : e.contains("argv") ? Field(e, "argv")
                                            : Field(e, "path");
    if (what.size() > 60) what = what.substr(0, 57) + "...";
    std::string bytes =
        e.contains("stdout_bytes") ? Field(e, "stdout_bytes") + "/" + Field(e, "stderr_bytes") : Field(e, "bytes");
    std::string exit = e.contains("error") ? "error" : Field(e, "exit_code");
    rows.push_back({absl::StrCat(s), absl::StrCat((t - s) / 1000000), Field(e, "op"), what, exit, bytes});
  }
  PrintTable(std::cout, rows);
  return kExitOk;
}

int RunPauseResume(Invocation& inv, bool pause) {
  Client client(inv.global);
  v1::Lifecycle::Stub stub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::Sandbox sb;
  grpc::Status gs;
  if (pause) {
    v1::PauseRequest req;
    req.set_id(inv.lifecycle_id);
    gs = stub.Pause(&ctx, req, &sb);
  } else {
    v1::ResumeRequest req;
    req.set_id(inv.lifecycle_id);
    gs = stub.Resume(&ctx, req, &sb);
  }
  Status st = FromGrpc(gs);
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson({{"id", sb.id()}, {"state", StateName(sb.state())}});
  } else {
    std::cout << sb.id() << std::endl;
  }
  return kExitOk;
}

int PrintSandbox(Invocation& inv, const grpc::Status& gs, const v1::Sandbox& sb) {
  Status st = FromGrpc(gs);
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson(SandboxToJson(sb));
  } else {
    std::cout << sb.id() << std::endl;
  }
  return kExitOk;
}

int RunSuspend(Invocation& inv) {
  Client client(inv.global);
  v1::Lifecycle::Stub stub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::SuspendRequest req;
  req.set_id(inv.rl.id);
  v1::Sandbox sb;
  grpc::Status gs = stub.Suspend(&ctx, req, &sb);
  return PrintSandbox(inv, gs, sb);
}

int RunTtl(Invocation& inv) {
  Client client(inv.global);
  v1::Lifecycle::Stub stub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::ExtendTtlRequest req;
  req.set_id(inv.rl.id);
  req.set_ttl_s(inv.rl.ttl_s);
  v1::Sandbox sb;
  grpc::Status gs = stub.ExtendTtl(&ctx, req, &sb);
  return PrintSandbox(inv, gs, sb);
}

}  // namespace

void AddLifecycleCommands(CLI::App& root, Invocation& inv) {
  CLI::App* audit = root.add_subcommand("audit", "Show a sandbox's audit log (every exec and file call).");
  audit->fallthrough();
  audit->add_option("id", inv.lifecycle_id, "sandbox id")->required();
  audit->callback([&inv] {
    inv.verb = "audit";
    inv.run = RunAudit;
  });
  CLI::App* pause = root.add_subcommand("pause", "Freeze every process of a sandbox.");
  pause->fallthrough();
  pause->add_option("id", inv.lifecycle_id, "sandbox id")->required();
  pause->callback([&inv] {
    inv.verb = "pause";
    inv.run = [](Invocation& i) { return RunPauseResume(i, true); };
  });
  CLI::App* resume = root.add_subcommand("resume", "Thaw a paused sandbox.");
  resume->fallthrough();
  resume->add_option("id", inv.lifecycle_id, "sandbox id")->required();
  resume->callback([&inv] {
    inv.verb = "resume";
    inv.run = [](Invocation& i) { return RunPauseResume(i, false); };
  });
  CLI::App* suspend = root.add_subcommand(
      "suspend", "Pause a sandbox and give its memory back (reclaimed into swap); resume or any call brings it back.");
  suspend->fallthrough();
  suspend->add_option("id", inv.rl.id, "sandbox id")->required();
  suspend->callback([&inv] {
    inv.verb = "suspend";
    inv.run = RunSuspend;
  });
  CLI::App* ttl = root.add_subcommand("ttl", "Set a sandbox's TTL to SECONDS from now (0 = no TTL).");
  ttl->fallthrough();
  ttl->add_option("id", inv.rl.id, "sandbox id")->required();
  ttl->add_option("seconds", inv.rl.ttl_s, "TTL in seconds from now; 0 = none")->required();
  ttl->callback([&inv] {
    inv.verb = "ttl";
    inv.run = RunTtl;
  });
}

}  // namespace warren::cli
