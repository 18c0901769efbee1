// warren ls: table of sandboxes; warren get ID: one sandbox.
#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace warren::cli {
namespace {

// Layer names as asked, digests where no name was given.
std::string LayersColumn(const v1::Sandbox& s) {
  std::vector<std::string> out;
  for (int i = 0; i < s.layers_size(); ++i) {
    if (i < s.layer_names_size() && !s.layer_names(i).empty()) {
      out.push_back(s.layer_names(i));
    } else {
      out.push_back(ShortDigest(s.layers(i)));
    }
  }
  if (out.empty()) {
    for (const std::string& n : s.layer_names()) out.push_back(n);
  }
  return out.empty() ? "-" : absl::StrJoin(out, ",");
}

int RunLs(Invocation& inv) {
  StatusOr<v1::ListSandboxesRequest> req = BuildListRequest(inv.ls);
  if (!req.ok()) return UsageError(req.status());
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::ListSandboxesResponse resp;
  Status st = FromGrpc(client.sandboxes().List(&ctx, *req, &resp));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const v1::Sandbox& s : resp.sandboxes()) list.push_back(SandboxToJson(s));
    PrintJson({{"sandboxes", list}});
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"ID", "BACKEND", "STATE", "AGE", "LAYERS", "CPU", "MEM"}};
  int64_t now = WallNowNs();
  for (const v1::Sandbox& s : resp.sandboxes()) {
    rows.push_back({s.id(), s.backend(), StateName(s.state()), FormatAge(s.created_at_ns(), now), LayersColumn(s),
                    absl::StrCat(s.resources().cpu_millis(), "m"), absl::StrCat(s.resources().memory_mb(), "MiB")});
  }
  PrintTable(std::cout, rows);
  return kExitOk;
}

int RunGet(Invocation& inv) {
  if (inv.get_id.empty()) return UsageError(absl::InvalidArgumentError("missing sandbox ID"));
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::GetSandboxRequest req;
  req.set_id(inv.get_id);
  v1::Sandbox s;
  Status st = FromGrpc(client.sandboxes().Get(&ctx, req, &s));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson(SandboxToJson(s));
    return kExitOk;
  }
  std::vector<std::string> layers;
  for (int i = 0; i < s.layers_size(); ++i) {
    std::string name = i < s.layer_names_size() ? s.layer_names(i) : "";
    layers.push_back(name.empty() ? s.layers(i) : absl::StrCat(name, " (", s.layers(i), ")"));
  }
  std::vector<std::string> labels;
  for (const auto& [k, v] : s.labels()) labels.push_back(absl::StrCat(k, "=", v));
  std::sort(labels.begin(), labels.end());
  const v1::Resources& r = s.resources();
  std::vector<std::vector<std::string>> rows = {
      {"id:", s.id()},
      {"backend:", s.backend()},
      {"state:", StateName(s.state())},
      {"age:", FormatAge(s.created_at_ns(), WallNowNs())},
      {"job:", s.job()},
      {"hostname:", s.hostname()},
      {"init_pid:", absl::StrCat(s.init_pid())},
      {"layers:", absl::StrJoin(layers, ", ")},
      {"cpu_millis:", absl::StrCat(r.cpu_millis())},
      {"memory_mb:", absl::StrCat(r.memory_mb())},
      {"disk_mb:", absl::StrCat(r.disk_mb())},
      {"pids:", absl::StrCat(r.pids())},
      {"open_files:", absl::StrCat(r.open_files())},
      {"tmpfs_mb:", absl::StrCat(r.tmpfs_mb())},
      {"labels:", absl::StrJoin(labels, ",")},
  };
  PrintTable(std::cout, rows);
  return kExitOk;
}

}  // namespace

StatusOr<v1::ListSandboxesRequest> BuildListRequest(const LsArgs& a) {
  v1::ListSandboxesRequest req;
  for (const std::string& kv : a.labels) {
    ASSIGN_OR_RETURN(auto p, ParseKeyValue(kv, "--label"));
    (*req.mutable_labels())[p.first] = p.second;
  }
  req.set_job(a.job);
  return req;
}

void AddLsCommands(CLI::App& root, Invocation& inv) {
  CLI::App* ls = root.add_subcommand("ls", "List sandboxes: ID BACKEND STATE AGE LAYERS CPU MEM.");
  ls->fallthrough();
  ls->add_option("--label", inv.ls.labels, "only sandboxes with this K=V label; repeatable")->allow_extra_args(false);
  ls->add_option("--job", inv.ls.job, "only sandboxes of this job");
  ls->callback([&inv] {
    inv.verb = "ls";
    inv.run = RunLs;
  });

  CLI::App* get = root.add_subcommand("get", "Show one sandbox.");
  get->fallthrough();
  get->add_option("id", inv.get_id, "sandbox id")->required();
  get->callback([&inv] {
    inv.verb = "get";
    inv.run = RunGet;
  });
}

}  // namespace warren::cli
